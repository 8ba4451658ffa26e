#!/usr/bin/env bash
# Runs the real control-plane tests (DESIGN 7, rung 4): builds or reuses etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager and helm (e2e/control-plane/build.sh, cached outside the
# repository), builds the operator binary, and runs `cargo test -p rdu-e2e`. Exit 0 only if all pass.
# CI calls it with RDU_REQUIRE_CONTROL_PLANE=1 so that nothing can skip.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN="$(bash e2e/control-plane/build.sh | tail -n 1)"
export KUBEBUILDER_ASSETS="$BIN"
export RDU_E2E_HELM="$BIN/helm"
export RDU_REQUIRE_CONTROL_PLANE="${RDU_REQUIRE_CONTROL_PLANE:-1}"
command -v kubectl >/dev/null || { echo "run.sh: kubectl is not on PATH (install kubectl >= 1.33)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "run.sh: openssl is not on PATH (apt-get install openssl)" >&2; exit 1; }
echo "run.sh: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
"$BIN/kube-apiserver" --version
"$BIN/helm" version --short

cargo build -p rdu-operator -p kubectl-rdujob
# Each test starts its own control plane; two at a time fit a 2-core machine.
cargo test -p rdu-e2e --no-fail-fast -- --test-threads="${RDU_E2E_THREADS:-2}" --nocapture
