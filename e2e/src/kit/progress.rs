//! Progress reports as rank 0 sends them to the operator (DESIGN 4.8): the body, and a POST with its token.

use std::net::SocketAddr;

use rdu_crds::{ProgressReport, StepPoint, TrainingProgress, consts};

use crate::metrics::http_post;

/// The JSON body of a report from `generation` at `step` (of 128, 16 samples a step).
pub fn progress_report(generation: u32, step: u64) -> Vec<u8> {
    let progress = TrainingProgress::at(StepPoint {
        step,
        total_steps: 128,
        start_step: 0,
        epoch: 1,
        epochs: 2,
        loss: 0.75,
        elapsed_seconds: 4.0,
        samples: step * 16,
    });
    serde_json::to_vec(&ProgressReport {
        generation,
        progress,
    })
    .expect("a report serializes")
}

/// POSTs `body` to job `namespace/job`'s progress path at `addr`, with `token` as the bearer when given: the
/// status code and body.
pub async fn post_progress(
    addr: SocketAddr,
    namespace: &str,
    job: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    http_post(addr, &consts::progress_path(namespace, job), &headers, body)
        .await
        .expect("the operator answers")
}
