#!/usr/bin/env bash
# Real pods on a real kubelet, without Docker or a registry (DESIGN 7, rung 5): builds or reuses the control
# plane (e2e/control-plane/build.sh) and the node's kubelet, kube-proxy, CoreDNS and pause
# (e2e/node/build.sh), builds the operator, device plugin and worker, and runs `cargo test -p rdu-e2e
# --test node --test failure_rules -- --ignored`: each test assembles the three images from docker/Dockerfile, starts a one-node
# testbed (e2e/src/testbed.rs: the node in namespaces of its own with containerd, the kubelet and kube-proxy;
# CoreDNS), `helm install`s the chart, runs examples/digits.yaml as pods, faults them, and removes everything it
# made (failure_rules: an OOM-killed rank under a FailJob rule, a hung gang, a deleted pod under RestartJobNotCounted).
# The last two stdout lines are the JSON summaries, node's then failure_rules'.
#
# Needs root and Debian's packages:  apt-get install containerd runc containernetworking-plugins umoci iptables
# RDU_E2E_KEEP=1 keeps the node's and control plane's files (logs) for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "node/run.sh: $*" >&2; exit 1; }
[[ "$(id -u)" == 0 ]] || fail "needs root (containerd, the kubelet, CNI and iptables)"
missing=()
for tool in containerd ctr umoci iptables ip nsenter unshare kubectl openssl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
for file in /usr/sbin/runc /usr/lib/cni/bridge /usr/lib/cni/host-local; do [[ -x "$file" ]] || missing+=("$file"); done
((${#missing[@]} == 0)) || fail "missing ${missing[*]}: apt-get install containerd runc containernetworking-plugins umoci iptables iproute2 openssl (and kubectl)"

BIN="$(bash e2e/control-plane/build.sh | tail -n 1)"
NODE_BIN="$(bash e2e/node/build.sh | tail -n 1)"
export KUBEBUILDER_ASSETS="$BIN" RDU_E2E_HELM="$BIN/helm" RDU_E2E_NODE_BIN="$NODE_BIN"

# The images carry the binaries cargo builds here (the dev profile optimises the worker and collective).
cargo build -p rdu-operator -p rdu-device-plugin -p rdu-worker -p kubectl-rdujob --bins >&2
TARGET="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
export RDU_E2E_IMAGE_BINARIES="$TARGET/debug"

OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
export RDU_NODE_BENCH_OUT="$OUT"
# Test output goes to stderr so that the summary is the last line on stdout.
cargo test -p rdu-e2e --test node --test failure_rules -- --ignored --nocapture --test-threads=1 >&2
[[ -s "$OUT" ]] || fail "the node test wrote no summary"
cat "$OUT"
