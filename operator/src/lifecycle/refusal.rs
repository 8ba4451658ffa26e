//! A job refused before its pods run: a spec the operator will not run, or a child name someone else's object
//! holds. The job fails at once with the reason and the message, once: a job already Failed keeps its condition.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rdu_crds::{JobPhase, RduJob, RduJobStatus};

use super::{Decision, JobEvent, condition};

/// Why a job is refused: the reason of its Failed condition and of its Warning event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The spec breaks a rule of the CRD, of `rdu_crds::validate_job` or of the operator's own limits.
    InvalidSpec,
    /// An object the job needs (its Service, Secret, NetworkPolicy, claim, PodGroup or a rank's pod) exists and is
    /// not the job's.
    ChildConflict,
}

impl Refusal {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::InvalidSpec => "InvalidSpec",
            Refusal::ChildConflict => "ChildConflict",
        }
    }
}

/// The job fails for `refusal` with `message`, on top of `status` (the job's own status, or the one this reconcile
/// decided before it found the refusal); nothing is created. A job already Failed is left as it is.
pub(crate) fn refuse(
    job: &RduJob,
    mut status: RduJobStatus,
    refusal: Refusal,
    message: &str,
    now: Timestamp,
) -> Decision {
    let mut events = Vec::new();
    if status.phase != Some(JobPhase::Failed) {
        status.phase = Some(JobPhase::Failed);
        status.completion_time = Some(Time(now));
        status.conditions.retain(|c| c.type_ != condition::FAILED);
        status.conditions.push(Condition {
            type_: condition::FAILED.to_string(),
            status: "True".to_string(),
            reason: refusal.reason().to_string(),
            message: message.to_string(),
            last_transition_time: Time(now),
            observed_generation: job.metadata.generation,
        });
        events.push(JobEvent {
            warning: true,
            reason: refusal.reason(),
            note: message.to_string(),
        });
    }
    Decision {
        changes: Vec::new(),
        status,
        events,
        requeue_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("time")
    }

    fn failed(reason: &str, message: &str, second: i64) -> Condition {
        Condition {
            type_: condition::FAILED.into(),
            status: "True".into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(at(second)),
            observed_generation: None,
        }
    }

    fn running() -> Condition {
        Condition {
            type_: condition::RUNNING.into(),
            status: "False".into(),
            reason: "GangRestart".into(),
            message: "m".into(),
            last_transition_time: Time(at(0)),
            observed_generation: None,
        }
    }

    #[test]
    fn a_refused_job_fails_once_with_the_reason_and_message() {
        struct Case {
            name: &'static str,
            before: RduJobStatus,
            refusal: Refusal,
            phase: JobPhase,
            conditions: Vec<Condition>,
            events: Vec<&'static str>,
        }
        let pending = RduJobStatus {
            phase: Some(JobPhase::Pending),
            ready: Some("0/4".into()),
            conditions: vec![running()],
            ..Default::default()
        };
        let already = RduJobStatus {
            phase: Some(JobPhase::Failed),
            completion_time: Some(Time(at(1))),
            conditions: vec![failed("InvalidSpec", "old", 1)],
            ..Default::default()
        };
        let stale_failed = RduJobStatus {
            phase: Some(JobPhase::Suspended),
            conditions: vec![Condition {
                status: "False".into(),
                ..failed("Resumed", "x", 0)
            }],
            ..Default::default()
        };
        let cases = [
            Case {
                name: "a new job with a bad spec",
                before: RduJobStatus::default(),
                refusal: Refusal::InvalidSpec,
                phase: JobPhase::Failed,
                conditions: vec![failed("InvalidSpec", "msg", 9)],
                events: vec!["InvalidSpec"],
            },
            Case {
                name: "a pending job whose Service is someone else's keeps its other conditions",
                before: pending,
                refusal: Refusal::ChildConflict,
                phase: JobPhase::Failed,
                conditions: vec![running(), failed("ChildConflict", "msg", 9)],
                events: vec!["ChildConflict"],
            },
            Case {
                name: "a job already failed: no new condition, no second event",
                before: already.clone(),
                refusal: Refusal::InvalidSpec,
                phase: JobPhase::Failed,
                conditions: already.conditions.clone(),
                events: vec![],
            },
            Case {
                name: "an old Failed condition of another status is replaced",
                before: stale_failed,
                refusal: Refusal::InvalidSpec,
                phase: JobPhase::Failed,
                conditions: vec![failed("InvalidSpec", "msg", 9)],
                events: vec!["InvalidSpec"],
            },
        ];
        let job = job("mnist", Some("ml"), 4);
        for case in cases {
            let d = refuse(&job, case.before.clone(), case.refusal, "msg", at(9));
            assert!(d.changes.is_empty(), "{}", case.name);
            assert_eq!(d.requeue_after, None, "{}", case.name);
            assert_eq!(d.status.phase, Some(case.phase), "{}", case.name);
            assert_eq!(d.status.conditions, case.conditions, "{}", case.name);
            let events: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
            assert_eq!(events, case.events, "{}", case.name);
            assert!(d.events.iter().all(|e| e.warning && e.note == "msg"));
            let completion = if case.events.is_empty() {
                case.before.completion_time
            } else {
                Some(Time(at(9)))
            };
            assert_eq!(d.status.completion_time, completion, "{}", case.name);
            assert_eq!(d.status.ready, case.before.ready, "{}", case.name);
        }
    }
}
