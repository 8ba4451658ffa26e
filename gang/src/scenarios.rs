//! Whole generations that both modes are tested against, each through its own adapter (the operator's lifecycle
//! over pods, local mode's watch over processes): ranks end in an order, the gang stops, and what follows (success,
//! a restart blamed on a rank, or a failure) must be the same. Chosen where both modes see the same ends: every
//! listed end is seen before the gang's stop reaches a rank that is not listed, and the ranks not listed end only
//! because the gang stopped (the operator deletes their pods; in local mode they give up on their peers, exit 75).

use rdu_crds::{RestartPolicy, RunPolicy};

use crate::{FailureReason, Restarts};

/// One generation's case.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub workers: u32,
    pub policy: RunPolicy,
    /// The gang's restarts before this generation.
    pub restarts: Restarts,
    /// (rank, exit code) in the order the ranks end.
    pub ends: Vec<(u32, i32)>,
    pub want: Want,
}

/// What must follow the generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Succeeded,
    /// The gang restarts, blamed on `rank`, counted against `backoffLimit` or not.
    Restart {
        rank: u32,
        counted: bool,
    },
    /// The job fails for `reason`, blamed on `rank`.
    Fail {
        rank: u32,
        reason: FailureReason,
    },
}

fn policy(restart_policy: RestartPolicy, backoff_limit: u32) -> RunPolicy {
    RunPolicy {
        restart_policy,
        backoff_limit,
        ..RunPolicy::default()
    }
}

/// Every case.
pub fn all() -> Vec<Scenario> {
    use RestartPolicy::{ExitCode, Never, OnFailure};
    let fresh = Restarts::default();
    vec![
        Scenario {
            name: "every rank exits 0",
            workers: 3,
            policy: policy(ExitCode, 3),
            restarts: fresh,
            ends: vec![(1, 0), (0, 0), (2, 0)],
            want: Want::Succeeded,
        },
        Scenario {
            name: "a permanent exit fails the job at once",
            workers: 3,
            policy: policy(ExitCode, 3),
            restarts: fresh,
            ends: vec![(1, 1)],
            want: Want::Fail {
                rank: 1,
                reason: FailureReason::PermanentFailure,
            },
        },
        Scenario {
            name: "a crash is blamed before the peer that gave up on it",
            workers: 3,
            policy: policy(ExitCode, 3),
            restarts: fresh,
            ends: vec![(2, 75), (1, 139)],
            want: Want::Restart {
                rank: 1,
                counted: true,
            },
        },
        Scenario {
            name: "a rank that succeeded does not save a generation another rank failed",
            workers: 3,
            policy: policy(ExitCode, 3),
            restarts: fresh,
            ends: vec![(0, 0), (2, 137)],
            want: Want::Restart {
                rank: 2,
                counted: true,
            },
        },
        Scenario {
            name: "a spent backoffLimit fails the job once the generation ended, blamed on the lowest of equals",
            workers: 3,
            policy: policy(ExitCode, 1),
            restarts: Restarts {
                counted: 1,
                not_counted: 0,
            },
            ends: vec![(1, 75), (0, 75), (2, 75)],
            want: Want::Fail {
                rank: 0,
                reason: FailureReason::BackoffLimitExceeded,
            },
        },
        Scenario {
            name: "restartPolicy OnFailure restarts a permanent exit",
            workers: 3,
            policy: policy(OnFailure, 3),
            restarts: fresh,
            ends: vec![(2, 1)],
            want: Want::Restart {
                rank: 2,
                counted: true,
            },
        },
        Scenario {
            name: "restartPolicy Never fails on a retryable exit",
            workers: 2,
            policy: policy(Never, 3),
            restarts: fresh,
            ends: vec![(1, 75)],
            want: Want::Fail {
                rank: 1,
                reason: FailureReason::RestartPolicyNever,
            },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RankExit::Code;
    use crate::{Culprit, Deadline, Look, Next, RankTally, Turn, turn};
    use rdu_crds::EndCause;

    /// The cases through `turn` alone: ends seen one at a time, the ranks not listed exiting 75 once the gang
    /// stops.
    fn play(s: &Scenario) -> Want {
        let mut evidence = Vec::new();
        let mut stopping: Option<Culprit> = None;
        let (mut present, mut succeeded) = (s.workers, 0);
        let unlisted = (0..s.workers).filter(|r| s.ends.iter().all(|(e, _)| e != r));
        let mut ends = s.ends.clone().into_iter().peekable();
        let mut gave_up = unlisted.map(|r| (r, 75)).collect::<Vec<_>>().into_iter();
        loop {
            let (rank, code) = match ends.next() {
                Some(end) => end,
                None if stopping.is_some() => gave_up.next().expect("a rank left"),
                None => panic!("{}: the gang never stopped", s.name),
            };
            present -= 1;
            if code == 0 {
                succeeded += 1;
            } else {
                evidence.push(Culprit::from_exit(rank, Code(code), EndCause::Failure));
            }
            let next = turn(Look {
                policy: &s.policy,
                restarts: s.restarts,
                deadline: Deadline::None,
                stopping: stopping.clone(),
                evidence: evidence.clone(),
                ranks: RankTally {
                    workers: s.workers,
                    started: s.workers,
                    succeeded,
                    present,
                },
            });
            match next {
                Turn::Succeeded => return Want::Succeeded,
                Turn::Fail {
                    culprit, reason, ..
                } => {
                    return Want::Fail {
                        rank: culprit.rank,
                        reason,
                    };
                }
                Turn::Ended {
                    culprit,
                    settlement,
                    ..
                } => {
                    return match settlement.next {
                        Next::Restart { .. } => Want::Restart {
                            rank: culprit.rank,
                            counted: settlement.restarts.counted > s.restarts.counted,
                        },
                        Next::Fail(reason) => Want::Fail {
                            rank: culprit.rank,
                            reason,
                        },
                    };
                }
                Turn::Stop { culprit, news } => {
                    if news {
                        stopping = Some(culprit);
                    }
                }
                Turn::Run | Turn::Create | Turn::DeadlineExceeded { .. } => {}
            }
        }
    }

    #[test]
    fn every_case_comes_out_as_it_says() {
        for s in all() {
            assert_eq!(play(&s), s.want, "{}", s.name);
        }
    }
}
