//! The status writes Kueue expects from a job controller, as server-side apply bodies built from the live
//! Workload. `PodsReady` goes under its own field manager; releasing the quota and finishing go under Kueue's
//! `kueue-admission`, with every field that manager owns carried over as `workload.PrepareWorkloadPatch` does
//! (what an apply leaves out, its manager gives up), and the resourceVersion as a precondition.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::types::{API_VERSION, KIND, Workload, WorkloadCondition, WorkloadStatus};

/// The conditions Kueue's admission manager owns (`admissionManagedConditions`).
const ADMISSION_CONDITIONS: [&str; 8] = [
    "QuotaReserved",
    "BlockedOnPreemptionGates",
    "Evicted",
    "Admitted",
    "Preempted",
    "Requeued",
    "DeactivationTarget",
    "Finished",
];

/// Status fields the admission manager writes beside its conditions and does not name in `WorkloadStatus`,
/// carried over unchanged (with `admissionChecks`, `accumulatedPastExecutionTimeSeconds`, `admission` and
/// `resourceRequests`, which it names).
const ADMISSION_FIELDS: [&str; 5] = [
    "requeueState",
    "schedulingStats",
    "clusterName",
    "nominatedClusterNames",
    "unhealthyNodes",
];

/// The apply body: the Workload's name and namespace (with `strict` its UID and resourceVersion as
/// preconditions) and `status`; no spec, which an apply would otherwise claim.
fn body(workload: &Workload, strict: bool, status: WorkloadStatus) -> Value {
    let meta = &workload.metadata;
    let metadata = ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone().filter(|_| strict),
        resource_version: meta.resource_version.clone().filter(|_| strict),
        ..ObjectMeta::default()
    };
    json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "status": status})
}

/// Sets condition `type_` in `conditions` as `apimeta.SetStatusCondition` does: the transition time changes only
/// when the status does. Returns whether anything changed.
fn set_condition(
    conditions: &mut Vec<WorkloadCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let mut new = WorkloadCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.chars().take(32 * 1024).collect(),
        last_transition_time: Some(now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            let changed = *old != new;
            *old = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// The `PodsReady` condition alone (field manager `kueue-job-controller-PodsReady`).
pub(crate) fn pods_ready(
    workload: &Workload,
    ready: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Value {
    let mut conditions: Vec<WorkloadCondition> = workload
        .status()
        .conditions
        .into_iter()
        .filter(|c| c.type_ == "PodsReady")
        .collect();
    set_condition(
        &mut conditions,
        "PodsReady",
        ready,
        reason,
        message,
        workload.metadata.generation,
        now,
    );
    let status = WorkloadStatus {
        conditions,
        ..WorkloadStatus::default()
    };
    body(workload, false, status)
}

/// A change to the admission part of the status.
pub(crate) enum AdmissionChange<'a> {
    /// `UnsetQuotaReservationWithCondition("Pending", message)`, `SetRequeuedCondition` and `SyncAdmittedCondition`.
    Release {
        requeued: bool,
        reason: &'a str,
        message: &'a str,
    },
    /// `SetFinishedCondition`.
    Finish { reason: &'a str, message: &'a str },
}

/// The admission manager's part of the status after `change` (field manager `kueue-admission`, strict).
pub(crate) fn admission(workload: &Workload, change: AdmissionChange<'_>, now: Timestamp) -> Value {
    let live = workload.status();
    let generation = workload.metadata.generation;
    let mut out = WorkloadStatus {
        conditions: live
            .conditions
            .iter()
            .filter(|c| ADMISSION_CONDITIONS.contains(&c.type_.as_str()))
            .cloned()
            .collect(),
        admission: live.admission.clone(),
        admission_checks: live.admission_checks.clone(),
        accumulated_past_execution_time_seconds: live.accumulated_past_execution_time_seconds,
        resource_requests: None,
        other: ADMISSION_FIELDS
            .iter()
            .filter_map(|field| {
                live.other
                    .get(*field)
                    .map(|v| (field.to_string(), v.clone()))
            })
            .filter(|(_, v)| !v.is_null())
            .collect(),
    };
    let conditions = &mut out.conditions;
    match change {
        AdmissionChange::Release {
            requeued,
            reason,
            message,
        } => {
            set_condition(
                conditions, "Requeued", requeued, reason, message, generation, now,
            );
            set_condition(
                conditions,
                "QuotaReserved",
                false,
                "Pending",
                message,
                generation,
                now,
            );
            out.admission = None;
            let admitted_since = conditions
                .iter()
                .find(|c| c.type_ == "Admitted" && c.is_true())
                .and_then(|c| c.last_transition_time.as_deref())
                .and_then(|t| t.parse::<Timestamp>().ok());
            if let Some(since) = admitted_since {
                let ran = (now.as_second() - since.as_second()).max(0);
                let before = live.accumulated_past_execution_time_seconds.unwrap_or(0);
                out.accumulated_past_execution_time_seconds = Some(before + ran);
                set_condition(
                    conditions,
                    "Admitted",
                    false,
                    "NoReservation",
                    "The workload has no reservation",
                    generation,
                    now,
                );
            }
        }
        AdmissionChange::Finish { reason, message } => {
            set_condition(
                conditions, "Finished", true, reason, message, generation, now,
            );
        }
    }
    out.resource_requests = match out.admission {
        None => live.resource_requests.clone().filter(|r| !r.is_null()),
        Some(_) => Some(json!([])),
    };
    body(workload, true, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Workload {
        serde_json::from_value(json!({
            "metadata": {"name": "rdujob-a-1", "namespace": "ml", "uid": "w-1", "resourceVersion": "42",
                         "generation": 1},
            "status": {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
                     "lastTransitionTime": "2026-11-25T10:00:00Z"},
                    {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "",
                     "lastTransitionTime": "2026-11-25T10:00:00Z"},
                    {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by b",
                     "lastTransitionTime": "2026-11-25T10:01:00Z"},
                    {"type": "PodsReady", "status": "True", "reason": "Started", "message": "",
                     "lastTransitionTime": "2026-11-25T10:00:30Z"},
                ],
                "admission": {"clusterQueue": "cq", "podSetAssignments": []},
                "schedulingStats": {"evictions": [{"reason": "Preempted", "count": 1}]},
            }
        }))
        .expect("a Workload")
    }

    /// The keys of `value`, sorted.
    fn keys(value: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = value
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        keys
    }

    fn condition<'a>(body: &'a Value, type_: &str) -> &'a Value {
        body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap_or(&Value::Null)
    }

    #[test]
    fn releasing_the_quota_clears_the_admission_and_keeps_what_the_manager_owns() {
        let now: Timestamp = "2026-11-25T10:02:00Z".parse().unwrap();
        let body = admission(
            &workload(),
            AdmissionChange::Release {
                requeued: true,
                reason: "Preempted",
                message: "by b",
            },
            now,
        );
        assert_eq!(
            body["metadata"]["resourceVersion"], "42",
            "strict: a precondition"
        );
        // What an apply names, its manager keeps; what it leaves out, its manager gives up.
        assert_eq!(keys(&body), ["apiVersion", "kind", "metadata", "status"]);
        assert_eq!(
            keys(&body["status"]),
            [
                "accumulatedPastExecutionTimeSeconds",
                "conditions",
                "schedulingStats"
            ]
        );
        assert!(body["status"]["admission"].is_null());
        assert_eq!(condition(&body, "QuotaReserved")["status"], "False");
        assert_eq!(condition(&body, "QuotaReserved")["reason"], "Pending");
        assert_eq!(condition(&body, "Admitted")["reason"], "NoReservation");
        assert_eq!(condition(&body, "Requeued")["status"], "True");
        assert_eq!(
            condition(&body, "Evicted")["status"],
            "True",
            "kept as it was"
        );
        assert!(
            condition(&body, "PodsReady").is_null(),
            "not the admission manager's"
        );
        assert_eq!(body["status"]["accumulatedPastExecutionTimeSeconds"], 120);
        assert_eq!(
            body["status"]["schedulingStats"],
            json!({"evictions": [{"reason": "Preempted", "count": 1}]})
        );
    }

    #[test]
    fn finishing_keeps_the_admission_and_sets_finished() {
        let now: Timestamp = "2026-11-25T10:02:00Z".parse().unwrap();
        let body = admission(
            &workload(),
            AdmissionChange::Finish {
                reason: "Succeeded",
                message: "done",
            },
            now,
        );
        assert_eq!(
            keys(&body["status"]),
            [
                "admission",
                "conditions",
                "resourceRequests",
                "schedulingStats"
            ]
        );
        assert_eq!(body["status"]["resourceRequests"], json!([]));
        assert_eq!(body["status"]["admission"]["clusterQueue"], "cq");
        assert_eq!(condition(&body, "Finished")["status"], "True");
        assert_eq!(condition(&body, "Admitted")["status"], "True");
    }

    #[test]
    fn pods_ready_keeps_its_transition_time_while_its_status_stays() {
        let now: Timestamp = "2026-11-25T10:05:00Z".parse().unwrap();
        let same = pods_ready(&workload(), true, "Recovered", "m", now);
        assert_eq!(
            condition(&same, "PodsReady")["lastTransitionTime"],
            "2026-11-25T10:00:30Z"
        );
        assert_eq!(same["status"]["conditions"].as_array().unwrap().len(), 1);
        assert_eq!(keys(&same["status"]), ["conditions"]);
        assert_eq!(keys(&same["metadata"]), ["name", "namespace"], "not strict");
        let flipped = pods_ready(&workload(), false, "WaitForRecovery", "m", now);
        assert_eq!(
            condition(&flipped, "PodsReady")["lastTransitionTime"],
            "2026-11-25T10:05:00Z"
        );
    }
}
