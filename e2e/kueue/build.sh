#!/usr/bin/env bash
# Builds Kueue's manager from its Go module (sigs.k8s.io/kueue, no replace directives, so `go install` works) and
# copies the module's CRDs and its manager ClusterRole beside it, into the cache outside the repository:
#   ${RDU_E2E_CACHE:-$HOME/.cache/rdu-e2e}/kueue-<ver>/{bin/kueue,crds/*.yaml,rbac/*.yaml}
# A stamp makes a second run a no-op, and a lock makes a second caller wait for the first. Prints the Kueue
# directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
source e2e/lib.sh

KUEUE_VERSION="${RDU_E2E_KUEUE_VERSION:-v0.17.0}"
ROOT="$E2E_CACHE/kueue-${KUEUE_VERSION#v}"
# The stamp's suffix changes when the cache's layout does (2: rbac/ added).
STAMP="$ROOT/.stamp-${KUEUE_VERSION}-2"

log() { e2e_log kueue/build.sh "$@"; }

# One build at a time: CI starts this beside its stages while the three-node test may call it too; the second
# caller waits here and then finds the stamp.
mkdir -p "$E2E_CACHE"
exec 9>"$E2E_CACHE/.kueue-${KUEUE_VERSION#v}.lock"
flock 9
done_if_cached kueue/build.sh "$STAMP" "$ROOT"
need_go
mkdir -p "$ROOT/bin" "$ROOT/crds" "$ROOT/rbac"
log "building kueue ${KUEUE_VERSION} (a few minutes)"
GOBIN="$ROOT/bin" with_retries go install -ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}" \
  "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}"
MOD="$(go list -m -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" 2>/dev/null | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
if [[ -z "$MOD" || ! -d "$MOD" ]]; then
  MOD="$(go env GOMODCACHE)/sigs.k8s.io/kueue@${KUEUE_VERSION}"
fi
[[ -d "$MOD/config/components/crd/bases" ]] || { log "no CRDs in $MOD/config/components/crd/bases"; exit 1; }
cp "$MOD"/config/components/crd/bases/*.yaml "$ROOT/crds/"
# Kueue's own roles: the tests run its manager as its ServiceAccount with them and the chart's grant.
cp "$MOD"/config/components/rbac/{role,manager_secrets_role}.yaml "$ROOT/rbac/"
chmod -R u+w "$ROOT/crds" "$ROOT/rbac"
touch "$STAMP"
log "done: $ROOT"
echo "$ROOT"
