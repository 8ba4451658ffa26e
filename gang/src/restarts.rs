//! What follows a restart the failure rules granted, written once for the operator and local mode: the restart
//! counted against its budget, the sentence saying where the budgets stand, and how long the gang waits before
//! its next generation. A gang that keeps failing backs off as the Job controller does (10 s, doubling, at most
//! 6 min), from its second restart within 10 minutes: one disruption (a drain, a lost node) is recovered from at
//! once, a loop (a template no node can run, a crash at start) is throttled.

use rdu_crds::{EndCause, RunPolicy};

use crate::Restarts;

/// Restarts closer together than this are one loop; a generation that ran longer ends it.
pub const RESTART_LOOP_WINDOW_SECONDS: i64 = 600;
/// The wait before a loop's second restart, doubled for each one after.
pub const BACKOFF_BASE_SECONDS: u64 = 10;
/// The longest wait.
pub const BACKOFF_MAX_SECONDS: u64 = 360;

impl Restarts {
    /// Counts a restart of `cause` that the rules granted under `policy` (`counted` against `backoffLimit`, else
    /// against `maxInfrastructureRestarts`), and says where that budget stands now.
    pub fn count(&mut self, policy: &RunPolicy, counted: bool, cause: EndCause) -> String {
        if counted {
            self.counted += 1;
            return format!(
                "counted against backoffLimit: {} of {}",
                self.counted, policy.backoff_limit
            );
        }
        self.not_counted += 1;
        let disruption = if cause == EndCause::Disruption {
            "a disruption: "
        } else {
            ""
        };
        match policy.max_infrastructure_restarts {
            Some(max) => format!(
                "{disruption}not counted against backoffLimit; maxInfrastructureRestarts: {} of {max}",
                self.not_counted
            ),
            None => format!("{disruption}not counted against backoffLimit"),
        }
    }
}

/// How long a gang restarted at `now` waits before its next generation, given when its earlier restarts
/// happened (seconds on the same clock, oldest first): none for the first restart of a loop, then
/// [`BACKOFF_BASE_SECONDS`] doubling per restart of the loop, at most [`BACKOFF_MAX_SECONDS`].
pub fn restart_delay(earlier: &[i64], now: i64) -> RestartDelay {
    let mut in_a_row = 0u32;
    let mut next = now;
    for &at in earlier.iter().rev() {
        if next - at >= RESTART_LOOP_WINDOW_SECONDS {
            break;
        }
        in_a_row += 1;
        next = at;
    }
    let seconds = match in_a_row {
        0 => 0,
        n => BACKOFF_BASE_SECONDS
            .saturating_mul(1u64.checked_shl(n - 1).unwrap_or(u64::MAX))
            .min(BACKOFF_MAX_SECONDS),
    };
    RestartDelay {
        seconds,
        loop_restarts: in_a_row + 1,
    }
}

/// The wait before a next generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartDelay {
    pub seconds: u64,
    /// Restarts of the loop so far, this one included.
    pub loop_restarts: u32,
}

impl RestartDelay {
    /// Says why the gang waits, for the condition and the console.
    pub fn message(&self, generation: u32) -> String {
        format!(
            "backing off {} s before generation {generation}: restart {} within {} minutes of each other \
             ({} s doubling, at most {} s)",
            self.seconds,
            self.loop_restarts,
            RESTART_LOOP_WINDOW_SECONDS / 60,
            BACKOFF_BASE_SECONDS,
            BACKOFF_MAX_SECONDS
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_backs_off_from_its_second_restart_doubling_to_the_cap() {
        // (earlier restarts, now) -> seconds to wait, restarts of the loop
        let cases: [(&[i64], i64, u64, u32); 8] = [
            (&[], 100, 0, 1),
            (&[50], 100, 10, 2),
            (&[20, 50], 100, 20, 3),
            (&[0, 10, 20, 50], 100, 80, 5),
            (&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 10, 360, 11),
            // A generation that ran 10 minutes ends the loop.
            (&[0, 10], 700, 0, 1),
            (&[0, 100, 710], 720, 10, 2),
            // The window is between consecutive restarts, not from the first.
            (&[0, 500, 1000], 1500, 40, 4),
        ];
        for (earlier, now, seconds, loop_restarts) in cases {
            assert_eq!(
                restart_delay(earlier, now),
                RestartDelay {
                    seconds,
                    loop_restarts
                },
                "{earlier:?} {now}"
            );
        }
        assert_eq!(restart_delay(&[0; 200], 0).seconds, BACKOFF_MAX_SECONDS);
    }

    #[test]
    fn a_granted_restart_is_counted_against_its_budget_and_said_so() {
        let policy = RunPolicy {
            backoff_limit: 3,
            max_infrastructure_restarts: Some(10),
            ..RunPolicy::default()
        };
        let mut restarts = Restarts::default();
        assert_eq!(
            restarts.count(&policy, true, EndCause::Failure),
            "counted against backoffLimit: 1 of 3"
        );
        assert_eq!(
            restarts.count(&policy, false, EndCause::Disruption),
            "a disruption: not counted against backoffLimit; maxInfrastructureRestarts: 1 of 10"
        );
        assert_eq!(
            restarts.count(&policy, false, EndCause::Failure),
            "not counted against backoffLimit; maxInfrastructureRestarts: 2 of 10"
        );
        let unbounded = RunPolicy {
            max_infrastructure_restarts: None,
            ..policy
        };
        assert_eq!(
            restarts.count(&unbounded, false, EndCause::Disruption),
            "a disruption: not counted against backoffLimit"
        );
        assert_eq!(
            restarts,
            Restarts {
                counted: 1,
                not_counted: 3
            }
        );
    }
}
