//! The status writes Kueue expects from a job controller, as server-side apply bodies built from the live
//! Workload. `PodsReady` goes under its own field manager; releasing the quota and finishing go under Kueue's
//! `kueue-admission`, with every field that manager owns carried over as `workload.PrepareWorkloadPatch` does
//! (what an apply leaves out, its manager gives up), and the resourceVersion as a precondition.

use jiff::Timestamp;
use serde_json::{Value, json};

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

/// Status fields the admission manager writes beside its conditions, carried over unchanged.
const ADMISSION_FIELDS: [&str; 7] = [
    "requeueState",
    "accumulatedPastExecutionTimeSeconds",
    "schedulingStats",
    "clusterName",
    "nominatedClusterNames",
    "unhealthyNodes",
    "admissionChecks",
];

fn head(workload: &Value, strict: bool) -> Value {
    let meta = &workload["metadata"];
    let mut metadata = json!({"name": meta["name"], "namespace": meta["namespace"]});
    if strict {
        metadata["uid"] = meta["uid"].clone();
        metadata["resourceVersion"] = meta["resourceVersion"].clone();
    }
    json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": metadata})
}

/// Sets condition `type_` in `conditions` as `apimeta.SetStatusCondition` does: the transition time changes only
/// when the status does. Returns whether anything changed.
fn set_condition(
    conditions: &mut Vec<Value>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: &Value,
    now: Timestamp,
) -> bool {
    let status_text = if status { "True" } else { "False" };
    let message: String = message.chars().take(32 * 1024).collect();
    let mut new = json!({
        "type": type_, "status": status_text, "reason": reason, "message": message,
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "observedGeneration": generation,
    });
    match conditions.iter_mut().find(|c| c["type"] == type_) {
        Some(old) => {
            if old["status"] == status_text {
                new["lastTransitionTime"] = old["lastTransitionTime"].clone();
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
pub fn pods_ready(
    workload: &Value,
    ready: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Value {
    let mut conditions: Vec<Value> = workload["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "PodsReady")
        .cloned()
        .collect();
    let generation = &workload["metadata"]["generation"];
    set_condition(
        &mut conditions,
        "PodsReady",
        ready,
        reason,
        message,
        generation,
        now,
    );
    let mut body = head(workload, false);
    body["status"] = json!({"conditions": conditions});
    body
}

/// A change to the admission part of the status.
pub enum AdmissionChange<'a> {
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
pub fn admission(workload: &Value, change: AdmissionChange<'_>, now: Timestamp) -> Value {
    let status = &workload["status"];
    let generation = &workload["metadata"]["generation"];
    let mut conditions: Vec<Value> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| ADMISSION_CONDITIONS.iter().any(|t| c["type"] == *t))
        .cloned()
        .collect();
    let mut out = serde_json::Map::new();
    for field in ADMISSION_FIELDS {
        if !status[field].is_null() {
            out.insert(field.to_string(), status[field].clone());
        }
    }
    let mut admission = status["admission"].clone();
    match change {
        AdmissionChange::Release {
            requeued,
            reason,
            message,
        } => {
            set_condition(
                &mut conditions,
                "Requeued",
                requeued,
                reason,
                message,
                generation,
                now,
            );
            set_condition(
                &mut conditions,
                "QuotaReserved",
                false,
                "Pending",
                message,
                generation,
                now,
            );
            admission = Value::Null;
            let admitted_since = conditions
                .iter()
                .find(|c| c["type"] == "Admitted" && c["status"] == "True")
                .and_then(|c| c["lastTransitionTime"].as_str())
                .and_then(|t| t.parse::<Timestamp>().ok());
            if let Some(since) = admitted_since {
                let ran = (now.as_second() - since.as_second()).max(0);
                let before = status["accumulatedPastExecutionTimeSeconds"]
                    .as_i64()
                    .unwrap_or(0);
                out.insert(
                    "accumulatedPastExecutionTimeSeconds".into(),
                    json!(before + ran),
                );
                set_condition(
                    &mut conditions,
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
                &mut conditions,
                "Finished",
                true,
                reason,
                message,
                generation,
                now,
            );
        }
    }
    if admission.is_null() {
        let requests = status["resourceRequests"].clone();
        if !requests.is_null() {
            out.insert("resourceRequests".into(), requests);
        }
    } else {
        out.insert("admission".into(), admission);
        out.insert("resourceRequests".into(), json!([]));
    }
    out.insert("conditions".into(), json!(conditions));
    let mut body = head(workload, true);
    body["status"] = Value::Object(out);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Value {
        json!({
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
        })
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
            workload()["status"]["schedulingStats"]
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
        let flipped = pods_ready(&workload(), false, "WaitForRecovery", "m", now);
        assert_eq!(
            condition(&flipped, "PodsReady")["lastTransitionTime"],
            "2026-11-25T10:05:00Z"
        );
    }
}
