//! The reconcile pipeline: fetch -> validate -> decide/build -> apply -> status. Only fetch, apply and status
//! touch the API server; everything in between is pure. The job's pods come from the controller's pod cache (a
//! reflector store the controller's pod watch keeps), not from a LIST per reconcile; the token Secret and the
//! checkpoint claim, which nothing watches, are read with a GET only when pods are about to be created.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use rdu_crds::{JobPhase, RduJob, RduJobStatus};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::builders;
use crate::expectations::{Cached, Expectations};
use crate::lifecycle::{Action, Decision, JobEvent, condition, decide};
use crate::metrics::Metrics;
use crate::validate::ValidJob;

/// Field manager of every server-side apply the operator does.
pub const FIELD_MANAGER: &str = "rdu-operator";
/// How often a job is looked at again when no timer or watch event asks sooner.
pub const RESYNC: Duration = Duration::from_secs(300);

/// The step of the pipeline an error comes from: the `step` label of `rdu_operator_reconcile_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Reading what the cache does not hold (the token Secret, the checkpoint claim).
    Fetch,
    /// Building the children: making the job's token (the builders themselves cannot fail on a validated job).
    Build,
    /// Creating and deleting children, or the job after its TTL.
    Apply,
    /// Writing the status subresource.
    Status,
}

impl Step {
    pub const ALL: [Step; 4] = [Step::Fetch, Step::Build, Step::Apply, Step::Status];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::Fetch => "fetch",
            Step::Build => "build",
            Step::Apply => "apply",
            Step::Status => "status",
        }
    }
}

/// Why one reconcile failed (it is retried with backoff): one variant per step, with what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cannot read {what}: {source}")]
    Fetch { what: String, source: kube::Error },
    #[error("cannot make the job's token: {0}")]
    Token(#[from] rdu_crds::token::TokenError),
    #[error("cannot create pod {pod}: {source}")]
    CreatePods { pod: String, source: kube::Error },
    #[error("cannot delete pod {pod}: {source}")]
    DeletePods { pod: String, source: kube::Error },
    #[error("cannot apply {what}: {source}")]
    SharedChildren { what: String, source: kube::Error },
    #[error("cannot delete the job after ttlSecondsAfterFinished: {source}")]
    DeleteJob { source: kube::Error },
    #[error("cannot write the job's status: {source}")]
    Status { source: kube::Error },
}

impl ReconcileError {
    /// The pipeline step that failed.
    pub fn step(&self) -> Step {
        match self {
            ReconcileError::Fetch { .. } => Step::Fetch,
            ReconcileError::Token(_) => Step::Build,
            ReconcileError::CreatePods { .. }
            | ReconcileError::DeletePods { .. }
            | ReconcileError::SharedChildren { .. }
            | ReconcileError::DeleteJob { .. } => Step::Apply,
            ReconcileError::Status { .. } => Step::Status,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The controller's pod cache: every pod carrying `rdu.dev/job-name`, kept by the controller's pod watch.
    pub pods: Store<Pod>,
    /// Pod writes the cache has not shown yet.
    pub expectations: Expectations,
    /// Whether scheduler-plugins' PodGroup CRD is installed (checked at start-up).
    pub pod_groups: bool,
    /// Whether every job gets a NetworkPolicy admitting only its own pods to the worker ports.
    pub network_policies: bool,
    /// The operator's own base URL for rank 0's progress reports (DESIGN 4.8); none: ranks do not report.
    pub progress_url: Option<String>,
}

/// What the fetch step read.
enum Fetch {
    /// The job's pods; the cache shows every pod write of earlier reconciles.
    Current(Vec<Pod>),
    /// The cache is behind this job's own pod writes: wait for the watch.
    Behind(crate::expectations::Behind),
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
    if let Err(error) = &result {
        ctx.metrics.count_error(error.step());
    }
    result
}

/// Retry a failed reconcile with a bounded backoff.
pub fn error_policy(job: Arc<RduJob>, error: &ReconcileError, _ctx: Arc<Context>) -> Requeue {
    warn!(job = %job.name_any(), namespace = ?job.namespace(), step = error.step().as_str(), %error,
          "reconcile failed");
    Requeue::requeue(Duration::from_secs(5))
}

/// The key of a job's expectations: its uid (a job deleted and created again under the same name is another job).
fn job_key(job: &RduJob) -> String {
    job.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            builders::job_namespace(job),
            builders::job_name(job)
        )
    })
}

async fn run_pipeline(job: &RduJob, ctx: &Context) -> Result<Requeue, ReconcileError> {
    if job.metadata.deletion_timestamp.is_some() {
        ctx.expectations.forget(&job_key(job));
        return Ok(Requeue::await_change());
    }
    let pods = match fetch(job, ctx) {
        Fetch::Current(pods) => pods,
        Fetch::Behind(behind) => {
            debug!(job = %job.name_any(), created = behind.created, deleted = behind.deleted,
                   "the pod cache is behind this job's own writes; waiting for the watch");
            return Ok(Requeue::requeue(behind.expires_in));
        }
    };
    let now = Timestamp::now();
    let (decision, valid) = match crate::validate(job) {
        Ok(valid) => (decide(&valid, &pods, now), Some(valid)),
        Err(errors) => (invalid(job, &errors.to_string(), now), None),
    };
    if let Some(valid) = &valid {
        apply(valid, ctx, &decision).await?;
    }
    write_status(job, ctx, &decision).await?;
    observe_creation_latency(job, ctx, &decision, now);
    Ok(decision
        .requeue_after
        .map_or(Requeue::requeue(RESYNC), Requeue::requeue))
}

/// Step 1: the job's pods from the controller's cache, unless it is behind this job's own writes. No API call.
fn fetch(job: &RduJob, ctx: &Context) -> Fetch {
    let ns = builders::job_namespace(job);
    let cached = |pod: &str| match ctx.pods.get(&ObjectRef::new(pod).within(ns)) {
        None => Cached::Absent,
        Some(p) if p.metadata.deletion_timestamp.is_some() => Cached::Terminating,
        Some(_) => Cached::Live,
    };
    match ctx.expectations.behind(&job_key(job), cached) {
        Some(behind) => Fetch::Behind(behind),
        None => Fetch::Current(cached_pods(&ctx.pods, ns, builders::job_name(job))),
    }
}

/// Step 1, the part the cache cannot answer: whether the token Secret and the checkpoint claim exist (a GET each;
/// nothing watches them). Only asked when pods are to be created, the one time the answer is used.
async fn fetch_existing(job: &RduJob, ctx: &Context) -> Result<Existing, ReconcileError> {
    let ns = builders::job_namespace(job);
    let name = builders::job_name(job);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret_name = rdu_crds::consts::token_secret_name(name);
    let secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|source| ReconcileError::Fetch {
            what: format!("Secret {ns}/{secret_name}"),
            source,
        })?
        .is_some();
    let wants_claim = job
        .spec
        .checkpoint
        .as_ref()
        .is_some_and(|c| c.volume_claim_template.is_some());
    let claim = if wants_claim {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        let claim_name = rdu_crds::consts::checkpoint_claim_name(name);
        claims
            .get_opt(&claim_name)
            .await
            .map_err(|source| ReconcileError::Fetch {
                what: format!("PersistentVolumeClaim {ns}/{claim_name}"),
                source,
            })?
            .is_some()
    } else {
        true
    };
    Ok(Existing { secret, claim })
}

/// The pods of job `name` in namespace `ns` held by the cache: those labelled `rdu.dev/job-name=<name>`.
pub fn cached_pods(store: &Store<Pod>, ns: &str, name: &str) -> Vec<Pod> {
    store
        .state_filter(|pod| {
            pod.metadata.namespace.as_deref() == Some(ns)
                && pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(rdu_crds::consts::LABEL_JOB_NAME))
                    .is_some_and(|job| job == name)
        })
        .iter()
        .map(|pod| Pod::clone(pod))
        .collect()
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
) -> Result<(), ReconcileError> {
    let ns = builders::job_namespace(job);
    let key = job_key(job);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for action in &decision.actions {
        match action {
            Action::CreatePods { generation, ranks } => {
                let existing = fetch_existing(job, ctx).await?;
                ensure_shared_children(job, ctx, existing).await?;
                let built: Vec<Pod> = ranks
                    .iter()
                    .map(|rank| {
                        builders::rank_pod(job, *rank, *generation, ctx.progress_url.as_deref())
                    })
                    .collect();
                futures::stream::iter(built.into_iter().map(|pod| {
                    let (pods, key) = (pods.clone(), &key);
                    async move {
                        let name = pod.name_any();
                        match pods
                            .patch(&name, &apply_params(), &Patch::Apply(&pod))
                            .await
                        {
                            Ok(_) => {
                                ctx.expectations.created(key, &name);
                                Ok(())
                            }
                            Err(source) => Err(ReconcileError::CreatePods {
                                pod: format!("{ns}/{name}"),
                                source,
                            }),
                        }
                    }
                }))
                .buffer_unordered(CONCURRENT_WRITES)
                .try_collect::<()>()
                .await?;
                info!(job = %job.name_any(), generation, count = ranks.len(), "created rank pods");
            }
            Action::DeletePods { names } => {
                futures::stream::iter(names.iter().cloned().map(|name| {
                    let (pods, key) = (pods.clone(), &key);
                    async move {
                        let deleted = pods.delete(&name, &DeleteParams::background()).await;
                        match ignore_not_found(deleted) {
                            Ok(()) => {
                                ctx.expectations.deleted(key, &name);
                                Ok(())
                            }
                            Err(source) => Err(ReconcileError::DeletePods {
                                pod: format!("{ns}/{name}"),
                                source,
                            }),
                        }
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
                )
                .map_err(|source| ReconcileError::DeleteJob { source })?;
                ctx.expectations.forget(&key);
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
    apply_child(&services, "Service", &service).await?;
    if !existing.secret {
        let secret = builders::token_secret(job, &rdu_crds::token::new_token()?);
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
        apply_child(&secrets, "Secret", &secret).await?;
    }
    if let (false, Some(claim)) = (existing.claim, builders::checkpoint_claim(job)) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        apply_child(&claims, "PersistentVolumeClaim", &claim).await?;
        info!(job = %job.name_any(), claim = %claim.name_any(), "created the checkpoint claim");
    }
    if ctx.network_policies {
        let policy = builders::network_policy(job);
        let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        apply_child(&policies, "NetworkPolicy", &policy).await?;
    }
    if let (Some(min), true) = (builders::gang_min_available(job), ctx.pod_groups) {
        let group = builders::pod_group(job, min);
        let groups: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), ns, &builders::pod_group_resource());
        apply_child(&groups, "PodGroup", &group).await?;
    }
    Ok(())
}

/// Server-side apply of one shared child; a failure names its kind, namespace and name.
async fn apply_child<K>(api: &Api<K>, kind: &str, child: &K) -> Result<(), ReconcileError>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = child.name_any();
    match api
        .patch(&name, &apply_params(), &Patch::Apply(child))
        .await
    {
        Ok(_) => Ok(()),
        Err(source) => Err(ReconcileError::SharedChildren {
            what: format!("{kind} {}/{name}", child.namespace().unwrap_or_default()),
            source,
        }),
    }
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
        .await
        .map_err(|source| ReconcileError::Status { source })?;
    }
    publish_events(job, ctx, &decision.events).await
}

/// The object server-side apply needs for the status subresource. `progress` is left out: the progress endpoint
/// owns it under its own field manager, and an apply from this one must neither take it over nor roll it back to
/// what the cache held.
pub fn status_patch(status: &RduJobStatus) -> serde_json::Value {
    let status = RduJobStatus {
        progress: None,
        ..status.clone()
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    fn api_error() -> kube::Error {
        kube::Error::Api(
            Status::failure("pods is forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    #[test]
    fn each_error_maps_to_its_step_label() {
        let cases = [
            (
                ReconcileError::Fetch {
                    what: "Secret ml/a-token".into(),
                    source: api_error(),
                },
                "fetch",
            ),
            (
                ReconcileError::Token(rdu_crds::token::TokenError("no entropy".into())),
                "build",
            ),
            (
                ReconcileError::CreatePods {
                    pod: "ml/a-worker-0".into(),
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::DeletePods {
                    pod: "ml/a-worker-0".into(),
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::SharedChildren {
                    what: "Service ml/a".into(),
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::DeleteJob {
                    source: api_error(),
                },
                "apply",
            ),
            (
                ReconcileError::Status {
                    source: api_error(),
                },
                "status",
            ),
        ];
        for (error, label) in cases {
            assert_eq!(error.step().as_str(), label, "{error}");
        }
        let all: Vec<&str> = Step::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(all, ["fetch", "build", "apply", "status"]);
    }

    #[test]
    fn errors_say_what_was_being_done() {
        let error = ReconcileError::CreatePods {
            pod: "ml/a-worker-3".into(),
            source: api_error(),
        };
        let text = error.to_string();
        assert!(text.contains("cannot create pod ml/a-worker-3"), "{text}");
        assert!(text.contains("forbidden"), "{text}");
        assert!(std::error::Error::source(&error).is_some());
    }

    fn pod(ns: &str, name: &str, job: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some(ns.into());
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = job.map(|j| {
            [(rdu_crds::consts::LABEL_JOB_NAME.to_string(), j.to_string())]
                .into_iter()
                .collect()
        });
        pod
    }

    #[test]
    fn cached_pods_are_filtered_by_namespace_and_job_label() {
        let (store, mut writer) = reflector::store::<Pod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for p in [
            pod("ml", "a-worker-0", Some("a")),
            pod("ml", "a-worker-1", Some("a")),
            pod("ml", "ab-worker-0", Some("ab")),
            pod("other", "a-worker-0", Some("a")),
            pod("ml", "unlabelled", None),
        ] {
            writer.apply_watcher_event(&watcher::Event::InitApply(p));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut names: Vec<String> = cached_pods(&store, "ml", "a")
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        assert_eq!(names, ["a-worker-0", "a-worker-1"]);
    }
}
