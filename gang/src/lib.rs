//! The gang's decisions (DESIGN 5), written once for the operator and local mode and free of I/O: how a rank
//! ended, which rank caused a failed generation, whether the gang restarts or the job fails (the failure rules of
//! `rules`), how a granted restart is counted and how long the next generation waits (`restarts`, `settle`), and
//! when a gang that stopped making progress is hung (`hang`). The operator turns pods and `status` into its
//! inputs, local mode its child processes.

use std::fmt;

use rdu_crds::consts::exit_code;
use rdu_crds::{EndCause, RestartPolicy, RunPolicy};

mod deadline;
mod hang;
mod restarts;
mod rules;
#[cfg(any(test, feature = "scenarios"))]
pub mod scenarios;
mod settle;
mod turn;
pub use deadline::{DEADLINE_EXCEEDED, Deadline, deadline_message};
pub use hang::{
    GangNow, Hang, HangCheck, ProgressWatch, REPORTS_OVERDUE_SECONDS, StepWatcher,
    UNREPORTED_RECHECK_SECONDS, check_hang,
};
pub use restarts::{
    BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS, RESTART_LOOP_WINDOW_SECONDS, RestartDelay,
    restart_delay,
};
pub use rules::{Culprit, Restarts, Ruling, default_rules, judge};
pub use settle::{Backoff, Next, Settlement, backoff, settle};
pub use turn::{Evidence, Look, RankTally, Turn, turn};

/// How one rank of a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankExit {
    /// The process exited with this code (in a pod: the container's exit code; 128 + N means signal N).
    Code(i32),
    /// The process was killed by this signal (local mode sees the signal itself).
    Signal(i32),
    /// The rank is gone without an exit code: its pod vanished, its node was lost.
    Lost,
}

impl RankExit {
    pub fn is_success(self) -> bool {
        self == RankExit::Code(exit_code::SUCCESS)
    }

    /// Transient failures a new generation can get past: the retryable code, a signal (killed, OOM), or a rank
    /// that was lost with its node or pod.
    pub fn is_retryable(self) -> bool {
        match self {
            RankExit::Code(code) => code == exit_code::RETRYABLE || code > exit_code::SIGNAL_BASE,
            RankExit::Signal(_) | RankExit::Lost => true,
        }
    }

    /// The shell's convention: the code, or 128 + the signal; a lost rank counts as killed (SIGKILL).
    pub fn as_exit_code(self) -> i32 {
        match self {
            RankExit::Code(code) => code,
            RankExit::Signal(signal) => exit_code::SIGNAL_BASE + signal,
            RankExit::Lost => exit_code::SIGNAL_BASE + 9,
        }
    }

    /// How surely this exit is the cause of a failed generation rather than a consequence of another rank's:
    /// lower is surer. Peers of a failed rank exit with the retryable code when it goes away.
    pub fn blame_order(self) -> u8 {
        match self {
            RankExit::Code(code) if code == exit_code::RETRYABLE => 2,
            exit if exit.is_retryable() => 1,
            _ => 0,
        }
    }
}

impl fmt::Display for RankExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankExit::Code(code) => write!(f, "exit code {code}"),
            RankExit::Signal(signal) => write!(f, "signal {signal}"),
            RankExit::Lost => f.write_str("no exit code (lost)"),
        }
    }
}

/// The rank a failed generation is blamed on, from the ranks that ended: a permanent failure before a killed or
/// lost rank before a retryable exit, the lowest rank among equals. The order the ranks ended in does not matter,
/// so the operator (which sees pods) and local mode (which sees processes) blame the same rank.
pub fn culprit(exits: impl IntoIterator<Item = (u32, RankExit)>) -> Option<(u32, RankExit)> {
    exits
        .into_iter()
        .filter(|(_, exit)| !exit.is_success())
        .min_by_key(|&(rank, exit)| blame_key(rank, exit, EndCause::Failure))
}

/// Which of two ends is more surely a failed generation's cause (the lower key): the surer exit
/// ([`RankExit::blame_order`]), then the lower rank, then a disruption over a failure (a pod deleted on a lost node
/// was lost with its node). The operator blames its evidence by it, local mode its exits (`culprit`).
pub fn blame_key(rank: u32, exit: RankExit, cause: EndCause) -> (u8, u32, bool) {
    (exit.blame_order(), rank, cause == EndCause::Failure)
}

/// Why a job failed after a rank's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// `restartPolicy: Never`: no failure restarts the gang.
    RestartPolicyNever,
    /// `restartPolicy: ExitCode` and the exit was not retryable.
    PermanentFailure,
    /// The gang was already restarted `backoffLimit` times.
    BackoffLimitExceeded,
    /// The gang was already restarted `maxInfrastructureRestarts` times without counting.
    MaxInfrastructureRestartsExceeded,
    /// A rule of `failurePolicy` with action `FailJob` matched.
    FailurePolicy,
}

impl FailureReason {
    /// The condition reason and event reason.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::RestartPolicyNever => "RestartPolicyNever",
            FailureReason::PermanentFailure => "PermanentFailure",
            FailureReason::BackoffLimitExceeded => "BackoffLimitExceeded",
            FailureReason::MaxInfrastructureRestartsExceeded => "MaxInfrastructureRestartsExceeded",
            FailureReason::FailurePolicy => "FailurePolicy",
        }
    }

    /// A spent budget: the operator waits for the generation to end before failing the job, as evidence that
    /// arrives meanwhile may blame a rank whose end another rule (or budget) judges.
    pub fn is_spent_budget(self) -> bool {
        matches!(
            self,
            FailureReason::BackoffLimitExceeded | FailureReason::MaxInfrastructureRestartsExceeded
        )
    }
}

/// What follows an ended generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Restart the whole gang as the next generation; `counted` against `backoffLimit` or not.
    Restart { counted: bool },
    /// The job fails.
    Fail(FailureReason),
}

/// Restart or fail, after a failure of the job's own in which the culprit ended with `exit`, under `policy`, with
/// `failure_restarts` counted gang restarts so far.
pub fn after_failure(
    policy: RestartPolicy,
    backoff_limit: u32,
    failure_restarts: u32,
    exit: RankExit,
) -> Verdict {
    after_end(
        policy,
        backoff_limit,
        failure_restarts,
        exit,
        EndCause::Failure,
    )
}

/// Restart or fail after a generation ended with its culprit's `exit`, caused by `cause`, under the defaults of
/// `policy` (no failure policy, no cap on uncounted restarts): a disruption from outside the job (its node lost, a
/// drain, a preemption) restarts the gang without counting against `backoffLimit`, as the Job API's pod failure
/// policy `Ignore` does for `DisruptionTarget`; `restartPolicy: Never` fails on anything.
pub fn after_end(
    policy: RestartPolicy,
    backoff_limit: u32,
    failure_restarts: u32,
    exit: RankExit,
    cause: EndCause,
) -> Verdict {
    let run = RunPolicy {
        restart_policy: policy,
        backoff_limit,
        ..RunPolicy::default()
    };
    let restarts = Restarts {
        counted: failure_restarts,
        not_counted: 0,
    };
    judge(&run, restarts, &Culprit::from_exit(0, exit, cause)).verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureReason::*;
    use RankExit::{Code, Lost, Signal};
    use RestartPolicy::{ExitCode, Never, OnFailure};

    const RESTART: Verdict = Verdict::Restart { counted: true };

    #[test]
    fn disruptions_restart_without_counting_except_under_never() {
        // (policy, backoffLimit, counted restarts so far, exit) -> verdict after a disruption
        let table = [
            (ExitCode, 3, 0, Lost, Verdict::Restart { counted: false }),
            (ExitCode, 0, 0, Lost, Verdict::Restart { counted: false }),
            (
                ExitCode,
                3,
                3,
                Code(143),
                Verdict::Restart { counted: false },
            ),
            // A disrupted rank's own exit code does not make the disruption permanent.
            (ExitCode, 3, 0, Code(1), Verdict::Restart { counted: false }),
            (OnFailure, 0, 5, Lost, Verdict::Restart { counted: false }),
            (Never, 3, 0, Lost, Verdict::Fail(RestartPolicyNever)),
        ];
        for (i, (policy, limit, restarts, exit, verdict)) in table.into_iter().enumerate() {
            assert_eq!(
                after_end(policy, limit, restarts, exit, EndCause::Disruption),
                verdict,
                "row {i}"
            );
        }
    }

    #[test]
    fn restart_or_fail_under_every_policy() {
        // (policy, backoffLimit, restarts so far, how the culprit ended) -> verdict
        let table: [(RestartPolicy, u32, u32, RankExit, Verdict); 16] = [
            (ExitCode, 3, 0, Code(75), RESTART),
            (ExitCode, 3, 0, Code(137), RESTART),
            (ExitCode, 3, 0, Signal(9), RESTART),
            (ExitCode, 3, 0, Lost, RESTART),
            (ExitCode, 3, 0, Code(1), Verdict::Fail(PermanentFailure)),
            (ExitCode, 3, 0, Code(64), Verdict::Fail(PermanentFailure)),
            (ExitCode, 3, 0, Code(65), Verdict::Fail(PermanentFailure)),
            (ExitCode, 3, 0, Code(74), Verdict::Fail(PermanentFailure)),
            (
                ExitCode,
                3,
                3,
                Code(75),
                Verdict::Fail(BackoffLimitExceeded),
            ),
            (
                ExitCode,
                0,
                0,
                Signal(9),
                Verdict::Fail(BackoffLimitExceeded),
            ),
            (OnFailure, 3, 0, Code(65), RESTART),
            (OnFailure, 3, 2, Code(1), RESTART),
            (
                OnFailure,
                3,
                3,
                Code(1),
                Verdict::Fail(BackoffLimitExceeded),
            ),
            (Never, 3, 0, Code(75), Verdict::Fail(RestartPolicyNever)),
            (Never, 3, 0, Lost, Verdict::Fail(RestartPolicyNever)),
            (Never, 3, 0, Code(65), Verdict::Fail(RestartPolicyNever)),
        ];
        for (i, (policy, limit, restarts, exit, verdict)) in table.into_iter().enumerate() {
            assert_eq!(
                after_failure(policy, limit, restarts, exit),
                verdict,
                "row {i}: {policy:?} limit {limit} restarts {restarts} {exit}"
            );
        }
    }

    #[test]
    fn the_culprit_is_the_cause_not_the_peers_that_noticed() {
        // (exits in the order they ended) -> the blamed rank
        type Ended = (u32, RankExit);
        let table: [(&[Ended], Option<Ended>); 7] = [
            (&[(0, Code(0)), (1, Code(0))], None),
            (&[(0, Code(75)), (1, Signal(9))], Some((1, Signal(9)))),
            (&[(1, Signal(9)), (0, Code(75))], Some((1, Signal(9)))),
            (
                &[(2, Code(75)), (0, Code(65)), (1, Code(75))],
                Some((0, Code(65))),
            ),
            (&[(3, Code(137)), (1, Code(64))], Some((1, Code(64)))),
            (&[(2, Lost), (1, Signal(15))], Some((1, Signal(15)))),
            (
                &[(2, Code(75)), (1, Code(75)), (0, Code(0))],
                Some((1, Code(75))),
            ),
        ];
        for (i, (exits, blamed)) in table.into_iter().enumerate() {
            assert_eq!(culprit(exits.iter().copied()), blamed, "row {i}");
        }
    }

    #[test]
    fn the_surer_exit_then_the_lower_rank_then_a_disruption_is_blamed_first() {
        use EndCause::{Disruption, Failure};
        assert!(blame_key(3, Signal(9), Failure) < blame_key(0, Code(75), Disruption));
        assert!(blame_key(1, Lost, Failure) < blame_key(2, Lost, Disruption));
        assert!(blame_key(1, Lost, Disruption) < blame_key(1, Lost, Failure));
    }

    #[test]
    fn exits_read_as_the_shell_reports_them() {
        assert_eq!(Signal(15).as_exit_code(), 143);
        assert_eq!(Code(65).as_exit_code(), 65);
        assert_eq!(Lost.as_exit_code(), 137);
        assert!(Code(0).is_success() && !Signal(0).is_success());
        assert_eq!(Signal(9).to_string(), "signal 9");
    }
}
