#!/usr/bin/env bash
# For users with Docker (DESIGN 7, rung 5): create a kind cluster, build and load the three images,
# helm install the chart, run examples/digits.yaml, wait for Succeeded, print every rank's log, and
# delete the cluster.
#   bash e2e/kind/run.sh              # needs docker, kind (>= 0.23: Kubernetes >= 1.30), kubectl, helm
#   bash e2e/kind/run.sh --dry-run    # prints the commands instead of running them (no Docker needed)
# Env: RDU_KIND_CLUSTER (default rdu-e2e), RDU_KIND_KEEP=1 keeps the cluster, RDU_KIND_TIMEOUT (s, 900).
set -euo pipefail
cd "$(dirname "$0")/../.."

DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 64 ;;
esac
CLUSTER="${RDU_KIND_CLUSTER:-rdu-e2e}"
TAG=0.1.0
NAMESPACE=rdu-system
JOB=digits
TIMEOUT="${RDU_KIND_TIMEOUT:-900}"
IMAGES=(operator device-plugin worker)
image_name() { case "$1" in worker) echo "rdu-worker:$TAG" ;; *) echo "rdu-$1:$TAG" ;; esac; }

run() {
  printf '+ %s\n' "$*" >&2
  if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}

# Polls `check` (a function returning 0 when done) every 2 s until TIMEOUT seconds have passed.
wait_for() {
  local what="$1" check="$2" deadline=$((SECONDS + TIMEOUT))
  printf '+ wait for %s (up to %ss)\n' "$what" "$TIMEOUT" >&2
  [[ $DRY_RUN == 1 ]] && return 0
  until "$check"; do
    if ((SECONDS >= deadline)); then echo "timed out waiting for $what" >&2; return 1; fi
    sleep 2
  done
}

if [[ $DRY_RUN == 0 ]]; then
  for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null || { echo "$tool is not on PATH; it is needed (or use --dry-run)" >&2; exit 1; }
  done
fi

cleanup() {
  if [[ "${RDU_KIND_KEEP:-0}" == 1 ]]; then
    echo "RDU_KIND_KEEP=1: cluster $CLUSTER kept (kind delete cluster --name $CLUSTER)" >&2
  else
    run kind delete cluster --name "$CLUSTER"
  fi
}

run kind create cluster --name "$CLUSTER" --config e2e/kind/cluster.yaml --wait 120s
trap cleanup EXIT
for image in "${IMAGES[@]}"; do
  run docker build -f "docker/$image.Dockerfile" -t "$(image_name "$image")" .
  run kind load docker-image "$(image_name "$image")" --name "$CLUSTER"
done
run helm install rdu charts/rdu-operator --namespace "$NAMESPACE" --create-namespace \
  --values e2e/kind/values.yaml --wait --timeout 5m

tiles_advertised() {
  [[ "$(kubectl get nodes -l rdu.dev/simulated=true \
      -o jsonpath='{range .items[*]}{.status.allocatable.rdu\.dev/tile}{"\n"}{end}' | grep -c '^[1-9]')" == 2 ]]
}
wait_for "both nodes to advertise rdu.dev/tile" tiles_advertised

run kubectl apply -f examples/digits.yaml
phase=""
job_finished() {
  phase="$(kubectl get rdujob "$JOB" -o jsonpath='{.status.phase}')"
  [[ "$phase" == Succeeded || "$phase" == Failed ]]
}
wait_for "rdujob/$JOB to finish" job_finished
run kubectl get rdujob "$JOB" -o wide

if [[ $DRY_RUN == 0 ]]; then
  for pod in $(kubectl get pods -l "rdu.dev/job-name=$JOB" -o name | sort -V); do
    echo "===== $pod"
    kubectl logs "$pod" || true
  done
  kubectl get rdujob "$JOB" -o jsonpath='{.status.result}'; echo
  # The tiles each rank got, as the device plugin published them on its pod.
  kubectl get pods -l "rdu.dev/job-name=$JOB" \
    -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,TILES:.metadata.annotations.rdu\.dev/tiles'
  [[ "$phase" == Succeeded ]] || { echo "rdujob/$JOB ended $phase" >&2; exit 1; }
else
  echo "+ kubectl logs <every pod labelled rdu.dev/job-name=$JOB>" >&2
fi
if [[ $DRY_RUN == 1 ]]; then echo "dry run: nothing was executed" >&2; else echo "kind e2e: rdujob/$JOB Succeeded" >&2; fi
