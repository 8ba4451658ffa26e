#!/usr/bin/env bash
# Builds the control-plane binaries the e2e tests need (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager) and helm from their Go modules, into a cache outside the repository:
#   ${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}/k8s-<ver>/bin
# A stamp file makes a second run a no-op. Prints the bin directory on its last line.
#
# k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces the staging modules with local
# paths), so a throwaway wrapper module requires it and pins every k8s.io/* staging module to
# v0.<minor>.<patch>. etcd is built from the same module graph (k8s.io/kubernetes already requires
# go.etcd.io/etcd/server/v3 at the version the apiserver is tested with), in the same `go build`,
# so shared packages compile once.
#
# The Go tools built against Kubernetes' client libraries share that graph too (one Go module graph, DESIGN 7):
# helm and CoreDNS (releases whose client libraries are this Kubernetes minor's) and local-path-provisioner, built
# here, in e2e/node/build.sh and in e2e/kind/build.sh. Go's build cache is keyed by a package's inputs, so k8s.io/api,
# apimachinery and client-go (24 of local-path-provisioner's 29 MB of Go source, 25 of CoreDNS's 34, 29 of helm's 42)
# compile once for all of them instead of once per tool at its own versions.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

BIN="$K8S_ROOT/bin"
STAMP="$BIN/.stamp-${K8S_VERSION}-helm-${HELM_VERSION}-local-path-${LOCAL_PATH_VERSION}"
STAMP+="-coredns-${COREDNS_VERSION}-graph-${GO_GRAPH}"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

log() { e2e_log build.sh "$@"; }

if cached "$STAMP"; then
  log "cached: $BIN"
  echo "$BIN"
  exit 0
fi

need_go
mkdir -p "$BIN"
LDFLAGS="-s -w"

# --- kube-apiserver, kube-scheduler, kube-controller-manager and etcd -------------------------
WRAP="$K8S_WRAPPER"
mkdir -p "$WRAP"
cd "$WRAP"
MODFILE_URL_GO="k8s.io/kubernetes@${K8S_VERSION}"
log "resolving $MODFILE_URL_GO"
cat > go.mod <<MOD
module rdu-e2e/k8s-wrapper

go 1.24.0

require k8s.io/kubernetes ${K8S_VERSION}
MOD
rm -f go.sum
with_retries go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" > kubernetes.json
KMOD="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' kubernetes.json)"
[[ -f "$KMOD" ]] || { log "could not download k8s.io/kubernetes ${K8S_VERSION}"; exit 1; }
# Every `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.M.P`.
STAGING="$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$KMOD")"
[[ -n "$STAGING" ]] || { log "no staging replaces found in $KMOD"; exit 1; }
{
  echo
  echo "replace ("
  for m in $STAGING; do echo "	$m => $m ${STAGING_VERSION}"; done
  echo ")"
} >> go.mod
# The tools that share the graph, and the pins that keep Kubernetes' own build: every module whose packages the
# Kubernetes binaries compile stays at Kubernetes' version when a tool's go.mod asks for a newer one (a replace), but
# for those in KEEP_RAISED, which a tool's code needs newer: helm's root command calls pflag's ParseErrorsAllowlist
# (pflag >= 1.0.8). The tools then compile against the same packages, and those compile once.
KEEP_RAISED="github.com/spf13/pflag"
KUBE_CMDS=(k8s.io/kubernetes/cmd/{kube-apiserver,kube-scheduler,kube-controller-manager}
  k8s.io/kubernetes/cmd/{kubelet,kube-proxy,kubeadm,kubectl} go.etcd.io/etcd/server/v3)
build_list() { go list -m all | awk 'NR > 1 { print $1, $2 }' | LC_ALL=C sort; }
with_retries build_list > build-list.kubernetes
with_retries go list -deps -f '{{with .Module}}{{.Path}}{{end}}' "${KUBE_CMDS[@]}" \
  | LC_ALL=C sort -u > modules.kubernetes
# CoreDNS by its server package: e2e/node/build.sh builds a main of its own that imports the plugins it uses, and
# CoreDNS's own main would fetch every plugin's modules (cloud SDKs among them).
TOOLS=("helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" "github.com/rancher/local-path-provisioner@${LOCAL_PATH_VERSION}"
  "github.com/coredns/coredns/coremain@${COREDNS_VERSION}")
with_retries go get "${TOOLS[@]}"
with_retries build_list > build-list.tools
LC_ALL=C join build-list.kubernetes build-list.tools | LC_ALL=C join - modules.kubernetes |
  while read -r mod own raised; do
    [[ "$own" == "$raised" || "$mod" == k8s.io/* || " $KEEP_RAISED " == *" $mod "* ]] && continue
    go mod edit -replace="$mod=$mod@$own"
  done
# go.sum entries for the tools' packages at the pinned versions (a build does not add those of replaced modules; the
# pins are Kubernetes' versions, whose entries the package list above added).
with_retries go get "${TOOLS[@]}"
log "building kube-apiserver, kube-scheduler, kube-controller-manager, etcd (${K8S_VERSION}); this takes a while"
# The version the binaries report (kubectl version, /version) is stamped at link time.
with_retries go build -ldflags="$(k8s_ldflags)" -o "$BIN/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  go.etcd.io/etcd/server/v3
# `go build -o dir` names go.etcd.io/etcd/server/v3 after its last non-version element.
if [[ -f "$BIN/server" ]]; then mv -f "$BIN/server" "$BIN/etcd"; fi
"$BIN/etcd" --version >&2
"$BIN/kube-apiserver" --version >&2

# --- helm ---------------------------------------------------------------------------------------
log "building helm ${HELM_VERSION}"
# As helm's Makefile does: stamp its version and the Kubernetes version its client libraries speak
# (the default .Capabilities.KubeVersion of `helm template`; unstamped it is v1.20).
HELM_K8S_MINOR="$(with_retries go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" \
  | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' | xargs sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p')"
[[ -n "$HELM_K8S_MINOR" ]] || { log "cannot read helm's k8s.io/client-go version"; exit 1; }
HELM_LDFLAGS="$LDFLAGS -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  HELM_LDFLAGS="$HELM_LDFLAGS -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${HELM_K8S_MINOR}"
done
with_retries go build -ldflags="$HELM_LDFLAGS" -o "$BIN/" helm.sh/helm/v3/cmd/helm
"$BIN/helm" version --short >&2

touch "$STAMP"
log "done: $BIN"
echo "$BIN"
