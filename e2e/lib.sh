# Shared by the e2e scripts (sourced, not run): versions, the cache of Go-built binaries, stamps, and the
# ldflags that stamp a Kubernetes binary's version as Kubernetes' own build does.
#   RDU_E2E_CACHE          where binaries are cached (default ~/.cache/rdu-e2e)
#   RDU_E2E_K8S_VERSION    Kubernetes (default v1.34.4); RDU_E2E_HELM_VERSION, RDU_E2E_COREDNS_VERSION,
#                          RDU_E2E_KIND_VERSION, RDU_E2E_CONTAINERD_VERSION

K8S_VERSION="${RDU_E2E_K8S_VERSION:-v1.34.4}"
# helm's and CoreDNS's release lines whose client libraries are Kubernetes' own minor (k8s.io/client-go v0.34;
# kubeadm v1.34 deploys CoreDNS v1.12): they build in the control plane's module graph (e2e/control-plane/build.sh).
HELM_VERSION="${RDU_E2E_HELM_VERSION:-v3.19.5}"
COREDNS_VERSION="${RDU_E2E_COREDNS_VERSION:-v1.12.4}"
# kind (its offline node image, e2e/kind/) and the containerd v2 inside that image.
KIND_VERSION="${RDU_E2E_KIND_VERSION:-v0.33.0}"
CONTAINERD_VERSION="${RDU_E2E_CONTAINERD_VERSION:-v2.4.2}"
LOCAL_PATH_VERSION="${RDU_E2E_LOCAL_PATH_VERSION:-v0.0.30}"
E2E_CACHE="${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}"
# The layout of the wrapper module's graph (2: helm, CoreDNS and local-path-provisioner share it), in the stamps
# of every build from it and in the node image's tag, so that a change rebuilds them all.
GO_GRAPH=2
# Everything built for one Kubernetes version lives below this directory.
K8S_ROOT="$E2E_CACHE/k8s-${K8S_VERSION#v}"
# The throw-away Go module that requires k8s.io/kubernetes (see e2e/control-plane/build.sh).
K8S_WRAPPER="$K8S_ROOT/wrapper"
export GOFLAGS="${GOFLAGS:-} -mod=mod -trimpath"

# e2e_log NAME MESSAGE...: a line on stderr prefixed with the script's name.
e2e_log() { local name="$1"; shift; printf '%s: %s\n' "$name" "$*" >&2; }

# k8s_ldflags: -ldflags for a Kubernetes binary, with its version stamped (unstamped it reports v0.0.0-master).
k8s_ldflags() {
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  printf '%s' "-s -w -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor} -X $pkg.gitTreeState=clean"
}

# cached STAMP: true when STAMP exists (the build it names is done).
cached() { [[ -f "$1" ]]; }

# done_if_cached NAME STAMP DIR: when STAMP exists, says so and prints DIR (a build script's last line), and ends
# the script that sourced this file.
done_if_cached() {
  if cached "$2"; then
    e2e_log "$1" "cached: $3"
    echo "$3"
    exit 0
  fi
}

# wrapper_module NAME: builds the control plane first (its wrapper module and module downloads, see
# e2e/control-plane/build.sh) and prints the wrapper module's directory.
wrapper_module() {
  bash e2e/control-plane/build.sh >&2
  [[ -f "$K8S_WRAPPER/go.mod" ]] || { e2e_log "$1" "no wrapper module in $K8S_WRAPPER"; exit 1; }
  echo "$K8S_WRAPPER"
}

# with_retries CMD...: runs CMD, and again after a pause when it fails, three times at most. For the Go commands
# that download modules: on a fresh machine the proxy now and then times out (`TLS handshake timeout` in the
# fresh-machine CI run of 2026-11-28 failed the whole run).
with_retries() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    e2e_log "${0##*/}" "attempt $attempt of 3 failed: $*"
    if ((attempt < 3)); then sleep $((attempt * 15)); fi
  done
  return 1
}

# go_module_dir MODULE@VERSION: downloads a module (no build) and prints the directory of its source.
go_module_dir() { with_retries go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# need_go: fails with a clear message when Go is missing, and sets the Go compiler's GC target for the builds that
# follow. GOGC=400 (the compiler's heap grows to 5x its live data before a collection, not 2x): building kubectl
# from an empty build cache took 239 core-seconds against 295 at the default 100 (2026-12-02, the 2-core EPYC;
# GOGC=off with a 2 GiB GOMEMLIMIT 249), the peak RSS 1.03 against 0.95 GB. Set for the build scripts only, which
# call this: the Kubernetes binaries the tests start keep Go's default.
need_go() {
  command -v go >/dev/null || { e2e_log "${0##*/}" "go is not on PATH; install Go >= 1.24"; exit 1; }
  export GOGC="${GOGC:-400}"
}
