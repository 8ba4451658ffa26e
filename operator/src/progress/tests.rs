//! The endpoint's decisions, with a table of tokens in place of the API server's TokenReview.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use rdu_crds::{ProgressReport, RduJob, RduJobStatus, StepPoint, TrainingProgress};

use super::review::{PodIdentity, ReviewError, TokenReviewer};
use super::{ProgressService, Refusal};
use crate::builders::worker_pod;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::test_fixtures::job;
use crate::validate::valid;

struct Tokens(HashMap<&'static str, PodIdentity>);

impl TokenReviewer for Tokens {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, ReviewError>> {
        let answer = self
            .0
            .get(token)
            .cloned()
            .ok_or_else(|| ReviewError::Rejected("unknown token".into()));
        Box::pin(async move { answer })
    }
}

fn identity(pod: &str, uid: &str) -> PodIdentity {
    PodIdentity {
        namespace: "ml".into(),
        pod_name: pod.into(),
        pod_uid: uid.into(),
    }
}

/// Job `mnist` in `ml` at generation 1, its rank 0 and 1 pods of generation 1 (UIDs `u0`, `u1`), and tokens:
/// `rank0`, `rank1`, `old-rank0` (rank 0's name, an earlier pod's UID), `other-ns`.
fn service() -> ProgressService {
    service_where(|_| {})
}

/// [`service`] with rank 0's pod in the cache changed by `change`.
fn service_where(change: impl FnOnce(&mut Pod)) -> ProgressService {
    let mut change = Some(change);
    let mut the_job = job("mnist", Some("ml"), 2);
    the_job.status = Some(RduJobStatus {
        restarts: 1,
        ..Default::default()
    });
    let (jobs, mut job_writer) = reflector::store::<RduJob>();
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    for (rank, uid) in [(0, "u0"), (1, "u1")] {
        let mut pod = worker_pod(&valid(&the_job), rank, 1);
        pod.metadata.uid = Some(uid.into());
        if rank == 0 {
            change
                .take()
                .into_iter()
                .for_each(|change| change(&mut pod));
        }
        pod_writer.apply_watcher_event(&Event::Apply(pod));
    }
    job_writer.apply_watcher_event(&Event::Apply(the_job));
    let tokens = Tokens(HashMap::from([
        ("rank0", identity("mnist-worker-0", "u0")),
        ("rank1", identity("mnist-worker-1", "u1")),
        ("old-rank0", identity("mnist-worker-0", "u-old")),
        (
            "other-ns",
            PodIdentity {
                namespace: "other".into(),
                pod_name: "mnist-worker-0".into(),
                pod_uid: "u0".into(),
            },
        ),
    ]));
    let health = Arc::new(Health::new(Arc::new(Metrics::new(
        reflector::store::<RduJob>().0,
    ))));
    health.set_ready(true);
    ProgressService::new(Arc::new(tokens), jobs, pods, health)
}

fn report(generation: u32, step: u64) -> Vec<u8> {
    let progress = TrainingProgress::at(StepPoint {
        step,
        total_steps: 100,
        start_step: 0,
        epoch: 1,
        epochs: 2,
        loss: 0.5,
        elapsed_seconds: 2.0,
        samples: step * 64,
    });
    serde_json::to_vec(&ProgressReport {
        generation,
        progress,
    })
    .expect("json")
}

async fn send(svc: &ProgressService, token: Option<&str>, body: &[u8]) -> Result<(), Refusal> {
    svc.receive("ml", "mnist", token, body).await
}

#[tokio::test]
async fn rank_zero_of_the_current_generation_is_accepted_and_stamped() {
    let svc = service();
    send(&svc, Some("rank0"), &report(1, 10))
        .await
        .expect("accepted");
    let (due, _) = svc.board.take_due(std::time::Instant::now());
    assert_eq!(due.len(), 1);
    let progress = &due[0].1;
    assert_eq!((progress.step, progress.percent), (10, 10));
    assert!(progress.update_time.is_some(), "the operator's clock");
}

#[tokio::test]
async fn forged_or_foreign_reports_are_refused_and_change_nothing() {
    let svc = service();
    let cases: [(Option<&str>, Vec<u8>, u16, &str); 8] = [
        (None, report(1, 10), 401, "bearer"),
        (Some("stolen"), report(1, 10), 401, "unknown token"),
        (Some("rank1"), report(1, 10), 403, "only rank 0"),
        (Some("old-rank0"), report(1, 10), 403, "only rank 0"),
        (Some("other-ns"), report(1, 10), 403, "only rank 0"),
        (Some("rank0"), b"{\"generation\":1".to_vec(), 400, "not valid JSON"),
        (Some("rank0"), report(0, 10), 409, "generation 0"),
        (
            Some("rank0"),
            br#"{"generation":1,"progress":{"step":500,"totalSteps":100,"epoch":1,"epochs":2,"percent":0}}"#.to_vec(),
            422,
            "step 500",
        ),
    ];
    for (token, body, code, says) in cases {
        let refusal = send(&svc, token, &body).await.expect_err(says);
        assert_eq!(refusal.status().as_u16(), code, "{refusal}");
        assert!(
            refusal.to_string().contains(says),
            "{refusal} should say {says}"
        );
    }
    let (due, _) = svc.board.take_due(std::time::Instant::now());
    assert!(due.is_empty(), "nothing was accepted: {due:?}");
}

#[tokio::test]
async fn a_rank_zero_pod_the_job_does_not_control_cannot_report() {
    // Named and labelled as rank 0 of the current generation, but someone else's pod.
    let svc = service_where(|pod| {
        pod.metadata
            .owner_references
            .iter_mut()
            .flatten()
            .for_each(|r| r.uid = "u-other".into());
    });
    let refusal = send(&svc, Some("rank0"), &report(1, 10))
        .await
        .expect_err("not the job's pod");
    assert_eq!(refusal.status().as_u16(), 403, "{refusal}");
    let svc = service_where(|pod| pod.metadata.owner_references = None);
    let refusal = send(&svc, Some("rank0"), &report(1, 10))
        .await
        .expect_err("no controller");
    assert_eq!(refusal.status().as_u16(), 403, "{refusal}");
}

#[tokio::test]
async fn a_second_report_within_a_second_is_rate_limited() {
    let svc = service();
    send(&svc, Some("rank0"), &report(1, 10))
        .await
        .expect("first");
    let refusal = send(&svc, Some("rank0"), &report(1, 11))
        .await
        .expect_err("too soon");
    assert_eq!(refusal.status().as_u16(), 429);
    let response = axum::response::IntoResponse::into_response(refusal);
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
}

#[tokio::test]
async fn nothing_is_taken_before_the_caches_are_ready() {
    let svc = service();
    svc.health.set_ready(false);
    let refusal = send(&svc, Some("rank0"), &report(1, 10))
        .await
        .expect_err("not ready");
    assert_eq!(refusal.status().as_u16(), 503);
}

#[tokio::test]
async fn an_unknown_job_is_named() {
    let svc = service();
    let refusal = svc
        .receive("ml", "nope", Some("rank0"), &report(1, 1))
        .await
        .expect_err("no job");
    assert_eq!(refusal.to_string(), "no RduJob ml/nope");
}
