//! The decisions of the Kueue step, pure: whether a queued job may have pods (`gate`), and what the Workload's
//! status and spec must say after the lifecycle decided (`writes`), as `jobframework.ReconcileGenericJob` decides
//! for Kueue's own job kinds.

use rdu_crds::{JobPhase, QueueState, QueueStatus, RduJobStatus};

use super::view::{Condition, PodSetAsk, WorkloadView};

/// Whether a queued job may have pods.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Gate {
    /// Kueue admitted the Workload: the pods may run.
    Admitted,
    /// No pod may exist: the lifecycle holds the job as suspended, with this reason and message.
    Held {
        reason: &'static str,
        message: String,
    },
}

/// `Held`'s reason while the Workload waits for admission.
pub(crate) const QUEUED: &str = "Queued";
/// `Held`'s reason once Kueue evicted the Workload (preemption, a PodsReady timeout, deactivation…).
pub(crate) const EVICTED: &str = "Evicted";

/// `Held`'s reason when the Workload of the job's name is not the job's.
pub(crate) const WORKLOAD_CONFLICT: &str = "WorkloadConflict";
/// `Held`'s reason when the job asks for more or other than its Workload was queued (and admitted) for.
pub(crate) const WORKLOAD_OUTDATED: &str = "WorkloadOutdated";

/// Whether `workload`, found under the job's Workload name, may stand for the job (UID `job_uid`) that would
/// ask for `now` today: controlled by the job, and asking what the job asks. A job whose `workers`,
/// `tilesPerWorker` or template changed after it was queued is held, so no generation runs on an admission
/// granted for less; restoring the fields lets it run again.
pub(crate) fn vet(workload: &WorkloadView, job_uid: &str, now: &PodSetAsk) -> Option<Gate> {
    if workload.controller_uid.as_deref() != Some(job_uid) {
        return Some(Gate::Held {
            reason: WORKLOAD_CONFLICT,
            message: format!(
                "Workload {} exists and is not this job's (its controller's UID is {}): the job waits; delete \
                 that Workload",
                workload.name,
                workload.controller_uid.as_deref().unwrap_or("none")
            ),
        });
    }
    if workload.asked != *now {
        return Some(Gate::Held {
            reason: WORKLOAD_OUTDATED,
            message: format!(
                "the job asks for {} pod(s) with {} but its Workload {} was queued for {} with {}: \
                 spec.workers, spec.tilesPerWorker and spec.template's resources cannot change once queued; \
                 restore them, or delete the job and apply it again",
                now.count,
                describe(&now.requests),
                workload.name,
                workload.asked.count,
                describe(&workload.asked.requests)
            ),
        });
    }
    None
}

fn describe(requests: &[(String, String, String)]) -> String {
    if requests.is_empty() {
        return "no requests".to_string();
    }
    requests
        .iter()
        .map(|(container, resource, quantity)| format!("{container}: {resource} {quantity}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether job pods may exist, given its Workload (`None`: not created yet) in LocalQueue `queue`.
pub(crate) fn gate(workload: Option<&WorkloadView>, queue: &str) -> Gate {
    match workload {
        None => Gate::Held {
            reason: QUEUED,
            message: format!(
                "waiting for Kueue: its Workload in LocalQueue {queue} is being created"
            ),
        },
        Some(
            w @ WorkloadView {
                evicted: Some(e), ..
            },
        ) => Gate::Held {
            reason: EVICTED,
            message: format!(
                "Kueue evicted Workload {} ({}: {}); the job waits to be admitted again",
                w.name, e.reason, e.message
            ),
        },
        Some(w) if w.admitted && !w.finished => Gate::Admitted,
        Some(w) => Gate::Held {
            reason: QUEUED,
            message: format!(
                "waiting for Kueue to admit Workload {} in LocalQueue {queue}",
                w.name
            ),
        },
    }
}

/// The job's `status.queue`: LocalQueue `queue` and where its Workload (`None`: not created yet) stands.
pub(crate) fn queue_status(workload: Option<&WorkloadView>, queue: &str) -> QueueStatus {
    let state = match workload {
        None => QueueState::Queued,
        Some(w) if w.finished => QueueState::Finished,
        Some(w) if w.evicted.is_some() => QueueState::Evicted,
        Some(w) if w.admitted => QueueState::Admitted,
        Some(_) => QueueState::Queued,
    };
    QueueStatus {
        name: queue.to_string(),
        state,
    }
}

/// The job's `status.queue` once `writes` landed: a reconcile that finishes the Workload shows `Finished` in the
/// same status write that says the job ended, not one reconcile later.
pub(crate) fn queue_status_after(before: &QueueStatus, writes: &[Write]) -> QueueStatus {
    let finished = writes.iter().any(|w| matches!(w, Write::Finish { .. }));
    QueueStatus {
        name: before.name.clone(),
        state: if finished {
            QueueState::Finished
        } else {
            before.state
        },
    }
}

/// A write to the Workload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Write {
    /// `spec.active`: false while `spec.runPolicy.suspend` is true (Kueue then evicts and releases the quota).
    SetActive(bool),
    /// The `PodsReady` condition (Kueue's reasons: `WaitForStart`, `WaitForRecovery`, `Started`, `Recovered`).
    PodsReady {
        ready: bool,
        reason: &'static str,
        message: &'static str,
    },
    /// After an eviction, once no pod is left: the quota reservation cleared, `Requeued` set (True for a
    /// preemption or node failures), `Admitted` synced.
    ReleaseQuota {
        requeued: bool,
        reason: String,
        message: String,
    },
    /// The job ended: `Finished` True with reason `Succeeded` or `Failed`.
    Finish { succeeded: bool, message: String },
}

/// What the Workload must be told after the lifecycle produced `status` for a job whose spec asks
/// `suspend`, with `live_pods` of its pods still there (not yet deleted). `end_recorded`: the job's stored status
/// already says it ended. A job's end is written to its own status before the Workload is finished: a Workload
/// Finished under a job whose status still says it runs (the status write lost to an API server fault) would hold
/// the job as queued for good, as a finished Workload is never admitted again (found by the long soak).
pub(crate) fn writes(
    w: &WorkloadView,
    suspend: bool,
    status: &RduJobStatus,
    live_pods: usize,
    end_recorded: bool,
) -> Vec<Write> {
    let mut out = Vec::new();
    if w.finished {
        return out;
    }
    if let Some(phase @ (JobPhase::Succeeded | JobPhase::Failed)) = status.phase {
        if !end_recorded {
            // The status write of this reconcile records the end; the next reconcile (woken by it) finishes.
            return out;
        }
        let message = status
            .conditions
            .iter()
            .rev()
            .find(|c| c.type_ == phase.as_str())
            .map(|c| c.message.clone())
            .unwrap_or_else(|| format!("the job {}", phase.as_str().to_lowercase()));
        out.push(Write::Finish {
            succeeded: phase == JobPhase::Succeeded,
            message,
        });
        return out;
    }
    if w.active == suspend {
        out.push(Write::SetActive(!suspend));
    }
    if let Some(evicted) = &w.evicted {
        if w.quota_reserved && live_pods == 0 {
            out.push(Write::ReleaseQuota {
                requeued: matches!(evicted.reason.as_str(), "Preempted" | "NodeFailures"),
                reason: evicted.reason.clone(),
                message: evicted.message.clone(),
            });
        }
        return out;
    }
    let wanted = pods_ready(w, status);
    let current = w.pods_ready.as_ref();
    if current.is_none_or(|c| c.status != wanted.0 || c.reason != wanted.1) {
        out.push(Write::PodsReady {
            ready: wanted.0,
            reason: wanted.1,
            message: wanted.2,
        });
    }
    out
}

/// `PodsReady` as Kueue's `generatePodsReadyCondition` makes it: (status, reason, message).
fn pods_ready(w: &WorkloadView, status: &RduJobStatus) -> (bool, &'static str, &'static str) {
    const NOT_READY: &str = "Not all pods are ready or succeeded";
    const RECOVERING: &str = "At least one pod has failed, waiting for recovery";
    const READY: &str = "All pods reached readiness and the workload is running";
    let was = w.pods_ready.as_ref();
    let recovering = |c: &Condition| matches!(c.reason.as_str(), "WaitForRecovery" | "Recovered");
    if !w.admitted {
        return (false, "WaitForStart", NOT_READY);
    }
    let all_ready = status.phase == Some(JobPhase::Running);
    match was {
        _ if all_ready && was.is_some_and(recovering) => (true, "Recovered", READY),
        _ if all_ready => (true, "Started", READY),
        Some(c) if c.status || c.reason == "WaitForRecovery" => {
            (false, "WaitForRecovery", RECOVERING)
        }
        _ => (false, "WaitForStart", NOT_READY),
    }
}

#[cfg(test)]
mod tests;
