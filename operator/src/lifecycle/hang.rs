//! Hang detection (`spec.runPolicy.progressDeadlineSeconds`, DESIGN 5.3): while every rank of the generation
//! runs, the step rank 0 last reported (`status.progress.step`) and since when it stood still are kept in
//! `status.lastProgress`; the job is looked at again when the deadline falls, and a step that did not advance by
//! then blames rank 0 with a `Hung` end, which the failure rules judge as any other (by default a counted restart),
//! once a report taken after the deadline still says that step (`status.progress.updateTime`). When reports stop
//! arriving instead, the gang runs on under the condition `ProgressUnreported`: whoever keeps rank 0's reports
//! from the operator (a flooded progress port) cannot restart the job.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rdu_crds::ProgressMark;
use rdu_crds::failure_policy::LostReason;
use rdu_gang::{GangNow, HangCheck, ProgressWatch, check_hang};

use super::pod_view::PodState;
use super::teardown::RankFailure;
use super::{Look, condition};

impl Look<'_> {
    /// Whether every rank of the current generation runs (none pending, ended or being deleted).
    fn all_ranks_running(&self) -> bool {
        self.live_by_rank()
            .iter()
            .all(|p| p.is_some_and(|p| matches!(p.state, PodState::Running { .. })))
    }

    /// Keeps `status.lastProgress` while every rank runs and no generation is stopping (cleared otherwise), and
    /// returns rank 0's `Hung` end once its step stood still for `progressDeadlineSeconds`; else requeues at the
    /// deadline. The judgement is `rdu_gang::check_hang`, local mode's too.
    pub(super) fn hang(&mut self) -> Option<RankFailure> {
        let kept = self.status.last_progress.take();
        let previous = kept.as_ref().map(|mark| ProgressWatch {
            generation: mark.generation,
            step: mark.step,
            since: mark.since.0.as_second(),
        });
        let progress = self.status.progress.as_ref();
        let gang = GangNow {
            generation: self.generation(),
            step: progress.map(|p| p.step),
            reported_at: progress
                .and_then(|p| p.update_time.as_ref())
                .map(|t| t.0.as_second()),
            every_rank_runs: self.status.stopping.is_none() && self.all_ranks_running(),
            now: self.now.as_second(),
        };
        let check = check_hang(
            self.job.run_policy.progress_deadline_seconds,
            previous,
            gang,
        );
        if !matches!(check, HangCheck::Unreported { .. }) {
            self.clear_condition(
                condition::PROGRESS_UNREPORTED,
                "ReportsTaken",
                "rank 0's progress reports are taken again",
            );
        }
        match check {
            HangCheck::Off => None,
            HangCheck::Watching { watch, recheck_in } => {
                self.keep_watch(kept, previous, watch, recheck_in);
                None
            }
            HangCheck::Unreported {
                watch,
                silent_seconds,
                recheck_in,
            } => {
                self.keep_watch(kept, previous, watch, recheck_in);
                let at = match watch.step {
                    Some(step) => format!("the last one taken said step {step}"),
                    None => "none was taken this generation".to_string(),
                };
                let message = format!(
                    "no progress report from rank 0 taken for {silent_seconds} s ({at}): a hang is judged only on \
                     reports (spec.runPolicy.progressDeadlineSeconds), so the gang runs on; check that rank 0 \
                     reaches the operator's progress endpoint"
                );
                if !self.condition_is(condition::PROGRESS_UNREPORTED) {
                    self.event(true, "ProgressUnreported", message.clone());
                }
                self.set_condition(
                    condition::PROGRESS_UNREPORTED,
                    true,
                    "NoReportTaken",
                    message,
                );
                None
            }
            // The generation stops now: no window until the next one runs (`last_progress` stays cleared).
            HangCheck::Hung(hang) => {
                let pod = self.current_rank(0)?;
                let mut hung = RankFailure::lost(0, LostReason::Hung, None).on(pod.node.clone());
                hung.message = hang.message();
                Some(hung)
            }
        }
    }

    /// Keeps the watch in `status.lastProgress` and looks again in `recheck_in`: an unchanged watch keeps its mark
    /// as it was (its time to the nanosecond); a new one starts now.
    fn keep_watch(
        &mut self,
        kept: Option<ProgressMark>,
        previous: Option<ProgressWatch>,
        watch: ProgressWatch,
        recheck_in: i64,
    ) {
        self.status.last_progress = match kept {
            Some(mark) if previous == Some(watch) => Some(mark),
            _ => Some(ProgressMark {
                generation: watch.generation,
                step: watch.step,
                since: Time(self.now),
            }),
        };
        self.requeue_in(recheck_in);
    }
}
