#!/usr/bin/env bash
# Jobs through random faults (issue 35; DESIGN 7): a kind cluster of three RDU nodes with the chart (two operator
# replicas) and Kueue, three jobs kept running while faults drawn from a seed land on nodes, ranks and the control
# plane (rdu_e2e::soak, on a cluster of its own: e2e/tests/soak.rs). Runs `cargo test --workspace --test soak --
# --ignored`; the last stdout line is the run's JSON summary ({"bench":"soak",...}). CI's short soak (12 faults)
# runs at the end of e2e/multi-node/run.sh instead, on that stage's cluster; this script is for long soaks.
#   RDU_SOAK_FAULTS   how many faults (default 20; 200 or more for a long one)
#   RDU_SOAK_SEED     replays a run's faults (each run prints its seed)
#   RDU_SOAK_STEPS    steps of each job (default 100000; RDU_SOAK_CHECKPOINT_STEPS, 4000, between checkpoints)
# Needs what e2e/multi-node/run.sh needs (kind, kubectl, helm, docker or podman, Go for Kueue).
set -euo pipefail
cd "$(dirname "$0")/../.."
source e2e/kind/testbed.sh

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
export RDU_SOAK_BENCH_OUT="$OUT"
# Test output goes to stderr so that the summary is the last line on stdout.
cargo test --workspace --test soak -- --ignored --nocapture --test-threads=1 >&2
grep -q '"bench":"soak"' "$OUT" || testbed_fail "the soak wrote no summary: its test did not run to the end"
cat "$OUT"
