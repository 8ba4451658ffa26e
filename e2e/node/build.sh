#!/usr/bin/env bash
# Builds what a real test node needs beside the control plane, into a cache outside the repository:
#   ${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}/k8s-<ver>/node-bin/{kubelet,kube-proxy,coredns,pause,cri-teardown}
# kubelet and kube-proxy come from the same throw-away wrapper module as the control plane
# (e2e/control-plane/build.sh, run first), at the same version; CoreDNS from its own Go module (its
# go.mod has no replace directives, so `go install` works); pause from Kubernetes' own pause.c, which the
# k8s.io/kubernetes module carries (build/pause/linux), compiled static. A stamp makes a second run a no-op.
# Prints the node bin directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."

K8S_VERSION="${RDU_E2E_K8S_VERSION:-v1.34.4}"
COREDNS_VERSION="${RDU_E2E_COREDNS_VERSION:-v1.14.7}"
CACHE="${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}"
ROOT="$CACHE/k8s-${K8S_VERSION#v}"
BIN="$ROOT/node-bin"
# The stamp names every input, so a new version or a changed cri-teardown rebuilds.
TEARDOWN_SUM="$(sha256sum e2e/node/cri-teardown/main.go | cut -c1-12)"
STAMP="$BIN/.stamp-${K8S_VERSION}-coredns-${COREDNS_VERSION}-teardown-${TEARDOWN_SUM}"

log() { printf 'node/build.sh: %s\n' "$*" >&2; }

if [[ -f "$STAMP" ]]; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

# The control plane's wrapper module (and its module downloads) first.
bash e2e/control-plane/build.sh >&2
WRAP="$ROOT/wrapper"
[[ -f "$WRAP/go.mod" ]] || { log "no wrapper module in $WRAP"; exit 1; }
mkdir -p "$BIN"
export GOFLAGS="${GOFLAGS:-} -mod=mod -trimpath"
MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
VERSION_PKG=k8s.io/component-base/version
K8S_LDFLAGS="-s -w -X $VERSION_PKG.gitVersion=${K8S_VERSION} -X $VERSION_PKG.gitMajor=1 -X $VERSION_PKG.gitMinor=${MINOR} -X $VERSION_PKG.gitTreeState=clean"

log "building kubelet and kube-proxy (${K8S_VERSION})"
(cd "$WRAP" && go build -ldflags="$K8S_LDFLAGS" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
"$BIN/kubelet" --version >&2

log "building cri-teardown (e2e/node/cri-teardown: stops and removes a runtime's pod sandboxes)"
mkdir -p "$WRAP/cmd/cri-teardown"
cp e2e/node/cri-teardown/main.go "$WRAP/cmd/cri-teardown/main.go"
(cd "$WRAP" && go build -ldflags="-s -w" -o "$BIN/cri-teardown" ./cmd/cri-teardown)

log "building coredns ${COREDNS_VERSION}"
GOBIN="$BIN" go install -ldflags="-s -w" "github.com/coredns/coredns@${COREDNS_VERSION}"
"$BIN/coredns" -version >&2

log "building pause from k8s.io/kubernetes@${K8S_VERSION}/build/pause/linux/pause.c"
KDIR="$(cd "$WRAP" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
command -v cc >/dev/null || { log "a C compiler (cc) is needed for pause"; exit 1; }
cc -Os -static -Wall -DVERSION="${K8S_VERSION}-rdu-e2e" -o "$BIN/pause" "$KDIR/build/pause/linux/pause.c"
"$BIN/pause" -v >&2

touch "$STAMP"
log "done: $BIN"
echo "$BIN"
