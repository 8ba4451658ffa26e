//! The Kueue step's API calls: before the lifecycle, read (or create) the job's Workload and the flavors it was
//! admitted on; after it, write what `plan::writes` says. Everything it decides comes from `plan`.

use jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use rdu_crds::{RduJob, RduJobStatus};
use serde_json::json;
use tracing::info;

use super::patches::{self, AdmissionChange};
use super::plan::{self, Gate, Write};
use super::types::Workload;
use super::view::{PodSetAsk, WorkloadView};
use super::{
    ADMISSION_MANAGER, POD_SET, POD_SET_LABEL, PODS_READY_MANAGER, flavor_resource, workload,
    workload_resource,
};
use crate::placement::Placement;
use crate::validate::ValidJob;

/// A Kueue API call that failed.
#[derive(Debug, thiserror::Error)]
pub enum KueueError {
    #[error("cannot read Workload {name}")]
    ReadWorkload {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A create or a write (`action`: what the write was).
    #[error("cannot {action} Workload {name}")]
    WriteWorkload {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A Workload that is not one as this operator reads them (a Kueue whose API changed).
    #[error("cannot decode Workload {name}")]
    DecodeWorkload {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot read ResourceFlavor {name}")]
    Flavor {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot read PriorityClass {name} (spec.runPolicy.schedulingPolicy.priorityClassName): {source}"
    )]
    PriorityClass {
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl KueueError {
    /// Whether the call only read.
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            KueueError::Flavor { .. }
                | KueueError::PriorityClass { .. }
                | KueueError::ReadWorkload { .. }
                | KueueError::DecodeWorkload { .. }
        )
    }
}

/// What the step read before the lifecycle: the gate, the Workload (as it is on the server) and, once admitted,
/// where its pods go.
pub(crate) struct Queued {
    pub gate: Gate,
    /// What the job's `status.queue` says.
    pub status: rdu_crds::QueueStatus,
    pub workload: Option<Workload>,
    pub placement: Option<Placement>,
}

/// Reads job's Workload in LocalQueue `queue`, creating it when it does not exist and the job has not ended;
/// `rank0` is rank 0's pod as the builders make it (the pod set's template comes from it).
pub(crate) async fn before(
    client: &kube::Client,
    job: &RduJob,
    valid: &ValidJob<'_>,
    queue: &str,
    rank0: &k8s_openapi::api::core::v1::Pod,
) -> Result<Queued, KueueError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), valid.namespace, &workload_resource());
    let name = workload::workload_name(valid.name, valid.uid());
    let read = |source| KueueError::ReadWorkload {
        name: name.clone(),
        source,
    };
    let mut found = api.get_opt(&name).await.map_err(read)?;
    let finished = job
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(rdu_crds::JobPhase::is_finished);
    if found.is_none() && !finished {
        let priority = match &valid.scheduling.priority_class_name {
            Some(class) => Some(priority_of(client, class).await?),
            None => None,
        };
        let body = workload::build(
            valid,
            queue,
            workload::pod_set_template(rank0),
            !job.spec.run_policy.suspend,
            priority,
        );
        let object: DynamicObject = serde_json::to_value(body)
            .and_then(serde_json::from_value)
            .map_err(decode(&name))?;
        match api.create(&PostParams::default(), &object).await {
            Ok(created) => {
                info!(job = valid.name, namespace = valid.namespace, workload = %name, queue,
                      "created the job's Workload");
                found = Some(created);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                found = api.get_opt(&name).await.map_err(read)?;
            }
            Err(source) => {
                return Err(KueueError::WriteWorkload {
                    action: "create",
                    name,
                    source,
                });
            }
        }
    }
    let mut workload = found
        .map(|w| serde_json::to_value(w).and_then(serde_json::from_value::<Workload>))
        .transpose()
        .map_err(decode(&name))?;
    let mut view = workload.as_ref().map(WorkloadView::of);
    // The Workload must be the job's, asking what the job asks now (no generation on an admission for less).
    let asks_now = PodSetAsk::of(&workload::pod_set(
        valid.workers,
        workload::pod_set_template(rank0),
    ));
    let vetted = view
        .as_ref()
        .and_then(|v| plan::vet(v, valid.uid(), &asks_now));
    if matches!(&vetted, Some(Gate::Held { reason, .. }) if *reason == plan::WORKLOAD_CONFLICT) {
        // Someone else's: never written to.
        workload = None;
        view = None;
    }
    let mut gate = vetted.unwrap_or_else(|| plan::gate(view.as_ref(), queue));
    let status = plan::queue_status(view.as_ref(), queue);
    let mut placement = None;
    if let (Gate::Admitted, Some(view)) = (&gate, &view) {
        let flavors_api: Api<DynamicObject> = Api::all_with(client.clone(), &flavor_resource());
        let mut flavors = Vec::new();
        for flavor in &view.flavors {
            let object = flavors_api
                .get(flavor)
                .await
                .map_err(|source| KueueError::Flavor {
                    name: flavor.clone(),
                    source,
                })?;
            flavors.push(serde_json::to_value(object).expect("an object serializes"));
        }
        let podset = [(POD_SET_LABEL.to_string(), POD_SET.to_string())].into();
        let placed = Placement::of(&flavors, &view.pod_set_updates, podset)
            .and_then(|p| p.apply(&mut rank0.clone()).map(|()| p));
        match placed {
            Ok(p) => placement = Some(p),
            Err(conflict) => {
                gate = Gate::Held {
                    reason: "PlacementConflict",
                    message: format!("Kueue admitted Workload {} but {conflict}", view.name),
                }
            }
        }
    }
    Ok(Queued {
        gate,
        status,
        workload,
        placement,
    })
}

/// A Workload's (de)serialization failed.
fn decode(name: &str) -> impl Fn(serde_json::Error) -> KueueError + '_ {
    move |source| KueueError::DecodeWorkload {
        name: name.to_string(),
        source,
    }
}

/// The value of PriorityClass `class`.
async fn priority_of(client: &kube::Client, class: &str) -> Result<i32, KueueError> {
    let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    let found = classes
        .get(class)
        .await
        .map_err(|source| KueueError::PriorityClass {
            name: class.to_string(),
            source,
        })?;
    Ok(found.value)
}

/// Writes to the Workload what the lifecycle's `status` (with `live_pods` pods not yet deleted) calls for, and
/// returns what the job's `status.queue` says once they landed.
pub(crate) async fn after(
    client: &kube::Client,
    job: &RduJob,
    queued: &Queued,
    status: &RduJobStatus,
    live_pods: usize,
) -> Result<rdu_crds::QueueStatus, KueueError> {
    let Some(workload) = &queued.workload else {
        return Ok(queued.status.clone());
    };
    let view = WorkloadView::of(workload);
    let namespace = rdu_crds::job_namespace(job);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &workload_resource());
    let now = Timestamp::now();
    let end_recorded = job
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(rdu_crds::JobPhase::is_finished);
    let writes = plan::writes(
        &view,
        job.spec.run_policy.suspend,
        status,
        live_pods,
        end_recorded,
    );
    for write in &writes {
        let (action, result) = match write {
            Write::SetActive(active) => (
                "activate",
                api.patch(
                    &view.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"active": active}})),
                )
                .await,
            ),
            Write::PodsReady {
                ready,
                reason,
                message,
            } => (
                "set PodsReady on",
                api.patch_status(
                    &view.name,
                    &PatchParams::apply(PODS_READY_MANAGER).force(),
                    &Patch::Apply(patches::pods_ready(workload, *ready, reason, message, now)),
                )
                .await,
            ),
            Write::ReleaseQuota {
                requeued,
                reason,
                message,
            } => {
                let change = AdmissionChange::Release {
                    requeued: *requeued,
                    reason,
                    message,
                };
                (
                    "release the quota of",
                    api.patch_status(
                        &view.name,
                        &PatchParams::apply(ADMISSION_MANAGER).force(),
                        &Patch::Apply(patches::admission(workload, change, now)),
                    )
                    .await,
                )
            }
            Write::Finish { succeeded, message } => {
                let reason = if *succeeded { "Succeeded" } else { "Failed" };
                let change = AdmissionChange::Finish { reason, message };
                (
                    "finish",
                    api.patch_status(
                        &view.name,
                        &PatchParams::apply(ADMISSION_MANAGER).force(),
                        &Patch::Apply(patches::admission(workload, change, now)),
                    )
                    .await,
                )
            }
        };
        result.map_err(|source| KueueError::WriteWorkload {
            action,
            name: view.name.clone(),
            source,
        })?;
        info!(job = %rdu_crds::job_name(job), namespace, workload = %view.name, ?write, "wrote the Workload");
    }
    Ok(plan::queue_status_after(&queued.status, &writes))
}
