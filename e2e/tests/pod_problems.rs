//! Bad input gets an answer, not Pending forever: a rank whose image cannot be pulled and a rank no node fits
//! show up as the job's `PodsBlocked` condition (reason and message of the kubelet or scheduler) and one Warning
//! event, and the condition clears with the problem. The operator runs as the chart's ServiceAccount; there is
//! no kubelet or scheduler, the test reports what they would through the pods/status subresource.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use rdu_crds::RduJob;
use rdu_e2e::kit::{self, JobFixture, TIMEOUT, or_operator_log, wait_pods};
use rdu_e2e::{ControlPlane, poll_until};
use serde_json::{Value, json};

const JOBS: &str = "jobs";
const NOW: &str = "2026-01-01T00:00:00Z";
const NEVER_PULL: &str =
    "Container image \"rdu-worker:missing\" is not present with pull policy of Never";
const NO_NODE: &str = "0/1 nodes are available: 1 Insufficient rdu.dev/tile.";

fn job(name: &str) -> String {
    JobFixture::new(JOBS, name)
        .image("rdu-worker:missing")
        .set("imagePullPolicy", json!("Never"))
        .manifest()
}

async fn patch_status(pods: &Api<Pod>, name: &str, status: Value) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("status of {name}: {}", rdu_error_chain::Chain(&e)));
}

fn worker_status(ready: bool, state: Value) -> Value {
    json!([{"name": "worker", "ready": ready, "restartCount": 0, "image": "rdu-worker:missing",
            "imageID": "", "state": state}])
}

/// Waits until the job's PodsBlocked condition has `status` and `reason` and a message containing `message`.
async fn wait_condition(
    plane: &ControlPlane,
    jobs: &Api<RduJob>,
    job: &str,
    (status, reason, message): (&str, &str, &str),
) -> Value {
    let waited = poll_until(
        &format!("{job} PodsBlocked {status} {reason}"),
        TIMEOUT,
        || async {
            let j = jobs.get(job).await.map_err(|e| e.to_string())?;
            let s = serde_json::to_value(&j.status).unwrap_or(Value::Null);
            let found = s["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "PodsBlocked")
                .cloned();
            match found {
                Some(c)
                    if c["status"] == status
                        && c["reason"] == reason
                        && c["message"].as_str().is_some_and(|m| m.contains(message)) =>
                {
                    Ok(s)
                }
                _ => Err(s.to_string()),
            }
        },
    )
    .await;
    or_operator_log(plane, waited)
}

/// Waits for a Warning event on `job` with `reason` whose note contains `note`; returns how many there are.
async fn wait_warning(
    plane: &ControlPlane,
    events: &Api<Event>,
    job: &str,
    reason: &str,
    note: &str,
) -> usize {
    let waited = poll_until(&format!("Warning {reason} on {job}"), TIMEOUT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let matching: Vec<&Event> = list
            .items
            .iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(job)
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some(reason)
                    && e.note.as_deref().is_some_and(|n| n.contains(note))
            })
            .collect();
        if matching.is_empty() {
            let seen: Vec<_> = list
                .items
                .iter()
                .map(|e| (e.reason.clone(), e.note.clone()))
                .collect();
            Err(format!("events: {seen:?}"))
        } else {
            Ok(matching.len())
        }
    })
    .await;
    or_operator_log(plane, waited)
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn an_image_that_cannot_be_pulled_and_a_pod_no_node_fits_are_reported_on_the_job() {
    let (plane, _) = kit::plane("pod problems")
        .namespaces(&[JOBS])
        .start_operator()
        .await;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let events: Api<Event> = Api::namespaced(client.clone(), JOBS);

    // Rank 1's image is not on the node and the pull policy is Never.
    kit::apply(&plane, &job("pull")).expect("apply");
    wait_pods(&plane, &pods, "pull", 2, 0).await;
    let waiting = json!({"waiting": {"reason": "ErrImageNeverPull", "message": NEVER_PULL}});
    patch_status(
        &pods,
        "pull-worker-1",
        json!({"phase": "Pending", "containerStatuses": worker_status(false, waiting)}),
    )
    .await;
    let message = format!("rank 1, pod pull-worker-1, container worker: {NEVER_PULL}");
    let status = wait_condition(
        &plane,
        &jobs,
        "pull",
        ("True", "ErrImageNeverPull", &message),
    )
    .await;
    assert_eq!(status["phase"], "Pending", "the job waits: {status}");
    let count = wait_warning(&plane, &events, "pull", "ErrImageNeverPull", &message).await;
    assert_eq!(count, 1, "one Warning event");

    // Rank 0 of another job fits no node.
    kit::apply(&plane, &job("full")).expect("apply");
    wait_pods(&plane, &pods, "full", 2, 0).await;
    patch_status(
        &pods,
        "full-worker-0",
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
               "reason": "Unschedulable", "message": NO_NODE, "lastTransitionTime": NOW}]}),
    )
    .await;
    let message = format!("rank 0, pod full-worker-0: {NO_NODE}");
    wait_condition(&plane, &jobs, "full", ("True", "Unschedulable", &message)).await;
    wait_warning(&plane, &events, "full", "Unschedulable", &message).await;

    // The image appears: both ranks run, the condition clears.
    for name in ["pull-worker-0", "pull-worker-1"] {
        let running = json!({"running": {"startedAt": NOW}});
        patch_status(
            &pods,
            name,
            json!({"phase": "Running", "podIP": "10.1.0.1", "startTime": NOW,
                   "containerStatuses": worker_status(true, running)}),
        )
        .await;
    }
    let status = wait_condition(&plane, &jobs, "pull", ("False", "PodsUnblocked", "")).await;
    assert_eq!(status["phase"], "Running", "{status}");
}
