//! The endpoint's decisions, with a table of signed tokens in place of the API server's TokenReview, counting
//! the reviews it is asked for.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use rdu_crds::consts::PROGRESS_TOKEN_AUDIENCE;
use rdu_crds::{ProgressReport, RduJob, RduJobStatus, StepPoint, TrainingProgress};

use super::claims::forged::{pod_token_payload, unsigned_token};
use super::token_review::{PodIdentity, ReviewError, TokenReviewer};
use super::{ProgressService, Refusal};
use crate::builders::worker_pod;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::test_fixtures::job;
use crate::validate::valid;

/// The tokens the API server signed, and the pod each is bound to; any other token is refused.
struct Signed {
    tokens: HashMap<String, PodIdentity>,
    reviews: AtomicUsize,
}

impl TokenReviewer for Signed {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, ReviewError>> {
        self.reviews.fetch_add(1, Ordering::SeqCst);
        let answer = self
            .tokens
            .get(token)
            .cloned()
            .ok_or_else(|| ReviewError::Rejected("invalid bearer token".into()));
        Box::pin(async move { answer })
    }
}

fn identity(namespace: &str, pod: &str, uid: &str) -> PodIdentity {
    PodIdentity {
        namespace: namespace.into(),
        pod_name: pod.into(),
        pod_uid: uid.into(),
    }
}

/// A token whose claims name `namespace/pod` (UID `uid`) for `audience`; `salt` makes tokens of the same claims
/// differ, as two signatures would.
fn token_for(audience: &str, namespace: &str, pod: &str, uid: &str, salt: u32) -> String {
    let exp = jiff::Timestamp::now().as_second() + 600;
    let mut payload = pod_token_payload(audience, namespace, pod, uid, exp);
    payload["jti"] = salt.into();
    unsigned_token(&payload)
}

fn progress_token(namespace: &str, pod: &str, uid: &str) -> String {
    token_for(PROGRESS_TOKEN_AUDIENCE, namespace, pod, uid, 0)
}

struct Fixture {
    svc: ProgressService,
    signed: Arc<Signed>,
    rank0: String,
    rank1: String,
}

/// Job `mnist` in `ml` at generation 1, its rank 0 and 1 pods of generation 1 (UIDs `u0`, `u1`), and signed
/// tokens of rank 0 and rank 1.
fn service() -> Fixture {
    service_where(|_| {})
}

/// [`service`] with rank 0's pod in the cache changed by `change`.
fn service_where(change: impl FnOnce(&mut Pod)) -> Fixture {
    fixture(change, Vec::new())
}

/// [`service_where`] with more signed tokens.
fn fixture(change: impl FnOnce(&mut Pod), more: Vec<(String, PodIdentity)>) -> Fixture {
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
    let rank0 = progress_token("ml", "mnist-worker-0", "u0");
    let rank1 = progress_token("ml", "mnist-worker-1", "u1");
    let mut tokens = HashMap::from([
        (rank0.clone(), identity("ml", "mnist-worker-0", "u0")),
        (rank1.clone(), identity("ml", "mnist-worker-1", "u1")),
    ]);
    tokens.extend(more);
    let signed = Arc::new(Signed {
        tokens,
        reviews: AtomicUsize::new(0),
    });
    let health = Arc::new(Health::new(Arc::new(Metrics::new(
        reflector::store::<RduJob>().0,
    ))));
    health.set_synced(true);
    Fixture {
        svc: ProgressService::new(signed.clone(), jobs, pods, health),
        signed,
        rank0,
        rank1,
    }
}

impl Fixture {
    fn reviews(&self) -> usize {
        self.signed.reviews.load(Ordering::SeqCst)
    }
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
    let f = service();
    send(&f.svc, Some(&f.rank0), &report(1, 10))
        .await
        .expect("accepted");
    let (due, _) = f.svc.board.take_due(std::time::Instant::now());
    assert_eq!(due.len(), 1);
    let progress = &due[0].1;
    assert_eq!((progress.step, progress.percent), (10, 10));
    assert!(progress.update_time.is_some(), "the operator's clock");
    assert_eq!(f.reviews(), 1);
}

#[tokio::test]
async fn tokens_that_do_not_name_the_current_rank_zero_are_refused_without_a_review() {
    let f = service();
    let api_audience = token_for(
        "https://kubernetes.default.svc",
        "ml",
        "mnist-worker-0",
        "u0",
        0,
    );
    let old_rank0 = progress_token("ml", "mnist-worker-0", "u-old");
    let other_namespace = progress_token("other", "mnist-worker-0", "u0");
    let cases: [(Option<&str>, u16, &str); 7] = [
        (None, 401, "bearer"),
        (Some("not-a-token"), 401, "not a ServiceAccount token"),
        (Some(&api_audience), 401, "not rdu.dev/progress"),
        (Some(&f.rank1), 403, "does not name rank 0"),
        (Some(&old_rank0), 403, "does not name rank 0"),
        (Some(&other_namespace), 403, "does not name rank 0"),
        (Some("a.b.c"), 401, "not a ServiceAccount token"),
    ];
    for (token, code, says) in cases {
        let refusal = send(&f.svc, token, &report(1, 10)).await.expect_err(says);
        assert_eq!(refusal.status().as_u16(), code, "{refusal}");
        assert!(
            refusal.to_string().contains(says),
            "{refusal} should say {says}"
        );
    }
    assert_eq!(
        f.reviews(),
        0,
        "nothing cheap to refuse cost an API request"
    );
    assert!(f.svc.board.take_due(std::time::Instant::now()).0.is_empty());
}

#[tokio::test]
async fn reports_of_rank_zero_are_checked_after_the_review() {
    let f = service();
    let cases: [(Vec<u8>, u16, &str); 3] = [
        (b"{\"generation\":1".to_vec(), 400, "not valid JSON"),
        (report(0, 10), 409, "generation 0"),
        (
            br#"{"generation":1,"progress":{"step":500,"totalSteps":100,"epoch":1,"epochs":2,"percent":0}}"#.to_vec(),
            422,
            "step 500",
        ),
    ];
    for (body, code, says) in cases {
        let refusal = send(&f.svc, Some(&f.rank0), &body).await.expect_err(says);
        assert_eq!(refusal.status().as_u16(), code, "{refusal}");
        assert!(
            refusal.to_string().contains(says),
            "{refusal} should say {says}"
        );
    }
    assert_eq!(f.reviews(), 1, "rank 0's token, once");
    assert!(f.svc.board.take_due(std::time::Instant::now()).0.is_empty());
}

#[tokio::test]
async fn a_forged_token_naming_rank_zero_is_refused_by_the_review_and_holds_only_that_pods_turn() {
    let f = service();
    let forged = token_for(PROGRESS_TOKEN_AUDIENCE, "ml", "mnist-worker-0", "u0", 7);
    for _ in 0..2 {
        let refusal = send(&f.svc, Some(&forged), &report(1, 10))
            .await
            .expect_err("forged");
        assert_eq!(refusal.status().as_u16(), 401, "{refusal}");
        assert!(
            refusal.to_string().contains("invalid bearer token"),
            "{refusal}"
        );
    }
    assert_eq!(f.reviews(), 1, "the refusal is remembered");
    // Rank 0's own token, not yet reviewed, waits for the pod's next turn (429 with Retry-After), then goes in.
    let refusal = send(&f.svc, Some(&f.rank0), &report(1, 10))
        .await
        .expect_err("the pod's turn was the forger's");
    assert_eq!(refusal.status().as_u16(), 429, "{refusal}");
    assert_eq!(
        refusal
            .retry_after()
            .map(|d| d <= super::review_cache::PER_POD_INTERVAL),
        Some(true)
    );
    let deadline = std::time::Instant::now() + 5 * super::review_cache::PER_POD_INTERVAL;
    loop {
        match send(&f.svc, Some(&f.rank0), &report(1, 10)).await {
            Ok(()) => break,
            Err(refusal) if refusal.status().as_u16() == 429 => {
                assert!(std::time::Instant::now() < deadline, "still {refusal}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(refusal) => panic!("{refusal}"),
        }
    }
    assert_eq!(f.reviews(), 2);
}

#[tokio::test]
async fn a_stranger_cannot_tell_a_missing_job_from_one_whose_rank_zero_it_cannot_name() {
    let f = service();
    let answer = |refusal: Refusal, name: &str| {
        let status = refusal.status();
        let text = refusal.to_string().replace(name, "JOB");
        (status, text)
    };
    // Claims naming a job that does not exist, rank 1 of one that does, and rank 0 with a guessed UID.
    let ghost = progress_token("ml", "ghost-worker-0", "u0");
    let missing = f
        .svc
        .receive("ml", "ghost", Some(&ghost), &report(1, 1))
        .await
        .expect_err("no job");
    let guessed = progress_token("ml", "mnist-worker-0", "guess");
    let mut answers = vec![answer(missing, "ghost")];
    for token in [&f.rank1, &guessed] {
        let refusal = send(&f.svc, Some(token), &report(1, 1))
            .await
            .expect_err("not rank 0");
        answers.push(answer(refusal, "mnist"));
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:#?}");
    assert_eq!(answers[0].0.as_u16(), 403);
    assert!(
        !answers[0].1.contains("worker"),
        "no pod named: {}",
        answers[0].1
    );
    assert_eq!(f.reviews(), 0);
}

#[tokio::test]
async fn a_flood_of_forged_tokens_naming_rank_zero_costs_one_review_per_second() {
    let f = service();
    let mut refused = 0;
    for salt in 1..=500 {
        let forged = token_for(PROGRESS_TOKEN_AUDIENCE, "ml", "mnist-worker-0", "u0", salt);
        let refusal = send(&f.svc, Some(&forged), &report(1, 1))
            .await
            .expect_err("forged");
        assert!(matches!(refusal.status().as_u16(), 401 | 429), "{refusal}");
        refused += 1;
    }
    assert_eq!(refused, 500);
    assert_eq!(
        f.reviews(),
        1,
        "the first; the others within the second wait their turn"
    );
}

#[tokio::test]
async fn a_token_the_review_binds_to_another_pod_than_its_claims_is_refused() {
    // Claims of rank 0, but the API server says the token is rank 1's.
    let liar = token_for(PROGRESS_TOKEN_AUDIENCE, "ml", "mnist-worker-0", "u0", 9);
    let f = fixture(
        |_| {},
        vec![(liar.clone(), identity("ml", "mnist-worker-1", "u1"))],
    );
    let refusal = send(&f.svc, Some(&liar), &report(1, 1))
        .await
        .expect_err("claims and review disagree");
    assert_eq!(refusal.status().as_u16(), 403, "{refusal}");
    assert_eq!(f.reviews(), 1);
}

#[tokio::test]
async fn a_rank_zero_pod_the_job_does_not_control_cannot_report() {
    // Named and labelled as rank 0 of the current generation, but someone else's pod.
    let f = service_where(|pod| {
        pod.metadata
            .owner_references
            .iter_mut()
            .flatten()
            .for_each(|r| r.uid = "u-other".into());
    });
    let refusal = send(&f.svc, Some(&f.rank0), &report(1, 10))
        .await
        .expect_err("not the job's pod");
    assert_eq!(refusal.status().as_u16(), 403, "{refusal}");
    let f = service_where(|pod| pod.metadata.owner_references = None);
    let refusal = send(&f.svc, Some(&f.rank0), &report(1, 10))
        .await
        .expect_err("no controller");
    assert_eq!(refusal.status().as_u16(), 403, "{refusal}");
    assert_eq!(f.reviews(), 0);
}

#[tokio::test]
async fn a_second_report_within_a_second_is_rate_limited() {
    let f = service();
    send(&f.svc, Some(&f.rank0), &report(1, 10))
        .await
        .expect("first");
    let refusal = send(&f.svc, Some(&f.rank0), &report(1, 11))
        .await
        .expect_err("too soon");
    assert_eq!(refusal.status().as_u16(), 429);
    let response = axum::response::IntoResponse::into_response(refusal);
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    assert_eq!(f.reviews(), 1, "rank 0's token is remembered");
}

#[tokio::test]
async fn nothing_is_taken_before_the_caches_are_ready() {
    let f = service();
    f.svc.health.set_synced(false);
    let refusal = send(&f.svc, Some(&f.rank0), &report(1, 10))
        .await
        .expect_err("not ready");
    assert_eq!(refusal.status().as_u16(), 503);
}
