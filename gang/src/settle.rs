//! What follows a generation's end, written once for the operator and local mode: the culprit judged by the
//! failure rules, a granted restart counted against its budget, and how long the next generation waits.

use rdu_crds::RunPolicy;

use crate::{
    Culprit, FailureReason, RestartDelay, Restarts, Ruling, Verdict, judge, restart_delay,
};

/// A generation's end, settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The rule that matched the culprit and what the budgets made of it.
    pub ruling: Ruling,
    /// The budgets after this end (one more restart when one was granted).
    pub restarts: Restarts,
    pub next: Next,
}

/// What the gang does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Start the next generation; `budget` says where the budget it was counted against stands (`counted
    /// against backoffLimit: 2 of 3`).
    Restart { budget: String },
    /// The job fails.
    Fail(FailureReason),
}

/// Settles the end of a generation blamed on `culprit` under `policy`, after `restarts` so far.
pub fn settle(policy: &RunPolicy, restarts: Restarts, culprit: &Culprit) -> Settlement {
    let ruling = judge(policy, restarts, culprit);
    let mut after = restarts;
    let next = match ruling.verdict {
        Verdict::Restart { counted } => Next::Restart {
            budget: after.count(policy, counted, culprit.cause),
        },
        Verdict::Fail(reason) => Next::Fail(reason),
    };
    Settlement {
        ruling,
        restarts: after,
        next,
    }
}

/// A restart that made the next generation wait: how long in all, and how much of it is left at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub delay: RestartDelay,
    pub left_seconds: i64,
}

/// Whether the generation after a restart at `restarted_at` still waits at `now`, given when the gang's earlier
/// restarts happened (oldest first; seconds on one clock): the operator asks on every look, local mode once,
/// at the restart.
pub fn backoff(earlier: &[i64], restarted_at: i64, now: i64) -> Option<Backoff> {
    let delay = restart_delay(earlier, restarted_at);
    let left_seconds = restarted_at
        .saturating_add(i64::try_from(delay.seconds).unwrap_or(i64::MAX))
        .saturating_sub(now);
    (left_seconds > 0).then_some(Backoff {
        delay,
        left_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RankExit::{Code, Lost};
    use rdu_crds::EndCause::{Disruption, Failure};

    fn restarts(counted: u32, not_counted: u32) -> Restarts {
        Restarts {
            counted,
            not_counted,
        }
    }

    #[test]
    fn an_end_is_judged_and_a_granted_restart_counted() {
        let limited = RunPolicy {
            backoff_limit: 2,
            max_infrastructure_restarts: Some(1),
            ..RunPolicy::default()
        };
        // (restarts so far, culprit's exit and cause) -> (restarts after, next)
        let table = [
            (
                restarts(0, 0),
                Code(75),
                Failure,
                restarts(1, 0),
                Next::Restart {
                    budget: "counted against backoffLimit: 1 of 2".into(),
                },
            ),
            (
                restarts(2, 0),
                Code(75),
                Failure,
                restarts(2, 0),
                Next::Fail(FailureReason::BackoffLimitExceeded),
            ),
            (
                restarts(0, 0),
                Lost,
                Disruption,
                restarts(0, 1),
                Next::Restart {
                    budget: "a disruption: not counted against backoffLimit; maxInfrastructureRestarts: 1 of 1"
                        .into(),
                },
            ),
            (
                restarts(0, 1),
                Lost,
                Disruption,
                restarts(0, 1),
                Next::Fail(FailureReason::MaxInfrastructureRestartsExceeded),
            ),
            (
                restarts(0, 0),
                Code(1),
                Failure,
                restarts(0, 0),
                Next::Fail(FailureReason::PermanentFailure),
            ),
        ];
        for (i, (before, exit, cause, after, next)) in table.into_iter().enumerate() {
            let settled = settle(&limited, before, &Culprit::from_exit(1, exit, cause));
            assert_eq!((settled.restarts, &settled.next), (after, &next), "row {i}");
            assert_eq!(
                settled.ruling,
                judge(&limited, before, &Culprit::from_exit(1, exit, cause))
            );
        }
    }

    #[test]
    fn the_next_generation_waits_out_the_backoff_of_a_loop() {
        // (earlier restarts, restarted at, now) -> seconds left
        let table: [(&[i64], i64, i64, Option<i64>); 5] = [
            // The first restart of a loop starts the next generation at once.
            (&[], 100, 100, None),
            // The second within the window waits the base 10 s, counted from the restart.
            (&[95], 100, 100, Some(10)),
            (&[95], 100, 107, Some(3)),
            (&[95], 100, 110, None),
            // A restart after a long run starts a new loop.
            (&[0], 1_000, 1_000, None),
        ];
        for (i, (earlier, restarted_at, now, left)) in table.into_iter().enumerate() {
            assert_eq!(
                backoff(earlier, restarted_at, now).map(|b| b.left_seconds),
                left,
                "row {i}"
            );
        }
    }
}
