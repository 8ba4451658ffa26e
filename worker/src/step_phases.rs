//! Where a rank's training steps spend their time: gathering the batch, forward and backward, the reduction
//! backward did not hide, and the optimizer; summed over steps, reported as means in the job result.

use std::time::Duration;

use rdu_crds::StepPhasesResult;

/// How long a step's gradient took: forward and backward, then the reduction still running after them.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct GradientTimes {
    pub compute: Duration,
    pub exposed_reduce: Duration,
}

/// One step's phases, or the sum over several.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct StepPhases {
    pub steps: u64,
    pub gather: Duration,
    pub gradient: GradientTimes,
    pub optimizer: Duration,
}

impl StepPhases {
    /// Adds one step's times.
    pub(crate) fn record(
        &mut self,
        gather: Duration,
        gradient: GradientTimes,
        optimizer: Duration,
    ) {
        self.steps += 1;
        self.gather += gather;
        self.gradient.compute += gradient.compute;
        self.gradient.exposed_reduce += gradient.exposed_reduce;
        self.optimizer += optimizer;
    }

    /// Mean seconds per step of each phase; `None` before the first step.
    pub(crate) fn per_step(&self) -> Option<StepPhasesResult> {
        if self.steps == 0 {
            return None;
        }
        let mean = |d: Duration| d.as_secs_f64() / self.steps as f64;
        Some(StepPhasesResult {
            steps: self.steps,
            gather_seconds: mean(self.gather),
            compute_seconds: mean(self.gradient.compute),
            exposed_reduce_seconds: mean(self.gradient.exposed_reduce),
            optimizer_seconds: mean(self.optimizer),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_are_per_step_and_nothing_is_reported_before_a_step() {
        let mut phases = StepPhases::default();
        assert_eq!(phases.per_step(), None);
        let ms = Duration::from_millis;
        for (compute, exposed) in [(ms(10), ms(2)), (ms(30), ms(0))] {
            let gradient = GradientTimes {
                compute,
                exposed_reduce: exposed,
            };
            phases.record(ms(1), gradient, ms(4));
        }
        assert_eq!(
            phases.per_step(),
            Some(StepPhasesResult {
                steps: 2,
                gather_seconds: 0.001,
                compute_seconds: 0.02,
                exposed_reduce_seconds: 0.001,
                optimizer_seconds: 0.004,
            })
        );
    }
}
