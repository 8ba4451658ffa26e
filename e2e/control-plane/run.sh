#!/usr/bin/env bash
# Runs the real control-plane tests (DESIGN 7, rung 4): builds or reuses etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager and helm (e2e/control-plane/build.sh, cached outside the
# repository), builds the operator binary and kubectl-rdujob, and runs every e2e/tests/*.rs but the real-node
# ones (node, multi_node: their own scripts) with `-- --ignored`, the 4,096-rank bench (scale) last, with the
# release build of the operator (RDU_OPERATOR_RELEASE_BIN: one built already). The tests are #[ignore]d so that a plain
# `cargo test` lists them as ignored instead of passing them; run here, a missing binary fails them.
#   bash e2e/control-plane/run.sh            # the tests, then the benches
#   bash e2e/control-plane/run.sh tests      # the tests only (CI runs them beside the three-node test's last parts)
#   bash e2e/control-plane/run.sh benches    # the benches only (CI runs them once the machine is quiet)
# Exit 0 only if all pass.
set -euo pipefail
cd "$(dirname "$0")/../.."
PARTS="${1:-all}"
case "$PARTS" in
  all | tests | benches) ;;
  *) echo "run.sh: unknown part '$PARTS' (tests, benches, or none for both)" >&2; exit 2 ;;
esac

BIN="$(bash e2e/control-plane/build.sh | tail -n 1)"
export KUBEBUILDER_ASSETS="$BIN"
export RDU_E2E_HELM="$BIN/helm"
command -v kubectl >/dev/null || { echo "run.sh: kubectl is not on PATH (install kubectl >= 1.33)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "run.sh: openssl is not on PATH (apt-get install openssl)" >&2; exit 1; }
echo "run.sh: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
"$BIN/kube-apiserver" --version
"$BIN/helm" version --short

cargo build --workspace --bins
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
if [[ "$PARTS" != benches ]]; then
  # Every test file of e2e/tests but the real-node ones, so that a new control-plane test file is run here too.
  targets=()
  for file in e2e/tests/*.rs; do
    name="$(basename "$file" .rs)"
    case "$name" in
      node | multi_node | soak | kueue | scale) ;;
      *) targets+=(--test "$name") ;;
    esac
  done
  # Each test starts its own control plane; two at a time fit a 2-core machine.
  cargo test --workspace "${targets[@]}" --no-fail-fast -- --ignored --test-threads="${RDU_E2E_THREADS:-2}" --nocapture \
    2>&1 | tee "$LOG"
  # A stage whose tests were all filtered out or skipped must not pass: as many passed as are written, in each test
  # file and the module files beside it (e2e/tests/<name>/*.rs, which it includes with #[path]).
  written=0
  for ((i = 1; i < ${#targets[@]}; i += 2)); do
    modules=("e2e/tests/${targets[i]}.rs")
    if [[ -d "e2e/tests/${targets[i]}" ]]; then modules+=("e2e/tests/${targets[i]}"/*.rs); fi
    written=$((written + $(cat "${modules[@]}" | grep -c '^#\[ignore')))
  done
  passed="$(sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$LOG" | awk '{ s += $1 } END { print s + 0 }')"
  [[ "$passed" == "$written" ]] || { echo "run.sh: $passed control-plane tests passed, $written are written" >&2; exit 1; }
fi
[[ "$PARTS" != tests ]] || exit 0

# The benches of e2e/tests/scale.rs (4,096 ranks, issue 26; 256 pods beside direct creates, issue 38) time the
# operator users run, the release build: the debug build spends about twice the CPU per pod, and on 2 cores that
# the API server and etcd share, the operator's CPU is creation time. One at a time, each on a quiet machine.
# RDU_OPERATOR_RELEASE_BIN names one built already: CI passes the operator of the image it built from
# docker/Dockerfile, so the release profile is compiled once.
RELEASE_OPERATOR="${RDU_OPERATOR_RELEASE_BIN:-}"
if [[ -z "$RELEASE_OPERATOR" ]]; then
  cargo build --release -p rdu-operator --bin rdu-operator
  RELEASE_OPERATOR="$PWD/target/release/rdu-operator"
fi
[[ -x "$RELEASE_OPERATOR" ]] || { echo "run.sh: no release operator at $RELEASE_OPERATOR" >&2; exit 1; }
RDU_OPERATOR_BIN="$RELEASE_OPERATOR" cargo test --workspace --test scale -- --ignored --nocapture --test-threads=1 \
  2>&1 | tee "$LOG"
passed="$(sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$LOG" | awk '{ s += $1 } END { print s + 0 }')"
written="$(grep -c '^#\[ignore' e2e/tests/scale.rs)"
[[ "$passed" == "$written" ]] || { echo "run.sh: $passed scale tests passed, $written are written" >&2; exit 1; }
