//! What follows a generation whose ranks were seen ending (local mode sees its processes; the operator sees pods
//! and decides in its lifecycle): the user's stop, the job's deadline, success, or a failure settled by the rules.

use rdu_crds::RunPolicy;
use rdu_crds::consts::exit_code;

use crate::{Culprit, Hang, Next, RankExit, Restarts, Settlement, culprit, settle};
use rdu_crds::EndCause;

/// How a generation ended, as the one who ran its ranks saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenerationEnd {
    /// (rank, exit) in the order the ranks ended.
    pub exits: Vec<(u32, RankExit)>,
    /// The signal the user stopped the run with.
    pub interrupted: Option<i32>,
    /// `activeDeadlineSeconds` passed while the ranks ran.
    pub deadline_exceeded: bool,
    /// The gang was stopped because rank 0's step stood still for `progressDeadlineSeconds`.
    pub hung: Option<Hang>,
}

/// What follows a generation's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterGeneration {
    /// The user stopped the run: it ends, with 128 + the signal.
    Stopped { signal: i32 },
    /// `activeDeadlineSeconds` passed: the job fails (`DeadlineExceeded`).
    DeadlineExceeded,
    /// Every rank succeeded.
    Succeeded,
    /// The generation failed, blamed on `culprit` (`ended` says how, for people); the rules settled what follows.
    Failed {
        culprit: Culprit,
        ended: String,
        settlement: Settlement,
    },
}

impl AfterGeneration {
    /// The run's exit code when it ends here; none when the gang restarts.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            AfterGeneration::Stopped { signal } => Some(exit_code::SIGNAL_BASE + signal),
            AfterGeneration::DeadlineExceeded => Some(exit_code::DEADLINE_EXCEEDED),
            AfterGeneration::Succeeded => Some(exit_code::SUCCESS),
            AfterGeneration::Failed {
                settlement:
                    Settlement {
                        next: Next::Restart { .. },
                        ..
                    },
                ..
            } => None,
            AfterGeneration::Failed { culprit, .. } => Some(culprit.exit.as_exit_code()),
        }
    }
}

/// Decides what follows `end` under `policy`, after `restarts` so far. A hang is blamed on rank 0 and the ranks
/// stopped for it are its consequence; otherwise the culprit is the surest of the failed exits (`culprit`). Every
/// end here is the job's own (nothing outside disrupts local ranks).
pub fn after_generation(
    policy: &RunPolicy,
    restarts: Restarts,
    end: &GenerationEnd,
) -> AfterGeneration {
    if let Some(signal) = end.interrupted {
        return AfterGeneration::Stopped { signal };
    }
    if end.deadline_exceeded {
        return AfterGeneration::DeadlineExceeded;
    }
    let (blamed, ended) = match end.hung {
        Some(hang) => (hang.culprit(), "rank 0 hung".to_string()),
        None => match culprit(end.exits.iter().copied()) {
            Some((rank, exit)) => (
                Culprit::from_exit(rank, exit, EndCause::Failure),
                format!("rank {rank} ended with {exit}"),
            ),
            None => return AfterGeneration::Succeeded,
        },
    };
    AfterGeneration::Failed {
        settlement: settle(policy, restarts, &blamed),
        culprit: blamed,
        ended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FailureReason;
    use crate::RankExit::{Code, Signal};

    fn end(exits: &[(u32, RankExit)]) -> GenerationEnd {
        GenerationEnd {
            exits: exits.to_vec(),
            ..GenerationEnd::default()
        }
    }

    /// What a run does next, in short: `exit N`, or `restart` with the restarts counted after it.
    fn outcome(after: &AfterGeneration) -> String {
        match (after, after.exit_code()) {
            (_, Some(code)) => format!("exit {code}"),
            (AfterGeneration::Failed { settlement, .. }, None) => {
                format!("restart ({} counted)", settlement.restarts.counted)
            }
            (other, None) => format!("{other:?}"),
        }
    }

    #[test]
    fn a_generation_end_stops_succeeds_restarts_or_fails() {
        let policy = RunPolicy {
            backoff_limit: 1,
            ..RunPolicy::default()
        };
        let hang = Hang {
            step: Some(7),
            still_seconds: 30,
            deadline_seconds: 30,
        };
        let none = Restarts::default();
        let spent = Restarts {
            counted: 1,
            not_counted: 0,
        };
        // (end, restarts so far) -> what follows
        let table: Vec<(GenerationEnd, Restarts, &str)> = vec![
            (end(&[(0, Code(0)), (1, Code(0))]), none, "exit 0"),
            // The user's signal and the deadline come before any rank's exit.
            (
                GenerationEnd {
                    interrupted: Some(2),
                    ..end(&[(1, Code(75))])
                },
                none,
                "exit 130",
            ),
            (
                GenerationEnd {
                    deadline_exceeded: true,
                    ..end(&[(1, Signal(15))])
                },
                none,
                "exit 124",
            ),
            // A retryable failure restarts within backoffLimit, then fails with the culprit's code.
            (
                end(&[(1, Code(75)), (0, Signal(9))]),
                none,
                "restart (1 counted)",
            ),
            (end(&[(1, Code(75)), (0, Signal(9))]), spent, "exit 137"),
            // A permanent failure fails at once.
            (end(&[(1, Code(1))]), none, "exit 1"),
            // A hang blames rank 0 whatever the others' exits, and is restarted as a failure.
            (
                GenerationEnd {
                    hung: Some(hang),
                    ..end(&[(1, Code(1))])
                },
                none,
                "restart (1 counted)",
            ),
        ];
        for (i, (end, restarts, want)) in table.into_iter().enumerate() {
            assert_eq!(
                outcome(&after_generation(&policy, restarts, &end)),
                want,
                "row {i}"
            );
        }
    }

    #[test]
    fn a_failure_names_its_culprit_and_the_rules_verdict() {
        let policy = RunPolicy::default();
        let after = after_generation(
            &policy,
            Restarts::default(),
            &end(&[(2, Code(75)), (1, Code(65))]),
        );
        let AfterGeneration::Failed {
            culprit,
            ended,
            settlement,
        } = after
        else {
            panic!("{after:?}")
        };
        assert_eq!(
            (culprit.rank, ended.as_str()),
            (1, "rank 1 ended with exit code 65")
        );
        assert_eq!(settlement.next, Next::Fail(FailureReason::PermanentFailure));
    }
}
