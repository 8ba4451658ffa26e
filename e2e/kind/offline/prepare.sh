#!/usr/bin/env bash
# What kind needs on a machine with no registry (CI here; a user with a registry never runs this): podman set up
# for this host, local stand-ins for the Dockerfiles' base images, and a kind node image assembled from the
# Go-built binaries, whose containerd already holds every image kubeadm and the cluster's add-ons run.
#   source <(bash e2e/kind/offline/prepare.sh)     # prints the `export` lines e2e/kind/run.sh reads
#   bash e2e/kind/offline/prepare.sh bases         # only the Dockerfile's base images (no Go build needed)
#   bash e2e/kind/offline/prepare.sh rootfs        # only the root file systems (CI makes them while it compiles)
# Everything is cached: the binaries by version (e2e/*/build.sh), the images in podman's storage under names
# that carry their inputs' versions, so a second run takes seconds. Needs root, podman, mmdebstrap and Debian's
# runc and CNI plugins on the host (.ci/run installs them). Env: RDU_KIND_SUITE (Debian suite, bookworm).
#
# Why each piece (DESIGN 7, rung 6):
# - podman's default rlimits cannot be set without CAP_SYS_RESOURCE: containers.conf beside this script.
# - `kind build node-image` pulls (docker, `ctr content fetch`), so the node image is assembled as kind assembles
#   its own: kind's base layout (systemd units, containerd config, entrypoint, from the kind module), containerd
#   v2, Debian's runc and CNI plugins, kubeadm/kubelet/kubectl in /usr/bin, /kind/version, then containerd started
#   in a build container to import the component images, and the container committed.
# - kindnetd is not buildable here: /kind/manifests/default-cni.yaml is a small bridge CNI of our own (kind
#   installs whatever manifest the node image ships there); /kind/manifests/default-storage.yaml is
#   local-path-provisioner, as in kind's own images, built from its Go module.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source e2e/lib.sh

log() { e2e_log kind/offline/prepare.sh "$@"; }
SUITE="${RDU_KIND_SUITE:-bookworm}"
RUST_TAG="$(sed -n 's/^ARG RUST_VERSION=//p' docker/Dockerfile)"
[[ -n "$RUST_TAG" ]] || { log "no ARG RUST_VERSION in docker/Dockerfile"; exit 1; }
export CONTAINERS_CONF="$PWD/e2e/kind/offline/containers.conf"
WORK="$E2E_CACHE/kind-work"
# The node image's tag names its inputs: the versions, this directory's files, CoreDNS's plugin set and the Go
# module graph the binaries were built in (a change rebuilds it).
NODE_INPUTS="$({ cat e2e/kind/offline/* e2e/node/coredns/main.go; echo "go graph $GO_GRAPH"; } | sha256sum | cut -c1-12)"
NODE_IMAGE="localhost/rdu-kind-node:${K8S_VERSION}-kind-${KIND_VERSION}-containerd-${CONTAINERD_VERSION}-${NODE_INPUTS}"
COMPONENT_BASE="localhost/rdu-kind-component-base:${SUITE}-1"
NET_IMAGE="localhost/rdu-kind-net:${K8S_VERSION}-1"
STORAGE_IMAGE="localhost/rdu-kind-local-path-provisioner:${LOCAL_PATH_VERSION}-graph${GO_GRAPH}"

for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { log "$tool is not on PATH (apt-get install $tool)"; exit 1; }
done
[[ -x /usr/sbin/runc && -x /usr/lib/cni/bridge ]] || { log "Debian's runc and containernetworking-plugins are needed"; exit 1; }
# kind mounts the host's /lib/modules read-only into every node; this host has none.
mkdir -p /lib/modules "$WORK"

have_image() { podman image exists "$1"; }

# rootfs NAME PACKAGES [VARIANT]: a cached Debian root file system tarball.
rootfs() {
  local name="$1" packages="$2" variant="${3:-minbase}" out
  out="$WORK/$name-$SUITE-$(printf '%s %s' "$variant" "$packages" | sha256sum | cut -c1-12).tar"
  if [[ ! -s "$out" ]]; then
    log "mmdebstrap $name ($variant: $packages)"
    # mmdebstrap picks the output's format by its extension: the partial file ends in .tar too.
    mmdebstrap --quiet --variant="$variant" --include="$packages" "$SUITE" "${out%.tar}.part.tar" >&2
    mv "${out%.tar}.part.tar" "$out"
  fi
  echo "$out"
}
# The four root file systems: the two stand-ins for the Dockerfile's bases, the component images', the node's.
RUST_ROOTFS=(rust build-essential,ca-certificates,pkg-config)
CC_ROOTFS=(cc libc6,libgcc-s1,ca-certificates,tzdata,netbase extract)
COMPONENT_ROOTFS=(component iptables,conntrack,iproute2,ca-certificates,ipset)
NODE_ROOTFS=(node systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,procps,jq,runc,containernetworking-plugins)
if [[ "${1:-}" == rootfs ]]; then
  # mmdebstrap waits on the network and the disk more than on the CPU: CI runs this beside its compiles.
  for spec in RUST_ROOTFS CC_ROOTFS COMPONENT_ROOTFS NODE_ROOTFS; do
    declare -n args="$spec"
    rootfs "${args[@]}" >/dev/null
    unset -n args
  done
  log "the root file systems are ready"
  exit 0
fi

# --- the Dockerfile's base images, built locally under the names it uses ------------------------------------
RUST_IMAGE="docker.io/library/rust:${RUST_TAG}-${SUITE}"
if ! have_image "$RUST_IMAGE"; then
  log "building the stand-in $RUST_IMAGE (Debian $SUITE, build-essential, this machine's Rust toolchain)"
  tar="$(rootfs "${RUST_ROOTFS[@]}")"
  sysroot="$(rustc --print sysroot)"
  # The official image installs rustup's toolchain into /usr/local/{cargo,rustup}; the stand-in puts rustc and
  # cargo in /usr/local/bin (rustc finds its libraries beside its own path) and keeps CARGO_HOME where the
  # Dockerfile's cache mount expects it.
  ctx="$WORK/rust-context"
  rm -rf "$ctx" && mkdir -p "$ctx/toolchain"
  cp -a "$sysroot/bin" "$sysroot/lib" "$ctx/toolchain/"
  [[ -d "$sysroot/libexec" ]] && cp -a "$sysroot/libexec" "$ctx/toolchain/"
  # The host's CA bundle: cargo in the build stage reaches crates.io through whatever TLS proxy the host trusts.
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
  cat > "$ctx/Containerfile" <<EOF
FROM scratch
ADD $(basename "$tar") /
COPY toolchain/ /usr/local/
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["bash"]
EOF
  ln -f "$tar" "$ctx/$(basename "$tar")"
  podman build --quiet --pull=never -t "$RUST_IMAGE" "$ctx" >&2
  rm -rf "$ctx"
fi

CC_IMAGE="gcr.io/distroless/cc-debian12:nonroot"
if ! have_image "$CC_IMAGE"; then
  log "building the stand-in $CC_IMAGE (glibc, libgcc, CA certificates, tzdata; no shell, no package manager)"
  tar="$(rootfs "${CC_ROOTFS[@]}")"
  ctx="$WORK/cc-context"
  rm -rf "$ctx" && mkdir -p "$ctx/files/etc" "$ctx/files/tmp" "$ctx/files/home/nonroot"
  chmod 1777 "$ctx/files/tmp"
  chown 65532:65532 "$ctx/files/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    > "$ctx/files/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$ctx/files/etc/group"
  ln -f "$tar" "$ctx/$(basename "$tar")"
  cat > "$ctx/Containerfile" <<EOF
FROM scratch
ADD $(basename "$tar") /
COPY files/ /
USER 65532:65532
WORKDIR /home/nonroot
EOF
  podman build --quiet --pull=never -t "$CC_IMAGE" "$ctx" >&2
  rm -rf "$ctx"
fi

if [[ "${1:-}" == bases ]]; then
  log "the Dockerfile's base images are ready"
  echo "export CONTAINERS_CONF=$CONTAINERS_CONF"
  exit 0
fi

# --- the images kubeadm and the cluster's add-ons run, from the Go-built binaries -----------------------------
CP_BIN="$(bash e2e/control-plane/build.sh | tail -n 1)"
NODE_BIN="$(bash e2e/node/build.sh | tail -n 1)"
KIND_BIN="$(bash e2e/kind/build.sh | tail -n 1)"
if ! have_image "$COMPONENT_BASE"; then
  log "building $COMPONENT_BASE (Debian $SUITE with iptables, for kube-proxy and the CNI)"
  tar="$(rootfs "${COMPONENT_ROOTFS[@]}")"
  podman import --quiet "$tar" "$COMPONENT_BASE" >&2
fi

KUBEADM="$KIND_BIN/kubeadm"
mapfile -t KUBEADM_IMAGES < <("$KUBEADM" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null)
((${#KUBEADM_IMAGES[@]} >= 6)) || { log "kubeadm config images list gave: ${KUBEADM_IMAGES[*]}"; exit 1; }
# kind's containerd config names its own sandbox image; kubeadm lists another pause: both are tagged.
KIND_MOD="$(go_module_dir "sigs.k8s.io/kind@${KIND_VERSION}")"
KIND_BASE="$KIND_MOD/images/base/files"
[[ -d "$KIND_BASE" ]] || { log "kind's base files are missing in $KIND_MOD"; exit 1; }
SANDBOX_IMAGE="$(sed -n 's/^[[:space:]]*sandbox_image = "\(.*\)"/\1/p' "$KIND_BASE/etc/containerd/config.toml")"
[[ -n "$SANDBOX_IMAGE" ]] || { log "no sandbox_image in kind's containerd config"; exit 1; }

# component_image NAME BINARY_PATH_IN_IMAGE SOURCE [ENTRYPOINT]: builds NAME from the component base.
component_image() {
  local name="$1" dest="$2" src="$3" entrypoint="${4:-}" ctx="$WORK/component-context"
  have_image "$name" && return 0
  log "building $name from $src"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$src" "$ctx/binary"
  {
    echo "FROM $COMPONENT_BASE"
    echo "COPY binary $dest"
    if [[ -n "$entrypoint" ]]; then echo "ENTRYPOINT [\"$entrypoint\"]"; fi
  } > "$ctx/Containerfile"
  podman build --quiet --pull=never -t "$name" "$ctx" >&2
  rm -rf "$ctx"
}

PRELOAD=()
for image in "${KUBEADM_IMAGES[@]}" "$SANDBOX_IMAGE"; do
  component="${image##*/}"
  component="${component%%:*}"
  case "$component" in
    kube-apiserver | kube-controller-manager | kube-scheduler)
      component_image "$image" "/usr/local/bin/$component" "$CP_BIN/$component" ;;
    etcd) component_image "$image" /usr/local/bin/etcd "$CP_BIN/etcd" ;;
    kube-proxy) component_image "$image" /usr/local/bin/kube-proxy "$NODE_BIN/kube-proxy" ;;
    coredns) component_image "$image" /coredns "$NODE_BIN/coredns" /coredns ;;
    pause) component_image "$image" /pause "$NODE_BIN/pause" /pause ;;
    *) log "kubeadm lists an image this script cannot build: $image"; exit 1 ;;
  esac
  PRELOAD+=("$image")
done
component_image "$NET_IMAGE" /usr/local/bin/kubectl "$KIND_BIN/kubectl"
component_image "$STORAGE_IMAGE" /usr/local/bin/local-path-provisioner "$KIND_BIN/local-path-provisioner"
# The provisioner's helper pod runs `sh -c` with mkdir and rm: the component base has them.
PRELOAD+=("$NET_IMAGE" "$STORAGE_IMAGE" "$COMPONENT_BASE")

# kind's node images ship local-path-provisioner's manifest as /kind/manifests/default-storage.yaml; this one is
# the module's own deploy manifest with the local images, plus kind's default StorageClass `standard`.
LOCAL_PATH_MOD="$(go_module_dir "github.com/rancher/local-path-provisioner@${LOCAL_PATH_VERSION}")"
STORAGE_MANIFEST="$WORK/default-storage.yaml"
sed -e "s#image: rancher/local-path-provisioner:.*#image: $STORAGE_IMAGE#" -e "s#image: busybox#image: $COMPONENT_BASE#" \
  "$LOCAL_PATH_MOD/deploy/local-path-storage.yaml" > "$STORAGE_MANIFEST"
grep -q "image: $STORAGE_IMAGE" "$STORAGE_MANIFEST" && grep -q "image: $COMPONENT_BASE" "$STORAGE_MANIFEST" \
  || { log "local-path-provisioner's manifest did not take the local images"; exit 1; }
cat >> "$STORAGE_MANIFEST" <<'EOF'
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOF

# --- the node image ------------------------------------------------------------------------------------------
if ! have_image "$NODE_IMAGE"; then
  log "assembling $NODE_IMAGE"
  tar="$(rootfs "${NODE_ROOTFS[@]}")"
  root="$WORK/node-root"
  rm -rf "$root" && mkdir -p "$root"
  tar -C "$root" -xf "$tar"
  # kind's base image layout, file modes as its Dockerfile sets them.
  install -d -m 0755 "$root/kind/bin" "$root/etc/containerd" "$root/etc/kubernetes/manifests" "$root/kind/manifests" \
    "$root/opt/cni/bin" "$root/etc/systemd/system/kubelet.service.d"
  install -m 0755 "$KIND_BASE"/usr/local/bin/* "$root/usr/local/bin/"
  install -m 0755 "$KIND_BASE"/kind/bin/* "$root/kind/bin/"
  install -m 0644 "$KIND_BASE"/etc/crictl.yaml "$root/etc/"
  install -m 0644 "$KIND_BASE"/etc/containerd/config.toml "$root/etc/containerd/"
  install -m 0644 "$KIND_BASE"/etc/default/kubelet "$root/etc/default/"
  install -m 0644 "$KIND_BASE"/etc/sysctl.d/* "$root/etc/sysctl.d/"
  install -m 0644 "$KIND_BASE"/etc/systemd/system/*.service "$KIND_BASE"/etc/systemd/system/*.slice "$root/etc/systemd/system/"
  install -m 0644 "$KIND_BASE"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
  # No CAP_SYS_RESOURCE here: the kubelet's oom_score_adj of -997 cannot be set, containerd must clamp it.
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$root/etc/containerd/config.toml"
  # kind's base Dockerfile empties the systemd units a container does not want, then enables its own.
  find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
    "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
    "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >> "$root/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$root/sbin/init"
  for unit in kubelet containerd undo-mount-hacks; do
    install -d "$root/etc/systemd/system/multi-user.target.wants"
    ln -sf "/etc/systemd/system/$unit.service" "$root/etc/systemd/system/multi-user.target.wants/$unit.service"
  done
  ln -sf /dev/null "$root/etc/systemd/system/systemd-binfmt.service"
  # Binaries: containerd v2 and ctr, Debian's runc (kind's config runs io.containerd.runc.v2 → runc on PATH),
  # the CNI plugins where containerd looks, kubeadm, kubelet and kubectl where kind's units expect them.
  install -m 0755 "$KIND_BIN"/{containerd,containerd-shim-runc-v2,ctr} "$root/usr/local/bin/"
  cp -a "$root"/usr/lib/cni/* "$root/opt/cni/bin/"
  install -m 0755 "$KIND_BIN/kubeadm" "$KIND_BIN/kubectl" "$NODE_BIN/kubelet" "$root/usr/bin/"
  # containerd's default OCI spec without rlimits, with kind's product-files hook (kind's Dockerfile does this
  # with `ctr oci spec | jq`).
  "$KIND_BIN/ctr" oci spec | python3 -c '
import json, sys
spec = json.load(sys.stdin)
spec["process"].pop("rlimits", None)
spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
json.dump(spec, sys.stdout, indent=2)' > "$root/etc/containerd/cri-base.json"
  printf '%s' "$K8S_VERSION" > "$root/kind/version"
  install -m 0644 e2e/kind/offline/default-cni.yaml "$root/kind/manifests/default-cni.yaml"
  sed -i "s#@NET_IMAGE@#$NET_IMAGE#" "$root/kind/manifests/default-cni.yaml"
  install -m 0644 "$STORAGE_MANIFEST" "$root/kind/manifests/default-storage.yaml"
  base="localhost/rdu-kind-node-base:build"
  tar -C "$root" -c . | podman import --quiet \
    --change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$base" >&2
  rm -rf "$root"

  # Import the component images into the node's containerd, as `kind build node-image` does.
  archive="$WORK/preload.tar"
  rm -f "$archive"
  podman save --quiet --format docker-archive -m -o "$archive" "${PRELOAD[@]}"
  builder="rdu-kind-node-build-$$"
  podman run -d --name "$builder" --privileged --entrypoint sleep "$base" infinity >&2
  trap 'podman rm -f -t 0 "$builder" >/dev/null 2>&1 || true' EXIT
  podman exec "$builder" bash -c 'nohup containerd > /var/log/containerd-build.log 2>&1 &'
  deadline=$((SECONDS + 60))
  until podman exec "$builder" ctr version >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { podman exec "$builder" cat /var/log/containerd-build.log >&2; log "containerd did not start"; exit 1; }
    sleep 1
  done
  podman exec -i "$builder" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
    --all-platforms --no-unpack --digests - < "$archive" >&2
  imported="$(podman exec "$builder" ctr --namespace=k8s.io images list -q)"
  for image in "${PRELOAD[@]}"; do
    grep -qxF "$image" <<<"$imported" || { log "$image is missing from the node's containerd: $imported"; exit 1; }
  done
  # `sleep` is the container's init and reaps nothing: containerd has exited once it is a zombie.
  podman exec "$builder" bash -c 'pkill -x containerd
    while ps -o stat= -C containerd | grep -qv "^Z"; do sleep 0.2; done
    rm -f /var/log/containerd-build.log'
  podman commit --quiet \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
    "$builder" "$NODE_IMAGE" >&2
  podman rm -f -t 0 "$builder" >/dev/null
  trap - EXIT
  podman rmi "$base" >/dev/null
  rm -f "$archive"
fi

echo "export CONTAINERS_CONF=$CONTAINERS_CONF"
echo "export KIND_EXPERIMENTAL_PROVIDER=podman"
echo "export RDU_KIND_NODE_IMAGE=$NODE_IMAGE"
echo "export PATH=$KIND_BIN:$CP_BIN:\$PATH"
