//! What a kubelet would report of a rank's pod, written through the pods/status subresource: the control-plane
//! tests run no kubelet.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::fixture::WORKER_IMAGE;

/// The time every reported state started (and ended).
pub const REPORTED_AT: &str = "2026-01-01T00:00:00Z";

/// Pod `name` Running and Ready, its worker container running.
pub async fn report_running(pods: &Api<Pod>, name: &str) {
    report(
        pods,
        name,
        "Running",
        json!({"running": {"startedAt": REPORTED_AT}}),
    )
    .await;
}

/// Pod `name` in `phase` (Failed, Succeeded), its worker container terminated with `exit_code` and, if given,
/// the termination `message` (rank 0 writes its result there).
pub async fn report_terminated(
    pods: &Api<Pod>,
    name: &str,
    phase: &str,
    exit_code: i32,
    message: Option<&str>,
) {
    let reason = if exit_code == 0 { "Completed" } else { "Error" };
    let mut terminated = json!({"exitCode": exit_code, "reason": reason,
                                "startedAt": REPORTED_AT, "finishedAt": REPORTED_AT});
    if let Some(message) = message {
        terminated["message"] = json!(message);
    }
    report(pods, name, phase, json!({ "terminated": terminated })).await;
}

/// Writes `phase`, the Ready condition and the worker container's `state` into pod `name`'s status.
async fn report(pods: &Api<Pod>, name: &str, phase: &str, state: Value) {
    let running = state.get("running").is_some();
    let ready = if running { "True" } else { "False" };
    let patch = json!({"status": {"phase": phase, "podIP": "10.1.0.1", "startTime": REPORTED_AT,
        "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": REPORTED_AT}],
        "containerStatuses": [{"name": "worker", "ready": running, "restartCount": 0,
                               "image": WORKER_IMAGE, "imageID": "", "state": state}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}
