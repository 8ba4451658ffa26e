//! Hang detection (`spec.runPolicy.progressDeadlineSeconds`, DESIGN 5.3), written once for the operator and local
//! mode: while every rank of a generation runs, rank 0's step is watched; a step that stood still for the
//! deadline, as a report taken after the deadline still says, is a hang, blamed on rank 0 (reason `Hung`), which
//! the failure rules judge as any other end. Missing reports are no hang: the gang is left running and the
//! caller says the reports stopped (`Unreported`), so whoever keeps rank 0's reports from arriving (a flooded
//! progress port) cannot restart a job. Time is whole seconds on the caller's clock (the operator's wall clock,
//! local mode's gang start).

use rdu_crds::EndCause;
use rdu_crds::failure_policy::HUNG;

use crate::{Culprit, RankExit};

/// Rank 0's step as last seen for `generation`, unchanged since `since`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgressWatch {
    pub generation: u32,
    /// None before rank 0 ever reported.
    pub step: Option<u64>,
    pub since: i64,
}

/// What the gang looks like now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GangNow {
    pub generation: u32,
    /// The step rank 0 last reported.
    pub step: Option<u64>,
    /// When rank 0's newest report (of `step`) was taken; `now` where its output is read directly (local mode).
    pub reported_at: Option<i64>,
    /// Every rank of the generation runs (none pending, ended or being stopped).
    pub every_rank_runs: bool,
    pub now: i64,
}

/// What the watch says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HangCheck {
    /// No deadline, or not every rank runs: nothing is watched (the caller forgets its watch).
    Off,
    /// Keep `watch`; look again in `recheck_in` seconds (at least 1).
    Watching {
        watch: ProgressWatch,
        recheck_in: i64,
    },
    /// The step stood still for the deadline, but no report taken since says so: rank 0's reports are not
    /// arriving. The gang runs on; keep `watch`, say so, and look again in `recheck_in` seconds.
    Unreported {
        watch: ProgressWatch,
        /// Seconds since the newest report was taken (since the watch began, when none was).
        silent_seconds: i64,
        recheck_in: i64,
    },
    /// The step stood still for the deadline, and a report taken after it says so: the generation stops, rank 0
    /// is blamed.
    Hung(Hang),
}

/// How often a watch whose reports stopped is looked at again (rank 0 reports every 5 s).
pub const UNREPORTED_RECHECK_SECONDS: i64 = 5;

/// How old the newest report taken may be before reports count as stopped: rank 0 reports at least every 5 s and
/// the operator writes one to status at most every 5 s, so one 10 s old is on time; 15 s leaves a late heartbeat
/// its slack. Past the deadline, a younger one waits for the next report instead of saying they stopped.
pub const REPORTS_OVERDUE_SECONDS: i64 = 15;

/// Rank 0 made no progress for `progressDeadlineSeconds` while every rank ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hang {
    /// The step it last reported, if any.
    pub step: Option<u64>,
    /// How long that step stood still.
    pub still_seconds: i64,
    pub deadline_seconds: u64,
}

impl Hang {
    /// The message both the operator's history and local mode's console give.
    pub fn message(&self) -> String {
        let at = match self.step {
            Some(step) => format!("its step stayed at {step}"),
            None => "it reported no step".to_string(),
        };
        format!(
            "rank 0 hung: {at} for {} s while every rank ran (spec.runPolicy.progressDeadlineSeconds {})",
            self.still_seconds, self.deadline_seconds
        )
    }

    /// Rank 0, ended without an exit code, for the reason `Hung`: the job's own doing.
    pub fn culprit(&self) -> Culprit {
        Culprit {
            reason: HUNG.to_string(),
            container_reason: None,
            ..Culprit::from_exit(0, RankExit::Lost, EndCause::Failure)
        }
    }
}

/// Looks at the gang against the deadline `deadline` (seconds), given the watch kept from the last look. Past the
/// deadline with no report confirming it, reports count as stopped only once the newest is
/// [`REPORTS_OVERDUE_SECONDS`] old.
pub fn check_hang(
    deadline: Option<u64>,
    previous: Option<ProgressWatch>,
    gang: GangNow,
) -> HangCheck {
    let (Some(deadline), true) = (deadline, gang.every_rank_runs) else {
        return HangCheck::Off;
    };
    let watch = match previous {
        Some(watch) if watch.generation == gang.generation && watch.step == gang.step => watch,
        _ => ProgressWatch {
            generation: gang.generation,
            step: gang.step,
            since: gang.now,
        },
    };
    let still_seconds = gang.now - watch.since;
    let remaining = i64::try_from(deadline).unwrap_or(i64::MAX) - still_seconds;
    let confirmed = gang
        .reported_at
        .is_some_and(|at| at - watch.since >= i64::try_from(deadline).unwrap_or(i64::MAX));
    if remaining > 0 {
        HangCheck::Watching {
            watch,
            recheck_in: remaining,
        }
    } else if confirmed {
        HangCheck::Hung(Hang {
            step: gang.step,
            still_seconds,
            deadline_seconds: deadline,
        })
    } else {
        let silent_seconds = gang.now - gang.reported_at.unwrap_or(watch.since).max(watch.since);
        if silent_seconds < REPORTS_OVERDUE_SECONDS {
            // The report that confirms or clears the hang is on its way (its status write wakes the operator too).
            HangCheck::Watching {
                watch,
                recheck_in: REPORTS_OVERDUE_SECONDS - silent_seconds,
            }
        } else {
            HangCheck::Unreported {
                watch,
                silent_seconds,
                recheck_in: UNREPORTED_RECHECK_SECONDS,
            }
        }
    }
}

/// A watch kept in memory, for a caller that reads rank 0's steps directly (local mode reads its output; the
/// operator keeps its watch in `status.lastProgress` instead): what it last said is current, so a step that stood
/// still for the deadline is a hang at once. Time is whole seconds from the gang's start.
#[derive(Debug)]
pub struct StepWatcher {
    deadline: Option<u64>,
    step: Option<u64>,
    watch: Option<ProgressWatch>,
    every_rank_runs: bool,
    hung: Option<Hang>,
}

impl StepWatcher {
    /// A watcher of a gang whose every rank runs, under `progressDeadlineSeconds` `deadline`.
    pub fn new(deadline: Option<u64>) -> Self {
        StepWatcher {
            deadline,
            step: None,
            watch: None,
            every_rank_runs: true,
            hung: None,
        }
    }

    /// Looks at `now`, with rank 0's newest step if one came: when to look next (seconds from the start), none
    /// when nothing is watched any more (a hang found is kept for [`StepWatcher::take_hang`]).
    pub fn look(&mut self, now: i64, step: Option<u64>) -> Option<i64> {
        if step.is_some() {
            self.step = step;
        }
        let gang = GangNow {
            generation: 0,
            step: self.step,
            reported_at: Some(now),
            every_rank_runs: self.every_rank_runs,
            now,
        };
        match check_hang(self.deadline, self.watch.take(), gang) {
            HangCheck::Off => None,
            // Not with `reported_at` now; kept watching should it ever be.
            HangCheck::Watching { watch, recheck_in }
            | HangCheck::Unreported {
                watch, recheck_in, ..
            } => {
                self.watch = Some(watch);
                Some(now.saturating_add(recheck_in))
            }
            HangCheck::Hung(hang) => {
                self.hung = Some(hang);
                self.every_rank_runs = false;
                None
            }
        }
    }

    /// Not every rank runs any more: nothing to watch.
    pub fn stop(&mut self) {
        self.watch = None;
        self.every_rank_runs = false;
    }

    /// The hang found by the last look, once.
    pub fn take_hang(&mut self) -> Option<Hang> {
        self.hung.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_finds_a_step_that_stood_still_for_the_deadline_while_every_rank_ran() {
        // (look at, step that came) -> next look, for a deadline of 20 s
        let mut w = StepWatcher::new(Some(20));
        assert_eq!(w.look(0, None), Some(20));
        assert_eq!(
            w.look(5, Some(1)),
            Some(25),
            "a new step restarts the watch"
        );
        assert_eq!(w.look(12, Some(1)), Some(25), "the same step keeps it");
        assert_eq!(w.look(25, None), None);
        let hang = w.take_hang().expect("hung");
        assert_eq!((hang.step, hang.still_seconds), (Some(1), 20));
        assert!(w.take_hang().is_none(), "given once");
        // A rank ended: nothing is watched, and no hang is found after.
        let mut w = StepWatcher::new(Some(20));
        assert_eq!(w.look(0, None), Some(20));
        w.stop();
        assert_eq!(w.look(40, None), None);
        assert!(w.take_hang().is_none());
        // No deadline: nothing is watched.
        assert_eq!(StepWatcher::new(None).look(0, None), None);
    }

    /// The gang as local mode sees it: rank 0 read directly, so its state is current.
    fn gang(generation: u32, step: Option<u64>, every_rank_runs: bool, now: i64) -> GangNow {
        GangNow {
            generation,
            step,
            reported_at: Some(now),
            every_rank_runs,
            now,
        }
    }

    /// The gang as the operator sees it: rank 0's newest report taken at `reported_at`.
    fn reported(step: Option<u64>, reported_at: Option<i64>, now: i64) -> GangNow {
        GangNow {
            reported_at,
            ..gang(0, step, true, now)
        }
    }

    fn watch(generation: u32, step: Option<u64>, since: i64) -> Option<ProgressWatch> {
        Some(ProgressWatch {
            generation,
            step,
            since,
        })
    }

    fn watching(generation: u32, step: Option<u64>, since: i64, recheck_in: i64) -> HangCheck {
        HangCheck::Watching {
            watch: ProgressWatch {
                generation,
                step,
                since,
            },
            recheck_in,
        }
    }

    fn hung(step: Option<u64>, still_seconds: i64) -> HangCheck {
        HangCheck::Hung(Hang {
            step,
            still_seconds,
            deadline_seconds: 20,
        })
    }

    #[test]
    fn the_watch_follows_rank_0s_step_while_every_rank_runs() {
        let cases = [
            // (name, deadline, previous watch, gang now, expected)
            (
                "no deadline",
                None,
                None,
                gang(0, Some(5), true, 100),
                HangCheck::Off,
            ),
            (
                "a rank not running",
                Some(20),
                watch(0, Some(5), 50),
                gang(0, Some(5), false, 100),
                HangCheck::Off,
            ),
            (
                "first look starts the clock",
                Some(20),
                None,
                gang(0, None, true, 100),
                watching(0, None, 100, 20),
            ),
            (
                "same step: the clock runs on",
                Some(20),
                watch(0, Some(5), 90),
                gang(0, Some(5), true, 100),
                watching(0, Some(5), 90, 10),
            ),
            (
                "a new step restarts the clock",
                Some(20),
                watch(0, Some(5), 50),
                gang(0, Some(6), true, 100),
                watching(0, Some(6), 100, 20),
            ),
            (
                "a new generation restarts the clock",
                Some(20),
                watch(0, Some(5), 50),
                gang(1, Some(5), true, 100),
                watching(1, Some(5), 100, 20),
            ),
            (
                "one second short: look again in 1",
                Some(20),
                watch(0, Some(5), 81),
                gang(0, Some(5), true, 100),
                watching(0, Some(5), 81, 1),
            ),
            (
                "the deadline reached: hung",
                Some(20),
                watch(0, Some(5), 80),
                gang(0, Some(5), true, 100),
                hung(Some(5), 20),
            ),
            (
                "never reported: hung too",
                Some(20),
                watch(0, None, 70),
                gang(0, None, true, 100),
                hung(None, 30),
            ),
        ];
        for (name, deadline, previous, now, expected) in cases {
            assert_eq!(check_hang(deadline, previous, now), expected, "{name}");
        }
    }

    #[test]
    fn only_a_report_taken_after_the_deadline_makes_a_hang_and_missing_reports_never_do() {
        let unreported = |silent_seconds, since| HangCheck::Unreported {
            watch: ProgressWatch {
                generation: 0,
                step: Some(5),
                since,
            },
            silent_seconds,
            recheck_in: UNREPORTED_RECHECK_SECONDS,
        };
        let cases = [
            // (name, previous watch, gang now, expected)
            (
                "a report after the deadline at the same step: hung",
                watch(0, Some(5), 80),
                reported(Some(5), Some(100), 100),
                hung(Some(5), 20),
            ),
            (
                "the deadline passed 5 s after the last report: the next one is waited for, not missed",
                watch(0, Some(5), 80),
                reported(Some(5), Some(95), 100),
                watching(0, Some(5), 80, 10),
            ),
            (
                "one second short of overdue: still waited for",
                watch(0, Some(5), 80),
                reported(Some(5), Some(95), 109),
                watching(0, Some(5), 80, 1),
            ),
            (
                "reports stopped before the deadline and are overdue: no hang, reports missing",
                watch(0, Some(5), 80),
                reported(Some(5), Some(95), 110),
                unreported(15, 80),
            ),
            (
                "a report one second short of the deadline does not confirm it",
                watch(0, Some(5), 80),
                reported(Some(5), Some(99), 130),
                unreported(31, 80),
            ),
            (
                "a report older than the watch counts from the watch",
                watch(0, Some(5), 80),
                reported(Some(5), Some(10), 130),
                unreported(50, 80),
            ),
            (
                "never reported: missing, not hung",
                watch(0, None, 70),
                reported(None, None, 100),
                HangCheck::Unreported {
                    watch: ProgressWatch {
                        generation: 0,
                        step: None,
                        since: 70,
                    },
                    silent_seconds: 30,
                    recheck_in: UNREPORTED_RECHECK_SECONDS,
                },
            ),
            (
                "before the deadline nothing is judged",
                watch(0, Some(5), 90),
                reported(Some(5), None, 100),
                watching(0, Some(5), 90, 10),
            ),
        ];
        for (name, previous, now, expected) in cases {
            assert_eq!(check_hang(Some(20), previous, now), expected, "{name}");
        }
    }

    #[test]
    fn a_hang_is_rank_0s_and_says_where_it_stood() {
        let hang = Hang {
            step: Some(60),
            still_seconds: 21,
            deadline_seconds: 20,
        };
        assert_eq!(
            hang.message(),
            "rank 0 hung: its step stayed at 60 for 21 s while every rank ran \
             (spec.runPolicy.progressDeadlineSeconds 20)"
        );
        let none = Hang { step: None, ..hang };
        assert!(none.message().contains("it reported no step for 21 s"));
        let culprit = hang.culprit();
        assert_eq!((culprit.rank, culprit.exit), (0, RankExit::Lost));
        assert_eq!(culprit.reason, HUNG);
        assert_eq!(culprit.cause, EndCause::Failure);
        assert_eq!(culprit.container_reason, None);
    }
}
