//! What the operator reads of a Workload: its admission (the cluster queue, the flavors of the pod set, the
//! admission checks' pod set updates) and the conditions Kueue sets (`QuotaReserved`, `Admitted`, `Evicted`,
//! `Finished`) and the one the operator keeps (`PodsReady`).

use serde_json::Value;

use super::POD_SET;
use super::types::{PodSet, Workload};

/// A condition's status, reason and message.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Condition {
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// One Workload, as the plan needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct WorkloadView {
    pub name: String,
    pub active: bool,
    pub quota_reserved: bool,
    pub admitted: bool,
    pub evicted: Option<Condition>,
    pub finished: bool,
    pub pods_ready: Option<Condition>,
    /// The cluster queue of the admission.
    pub cluster_queue: Option<String>,
    /// The ResourceFlavors the pod set was admitted on (each resource's), without repeats.
    pub flavors: Vec<String>,
    /// The admission checks' `podSetUpdates` entries for the pod set.
    pub pod_set_updates: Vec<Value>,
    /// The UID of the Workload's controller (its job, when it is the job's).
    pub controller_uid: Option<String>,
    /// What its quota was asked for: the pod set's count and its template's containers' requests.
    pub asked: PodSetAsk,
}

/// What a pod set asks of the quota: how many pods, and each container's requests (name, resource, quantity).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodSetAsk {
    pub count: u64,
    pub requests: Vec<(String, String, String)>,
}

impl PodSetAsk {
    /// The ask of `pod_set` (a Workload's, or one as `workload::build` makes it).
    pub(crate) fn of(pod_set: &PodSet) -> PodSetAsk {
        let spec = pod_set.template.spec.as_ref();
        let mut requests: Vec<(String, String, String)> = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .chain(spec.into_iter().flat_map(|s| &s.containers))
            .flat_map(|c| {
                let requests = c
                    .resources
                    .as_ref()
                    .and_then(|r| r.requests.clone())
                    .unwrap_or_default();
                requests
                    .into_iter()
                    .map(|(resource, quantity)| (c.name.clone(), resource, quantity.0))
            })
            .collect();
        requests.sort();
        PodSetAsk {
            count: pod_set.count,
            requests,
        }
    }
}

impl WorkloadView {
    pub(crate) fn of(workload: &Workload) -> WorkloadView {
        let status = workload.status();
        let condition = |type_: &str| {
            status.condition(type_).map(|c| Condition {
                status: c.is_true(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
        };
        let is_true = |type_: &str| condition(type_).is_some_and(|c| c.status);
        let mut flavors: Vec<String> = status
            .admission
            .iter()
            .flat_map(|a| &a.pod_set_assignments)
            .filter(|a| a.name == POD_SET)
            .flat_map(|a| a.flavors.values().cloned())
            .collect();
        flavors.sort();
        flavors.dedup();
        let pod_set_updates = status
            .admission_checks
            .iter()
            .flatten()
            .flat_map(|c| c.pod_set_updates.iter().cloned())
            .filter(|u| u["name"] == POD_SET)
            .collect();
        WorkloadView {
            controller_uid: workload.controller_uid().map(str::to_string),
            asked: workload
                .pod_set(POD_SET)
                .map(PodSetAsk::of)
                .unwrap_or_default(),
            name: workload.metadata.name.clone().unwrap_or_default(),
            active: workload.spec.active.unwrap_or(true),
            quota_reserved: is_true("QuotaReserved"),
            admitted: is_true("Admitted"),
            evicted: condition("Evicted").filter(|c| c.status),
            finished: is_true("Finished"),
            pods_ready: condition("PodsReady"),
            cluster_queue: status.admission.as_ref().map(|a| a.cluster_queue.clone()),
            flavors,
            pod_set_updates,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(workload: Value) -> WorkloadView {
        WorkloadView::of(&serde_json::from_value(workload).expect("a Workload"))
    }

    #[test]
    fn an_admitted_workload_names_its_queue_flavors_and_updates() {
        let view = view(json!({
            "metadata": {"name": "rdujob-a-12345"},
            "spec": {"active": true},
            "status": {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
                    {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
                    {"type": "Evicted", "status": "False", "reason": "x", "message": ""},
                ],
                "admission": {"clusterQueue": "cq", "podSetAssignments": [
                    {"name": "main", "flavors": {"rdu.dev/tile": "pool-a", "cpu": "pool-a", "memory": "default"}}
                ]},
                "admissionChecks": [{"name": "check", "state": "Ready",
                    "podSetUpdates": [{"name": "main", "labels": {"a": "b"}}, {"name": "other"}]}],
            }
        }));
        assert!(view.admitted && view.quota_reserved && view.active && !view.finished);
        assert_eq!(
            view.evicted, None,
            "a False Evicted condition is no eviction"
        );
        assert_eq!(view.cluster_queue.as_deref(), Some("cq"));
        assert_eq!(view.flavors, ["default", "pool-a"]);
        assert_eq!(view.pod_set_updates.len(), 1);
    }

    #[test]
    fn an_evicted_workload_says_why() {
        let view = view(json!({"status": {"conditions": [
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "preempted by b"}]}}));
        let evicted = view.evicted.expect("evicted");
        assert_eq!(
            (evicted.reason.as_str(), evicted.message.as_str()),
            ("Preempted", "preempted by b")
        );
        assert!(!view.admitted && view.active, "active defaults to true");
    }
}
