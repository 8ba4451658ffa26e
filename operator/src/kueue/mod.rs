//! Kueue: an RduJob labelled `kueue.x-k8s.io/queue-name` waits in Kueue's queue as a Workload and runs only while
//! Kueue admits it. Kueue treats RduJob as an external framework (`integrations.externalFrameworks:
//! ["RduJob.v1alpha1.rdu.dev"]`), which only tells it the kind exists: as Kueue's own job controllers do
//! (`jobframework.ReconcileGenericJob`), this operator creates the job's Workload (named and labelled as Kueue
//! names its own, owned by the job, one pod set of the job's ranks), creates no pod before the Workload is
//! admitted, puts the admission's placement (the flavors' node labels and tolerations, admission checks' pod set
//! updates) on the pods it creates, keeps the Workload's `PodsReady` condition true to life, stops the gang when
//! Kueue evicts it and then releases the quota (clears the reservation, as Kueue's controllers do), and marks the
//! Workload finished when the job ends. `workload` builds the object, `view` reads one, `crate::placement` is where an
//! admission puts the pods, `plan` decides (pure), `patches` are the status writes Kueue expects, `sync` is the
//! only part that talks to the API server.

pub(crate) mod patches;
pub(crate) mod plan;
pub(crate) mod sync;
pub(crate) mod types;
pub(crate) mod view;
pub(crate) mod workload;

use kube::core::{ApiResource, GroupVersionKind};

/// The label that puts a job in a LocalQueue.
pub(crate) const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label naming the owner job's UID on its Workload.
pub const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
/// The one pod set of an RduJob's Workload (Kueue's default name).
pub(crate) const POD_SET: &str = "main";
/// The label Kueue puts on the pods of a pod set.
pub(crate) const POD_SET_LABEL: &str = "kueue.x-k8s.io/podset";
/// The field manager of the admission part of a Workload's status (Kueue's `kueue-admission`): releasing the quota
/// and finishing are applied under it, as Kueue's own job controllers apply them.
pub(crate) const ADMISSION_MANAGER: &str = "kueue-admission";
/// The field manager of the `PodsReady` condition (Kueue's job controllers: `kueue-job-controller-PodsReady`).
pub(crate) const PODS_READY_MANAGER: &str = "kueue-job-controller-PodsReady";

/// Kueue's Workload resource (`kueue.x-k8s.io/v1beta2`).
pub fn workload_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    )
}

/// Kueue's ResourceFlavor resource (cluster-scoped).
pub(crate) fn flavor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "ResourceFlavor"),
        "resourceflavors",
    )
}

/// The LocalQueue a job asks for, if it asks for one.
pub(crate) fn queue_name(job: &rdu_crds::RduJob) -> Option<&str> {
    job.metadata
        .labels
        .as_ref()?
        .get(QUEUE_LABEL)
        .map(String::as_str)
        .filter(|q| !q.is_empty())
}
