//! What a kubelet would do for a rank's pod, which the control-plane tests run without: report its state through
//! the pods/status subresource, and mint its pod-bound ServiceAccount token.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::fixture::WORKER_IMAGE;
use super::wait::TIMEOUT;
use crate::poll::poll_until;

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
        .unwrap_or_else(|e| panic!("status of {name}: {}", rdu_error_chain::Chain(&e)));
}

/// A token of `pod`'s ServiceAccount for `audience`, bound to the pod (its name and UID) by the TokenRequest API,
/// valid for 10 minutes, as the kubelet mints it for a projected volume. Retried until the API server issues it.
pub async fn pod_token(client: &kube::Client, pod: &Pod, audience: &str) -> String {
    let namespace = pod.metadata.namespace.clone().expect("a pod's namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(600),
        },
        ..Default::default()
    };
    let answer = poll_until("a pod-bound token", TIMEOUT, || async {
        accounts
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("TokenRequest: {}", rdu_error_chain::Chain(&e)));
    answer.status.expect("token status").token
}
