#!/usr/bin/env bash
# One job across three real nodes and the faults of nodes under it (issue 21; DESIGN 7, rung 5): builds the three
# images from docker/Dockerfile, and runs the ignored tests of e2e's test binary `multi_node` (as `cargo test
# --workspace --test multi_node -- --ignored`): a kind cluster with three RDU nodes (e2e/src/testbed.rs), Kueue's
# manager on the host (built or found cached by e2e/kueue/build.sh once the cluster is up, unless RDU_E2E_KUEUE
# names its directory) against its API server, `helm install` of the chart,
# an 8-rank job spread over the nodes, a queued job preempted by a higher priority and resumed, then a kubelet
# restart, a drain, a node crash, a partition and a capacity shortage under running jobs (before them, four ranks on
# two nodes through the DRA plugin: over each node's shared-memory domain, over TCP only, and a raw TCP stream
# between pods), then the control plane's own faults (the API server down 30 s, etcd restarted, the operator's
# leader killed, helm upgrade), and last, on the same cluster, a short soak of random faults under three jobs
# (rdu_e2e::soak; RDU_SOAK_FAULTS, default 12, one of every kind; 0 skips it; RDU_SOAK_SEED replays a run). The last
# stdout lines are the run's JSON summaries ({"bench":"multi_node",...}, {"bench":"dra","stage":"three_nodes",...},
# then {"bench":"soak",...}).
#
# Needs kind, kubectl, helm, and docker or podman (as e2e/kind/run.sh; see e2e/kind/testbed.sh for the env), and
# Go for Kueue. RDU_E2E_KEEP=1 keeps the cluster for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
source e2e/kind/testbed.sh

OUT="$(mktemp)" SOAK_OUT="$(mktemp)"
trap 'rm -f "$OUT" "$SOAK_OUT"' EXIT
export RDU_MULTI_NODE_BENCH_OUT="$OUT" RDU_SOAK_BENCH_OUT="$SOAK_OUT"
# Test output goes to stderr so that the summaries are the last lines on stdout.
testbed_run_ignored multi_node
grep -q '"bench":"multi_node"' "$OUT" || testbed_fail "the multi-node test wrote no summary"
grep -q '"bench":"dra"' "$OUT" || testbed_fail "the multi-node test wrote no two-node DRA summary"
cat "$OUT"
if [[ "${RDU_SOAK_FAULTS:-}" != 0 ]]; then
  grep -q '"bench":"soak"' "$SOAK_OUT" || testbed_fail "the soak after the multi-node stages wrote no summary"
  cat "$SOAK_OUT"
fi
