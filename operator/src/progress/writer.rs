//! Writes accepted progress into `status.progress` (server-side apply under `PROGRESS_FIELD_MANAGER`), at most
//! once per job every `STATUS_WRITE_INTERVAL`, newest report first.

use std::sync::Arc;
use std::time::Instant;

use kube::api::{Api, Patch, PatchParams};
use rdu_crds::{RduJob, TrainingProgress, consts};
use serde_json::json;

use super::{PROGRESS_FIELD_MANAGER, ProgressService};

/// The status object server-side apply needs to set only `status.progress`.
pub(crate) fn progress_patch(progress: &TrainingProgress) -> serde_json::Value {
    json!({
        "apiVersion": format!("{}/{}", consts::GROUP, consts::VERSION),
        "kind": "RduJob",
        "status": { "progress": progress },
    })
}

/// Writes due progress until the process ends: woken by accepted reports, or when the next write falls due.
pub async fn write_progress(service: Arc<ProgressService>, client: kube::Client) {
    let params = PatchParams::apply(PROGRESS_FIELD_MANAGER).force();
    loop {
        let (due, next) = service.board.take_due(Instant::now());
        for (job, progress) in due {
            let jobs: Api<RduJob> = Api::namespaced(client.clone(), &job.namespace);
            match jobs
                .patch_status(&job.name, &params, &Patch::Apply(progress_patch(&progress)))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.is_not_found() => {
                    tracing::debug!(job = %format!("{}/{}", job.namespace, job.name), "job gone before its progress was written")
                }
                Err(error) => {
                    tracing::warn!(job = %format!("{}/{}", job.namespace, job.name), error = %rdu_error_chain::Chain(&error), "cannot write status.progress")
                }
            }
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at.into()) => {}
                    _ = service.accepted.notified() => {}
                }
            }
            None => service.accepted.notified().await,
        }
    }
}
