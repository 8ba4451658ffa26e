#!/usr/bin/env bash
# Builds what a kind node needs beside the control plane (e2e/kind/offline/prepare.sh puts them in the offline
# node image and its component images), into a cache outside the repository:
#   ${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}/k8s-<ver>/node-bin/{kubelet,kube-proxy,coredns,pause}
# kubelet and kube-proxy come from the same throw-away wrapper module as the control plane
# (e2e/control-plane/build.sh, run first), at the same version; CoreDNS from e2e/node/coredns/main.go (only
# the plugins of kubeadm's Corefile) as a package of that wrapper module, whose graph holds CoreDNS's module and
# shares Kubernetes' client libraries with it; pause from Kubernetes' own pause.c,
# which the k8s.io/kubernetes module carries (build/pause/linux), compiled static. A stamp makes a second run
# a no-op.
# Prints the node bin directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
source e2e/lib.sh

BIN="$K8S_ROOT/node-bin"
# The stamp names every input, so a new version rebuilds.
STAMP="$BIN/.stamp-${K8S_VERSION}-graph-${GO_GRAPH}-coredns-${COREDNS_VERSION}-$(sha1sum e2e/node/coredns/main.go | cut -c1-10)"

log() { e2e_log node/build.sh "$@"; }

done_if_cached node/build.sh "$STAMP" "$BIN"
need_go
WRAP="$(wrapper_module node/build.sh)"
mkdir -p "$BIN"

log "building kubelet and kube-proxy (${K8S_VERSION})"
(cd "$WRAP" && with_retries go build -ldflags="$(k8s_ldflags)" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
"$BIN/kubelet" --version >&2

log "building coredns ${COREDNS_VERSION} with the plugins kubeadm's Corefile uses"
# A package of the wrapper module, whose graph requires CoreDNS's module (e2e/control-plane/build.sh).
mkdir -p "$WRAP/coredns"
cp e2e/node/coredns/main.go "$WRAP/coredns/"
(cd "$WRAP" && with_retries go build -ldflags="-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}" \
  -o "$BIN/coredns" ./coredns)
"$BIN/coredns" -version >&2
"$BIN/coredns" -plugins >&2

log "building pause from k8s.io/kubernetes@${K8S_VERSION}/build/pause/linux/pause.c"
KDIR="$(cd "$WRAP" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
command -v cc >/dev/null || { log "a C compiler (cc) is needed for pause"; exit 1; }
cc -Os -static -Wall -DVERSION="${K8S_VERSION}-rdu-e2e" -o "$BIN/pause" "$KDIR/build/pause/linux/pause.c"
"$BIN/pause" -v >&2

touch "$STAMP"
log "done: $BIN"
echo "$BIN"
