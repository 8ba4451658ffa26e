#!/usr/bin/env bash
# Real pods on a real kubelet (DESIGN 7, rung 5): builds the three images from docker/Dockerfile and runs the
# ignored tests of e2e's test binary `node` (as `cargo test --workspace --test node -- --ignored`): it creates a
# kind cluster with one RDU node (e2e/src/testbed.rs), loads the images, `helm install`s the chart, runs
# examples/digits.yaml as pods, faults them, then the failure rules on the same node (an OOM-killed rank under a
# FailJob rule, a hung gang, a deleted pod under RestartJobNotCounted), then Dynamic Resource Allocation (`helm
# upgrade` to the DRA plugin: slices, claims and their tiles, packing, plugin and kubelet restarts), and deletes the
# cluster. The last three stdout lines are the JSON summaries: node's, the failure rules' and DRA's.
#
# Needs kind, kubectl, helm, and docker or podman (as e2e/kind/run.sh; see e2e/kind/testbed.sh for the env).
# RDU_E2E_KEEP=1 keeps the cluster for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
source e2e/kind/testbed.sh

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
export RDU_NODE_BENCH_OUT="$OUT"
# Test output goes to stderr so that the summaries are the last lines on stdout.
testbed_run_ignored node
# The test writes three summaries, DRA's last: all must be there (the test ran to its end).
for bench in node_digits node_failure_rules dra; do
  grep -q "\"bench\":\"$bench\"" "$OUT" || testbed_fail "no {\"bench\":\"$bench\"} summary: its test did not run to the end"
done
cat "$OUT"
