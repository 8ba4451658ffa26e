//! Local mode's progress channel: with `RDU_PROGRESS_LINES=1` (set by `rdujob run` on rank 0), one JSON line
//! `{"progress":{…}}` on stdout per update (at most every [`LINE_INTERVAL`], and the last step), which `rdujob`
//! turns into its progress bar instead of printing.

use std::io::Write;
use std::time::{Duration, Instant};

use rdu_crds::TrainingProgress;
use serde::{Deserialize, Serialize};

use crate::train_events::{StepDone, TrainObserver};

/// The progress line is rewritten at most this often.
pub(crate) const LINE_INTERVAL: Duration = Duration::from_millis(200);

/// One line on rank 0's stdout.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProgressLine {
    pub progress: TrainingProgress,
}

impl ProgressLine {
    /// The line's progress, if `line` is one (anything else is an ordinary log line).
    pub fn parse(line: &str) -> Option<TrainingProgress> {
        let line = line.trim();
        if !line.starts_with("{\"progress\"") {
            return None;
        }
        serde_json::from_str::<ProgressLine>(line)
            .ok()
            .map(|l| l.progress)
    }
}

/// Writes progress lines to stdout.
#[derive(Default)]
pub(crate) struct ProgressLines {
    last: Option<Instant>,
}

impl TrainObserver for ProgressLines {
    fn step_done(&mut self, step: &StepDone) {
        let last_step = step.point.step >= step.point.total_steps;
        if !last_step && self.last.is_some_and(|t| t.elapsed() < LINE_INTERVAL) {
            return;
        }
        self.last = Some(Instant::now());
        let line = ProgressLine {
            progress: TrainingProgress::at(step.point),
        };
        if let Ok(text) = serde_json::to_string(&line) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_crds::StepPoint;

    #[test]
    fn a_progress_line_round_trips_and_log_lines_are_not_progress() {
        let progress = TrainingProgress::at(StepPoint {
            step: 3,
            total_steps: 12,
            start_step: 0,
            epoch: 1,
            epochs: 2,
            loss: 0.5,
            elapsed_seconds: 1.0,
            samples: 96,
        });
        let text = serde_json::to_string(&ProgressLine {
            progress: progress.clone(),
        })
        .expect("json");
        assert_eq!(ProgressLine::parse(&text), Some(progress));
        assert_eq!(
            ProgressLine::parse("2026-11-24T00:00:00Z  INFO epoch done"),
            None
        );
        assert_eq!(ProgressLine::parse("{\"progress\": 3}"), None);
        assert_eq!(
            ProgressLine::parse("{\"progress\":{\"step\":1}} trailing"),
            None
        );
    }
}
