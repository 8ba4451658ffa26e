//! Hang detection (`spec.runPolicy.progressDeadlineSeconds`, DESIGN 5.3): while every rank of the generation
//! runs, the step rank 0 last reported (`status.progress.step`) and since when it stood still are kept in
//! `status.lastProgress`; the job is looked at again when the deadline falls, and a step that did not advance by
//! then blames rank 0 with a `Hung` end, which the failure rules judge as any other (by default a counted restart).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rdu_crds::ProgressMark;
use rdu_crds::failure_policy::LostReason;
use rdu_crds::policy::{GangNow, HangCheck, ProgressWatch, check_hang};

use super::Step;
use super::pod_view::PodState;
use super::teardown::RankFailure;

impl Step<'_> {
    /// Whether every rank of the current generation runs (none pending, ended or being deleted).
    fn all_ranks_running(&self) -> bool {
        self.live_by_rank()
            .iter()
            .all(|p| p.is_some_and(|p| matches!(p.state, PodState::Running { .. })))
    }

    /// Keeps `status.lastProgress` while every rank runs and no generation is stopping (cleared otherwise), and
    /// returns rank 0's `Hung` end once its step stood still for `progressDeadlineSeconds`; else requeues at the
    /// deadline. The judgement is `rdu_crds::policy::check_hang`, local mode's too.
    pub(super) fn hang(&mut self) -> Option<RankFailure> {
        let kept = self.status.last_progress.take();
        let previous = kept.as_ref().map(|mark| ProgressWatch {
            generation: mark.generation,
            step: mark.step,
            since: mark.since.0.as_second(),
        });
        let gang = GangNow {
            generation: self.generation(),
            step: self.status.progress.as_ref().map(|p| p.step),
            every_rank_runs: self.status.stopping.is_none() && self.all_ranks_running(),
            now: self.now.as_second(),
        };
        match check_hang(
            self.job.spec.run_policy.progress_deadline_seconds,
            previous,
            gang,
        ) {
            HangCheck::Off => None,
            HangCheck::Watching { watch, recheck_in } => {
                // An unchanged watch keeps its mark as it was (its time to the nanosecond); a new one starts now.
                self.status.last_progress = match kept {
                    Some(mark) if previous == Some(watch) => Some(mark),
                    _ => Some(ProgressMark {
                        generation: watch.generation,
                        step: watch.step,
                        since: Time(self.now),
                    }),
                };
                self.requeue_in(recheck_in);
                None
            }
            // The generation stops now: no window until the next one runs (`last_progress` stays cleared).
            HangCheck::Hung(hang) => {
                let pod = self.current_rank(0)?;
                let mut hung = RankFailure::lost(0, LostReason::Hung, None, pod.node.clone());
                hung.message = hang.message();
                Some(hung)
            }
        }
    }
}
