#!/usr/bin/env bash
# The kind quick start (README), and CI's kind stage: creates a kind cluster (one control plane, two nodes with
# simulated RDUs), builds the three images from docker/Dockerfile and loads them, `helm install`s the chart, runs
# examples/digits.yaml to Succeeded and prints every rank's `kubectl logs` and `kubectl rdujob status|logs`, kills
# a node's container under a running checkpointed job and checks the job resumed from its checkpoint on the other
# node, then `helm uninstall`s and checks nothing of the release is left, and deletes the cluster.
#   bash e2e/kind/run.sh              # needs kind (>= 0.23), kubectl, helm, cargo, and docker or podman
#   bash e2e/kind/run.sh --dry-run    # prints the commands instead of running them
# Its last stdout line is a JSON summary ({"bench":"kind",...}).
# Env: RDU_KIND_CLUSTER (rdu-e2e), RDU_KIND_KEEP=1 keeps the cluster, RDU_KIND_TIMEOUT (s per wait, 600),
#   KIND_EXPERIMENTAL_PROVIDER=podman (picked by itself when docker does not answer), RDU_KIND_NODE_IMAGE (a kind
#   node image; kind's default otherwise), RDU_KIND_BUILD_ARGS (extra image build arguments, e.g. --pull=never),
#   RDU_KIND_NODE_IMAGE_SECONDS (what building the node image took, for the summary; CI's offline image).
set -euo pipefail
cd "$(dirname "$0")/../.."

DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 64 ;;
esac
CLUSTER="${RDU_KIND_CLUSTER:-rdu-e2e}"
TAG="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/rdu-operator/Chart.yaml)"
NAMESPACE=rdu-system
RELEASE=rdu
TIMEOUT="${RDU_KIND_TIMEOUT:-600}"
IMAGES=(operator device-plugin worker)
KILL_JOB=digits-node-kill
read -r -a BUILD_ARGS <<<"${RDU_KIND_BUILD_ARGS:-}"

log() { printf '[kind e2e] %s\n' "$*" >&2; }
run() {
  printf '+ %s\n' "$*" >&2
  if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Polls `check` (a command returning 0 when done) every 2 s until TIMEOUT seconds have passed.
wait_for() {
  local what="$1" deadline=$((SECONDS + TIMEOUT))
  shift
  printf '+ wait for %s (up to %ss)\n' "$what" "$TIMEOUT" >&2
  [[ $DRY_RUN == 1 ]] && return 0
  until "$@"; do
    if ((SECONDS >= deadline)); then log "timed out waiting for $what"; return 1; fi
    sleep 2
  done
}

# The container engine kind runs its nodes with: docker when it answers, else podman.
if [[ -n "${KIND_EXPERIMENTAL_PROVIDER:-}" ]]; then
  ENGINE="$KIND_EXPERIMENTAL_PROVIDER"
elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  ENGINE=docker
elif command -v podman >/dev/null; then
  ENGINE=podman
  export KIND_EXPERIMENTAL_PROVIDER=podman
else
  ENGINE=docker
fi
if [[ $DRY_RUN == 0 ]]; then
  for tool in "$ENGINE" kind kubectl helm cargo; do
    command -v "$tool" >/dev/null || { log "$tool is not on PATH; it is needed (or use --dry-run)"; exit 1; }
  done
  source e2e/kind/inotify.sh
fi
NODE_IMAGE_ARGS=()
if [[ -n "${RDU_KIND_NODE_IMAGE:-}" ]]; then NODE_IMAGE_ARGS=(--image "$RDU_KIND_NODE_IMAGE"); fi
# `kubectl rdujob` of this checkout (an installed one may be older than the chart it reads).
KUBECTL_RDUJOB=target/debug/kubectl-rdujob

job_field() { kubectl get rdujob "$1" -o jsonpath="{$2}" 2>/dev/null; }

diagnose() {
  log "diagnostics"
  kubectl get nodes -o wide >&2 || true
  kubectl get pods -A -o wide >&2 || true
  kubectl get rdujobs -o yaml >&2 || true
  kubectl get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 40 >&2 || true
  kubectl logs -n "$NAMESPACE" -l app.kubernetes.io/component=operator --tail=80 >&2 || true
  # A node agent that crash-loops (as once when `helm install --wait` timed out): its last run's log too.
  kubectl logs -n "$NAMESPACE" -l app.kubernetes.io/component=device-plugin --prefix --tail=40 >&2 || true
  kubectl logs -n "$NAMESPACE" -l app.kubernetes.io/component=device-plugin --prefix --previous --tail=40 >&2 || true
}

cleanup() {
  local status=$?
  if [[ $status != 0 && $DRY_RUN == 0 ]]; then diagnose; fi
  if [[ "${RDU_KIND_KEEP:-0}" == 1 ]]; then
    log "RDU_KIND_KEEP=1: cluster $CLUSTER kept (kind delete cluster --name $CLUSTER)"
  else
    run kind delete cluster --name "$CLUSTER" || true
  fi
  [[ -n "${ARCHIVE_DIR:-}" ]] && rm -rf "$ARCHIVE_DIR"
  exit "$status"
}
trap cleanup EXIT

# --- cluster and images --------------------------------------------------------------------------------------
# The cluster is this script's own: one left by a run that was killed outright is swept first.
if [[ $DRY_RUN == 0 ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "deleting cluster $CLUSTER, left by an earlier run"
  kind delete cluster --name "$CLUSTER"
fi
started=$(now)
run kind create cluster --name "$CLUSTER" --config e2e/kind/cluster.yaml "${NODE_IMAGE_ARGS[@]}" --wait 300s
CLUSTER_CREATE_SECONDS=$(since "$started")
NODES=null
if [[ $DRY_RUN == 0 ]]; then NODES="$(kubectl get nodes -o name | wc -l)"; fi

started=$(now)
run env CONTAINER_ENGINE="$ENGINE" bash docker/build.sh "${BUILD_ARGS[@]}"
IMAGES_BUILD_SECONDS=$(since "$started")
# Every binary of the workspace, as every e2e script builds them: cargo unifies features over the packages of one
# build, so building a subset (`-p kubectl-rdujob -p rdujob`) recompiles the dependencies they share with what
# `cargo test --workspace` built (159 s on 2 cores in CI, 2026-11-28).
run cargo build --quiet --workspace --bins

IMAGE_MIB=()
ARCHIVE_DIR="$(mktemp -d)"
for image in "${IMAGES[@]}"; do
  name="rdu-$image:$TAG"
  if [[ $ENGINE == docker ]]; then
    run kind load docker-image "$name" --name "$CLUSTER"
  else
    # podman names a local image localhost/NAME; the chart's pods ask for NAME, which the nodes' containerd reads
    # as docker.io/library/NAME: save it under that name.
    run podman tag "$name" "docker.io/library/$name"
    run podman save --quiet --format docker-archive -o "$ARCHIVE_DIR/$image.tar" "docker.io/library/$name"
    run kind load image-archive "$ARCHIVE_DIR/$image.tar" --name "$CLUSTER"
    rm -f "$ARCHIVE_DIR/$image.tar"
  fi
  if [[ $DRY_RUN == 0 ]]; then
    IMAGE_MIB+=("\"$image\":$("$ENGINE" image inspect --format '{{.Size}}' "$name" | awk '{ printf "%.1f", $1 / 1048576 }')")
  fi
done

# --- the chart -----------------------------------------------------------------------------------------------
started=$(now)
run helm install "$RELEASE" charts/rdu-operator --namespace "$NAMESPACE" --create-namespace \
  --values e2e/kind/values.yaml --wait --timeout 5m
tiles_on_both_nodes() {
  [[ "$(kubectl get nodes -l rdu.dev/simulated=true \
      -o jsonpath='{range .items[*]}{.status.allocatable.rdu\.dev/tile}{"\n"}{end}' | grep -c '^[1-9]')" == 2 ]]
}
wait_for "both RDU nodes to advertise rdu.dev/tile" tiles_on_both_nodes
HELM_TO_TILES_SECONDS=$(since "$started")
run kubectl get nodes -o custom-columns='NODE:.metadata.name,TILES:.status.allocatable.rdu\.dev/tile'

# --- the digits example, as the README runs it ---------------------------------------------------------------
phase=""
finished() {
  phase="$(job_field "$1" .status.phase)"
  [[ "$phase" == Succeeded || "$phase" == Failed ]]
}
started=$(now)
run kubectl apply -f examples/digits.yaml
wait_for "rdujob/digits to finish" finished digits
APPLY_TO_SUCCEEDED_SECONDS=$(since "$started")
ACCURACY=null
if [[ $DRY_RUN == 0 ]]; then
  [[ "$phase" == Succeeded ]] || { log "rdujob/digits ended $phase"; exit 1; }
  kubectl get rdujob digits -o wide
  for pod in $(kubectl get pods -l rdu.dev/job-name=digits -o name | sort -V); do
    echo "===== kubectl logs $pod"
    logs="$(kubectl logs "$pod")"
    echo "$logs"
    # Every rank ends its log with the seeds' throughput line.
    grep -q 'samples_per_sec' <<<"$logs" || { log "$pod's log has no samples_per_sec line"; exit 1; }
  done
  "$KUBECTL_RDUJOB" status digits
  "$KUBECTL_RDUJOB" logs digits | tail -n 8
  ACCURACY="$(job_field digits .status.result.testAccuracy)"
  awk -v a="$ACCURACY" 'BEGIN { exit !(a > 0.9) }' || { log "digits' test accuracy $ACCURACY is not above 0.9"; exit 1; }
fi

# --- a node's container killed under a running checkpointed job ----------------------------------------------
started_step() {
  local step
  step="$(job_field "$KILL_JOB" .status.progress.step)"
  [[ "$(job_field "$KILL_JOB" .status.phase)" == Running && "${step:-0}" -ge 60 ]]
}
run kubectl apply -f e2e/kind/digits-node-kill.yaml
wait_for "rdujob/$KILL_JOB to pass step 60 (three checkpoints)" started_step
NODE_KILL_TO_RESUMED_SECONDS=null
RESUMED_FROM_STEP=null
if [[ $DRY_RUN == 0 ]]; then
  rank0_node="$(kubectl get pod "$KILL_JOB-worker-0" -o jsonpath='{.spec.nodeName}')"
  rank1_node="$(kubectl get pod "$KILL_JOB-worker-1" -o jsonpath='{.spec.nodeName}')"
  [[ -n "$rank0_node" && -n "$rank1_node" && "$rank0_node" != "$rank1_node" ]] \
    || { log "the two ranks are not on two nodes: $rank0_node and $rank1_node"; exit 1; }
  restarts_before="$(job_field "$KILL_JOB" .status.restarts)"
  log "killing node $rank1_node (rank 1; rank 0 and its checkpoint claim are on $rank0_node)"
  killed=$(now)
  "$ENGINE" kill "$rank1_node" >/dev/null
  resumed() {
    local restarts
    restarts="$(job_field "$KILL_JOB" .status.restarts)"
    [[ "${restarts:-0}" -gt "$restarts_before" && "$(job_field "$KILL_JOB" .status.phase)" == Running \
      && "$(job_field "$KILL_JOB" .status.ready)" == 2/2 ]]
  }
  wait_for "rdujob/$KILL_JOB to run again on $rank0_node" resumed
  NODE_KILL_TO_RESUMED_SECONDS=$(since "$killed")
  # The node is gone for good: remove its Node, as a cloud's node controller would, so that the pods the kubelet
  # can no longer stop (the device plugin's among them) are collected.
  run kubectl delete node "$rank1_node"
  wait_for "rdujob/$KILL_JOB to finish" finished "$KILL_JOB"
  [[ "$phase" == Succeeded ]] || { log "rdujob/$KILL_JOB ended $phase"; exit 1; }
  kubectl get pods -l "rdu.dev/job-name=$KILL_JOB" -o wide
  "$KUBECTL_RDUJOB" status "$KILL_JOB"
  for rank in 0 1; do
    node="$(kubectl get pod "$KILL_JOB-worker-$rank" -o jsonpath='{.spec.nodeName}')"
    [[ "$node" == "$rank0_node" ]] || { log "rank $rank of the new generation runs on $node, not $rank0_node"; exit 1; }
  done
  rank0_log="$(kubectl logs "$KILL_JOB-worker-0")"
  RESUMED_FROM_STEP="$(grep 'resumed from checkpoint' <<<"$rank0_log" | grep -o '\bstep[=":]\+[0-9]\+' | head -n 1 | grep -o '[0-9]*$' || true)"
  [[ -n "$RESUMED_FROM_STEP" && "$RESUMED_FROM_STEP" -ge 60 ]] \
    || { log "the new generation did not resume from a checkpoint of step 60 or later:"; echo "$rank0_log" >&2; exit 1; }
  [[ "$(job_field "$KILL_JOB" .status.failureRestarts)" == 0 ]] \
    || { log "the node loss was counted against backoffLimit"; exit 1; }
fi

# --- helm uninstall leaves nothing of the release behind -----------------------------------------------------
run kubectl delete rdujobs --all --wait --timeout 120s
run helm uninstall "$RELEASE" --namespace "$NAMESPACE" --wait --timeout 5m
LEFTOVERS=null
if [[ $DRY_RUN == 0 ]]; then
  kinds="$(kubectl api-resources --verbs=list -o name | grep -v -x -e events -e events.events.k8s.io | paste -sd, -)"
  nothing_left() {
    left="$( {
      kubectl get "$kinds" -A -l "app.kubernetes.io/instance=$RELEASE" -o name 2>/dev/null
      kubectl get pods,services,secrets,networkpolicies,persistentvolumeclaims -A -l rdu.dev/job-name -o name 2>/dev/null
    } | sort -u)"
    LEFTOVERS="$(grep -c . <<<"$left" || true)"
    [[ "$LEFTOVERS" == 0 ]]
  }
  wait_for "no object of the release or its jobs to be left" nothing_left \
    || { log "left after helm uninstall:"; echo "$left" >&2; exit 1; }
fi

if [[ $DRY_RUN == 1 ]]; then log "dry run: nothing was executed"; exit 0; fi
log "rdujob/digits Succeeded, rdujob/$KILL_JOB resumed from step $RESUMED_FROM_STEP after its node was killed"
printf '{"bench":"kind","provider":"%s","nodes":%s,"node_image_seconds":%s,"images_build_seconds":%s,"image_mib":{%s},"cluster_create_seconds":%s,"helm_install_to_tiles_seconds":%s,"apply_to_succeeded_seconds":%s,"node_kill_to_resumed_seconds":%s,"resumed_from_step":%s,"accuracy":%s,"leftover_objects_after_uninstall":%s}\n' \
  "$ENGINE" "$NODES" "${RDU_KIND_NODE_IMAGE_SECONDS:-null}" "$IMAGES_BUILD_SECONDS" "$(IFS=,; echo "${IMAGE_MIB[*]}")" \
  "$CLUSTER_CREATE_SECONDS" "$HELM_TO_TILES_SECONDS" "$APPLY_TO_SUCCEEDED_SECONDS" "$NODE_KILL_TO_RESUMED_SECONDS" \
  "$RESUMED_FROM_STEP" "$ACCURACY" "$LEFTOVERS"
