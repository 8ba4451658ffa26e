//! Waiting for what the operator does, with a deadline; when it does not happen, the panic carries the operator's
//! log.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use rdu_crds::RduJob;
use serde_json::Value;

use crate::control_plane::ControlPlane;
use crate::poll::{PollError, poll_until};

/// How long the operator may take for one thing the tests wait for.
pub const TIMEOUT: Duration = Duration::from_secs(90);
/// How many of the operator's last log lines a failure shows.
const LOG_LINES: usize = 40;

/// The last lines of the operator's log (`rdu-operator` beside the control plane).
pub fn operator_log(plane: &ControlPlane) -> String {
    plane.log_tail("rdu-operator", LOG_LINES)
}

/// The value of a wait, or a panic with the wait's error and the operator's log.
pub fn or_operator_log<T>(plane: &ControlPlane, waited: Result<T, PollError>) -> T {
    waited.unwrap_or_else(|e| {
        panic!(
            "{}\noperator log:\n{}",
            rdu_error_chain::Chain(&e),
            operator_log(plane)
        )
    })
}

/// The job's status as JSON (null when it has none).
pub async fn job_status(jobs: &Api<RduJob>, name: &str) -> Result<Value, String> {
    let job = jobs.get(name).await.map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(&job.status).unwrap_or(Value::Null))
}

/// The job's status once `ready` holds for it (`what` names the wait).
pub async fn wait_status(
    plane: &ControlPlane,
    jobs: &Api<RduJob>,
    name: &str,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let waited = poll_until(&format!("{name}: {what}"), TIMEOUT, || async {
        let status = job_status(jobs, name).await?;
        if ready(&status) {
            Ok(status)
        } else {
            Err(status.to_string())
        }
    })
    .await;
    or_operator_log(plane, waited)
}

/// The job's status once its phase is `phase`.
pub async fn wait_phase(
    plane: &ControlPlane,
    jobs: &Api<RduJob>,
    name: &str,
    phase: &str,
) -> Value {
    wait_status(plane, jobs, name, &format!("phase {phase}"), |s| {
        s["phase"] == phase
    })
    .await
}

/// The live (not terminating) pods of `job` at `generation`, sorted by name, once there are `workers` of them.
pub async fn wait_pods(
    plane: &ControlPlane,
    pods: &Api<Pod>,
    job: &str,
    workers: usize,
    generation: u32,
) -> Vec<Pod> {
    let selector = format!("rdu.dev/job-name={job},rdu.dev/generation={generation}");
    let waited = poll_until(
        &format!("{workers} pods of {job} generation {generation}"),
        TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            let mut live: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            live.sort_by_key(|p| p.metadata.name.clone());
            if live.len() == workers {
                Ok(live)
            } else {
                Err(format!("{} pods: {:?}", live.len(), names(&live)))
            }
        },
    )
    .await;
    or_operator_log(plane, waited)
}

/// The pods' names.
pub fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// Every pod labelled as `job`'s, of any generation, terminating ones too.
pub async fn pods_of(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("rdu.dev/job-name={job}")))
        .await
        .expect("list pods")
        .items
}
