//! What the operator reads of a Workload: its admission (the cluster queue, the flavors of the pod set, the
//! admission checks' pod set updates) and the conditions Kueue sets (`QuotaReserved`, `Admitted`, `Evicted`,
//! `Finished`) and the one the operator keeps (`PodsReady`).

use serde_json::Value;

use super::POD_SET;

/// A condition's status, reason and message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Condition {
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// One Workload, as the plan needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadView {
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
pub struct PodSetAsk {
    pub count: u64,
    pub requests: Vec<(String, String, String)>,
}

impl PodSetAsk {
    /// The ask of pod set `pod_set` (a Workload's `spec.podSets[]` entry, or one as `workload::build` makes it).
    pub fn of(pod_set: &Value) -> PodSetAsk {
        let spec = &pod_set["template"]["spec"];
        let mut requests: Vec<(String, String, String)> = ["initContainers", "containers"]
            .iter()
            .flat_map(|list| spec[*list].as_array().cloned().unwrap_or_default())
            .flat_map(|c| {
                let name = c["name"].as_str().unwrap_or_default().to_string();
                c["resources"]["requests"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |(resource, q)| {
                        let quantity = q.as_str().map_or_else(|| q.to_string(), str::to_string);
                        (name.clone(), resource, quantity)
                    })
            })
            .collect();
        requests.sort();
        PodSetAsk {
            count: pod_set["count"].as_u64().unwrap_or_default(),
            requests,
        }
    }
}

impl WorkloadView {
    pub fn of(workload: &Value) -> WorkloadView {
        let status = &workload["status"];
        let condition = |type_: &str| {
            status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_)
                .map(|c| Condition {
                    status: c["status"] == "True",
                    reason: c["reason"].as_str().unwrap_or_default().to_string(),
                    message: c["message"].as_str().unwrap_or_default().to_string(),
                })
        };
        let is_true = |type_: &str| condition(type_).is_some_and(|c| c.status);
        let assignment = status["admission"]["podSetAssignments"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["name"] == POD_SET);
        let mut flavors: Vec<String> = assignment
            .and_then(|a| a["flavors"].as_object())
            .into_iter()
            .flatten()
            .filter_map(|(_, f)| f.as_str().map(str::to_string))
            .collect();
        flavors.sort();
        flavors.dedup();
        let pod_set_updates = status["admissionChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["podSetUpdates"].as_array().cloned().unwrap_or_default())
            .filter(|u| u["name"] == POD_SET)
            .collect();
        let pod_set = workload["spec"]["podSets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == POD_SET)
            .cloned()
            .unwrap_or_default();
        let controller_uid = workload["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["controller"] == true)
            .and_then(|o| o["uid"].as_str())
            .map(str::to_string);
        WorkloadView {
            controller_uid,
            asked: PodSetAsk::of(&pod_set),
            name: workload["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            active: workload["spec"]["active"].as_bool().unwrap_or(true),
            quota_reserved: is_true("QuotaReserved"),
            admitted: is_true("Admitted"),
            evicted: condition("Evicted").filter(|c| c.status),
            finished: is_true("Finished"),
            pods_ready: condition("PodsReady"),
            cluster_queue: status["admission"]["clusterQueue"]
                .as_str()
                .map(str::to_string),
            flavors,
            pod_set_updates,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_admitted_workload_names_its_queue_flavors_and_updates() {
        let view = WorkloadView::of(&json!({
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
        let view = WorkloadView::of(&json!({"status": {"conditions": [
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "preempted by b"}]}}));
        let evicted = view.evicted.expect("evicted");
        assert_eq!(
            (evicted.reason.as_str(), evicted.message.as_str()),
            ("Preempted", "preempted by b")
        );
        assert!(!view.admitted && view.active, "active defaults to true");
    }
}
