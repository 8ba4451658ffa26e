#!/usr/bin/env bash
# RduJobs queued in Kueue on the real control plane (issue 25): builds (or finds cached) the control plane's and
# Kueue's binaries, builds the operator, runs e2e/tests/kueue.rs and prints its JSON summary as the last line.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "kueue/run.sh: $*" >&2; exit 1; }
for tool in kubectl openssl unshare mount; do command -v "$tool" >/dev/null || fail "$tool is not on PATH"; done
[[ "$(id -u)" == 0 ]] || fail "needs root (Kueue's manager runs in a mount namespace of its own)"

BIN="$(bash e2e/control-plane/build.sh | tail -n 1)"
KUEUE="$(bash e2e/kueue/build.sh | tail -n 1)"
export KUBEBUILDER_ASSETS="$BIN" RDU_E2E_HELM="$BIN/helm" RDU_E2E_KUEUE="$KUEUE"

cargo build --workspace --bins >&2
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
export RDU_KUEUE_BENCH_OUT="$OUT"
cargo test --workspace --test kueue -- --ignored --nocapture --test-threads=1 >&2
[[ -s "$OUT" ]] || fail "the Kueue test wrote no summary"
cat "$OUT"
