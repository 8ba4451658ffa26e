//! Hang detection (`spec.runPolicy.progressDeadlineSeconds`, DESIGN 5.3): while every rank of the generation
//! runs, the step rank 0 last reported (`status.progress.step`) and since when it stood still are kept in
//! `status.lastProgress`; the job is looked at again when the deadline falls, and a step that did not advance by
//! then blames rank 0 with a `Hung` end, which the failure rules judge as any other (by default a counted restart).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rdu_crds::failure_policy::HUNG;
use rdu_crds::policy::RankExit;
use rdu_crds::{EndCause, ProgressMark};

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
    /// deadline.
    pub(super) fn hang(&mut self) -> Option<RankFailure> {
        let deadline = self.job.spec.run_policy.progress_deadline_seconds;
        let watched = self.status.stopping.is_none() && self.all_ranks_running();
        let (Some(deadline), true) = (deadline, watched) else {
            self.status.last_progress = None;
            return None;
        };
        let generation = self.generation();
        let step = self.status.progress.as_ref().map(|p| p.step);
        let mark = match self.status.last_progress.take() {
            Some(mark) if mark.generation == generation && mark.step == step => mark,
            _ => ProgressMark {
                generation,
                step,
                since: Time(self.now),
            },
        };
        let still = self.now.as_second() - mark.since.0.as_second();
        self.status.last_progress = Some(mark);
        let remaining = i64::try_from(deadline).unwrap_or(i64::MAX) - still;
        if remaining > 0 {
            self.requeue_in(remaining);
            return None;
        }
        // The generation stops now: no window until the next one runs.
        self.status.last_progress = None;
        let pod = self.current_rank(0)?;
        let at = match step {
            Some(step) => format!("its step stayed at {step}"),
            None => "it reported no step".to_string(),
        };
        let mut hung = RankFailure::new(
            0,
            RankExit::Lost,
            HUNG,
            HUNG,
            EndCause::Failure,
            pod.node.clone(),
        );
        hung.message = format!(
            "rank 0 hung: {at} for {still} s while every rank ran (spec.runPolicy.progressDeadlineSeconds {deadline})"
        );
        Some(hung)
    }
}
