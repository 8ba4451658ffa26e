//! What rank 0 sends the operator's progress endpoint, and the checks a report must pass before any of it
//! reaches `status.progress` (DESIGN 4.8).

use serde::{Deserialize, Serialize};

use crate::progress::TrainingProgress;

/// Ten years: no ETA beyond it is a real estimate.
const MAX_ETA_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// One progress report of rank 0 of the gang `generation`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProgressReport {
    /// The gang generation the reporting rank belongs to (`RDU_GENERATION`).
    pub generation: u32,
    pub progress: TrainingProgress,
}

/// Why a report's content was refused; the message names the field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ReportError {
    #[error("progress.updateTime is set by the operator; leave it out")]
    UpdateTimeSet,
    #[error("progress.totalSteps must be at least 1")]
    NoSteps,
    #[error("progress.step {step} is past progress.totalSteps {total}")]
    StepPastTotal { step: u64, total: u64 },
    #[error("progress.epoch {epoch} is past progress.epochs {epochs}")]
    EpochPastTotal { epoch: u64, epochs: u64 },
    #[error("progress.percent {got} does not match step/totalSteps ({want})")]
    PercentMismatch { got: u32, want: u32 },
    #[error(
        "progress.estimatedRemainingSeconds {0} is beyond any real run (at most {MAX_ETA_SECONDS})"
    )]
    EtaTooLarge(u64),
    #[error("progress.{field} must be a finite number of at least 0, not {value}")]
    BadNumber { field: &'static str, value: f64 },
}

impl ProgressReport {
    /// The report's progress if it is consistent: step within the run, percent matching it, numbers finite.
    pub fn checked(self) -> Result<TrainingProgress, ReportError> {
        let p = self.progress;
        if p.update_time.is_some() {
            return Err(ReportError::UpdateTimeSet);
        }
        if p.total_steps == 0 {
            return Err(ReportError::NoSteps);
        }
        if p.step > p.total_steps {
            return Err(ReportError::StepPastTotal {
                step: p.step,
                total: p.total_steps,
            });
        }
        if p.epoch > p.epochs {
            return Err(ReportError::EpochPastTotal {
                epoch: p.epoch,
                epochs: p.epochs,
            });
        }
        let want = (u128::from(p.step) * 100 / u128::from(p.total_steps)) as u32;
        if p.percent != want {
            return Err(ReportError::PercentMismatch {
                got: p.percent,
                want,
            });
        }
        if let Some(eta) = p
            .estimated_remaining_seconds
            .filter(|s| *s > MAX_ETA_SECONDS)
        {
            return Err(ReportError::EtaTooLarge(eta));
        }
        for (field, value) in [("loss", p.loss), ("samplesPerSecond", p.samples_per_second)] {
            if let Some(value) = value.filter(|v| !v.is_finite() || *v < 0.0) {
                return Err(ReportError::BadNumber { field, value });
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::StepPoint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn report() -> ProgressReport {
        ProgressReport {
            generation: 1,
            progress: TrainingProgress::at(StepPoint {
                step: 30,
                total_steps: 120,
                start_step: 0,
                epoch: 1,
                epochs: 4,
                loss: 0.7,
                elapsed_seconds: 3.0,
                samples: 30 * 128,
            }),
        }
    }

    #[test]
    fn what_the_worker_computes_passes() {
        let checked = report().checked().expect("consistent");
        assert_eq!((checked.step, checked.percent), (30, 25));
    }

    #[test]
    fn inconsistent_reports_name_the_field() {
        type Spoil = fn(&mut TrainingProgress);
        let cases: [(Spoil, &str); 7] = [
            (
                |p| p.update_time = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                "updateTime",
            ),
            (|p| p.total_steps = 0, "totalSteps"),
            (|p| p.step = 121, "step 121"),
            (|p| p.epoch = 5, "epoch 5"),
            (|p| p.percent = 90, "percent 90"),
            (
                |p| p.estimated_remaining_seconds = Some(u64::MAX),
                "estimatedRemaining",
            ),
            (|p| p.loss = Some(-1.0), "progress.loss"),
        ];
        for (spoil, field) in cases {
            let mut r = report();
            spoil(&mut r.progress);
            let error = r.checked().expect_err(field).to_string();
            assert!(error.contains(field), "{error} should name {field}");
        }
    }

    #[test]
    fn unknown_fields_and_wrong_types_do_not_parse() {
        let mut value = serde_json::to_value(report()).expect("json");
        value["admin"] = true.into();
        assert!(serde_json::from_value::<ProgressReport>(value).is_err());
        let text = r#"{"generation":"one","progress":{}}"#;
        assert!(serde_json::from_str::<ProgressReport>(text).is_err());
    }
}
