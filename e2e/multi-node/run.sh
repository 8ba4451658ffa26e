#!/usr/bin/env bash
# One job across three real nodes and the faults of nodes under it (issue 21; DESIGN 7, rung 5): builds or
# reuses the control plane's, the nodes' and Kueue's binaries (e2e/control-plane/build.sh, e2e/node/build.sh,
# e2e/kueue/build.sh), builds the operator, device plugin, worker and the CLIs, and runs `cargo test -p rdu-e2e
# --test multi_node -- --ignored`: a testbed of three nodes (e2e/src/testbed.rs) with Kueue's manager, `helm
# install` of the chart, an 8-rank job spread over them, a queued job preempted by a higher priority and resumed,
# then a kubelet restart, a drain, a node crash, a partition and a capacity shortage under running jobs.
# The last stdout line is the run's JSON summary ({"bench":"multi_node",...}).
#
# Needs root and Debian's packages:  apt-get install containerd runc containernetworking-plugins umoci iptables
# RDU_E2E_KEEP=1 keeps the nodes' and control plane's files (logs) for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "multi-node/run.sh: $*" >&2; exit 1; }
[[ "$(id -u)" == 0 ]] || fail "needs root (namespaces, cgroups, containerd, the kubelet, iptables)"
missing=()
for tool in containerd ctr umoci iptables ip nsenter unshare kubectl openssl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
for file in /usr/sbin/runc /usr/lib/cni/bridge /usr/lib/cni/host-local; do [[ -x "$file" ]] || missing+=("$file"); done
((${#missing[@]} == 0)) || fail "missing ${missing[*]}: apt-get install containerd runc containernetworking-plugins umoci iptables iproute2 util-linux openssl (and kubectl)"

BIN="$(bash e2e/control-plane/build.sh | tail -n 1)"
NODE_BIN="$(bash e2e/node/build.sh | tail -n 1)"
KUEUE="$(bash e2e/kueue/build.sh | tail -n 1)"
export KUBEBUILDER_ASSETS="$BIN" RDU_E2E_HELM="$BIN/helm" RDU_E2E_NODE_BIN="$NODE_BIN" RDU_E2E_KUEUE="$KUEUE"

# The images carry the binaries cargo builds here (the dev profile optimises the worker and collective).
cargo build -p rdu-operator -p rdu-device-plugin -p rdu-worker -p kubectl-rdujob -p rdujob --bins >&2
TARGET="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
export RDU_E2E_IMAGE_BINARIES="$TARGET/debug"

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
export RDU_MULTI_NODE_BENCH_OUT="$OUT"
# Test output goes to stderr so that the summary is the last line on stdout.
cargo test -p rdu-e2e --test multi_node -- --ignored --nocapture --test-threads=1 >&2
[[ -s "$OUT" ]] || fail "the multi-node test wrote no summary"
cat "$OUT"
