//! `status.progress`: how far a running job is (step, epoch, percent, ETA, latest loss and throughput), as
//! rank 0 measures it; the operator stamps `updateTime` with its own clock when it accepts a report.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Progress of the training loop of the current generation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingProgress {
    /// Global optimizer steps done.
    pub step: u64,
    /// Global optimizer steps of the whole run.
    pub total_steps: u64,
    /// The epoch being trained, from 1.
    pub epoch: u64,
    /// Epochs of the whole run.
    pub epochs: u64,
    /// `step / totalSteps` in percent, rounded down (0–100).
    pub percent: u32,
    /// Seconds left at the throughput of the run so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_remaining_seconds: Option<u64>,
    /// Mean training loss of rank 0's latest step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Samples per second of the whole job (all ranks) so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second: Option<f64>,
    /// When the operator accepted the report this progress comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time: Option<Time>,
}

/// What the training loop knows at the end of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepPoint {
    /// Steps done in this run (global), and the run's total.
    pub step: u64,
    pub total_steps: u64,
    /// Steps this process started from (a resumed run starts past 0): the ETA uses only steps it timed.
    pub start_step: u64,
    pub epoch: u64,
    pub epochs: u64,
    pub loss: f64,
    /// Seconds since this process's first step began.
    pub elapsed_seconds: f64,
    /// Samples all ranks processed since then.
    pub samples: u64,
}

impl TrainingProgress {
    /// Progress at `p`, without `updateTime`: percent rounded down, ETA from the steps this process timed.
    pub fn at(p: StepPoint) -> TrainingProgress {
        let total = p.total_steps.max(1);
        let step = p.step.min(total);
        let timed = step.saturating_sub(p.start_step);
        let rate_ok = timed > 0 && p.elapsed_seconds > 0.0 && p.elapsed_seconds.is_finite();
        let estimated_remaining_seconds = rate_ok.then(|| {
            let per_step = p.elapsed_seconds / timed as f64;
            (per_step * (total - step) as f64).ceil() as u64
        });
        let samples_per_second =
            (rate_ok && p.samples > 0).then(|| p.samples as f64 / p.elapsed_seconds);
        TrainingProgress {
            step,
            total_steps: total,
            epoch: p.epoch,
            epochs: p.epochs,
            percent: (step * 100 / total) as u32,
            estimated_remaining_seconds,
            loss: p.loss.is_finite().then_some(p.loss),
            samples_per_second,
            update_time: None,
        }
    }

    /// The progress of a run that ended with `result`: all its steps done (the total the last report `last`
    /// gave, else the result's step count), 100 %, no ETA, the result's loss and throughput, without
    /// `updateTime`. Reports stop with the run, and the last one may not have reached the operator (rank 0 ended
    /// while the endpoint was away), so a finished job must not keep showing a step it passed.
    pub fn completed(
        last: Option<&TrainingProgress>,
        result: &crate::JobResult,
    ) -> TrainingProgress {
        let total = last.map_or(result.global_steps, |p| p.total_steps);
        let epochs = last.map_or(0, |p| p.epochs);
        TrainingProgress {
            step: total,
            total_steps: total,
            epoch: epochs,
            epochs,
            percent: 100,
            estimated_remaining_seconds: None,
            loss: result.final_loss.is_finite().then_some(result.final_loss),
            samples_per_second: (result.samples_per_second.is_finite()
                && result.samples_per_second > 0.0)
                .then_some(result.samples_per_second),
            update_time: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: u64, start_step: u64, elapsed_seconds: f64) -> StepPoint {
        StepPoint {
            step,
            total_steps: 200,
            start_step,
            epoch: 2,
            epochs: 4,
            loss: 0.5,
            elapsed_seconds,
            samples: (step - start_step) * 64,
        }
    }

    #[test]
    fn percent_rounds_down_and_eta_follows_the_rate_so_far() {
        let p = TrainingProgress::at(point(50, 0, 10.0));
        assert_eq!(p.percent, 25);
        assert_eq!(p.estimated_remaining_seconds, Some(30));
        assert_eq!(p.samples_per_second, Some(320.0));
        assert_eq!(TrainingProgress::at(point(199, 0, 1.0)).percent, 99);
        assert_eq!(
            TrainingProgress::at(point(200, 0, 1.0)).estimated_remaining_seconds,
            Some(0)
        );
    }

    #[test]
    fn a_resumed_run_times_only_its_own_steps() {
        // Resumed at step 100: 50 steps in 10 s leaves 50 steps, 10 s.
        let p = TrainingProgress::at(point(150, 100, 10.0));
        assert_eq!((p.percent, p.estimated_remaining_seconds), (75, Some(10)));
    }

    #[test]
    fn a_finished_run_is_at_its_last_step_whatever_the_last_report_said() {
        let result = crate::JobResult {
            final_loss: 0.25,
            samples_per_second: 640.5,
            global_steps: 200,
            ..crate::JobResult::default()
        };
        let last = TrainingProgress::at(point(75, 0, 10.0));
        let done = TrainingProgress::completed(Some(&last), &result);
        assert_eq!(
            (
                done.step,
                done.total_steps,
                done.epoch,
                done.epochs,
                done.percent
            ),
            (200, 200, 4, 4, 100)
        );
        assert_eq!(done.estimated_remaining_seconds, None);
        assert_eq!(
            (done.loss, done.samples_per_second),
            (Some(0.25), Some(640.5))
        );
        // No report ever came: the result's step count.
        let unreported = TrainingProgress::completed(None, &result);
        assert_eq!(
            (unreported.step, unreported.percent, unreported.epochs),
            (200, 100, 0)
        );
        let nan = crate::JobResult {
            final_loss: f64::NAN,
            ..result
        };
        assert_eq!(TrainingProgress::completed(None, &nan).loss, None);
    }

    #[test]
    fn no_estimate_before_a_timed_step_and_no_nan_loss() {
        let mut at_start = point(100, 100, 0.0);
        at_start.loss = f64::NAN;
        let p = TrainingProgress::at(at_start);
        assert_eq!(p.estimated_remaining_seconds, None);
        assert_eq!(p.samples_per_second, None);
        assert_eq!(p.loss, None);
    }
}
