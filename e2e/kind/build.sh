#!/usr/bin/env bash
# Builds what an offline kind node image needs beyond the real-node binaries, into the cache outside the
# repository (CI only; a user with a registry pulls kind's own node image instead):
#   ${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}/k8s-<ver>/kind-bin/{kind,kubeadm,kubectl,containerd,containerd-shim-runc-v2,ctr,
#                                                             local-path-provisioner}
# kubeadm and kubectl come from the control plane's wrapper module (e2e/control-plane/build.sh, run first), at
# the same version, so the kubelet, kubeadm and the component images agree, and so does Rancher's
# local-path-provisioner (the storage kind's own node images ship): it shares the wrapper's module graph and with it
# the compiled client libraries; kind and containerd v2 (which use little of them) from their own Go modules (no
# replace directives, so `go install` works). A stamp makes a second run a no-op. Prints the
# directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
source e2e/lib.sh

BIN="$K8S_ROOT/kind-bin"
STAMP="$BIN/.stamp-${K8S_VERSION}-graph-${GO_GRAPH}-kind-${KIND_VERSION}-containerd-${CONTAINERD_VERSION}-local-path-${LOCAL_PATH_VERSION}"

log() { e2e_log kind/build.sh "$@"; }

done_if_cached kind/build.sh "$STAMP" "$BIN"
need_go
WRAP="$(wrapper_module kind/build.sh)"
mkdir -p "$BIN"

log "building kubeadm and kubectl (${K8S_VERSION})"
(cd "$WRAP" && with_retries go build -ldflags="$(k8s_ldflags)" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kubectl)
"$BIN/kubeadm" version -o short >&2

log "building kind ${KIND_VERSION}"
GOBIN="$BIN" with_retries go install -ldflags="-s -w" "sigs.k8s.io/kind@${KIND_VERSION}"
"$BIN/kind" version >&2

log "building containerd ${CONTAINERD_VERSION} (containerd, its runc shim, ctr)"
# As containerd's Makefile: the optional snapshotters kind never selects are left out, the version stamped.
CTR_PKG=github.com/containerd/containerd/v2
GOBIN="$BIN" with_retries go install -tags "no_aufs no_zfs no_btrfs no_devmapper" \
  -ldflags="-s -w -X $CTR_PKG/version.Version=${CONTAINERD_VERSION} -X $CTR_PKG/version.Package=$CTR_PKG" \
  "$CTR_PKG/cmd/containerd@${CONTAINERD_VERSION}" \
  "$CTR_PKG/cmd/containerd-shim-runc-v2@${CONTAINERD_VERSION}" \
  "$CTR_PKG/cmd/ctr@${CONTAINERD_VERSION}"
"$BIN/containerd" --version >&2

log "building local-path-provisioner ${LOCAL_PATH_VERSION}"
# Its own `go build`: it imports logrus as github.com/Sirupsen/logrus, which may not share a build with the
# lower-case path that helm and Kubernetes import (Go refuses import paths that differ only in case).
(cd "$WRAP" && with_retries go build -ldflags="-s -w -X main.VERSION=${LOCAL_PATH_VERSION}" -o "$BIN/" \
  github.com/rancher/local-path-provisioner)

touch "$STAMP"
log "done: $BIN"
echo "$BIN"
