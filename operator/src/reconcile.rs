//! The reconcile pipeline: fetch -> validate -> decide/build -> apply -> status. Only fetch, apply and status
//! touch the API server; everything in between is pure. The job's pods come from the controller's pod cache (a
//! reflector store the controller's pod watch keeps), not from a LIST per reconcile, and only the pods the job
//! controls count. The apply step (`crate::apply`) creates children and never takes over an existing object.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use rdu_crds::{JobPhase, RduJob, RduJobStatus};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::apply::{Stop, apply};
use crate::builders;
use crate::context::{Context, FIELD_MANAGER};
use crate::expectations::Cached;
use crate::kueue::{self, plan::Gate};
use crate::lifecycle::{Change, Decision, Hold, JobEvent, Refusal, decide, refuse};
use crate::ownership::controlled_by;
use crate::step::ReconcileError;
use crate::validate::ValidJob;

/// How often a job is looked at again when no timer or watch event asks sooner.
pub(crate) const RESYNC: Duration = Duration::from_secs(300);
/// How soon a job whose cached status is behind the operator's own write is looked at again (its watch event
/// usually wakes it sooner).
pub(crate) const WAIT_FOR_STATUS: Duration = Duration::from_secs(1);
/// How soon a job waiting for an object to go away (an earlier job's child the garbage collector removes) is
/// looked at again.
pub(crate) const WAIT_FOR_LEAVING: Duration = Duration::from_secs(2);

/// How soon a job whose write met a newer version of its object (409 `Conflict`) is reconciled again.
pub const AFTER_CONFLICT: Duration = Duration::from_millis(200);
/// The log line of such a reconcile (info, not an error: the e2e soak counts these apart from failures).
pub const CONFLICT_RETRIED: &str =
    "a write found its object changed since it was read; reconciling again from a fresh read";

/// What the fetch step read.
enum Fetch {
    /// The job's pods; the cache shows every pod write of earlier reconciles.
    Current(Vec<Arc<Pod>>),
    /// The cache is behind this job's own pod writes: wait for the watch.
    Behind(crate::expectations::Behind),
    /// The job cache is behind this operator's own status write (`status_writes`), or a pod of generation `seen`
    /// exists while the cached status says generation `cached` (the reconcile that started a generation created
    /// its pods, and their watch events came before the status's). Deciding from that status would, for instance,
    /// take the new pods for an old generation's; wait for the job's watch event.
    StaleJob { cached: u32, seen: u32 },
}

/// One reconcile of one job.
pub async fn reconcile(job: Arc<RduJob>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let result = run_pipeline(&job, &ctx).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    match result {
        Err(error) if error.is_conflict() => {
            ctx.metrics.conflicts.inc();
            info!(job = %job.name_any(), namespace = ?job.namespace(), step = error.step().as_str(),
                  error = %rdu_error_chain::Chain(&error),
                  "{CONFLICT_RETRIED}");
            Ok(Action::requeue(AFTER_CONFLICT))
        }
        Err(error) => {
            ctx.metrics.count_error(error.step());
            Err(error)
        }
        done => done,
    }
}

/// Retry a failed reconcile with a bounded backoff.
pub fn error_policy(job: Arc<RduJob>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    warn!(job = %job.name_any(), namespace = ?job.namespace(), step = error.step().as_str(), error = %rdu_error_chain::Chain(error),
          "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// The key of a job's pod expectations: its uid (a job deleted and created again under the same name is another
/// job; the apply step records a valid job's writes under `ValidJob::uid`), else its namespace and name.
pub(crate) fn job_key(job: &RduJob) -> String {
    job.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            builders::job_namespace(job),
            builders::job_name(job)
        )
    })
}

async fn run_pipeline(job: &RduJob, ctx: &Context) -> Result<Action, ReconcileError> {
    if job.metadata.deletion_timestamp.is_some() {
        ctx.expectations.forget(&job_key(job));
        ctx.status_writes.forget(&job_key(job));
        return Ok(Action::await_change());
    }
    if !ctx.caches.is_synced() {
        debug!(job = %job.name_any(), "the caches are still listing; waiting");
        return Ok(Action::requeue(WAIT_FOR_STATUS));
    }
    let pods = match fetch(job, ctx) {
        Fetch::Current(pods) => pods,
        Fetch::Behind(behind) => {
            debug!(job = %job.name_any(), created = behind.created, deleted = behind.deleted,
                   "the pod cache is behind this job's own writes; waiting for the watch");
            return Ok(Action::requeue(behind.expires_in));
        }
        Fetch::StaleJob { cached, seen } => {
            debug!(job = %job.name_any(), cached, seen,
                   "the job cache is behind this operator's status write; waiting for the watch");
            return Ok(Action::requeue(WAIT_FOR_STATUS));
        }
    };
    let now = Timestamp::now();
    let mut waiting = None;
    let decision = match crate::validate(job, &ctx.settings.limits) {
        Err(errors) => {
            let status = job.status.clone().unwrap_or_default();
            refuse(job, status, Refusal::InvalidSpec, &errors.to_string(), now)
        }
        Ok(mut valid) => {
            let queued = queue(job, &valid, ctx).await?;
            let hold = queued.as_ref().and_then(|q| hold_of(&q.gate));
            valid.placement = queued.as_ref().and_then(|q| q.placement.clone());
            let cluster = ctx.nodes.view(job, &pods, &ctx.pods);
            let pod_refs = pods.iter().map(|p| p.as_ref());
            let mut decision = decide(&valid, pod_refs, &cluster, now, hold.as_ref());
            decision.status.queue = queued.as_ref().map(|q| q.status.clone());
            match apply(&valid, ctx, &decision.changes).await {
                Ok(()) => {
                    if let Some(queued) = &queued {
                        let status = &decision.status;
                        let queue =
                            kueue::sync::after(&ctx.client, job, queued, status, pods.len())
                                .await?;
                        decision.status.queue = Some(queue);
                    }
                    decision
                }
                Err(Stop::Failed(error)) => return Err(error),
                Err(Stop::Conflict(conflict)) => {
                    warn!(job = valid.name, namespace = valid.namespace, %conflict, "the job cannot run");
                    let message = conflict.to_string();
                    refuse(job, decision.status, Refusal::ChildConflict, &message, now)
                }
                Err(Stop::Waiting(what)) => {
                    info!(job = valid.name, namespace = valid.namespace, %what, "waiting");
                    waiting = Some(WAIT_FOR_LEAVING);
                    decision
                }
            }
        }
    };
    write_status(job, ctx, &decision).await?;
    observe_creation_latency(job, ctx, &decision, now);
    let after = [decision.requeue_after, waiting]
        .into_iter()
        .flatten()
        .min();
    Ok(Action::requeue(after.unwrap_or(RESYNC)))
}

/// Step 2b, for a job queued in Kueue (`--kueue` and the queue label, or `--kueue-default-queue`): its Workload
/// read or created, whether it may have pods, and where Kueue's admission puts them.
async fn queue(
    job: &RduJob,
    valid: &ValidJob<'_>,
    ctx: &Context,
) -> Result<Option<kueue::sync::Queued>, ReconcileError> {
    let default_queue = ctx.settings.kueue_default_queue.as_deref();
    let Some(queue) = kueue::queue_name(job)
        .or(default_queue)
        .filter(|_| ctx.settings.kueue)
    else {
        return Ok(None);
    };
    let generation = job.status.as_ref().map_or(0, |s| s.restarts);
    let rank0 = builders::rank_pod(valid, 0, generation, None);
    Ok(Some(
        kueue::sync::before(&ctx.client, job, valid, queue, &rank0).await?,
    ))
}

/// The lifecycle's hold for a Kueue gate that is not open.
fn hold_of(gate: &Gate) -> Option<Hold> {
    match gate {
        Gate::Admitted => None,
        Gate::Held { reason, message } => Some(Hold {
            reason,
            message: message.clone(),
            eviction: *reason == kueue::plan::EVICTED,
        }),
    }
}

/// Step 1: the job's pods from the controller's cache, unless it is behind this job's own writes. No API call.
fn fetch(job: &RduJob, ctx: &Context) -> Fetch {
    let ns = builders::job_namespace(job);
    let cached = |pod: &str| match ctx.pods.get(&ObjectRef::new(pod).within(ns)) {
        None => Cached::Absent,
        Some(p) if p.metadata.deletion_timestamp.is_some() => Cached::Terminating,
        Some(_) => Cached::Live,
    };
    if let Some(behind) = ctx.expectations.behind(&job_key(job), cached) {
        return Fetch::Behind(behind);
    }
    let generation = job.status.as_ref().map_or(0, |s| s.restarts);
    if ctx
        .status_writes
        .behind(&job_key(job), job.status.as_ref())
        .is_some()
    {
        return Fetch::StaleJob {
            cached: generation,
            seen: generation,
        };
    }
    let pods = cached_pods(
        &ctx.pods,
        ns,
        builders::job_name(job),
        job.metadata.uid.as_deref().unwrap_or_default(),
    );
    let cached = job.status.as_ref().map_or(0, |s| s.restarts);
    match newest_generation(&pods) {
        Some(seen) if seen > cached => Fetch::StaleJob { cached, seen },
        _ => Fetch::Current(pods),
    }
}

/// The highest generation label among `pods`.
fn newest_generation(pods: &[Arc<Pod>]) -> Option<u32> {
    pods.iter()
        .filter_map(|p| {
            p.metadata
                .labels
                .as_ref()?
                .get(rdu_crds::consts::LABEL_GENERATION)?
                .parse()
                .ok()
        })
        .max()
}

/// The pods of job `name` (uid `uid`) in namespace `ns` held by the cache: those labelled
/// `rdu.dev/job-name=<name>` whose controller is the job. A pod labelled alike that the job does not control is
/// someone else's: neither counted nor deleted.
pub(crate) fn cached_pods(store: &Store<Pod>, ns: &str, name: &str, uid: &str) -> Vec<Arc<Pod>> {
    store.state_filter(|pod| {
        pod.metadata.namespace.as_deref() == Some(ns)
            && pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(rdu_crds::consts::LABEL_JOB_NAME))
                .is_some_and(|job| job == name)
            && controlled_by(&pod.metadata, uid)
    })
}

/// Step 5: the status subresource (server-side apply) and an event per transition.
async fn write_status(
    job: &RduJob,
    ctx: &Context,
    decision: &Decision,
) -> Result<(), ReconcileError> {
    if decision.changes.contains(&Change::DeleteJob) {
        return publish_events(job, ctx, &decision.events).await;
    }
    if job.status.as_ref() != Some(&decision.status) {
        let jobs: Api<RduJob> = Api::namespaced(ctx.client.clone(), builders::job_namespace(job));
        let written = jobs
            .patch_status(
                &job.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(status_patch(&decision.status)),
            )
            .await;
        match stored_status(written)? {
            Some(stored) => {
                if let Some(status) = &stored.status {
                    ctx.status_writes.written(&job_key(job), status);
                }
            }
            None => {
                tracing::debug!(job = %job.name_any(), "job deleted before its status was written");
                return Ok(());
            }
        }
    }
    publish_events(job, ctx, &decision.events).await
}

/// The job as the status write stored it; none when the job was deleted since it was read (a user deleting a
/// finished job while its last reconcile runs): its children go with it, there is nothing to record and no error
/// to retry.
fn stored_status(written: Result<RduJob, kube::Error>) -> Result<Option<RduJob>, ReconcileError> {
    match written {
        Ok(stored) => Ok(Some(stored)),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
        Err(source) => Err(ReconcileError::Status { source }),
    }
}

/// The object server-side apply needs for the status subresource. `progress` is left out while the job runs: the
/// progress endpoint owns it under its own field manager, and an apply from this one must neither take it over nor
/// roll it back to what the cache held. A job that succeeded with a result has the last word on it: its last step,
/// 100 % (`TrainingProgress::completed`), whatever report reached the endpoint last.
pub(crate) fn status_patch(status: &RduJobStatus) -> serde_json::Value {
    let finished = status.phase == Some(JobPhase::Succeeded) && status.result.is_some();
    let status = RduJobStatus {
        progress: status.progress.clone().filter(|_| finished),
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
            warn!(job = %job.name_any(), error = %rdu_error_chain::Chain(&error), reason = e.reason, "could not publish event");
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        crate::test_fixtures::api_error(code, reason, "rdujobs.rdu.dev \"a\"")
    }

    #[test]
    fn a_status_write_to_a_deleted_job_is_no_error_and_other_failures_are() {
        assert!(matches!(
            stored_status(Err(api_error(404, "NotFound"))),
            Ok(None)
        ));
        assert!(matches!(
            stored_status(Err(api_error(409, "Conflict"))),
            Err(ReconcileError::Status { .. })
        ));
        assert!(matches!(
            stored_status(Ok(crate::test_fixtures::job("a", Some("ml"), 2))),
            Ok(Some(_))
        ));
    }

    #[test]
    fn the_status_apply_leaves_progress_to_the_endpoint_until_the_job_succeeded_with_a_result() {
        let running = RduJobStatus {
            phase: Some(JobPhase::Running),
            progress: Some(rdu_crds::TrainingProgress::default()),
            ..RduJobStatus::default()
        };
        assert!(status_patch(&running)["status"].get("progress").is_none());
        let no_result = RduJobStatus {
            phase: Some(JobPhase::Succeeded),
            ..running.clone()
        };
        assert!(status_patch(&no_result)["status"].get("progress").is_none());
        let done = RduJobStatus {
            result: Some(rdu_crds::JobResult::default()),
            ..no_result
        };
        assert!(status_patch(&done)["status"]["progress"].is_object());
    }

    fn pod(ns: &str, name: &str, job: Option<&str>, controller_uid: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some(ns.into());
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = job.map(|j| {
            [(rdu_crds::consts::LABEL_JOB_NAME.to_string(), j.to_string())]
                .into_iter()
                .collect()
        });
        pod.metadata.owner_references = controller_uid.map(|uid| {
            vec![OwnerReference {
                api_version: "rdu.dev/v1alpha1".into(),
                kind: "RduJob".into(),
                name: job.unwrap_or_default().into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        });
        pod
    }

    #[test]
    fn the_newest_generation_label_among_the_pods_is_found() {
        let at = |generation: &str| {
            let mut p = pod("ml", "a-worker-0", Some("a"), Some("u-a"));
            p.metadata.labels.get_or_insert_default().insert(
                rdu_crds::consts::LABEL_GENERATION.to_string(),
                generation.to_string(),
            );
            Arc::new(p)
        };
        assert_eq!(newest_generation(&[]), None);
        assert_eq!(newest_generation(&[at("1"), at("3"), at("2")]), Some(3));
        assert_eq!(
            newest_generation(&[at("x"), Arc::new(pod("ml", "b", None, None))]),
            None
        );
    }

    #[test]
    fn cached_pods_are_the_jobs_own_by_namespace_label_and_controller() {
        let (store, mut writer) = reflector::store::<Pod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for p in [
            pod("ml", "a-worker-0", Some("a"), Some("u-a")),
            pod("ml", "a-worker-1", Some("a"), Some("u-a")),
            pod("ml", "ab-worker-0", Some("ab"), Some("u-ab")),
            pod("other", "a-worker-0", Some("a"), Some("u-a")),
            pod("ml", "unlabelled", None, Some("u-a")),
            // Labelled as a's, but not a's: someone else's, and an earlier job a's.
            pod("ml", "a-worker-2", Some("a"), None),
            pod("ml", "a-worker-3", Some("a"), Some("u-old")),
        ] {
            writer.apply_watcher_event(&watcher::Event::InitApply(p));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut names: Vec<String> = cached_pods(&store, "ml", "a", "u-a")
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        assert_eq!(names, ["a-worker-0", "a-worker-1"]);
        assert!(
            cached_pods(&store, "ml", "a", "").is_empty(),
            "a job without a uid owns nothing"
        );
    }
}
