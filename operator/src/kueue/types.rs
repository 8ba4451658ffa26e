//! Kueue's Workload (`kueue.x-k8s.io/v1beta2`), typed for the fields this operator reads and writes. What it only
//! carries over, or never reads, stays in each type's `other` (serialized back as it came), so a Workload read and
//! written again loses nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The API version of the Workloads this operator writes.
pub(crate) const API_VERSION: &str = "kueue.x-k8s.io/v1beta2";
pub(crate) const KIND: &str = "Workload";

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Workload {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WorkloadStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkloadSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
    /// False while the job is suspended; Kueue treats a missing field as true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_ref: Option<PriorityClassRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodSet {
    pub name: String,
    #[serde(default)]
    pub count: u64,
    #[serde(default)]
    pub template: PodTemplateSpec,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub(crate) struct PriorityClassRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

/// The status, with every field Kueue's admission manager owns (carried over by the operator's writes under that
/// manager) named or in `other`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkloadStatus {
    #[serde(default)]
    pub conditions: Vec<WorkloadCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_checks: Option<Vec<AdmissionCheckState>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulated_past_execution_time_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_requests: Option<Value>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A condition as `apimeta.SetStatusCondition` writes it; the time kept as the server wrote it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkloadCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl WorkloadCondition {
    pub(crate) fn is_true(&self) -> bool {
        self.status == "True"
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Admission {
    #[serde(default)]
    pub cluster_queue: String,
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodSetAssignment {
    pub name: String,
    /// Resource name to the ResourceFlavor it was admitted on.
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionCheckState {
    #[serde(default)]
    pub name: String,
    /// What the check asks of the pod set's pods (labels, annotations, node selector, tolerations): read by
    /// `crate::placement`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_set_updates: Vec<Value>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Workload {
    /// The status, empty when there is none yet.
    pub(crate) fn status(&self) -> WorkloadStatus {
        self.status.clone().unwrap_or_default()
    }

    /// The pod set named `name`.
    pub(crate) fn pod_set(&self, name: &str) -> Option<&PodSet> {
        self.spec.pod_sets.iter().find(|p| p.name == name)
    }

    /// The UID of the Workload's controller.
    pub(crate) fn controller_uid(&self) -> Option<&str> {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.as_str())
    }
}

impl WorkloadStatus {
    /// Condition `type_`, if set.
    pub(crate) fn condition(&self, type_: &str) -> Option<&WorkloadCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_workload_read_and_written_again_loses_nothing() {
        let live = json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": "w", "namespace": "ml", "ownerReferences": [
                {"apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob", "name": "j", "uid": "u-1", "controller": true}]},
            "spec": {"queueName": "lq", "active": false, "maximumExecutionTimeSeconds": 60,
                     "podSets": [{"name": "main", "count": 2, "minCount": 1,
                                  "template": {"spec": {"containers": [{"name": "worker"}]}}}]},
            "status": {
                "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "",
                                "lastTransitionTime": "2026-11-25T10:00:00Z", "observedGeneration": 1}],
                "admission": {"clusterQueue": "cq", "podSetAssignments": [
                    {"name": "main", "flavors": {"cpu": "f"}, "count": 2}]},
                "admissionChecks": [{"name": "c", "state": "Ready", "podSetUpdates": [{"name": "main"}]}],
                "requeueState": {"count": 1},
                "schedulingStats": {"evictions": []},
            }
        });
        let typed: Workload = serde_json::from_value(live.clone()).expect("a Workload");
        assert_eq!(typed.controller_uid(), Some("u-1"));
        assert_eq!(typed.spec.active, Some(false));
        assert!(
            typed
                .status()
                .condition("Admitted")
                .is_some_and(WorkloadCondition::is_true)
        );
        assert_eq!(serde_json::to_value(&typed).expect("serializes"), live);
    }
}
