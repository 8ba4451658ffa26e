//! The progress endpoint (DESIGN 4.8): rank 0 POSTs a `ProgressReport` with its pod-bound ServiceAccount token;
//! the operator checks who sent it (cheaply first: the token's unverified claims must name rank 0 of that job's
//! current generation in the caches; only then a TokenReview, remembered and bounded by `review_cache`), what it says
//! (size, shape, consistency) and how often, and writes `status.progress` under its own field manager at most
//! once per job every few seconds. Served on a listener of its own (`crate::serve`), so a flood of reports never
//! reaches `/healthz`.

pub(crate) mod board;
pub(crate) mod claims;
pub(crate) mod review_cache;
pub(crate) mod token_review;
pub(crate) mod writer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::{ObjectRef, Store};
use rdu_crds::consts::{self, PROGRESS_REPORT_MAX_BYTES};
use rdu_crds::{ProgressReport, RduJob, ReportError};
use tokio::sync::Notify;

use crate::health::Health;
use crate::metrics::OutcomeLabel;
use board::{Board, JobKey, TooFrequent};
use claims::ClaimsError;
use review_cache::{NotReviewed, Reviews};
use token_review::{PodIdentity, ReviewError, TokenReviewer};

/// Field manager of `status.progress`: only the endpoint writes it, so the reconciler's status apply (under
/// `FIELD_MANAGER`, without `progress`) neither removes nor rolls it back.
pub(crate) const PROGRESS_FIELD_MANAGER: &str = "rdu-operator-progress";

/// Why a report was refused; each maps to an HTTP status and a message for the worker's log. Nothing said before
/// the token is reviewed depends on which jobs or pods exist: a stranger learns only what its own token shows.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the operator is not ready (caches not synced, or not the leader); retry later")]
    NotReady,
    #[error(
        "no bearer token: send `Authorization: Bearer <the projected token in {}>`",
        consts::PROGRESS_TOKEN_DIR
    )]
    NoToken,
    #[error(transparent)]
    Token(#[from] ClaimsError),
    #[error(transparent)]
    Review(#[from] ReviewError),
    #[error(
        "the token does not name rank 0 of the current generation of RduJob {namespace}/{name}, or there is no such \
         job: only that pod's projected progress token ({}) is taken",
        consts::PROGRESS_TOKEN_DIR
    )]
    NotRankZero { namespace: String, name: String },
    #[error("{message}")]
    Throttled {
        message: String,
        retry_after: Duration,
    },
    #[error("the report is not valid JSON of a ProgressReport: {0}")]
    Malformed(String),
    #[error(transparent)]
    Inconsistent(#[from] ReportError),
    #[error("the report is for generation {got}, the job is at generation {current}")]
    StaleGeneration { got: u32, current: u32 },
    #[error(transparent)]
    TooFrequent(#[from] TooFrequent),
}

impl From<NotReviewed> for Refusal {
    fn from(not_reviewed: NotReviewed) -> Self {
        let retry_after = match &not_reviewed {
            NotReviewed::Review(error) => return Refusal::Review(error.clone()),
            NotReviewed::Throttled { retry_after } => *retry_after,
            NotReviewed::Busy => Duration::from_secs(1),
        };
        Refusal::Throttled {
            message: not_reviewed.to_string(),
            retry_after,
        }
    }
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::NotReady | Refusal::Review(ReviewError::Unavailable(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Refusal::NoToken | Refusal::Token(_) | Refusal::Review(_) => StatusCode::UNAUTHORIZED,
            Refusal::NotRankZero { .. } => StatusCode::FORBIDDEN,
            Refusal::Malformed(_) => StatusCode::BAD_REQUEST,
            Refusal::Inconsistent(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::StaleGeneration { .. } => StatusCode::CONFLICT,
            Refusal::Throttled { .. } | Refusal::TooFrequent(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The `outcome` label of the report counter.
    pub fn outcome(&self) -> &'static str {
        match self {
            Refusal::NotReady | Refusal::Review(ReviewError::Unavailable(_)) => "unavailable",
            Refusal::NoToken | Refusal::Token(_) | Refusal::Review(_) => "unauthenticated",
            Refusal::NotRankZero { .. } => "forbidden",
            Refusal::Malformed(_) | Refusal::Inconsistent(_) => "malformed",
            Refusal::StaleGeneration { .. } => "stale",
            Refusal::Throttled { .. } | Refusal::TooFrequent(_) => "rate_limited",
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Refusal::TooFrequent(t) => Some(t.retry_after),
            Refusal::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.status(), format!("{self}\n")).into_response();
        if let Some(wait) = self.retry_after() {
            let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// What the endpoint reads and keeps.
pub struct ProgressService {
    pub reviews: Reviews,
    /// The controller's job and pod caches.
    pub jobs: Store<RduJob>,
    pub pods: Store<Pod>,
    pub health: Arc<Health>,
    pub board: Board,
    /// Wakes the status writer when a report was accepted.
    pub accepted: Notify,
}

impl ProgressService {
    pub fn new(
        reviewer: Arc<dyn TokenReviewer>,
        jobs: Store<RduJob>,
        pods: Store<Pod>,
        health: Arc<Health>,
    ) -> Self {
        ProgressService {
            reviews: Reviews::new(reviewer),
            jobs,
            pods,
            health,
            board: Board::default(),
            accepted: Notify::new(),
        }
    }

    /// One report: who sent it (its claims, then the API server), what it says, how often; accepted progress
    /// waits on the board for its write.
    pub async fn receive(
        &self,
        namespace: &str,
        name: &str,
        bearer: Option<&str>,
        body: &[u8],
    ) -> Result<(), Refusal> {
        if !self.health.is_synced() {
            return Err(Refusal::NotReady);
        }
        let token = bearer.ok_or(Refusal::NoToken)?;
        let claimed = claims::claimed_pod(token, jiff::Timestamp::now().as_second())?;
        // Before anything costs an API request: the claims must name the job's current rank 0 as the caches
        // hold it (name, UID, controller, labels). A forger must know that pod's UID to get further.
        self.current_rank_zero(&claimed, namespace, name)?;
        let identity = self.reviews.review(token, &claimed).await?;
        if identity != claimed {
            return Err(not_rank_zero(namespace, name));
        }
        // Again: the job may have moved to another generation while the review ran.
        let generation = self.current_rank_zero(&identity, namespace, name)?;
        let report: ProgressReport =
            serde_json::from_slice(body).map_err(|e| Refusal::Malformed(e.to_string()))?;
        if report.generation != generation {
            return Err(Refusal::StaleGeneration {
                got: report.generation,
                current: generation,
            });
        }
        let mut progress = report.checked()?;
        progress.update_time = Some(Time(jiff::Timestamp::now()));
        let key = JobKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.board.accept(key, progress, Instant::now())?;
        self.accepted.notify_one();
        Ok(())
    }

    /// The current generation of job `namespace/name` if `pod` is its rank 0 of that generation; the same
    /// refusal whether the job is missing or the pod is not its rank 0.
    fn current_rank_zero(
        &self,
        pod: &PodIdentity,
        namespace: &str,
        name: &str,
    ) -> Result<u32, Refusal> {
        let job = self
            .jobs
            .get(&ObjectRef::new(name).within(namespace))
            .ok_or_else(|| not_rank_zero(namespace, name))?;
        rank_zero_generation(pod, &job, |ns, pod| {
            self.pods.get(&ObjectRef::new(pod).within(ns))
        })
        .ok_or_else(|| not_rank_zero(namespace, name))
    }
}

fn not_rank_zero(namespace: &str, name: &str) -> Refusal {
    Refusal::NotRankZero {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

/// The job's current generation if `identity` is its rank 0 of that generation, as the pod cache shows it (the
/// same name, the same UID, controlled by the job, the job's labels): a token of another rank, of an earlier
/// generation's pod, or of a pod the job does not control gives `None`.
pub(crate) fn rank_zero_generation(
    identity: &PodIdentity,
    job: &RduJob,
    pod_named: impl Fn(&str, &str) -> Option<Arc<Pod>>,
) -> Option<u32> {
    let namespace = rdu_crds::job_namespace(job);
    let name = rdu_crds::job_name(job);
    let generation = job.status.as_ref().map_or(0, |s| s.restarts);
    let rank0 = consts::pod_name(name, 0);
    if identity.namespace != namespace || identity.pod_name != rank0 {
        return None;
    }
    let pod = pod_named(namespace, &rank0)?;
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let label = |key: &str| labels.get(key).map(String::as_str);
    let generation_text = generation.to_string();
    let same_pod = pod.metadata.uid.as_deref() == Some(identity.pod_uid.as_str());
    let job_uid = job.metadata.uid.as_deref().unwrap_or_default();
    let of_this_job = crate::ownership::controlled_by(&pod.metadata, job_uid)
        && label(consts::LABEL_JOB_NAME) == Some(name)
        && label(consts::LABEL_RANK) == Some("0")
        && label(consts::LABEL_GENERATION) == Some(generation_text.as_str());
    (same_pod && of_this_job).then_some(generation)
}

/// The route `POST /progress/v1/namespaces/{namespace}/rdujobs/{name}`, bodies of at most
/// `PROGRESS_REPORT_MAX_BYTES` (413 beyond).
pub fn router(service: Arc<ProgressService>, metrics: Arc<crate::metrics::Metrics>) -> Router {
    Router::new()
        .route(
            "/progress/v1/namespaces/{namespace}/rdujobs/{name}",
            post(report),
        )
        .layer(DefaultBodyLimit::max(PROGRESS_REPORT_MAX_BYTES))
        .with_state((service, metrics))
}

async fn report(
    State((service, metrics)): State<(Arc<ProgressService>, Arc<crate::metrics::Metrics>)>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let result = service.receive(&namespace, &name, bearer, &body).await;
    let outcome = result
        .as_ref()
        .map_or_else(Refusal::outcome, |()| "accepted");
    metrics
        .progress_reports
        .get_or_create(&OutcomeLabel { outcome })
        .inc();
    match result {
        Ok(()) => (StatusCode::ACCEPTED, "accepted\n").into_response(),
        Err(refusal) => {
            let job = format!("{namespace}/{name}");
            // Whoever sends no valid token of the job's rank 0 could flood the log: those refusals, and the rate
            // limit's, are debug lines; the others come from the job's own rank 0.
            let quiet = matches!(
                refusal,
                Refusal::NoToken
                    | Refusal::Token(_)
                    | Refusal::Review(ReviewError::Rejected(_) | ReviewError::NotPodBound)
                    | Refusal::NotRankZero { .. }
                    | Refusal::Throttled { .. }
                    | Refusal::TooFrequent(_)
            );
            if quiet {
                tracing::debug!(%job, reason = %refusal, "progress report refused");
            } else {
                tracing::info!(%job, reason = %refusal, "progress report refused");
            }
            refusal.into_response()
        }
    }
}

#[cfg(test)]
mod tests;
