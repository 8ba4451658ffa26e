//! The reconcile pipeline: fetch -> validate -> decide/build -> apply -> status. Only fetch, apply and status
//! touch the API server; everything in between is pure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use rdu_crds::{JobPhase, RduJob, RduJobStatus};
use serde_json::json;
use tracing::{info, warn};

use crate::builders;
use crate::lifecycle::{Action, Decision, JobEvent, condition, decide};
use crate::metrics::Metrics;
use crate::validate::ValidJob;

/// Field manager of every server-side apply the operator does.
pub const FIELD_MANAGER: &str = "rdu-operator";
/// How often a job is looked at again when no timer or watch event asks sooner.
pub const RESYNC: Duration = Duration::from_secs(300);

/// Why one reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot make the job's token: {0}")]
    Token(#[from] rdu_crds::token::TokenError),
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Whether scheduler-plugins' PodGroup CRD is installed (checked at start-up).
    pub pod_groups: bool,
    /// Whether every job gets a NetworkPolicy admitting only its own pods to the worker ports.
    pub network_policies: bool,
}

/// What the fetch step read.
struct Fetched {
    pods: Vec<Pod>,
    existing: Existing,
}

/// Children created once and then kept as they are.
#[derive(Clone, Copy)]
struct Existing {
    /// The token Secret: an existing token is kept.
    secret: bool,
    /// The checkpoint claim (or no claim template): its spec is immutable once bound, so it is never re-applied.
    claim: bool,
}

/// One reconcile of one job.
pub async fn reconcile(job: Arc<RduJob>, ctx: Arc<Context>) -> Result<Requeue, ReconcileError> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let result = run_pipeline(&job, &ctx).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    if result.is_err() {
        ctx.metrics.errors.inc();
    }
    result
}

/// Retry a failed reconcile with a bounded backoff.
pub fn error_policy(job: Arc<RduJob>, error: &ReconcileError, _ctx: Arc<Context>) -> Requeue {
    warn!(job = %job.name_any(), namespace = ?job.namespace(), %error, "reconcile failed");
    Requeue::requeue(Duration::from_secs(5))
}

async fn run_pipeline(job: &RduJob, ctx: &Context) -> Result<Requeue, ReconcileError> {
    let key = format!(
        "{}/{}",
        builders::job_namespace(job),
        builders::job_name(job)
    );
    if job.metadata.deletion_timestamp.is_some() {
        ctx.metrics.set_phase(&key, None);
        return Ok(Requeue::await_change());
    }
    let fetched = fetch(job, ctx).await?;
    let now = Timestamp::now();
    let (decision, valid) = match crate::validate(job) {
        Ok(valid) => (decide(&valid, &fetched.pods, now), Some(valid)),
        Err(errors) => (invalid(job, &errors.to_string(), now), None),
    };
    if let Some(valid) = &valid {
        apply(valid, ctx, &decision, fetched.existing).await?;
    }
    write_status(job, ctx, &decision).await?;
    ctx.metrics.set_phase(&key, decision.status.phase);
    observe_creation_latency(job, ctx, &decision, now);
    Ok(decision
        .requeue_after
        .map_or(Requeue::requeue(RESYNC), Requeue::requeue))
}

/// Step 1: the job's pods, and whether its token Secret and checkpoint claim exist.
async fn fetch(job: &RduJob, ctx: &Context) -> Result<Fetched, ReconcileError> {
    let ns = builders::job_namespace(job);
    let name = builders::job_name(job);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&builders::job_selector(job)))
        .await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret_name = rdu_crds::consts::token_secret_name(name);
    let secret = secrets.get_opt(&secret_name).await?.is_some();
    let wants_claim = job
        .spec
        .checkpoint
        .as_ref()
        .is_some_and(|c| c.volume_claim_template.is_some());
    let claim = if wants_claim {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        claims
            .get_opt(&rdu_crds::consts::checkpoint_claim_name(name))
            .await?
            .is_some()
    } else {
        true
    };
    Ok(Fetched {
        pods: list.items,
        existing: Existing { secret, claim },
    })
}

/// Step 2 when validation fails: the job fails with the validation messages, nothing is created.
pub fn invalid(job: &RduJob, message: &str, now: Timestamp) -> Decision {
    let mut status = job.status.clone().unwrap_or_default();
    let already = status.phase == Some(JobPhase::Failed);
    let mut events = Vec::new();
    if !already {
        status.phase = Some(JobPhase::Failed);
        status.completion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        status.conditions.retain(|c| c.type_ != condition::FAILED);
        status
            .conditions
            .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: condition::FAILED.to_string(),
                status: "True".to_string(),
                reason: "InvalidSpec".to_string(),
                message: message.to_string(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
                observed_generation: job.metadata.generation,
            });
        events.push(JobEvent {
            warning: true,
            reason: "InvalidSpec",
            note: message.to_string(),
        });
    }
    Decision {
        actions: Vec::new(),
        status,
        events,
        requeue_after: None,
    }
}

/// How many pod writes are in flight at once: large gangs are created in parallel, as the Job controller
/// does, without flooding the API server.
const CONCURRENT_WRITES: usize = 16;

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Step 4: carry out the decided actions with server-side apply and deletes.
async fn apply(
    job: &ValidJob<'_>,
    ctx: &Context,
    decision: &Decision,
    existing: Existing,
) -> Result<(), ReconcileError> {
    let ns = builders::job_namespace(job);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for action in &decision.actions {
        match action {
            Action::CreatePods { generation, ranks } => {
                ensure_shared_children(job, ctx, existing).await?;
                let built: Vec<Pod> = ranks
                    .iter()
                    .map(|rank| builders::worker_pod(job, *rank, *generation))
                    .collect();
                futures::stream::iter(built.into_iter().map(|pod| {
                    let pods = pods.clone();
                    async move {
                        pods.patch(&pod.name_any(), &apply_params(), &Patch::Apply(&pod))
                            .await
                            .map(drop)
                    }
                }))
                .buffer_unordered(CONCURRENT_WRITES)
                .try_collect::<()>()
                .await?;
                info!(job = %job.name_any(), generation, count = ranks.len(), "created rank pods");
            }
            Action::DeletePods { names } => {
                futures::stream::iter(names.iter().cloned().map(|name| {
                    let pods = pods.clone();
                    async move {
                        ignore_not_found(pods.delete(&name, &DeleteParams::background()).await)
                    }
                }))
                .buffer_unordered(CONCURRENT_WRITES)
                .try_collect::<()>()
                .await?;
                info!(job = %job.name_any(), count = names.len(), "deleted pods");
            }
            Action::DeleteJob => {
                let jobs: Api<RduJob> = Api::namespaced(ctx.client.clone(), ns);
                ignore_not_found(
                    jobs.delete(&job.name_any(), &DeleteParams::background())
                        .await,
                )?;
                info!(job = %job.name_any(), "deleted job after ttlSecondsAfterFinished");
            }
        }
    }
    Ok(())
}

/// The Service, the token Secret (created once, an existing token is kept), the checkpoint claim (created once,
/// kept across gang restarts), the NetworkPolicy and the PodGroup.
async fn ensure_shared_children(
    job: &ValidJob<'_>,
    ctx: &Context,
    existing: Existing,
) -> Result<(), ReconcileError> {
    let ns = builders::job_namespace(job);
    let service = builders::headless_service(job);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    services
        .patch(
            &service.name_any(),
            &apply_params(),
            &Patch::Apply(&service),
        )
        .await?;
    if !existing.secret {
        let secret = builders::token_secret(job, &rdu_crds::token::new_token()?);
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
        secrets
            .patch(&secret.name_any(), &apply_params(), &Patch::Apply(&secret))
            .await?;
    }
    if let (false, Some(claim)) = (existing.claim, builders::checkpoint_claim(job)) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        claims
            .patch(&claim.name_any(), &apply_params(), &Patch::Apply(&claim))
            .await?;
        info!(job = %job.name_any(), claim = %claim.name_any(), "created the checkpoint claim");
    }
    if ctx.network_policies {
        let policy = builders::network_policy(job);
        let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        policies
            .patch(&policy.name_any(), &apply_params(), &Patch::Apply(&policy))
            .await?;
    }
    if let (Some(min), true) = (builders::gang_min_available(job), ctx.pod_groups) {
        let group = builders::pod_group(job, min);
        let groups: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), ns, &builders::pod_group_resource());
        groups
            .patch(&group.name_any(), &apply_params(), &Patch::Apply(&group))
            .await?;
    }
    Ok(())
}

fn ignore_not_found<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Step 5: the status subresource (server-side apply) and an event per transition.
async fn write_status(
    job: &RduJob,
    ctx: &Context,
    decision: &Decision,
) -> Result<(), ReconcileError> {
    if decision.actions.contains(&Action::DeleteJob) {
        return publish_events(job, ctx, &decision.events).await;
    }
    if job.status.as_ref() != Some(&decision.status) {
        let jobs: Api<RduJob> = Api::namespaced(ctx.client.clone(), builders::job_namespace(job));
        jobs.patch_status(
            &job.name_any(),
            &apply_params(),
            &Patch::Apply(status_patch(&decision.status)),
        )
        .await?;
    }
    publish_events(job, ctx, &decision.events).await
}

/// The object server-side apply needs for the status subresource.
pub fn status_patch(status: &RduJobStatus) -> serde_json::Value {
    json!({
        "apiVersion": format!("{}/{}", rdu_crds::consts::GROUP, rdu_crds::consts::VERSION),
        "kind": "RduJob",
        "status": status,
    })
}

async fn publish_events(
    job: &RduJob,
    ctx: &Context,
    events: &[JobEvent],
) -> Result<(), ReconcileError> {
    let reference = job.object_ref(&());
    for e in events {
        let event = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(e.note.clone()),
            action: "Reconcile".to_string(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &reference).await {
            // An event that cannot be written must not stop the job's lifecycle.
            warn!(job = %job.name_any(), %error, reason = e.reason, "could not publish event");
        }
    }
    Ok(())
}

/// The histogram of time from a job's creation to all its first-generation pods existing.
fn observe_creation_latency(job: &RduJob, ctx: &Context, decision: &Decision, now: Timestamp) {
    let all_created = decision.events.iter().any(|e| e.reason == "Created");
    if let (true, 0, Some(created)) = (
        all_created,
        decision.status.restarts,
        &job.metadata.creation_timestamp,
    ) {
        let seconds = (now.as_millisecond() - created.0.as_millisecond()) as f64 / 1000.0;
        ctx.metrics.pods_created_seconds.observe(seconds.max(0.0));
    }
}
