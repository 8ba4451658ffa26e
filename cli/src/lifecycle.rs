//! The gang's lifecycle in local mode, as the operator runs it (DESIGN 5): after a generation ends,
//! succeed, restart the whole gang with generation + 1, or fail with the first failing rank's code.

use rdu_crds::RestartPolicy;
use rdu_crds::consts::exit_code;

/// How one rank's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankExit {
    Code(i32),
    Signal(i32),
}

impl RankExit {
    pub fn is_success(self) -> bool {
        self == RankExit::Code(exit_code::SUCCESS)
    }

    /// Transient failures: the retryable code, or a signal (killed, OOM, node lost).
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            RankExit::Code(exit_code::RETRYABLE) | RankExit::Signal(_)
        )
    }

    /// The shell's convention: the code, or 128 + the signal.
    pub fn as_exit_code(self) -> i32 {
        match self {
            RankExit::Code(c) => c,
            RankExit::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for RankExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankExit::Code(c) => write!(f, "exit code {c}"),
            RankExit::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// What to do after a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Succeeded,
    Restart,
    Failed { rank: u32, exit: RankExit },
}

/// `exits` in the order the ranks ended (rank, how); the first failure is the cause, later ones
/// (peers exiting 75 because it went away) are consequences.
pub fn decide(
    exits: &[(u32, RankExit)],
    policy: RestartPolicy,
    restarts: u32,
    backoff_limit: u32,
) -> Decision {
    let Some(&(rank, exit)) = exits.iter().find(|(_, e)| !e.is_success()) else {
        return Decision::Succeeded;
    };
    let may_restart = match policy {
        RestartPolicy::Never => false,
        RestartPolicy::OnFailure => true,
        RestartPolicy::ExitCode => exit.is_retryable(),
    };
    if may_restart && restarts < backoff_limit {
        Decision::Restart
    } else {
        Decision::Failed { rank, exit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RankExit::{Code, Signal};

    #[test]
    fn all_zero_succeeds() {
        let exits = [(1, Code(0)), (0, Code(0))];
        assert_eq!(
            decide(&exits, RestartPolicy::ExitCode, 0, 3),
            Decision::Succeeded
        );
    }

    #[test]
    fn a_killed_rank_restarts_the_gang_until_the_backoff_limit() {
        let exits = [(1, Signal(9)), (0, Code(75))];
        assert_eq!(
            decide(&exits, RestartPolicy::ExitCode, 0, 1),
            Decision::Restart
        );
        assert_eq!(
            decide(&exits, RestartPolicy::ExitCode, 1, 1),
            Decision::Failed {
                rank: 1,
                exit: Signal(9)
            }
        );
    }

    #[test]
    fn permanent_codes_fail_at_once_under_exit_code_but_not_on_failure() {
        let exits = [(0, Code(65)), (1, Code(75))];
        assert_eq!(
            decide(&exits, RestartPolicy::ExitCode, 0, 3),
            Decision::Failed {
                rank: 0,
                exit: Code(65)
            }
        );
        assert_eq!(
            decide(&exits, RestartPolicy::OnFailure, 0, 3),
            Decision::Restart
        );
        assert_eq!(
            decide(&[(1, Code(75))], RestartPolicy::Never, 0, 3),
            Decision::Failed {
                rank: 1,
                exit: Code(75)
            }
        );
    }

    #[test]
    fn signals_map_to_128_plus() {
        assert_eq!(Signal(15).as_exit_code(), 143);
        assert_eq!(Code(65).as_exit_code(), 65);
    }
}
