//! What every reconcile shares: the client, the event recorder, the metrics, the controller's pod and node caches,
//! the pod writes the pod cache has not shown yet, and the operator's settings.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;

use crate::expectations::Expectations;
use crate::metrics::Metrics;
use crate::node_cache::NodeCache;
use crate::status_writes::StatusWrites;
use crate::validate::Limits;

/// Field manager of every write the operator makes to a job's children and status.
pub const FIELD_MANAGER: &str = "rdu-operator";

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The controller's pod cache: every pod carrying `rdu.dev/job-name`, kept by the controller's pod watch.
    pub pods: Store<Pod>,
    /// The controller's node cache: which nodes are lost, and what room they have for a new generation.
    pub nodes: NodeCache,
    /// Pod writes the cache has not shown yet.
    pub expectations: Expectations,
    /// Status writes the job cache has not shown yet.
    pub status_writes: StatusWrites,
    /// Ready once the job, pod and node caches hold their first full list (what /readyz says). A reconcile woken
    /// while the pod watch is still listing waits: the listed pods reach the store only when the list ends, so
    /// deciding earlier would take a running gang's pods for vanished (an operator that just took over the Lease
    /// failed running jobs so).
    pub caches: Arc<crate::health::Health>,
    /// What the operator was told by its flags (the chart's values) and found at start.
    pub settings: Settings,
}

/// What the operator was told by its flags (the chart's values) and found at start.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Whether scheduler-plugins' PodGroup CRD is installed (checked at start-up).
    pub pod_groups: bool,
    /// Whether every job gets a NetworkPolicy admitting only its own pods to the worker ports.
    pub network_policies: bool,
    /// Whether jobs labelled `kueue.x-k8s.io/queue-name` wait for Kueue's admission (`--kueue`).
    pub kueue: bool,
    /// With `kueue`, the LocalQueue of jobs without the label (`--kueue-default-queue`, as Kueue's
    /// `manageJobsWithoutQueueName`): none lets them run unqueued, outside every quota.
    pub kueue_default_queue: Option<String>,
    /// The operator's own base URL for rank 0's progress reports (DESIGN 4.8); none: ranks do not report.
    pub progress_url: Option<String>,
    /// What this operator runs at most (`--max-workers-per-job`) and lets a pod template ask for.
    pub limits: Limits,
}

/// The flags' defaults: NetworkPolicies on; no PodGroups, Kueue or progress endpoint; the default limits.
impl Default for Settings {
    fn default() -> Settings {
        Settings {
            pod_groups: false,
            network_policies: true,
            kueue: false,
            kueue_default_queue: None,
            progress_url: None,
            limits: Limits::default(),
        }
    }
}

impl Context {
    /// The context of the operator `instance` (its events' reporting instance): the caches its watches fill and
    /// its settings; no pod or status write pending.
    pub fn new(
        client: Client,
        instance: Option<String>,
        metrics: Arc<Metrics>,
        pods: Store<Pod>,
        nodes: NodeCache,
        caches: Arc<crate::health::Health>,
        settings: Settings,
    ) -> Context {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance,
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            pods,
            nodes,
            expectations: Expectations::default(),
            status_writes: StatusWrites::default(),
            caches,
            settings,
        }
    }
}
