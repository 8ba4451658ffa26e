//! Rank 0's TensorBoard event files (`spec.tensorboard`): a `TrainObserver` writing scalars, `train/loss`,
//! `train/learning_rate` and `train/samples_per_second` at every step, `train/accuracy` and `train/epoch_loss`
//! per epoch, `test/accuracy` and `test/loss` at the end, at their global steps. A write that fails is logged
//! once and ends the file; training goes on.

pub(crate) mod event;
pub(crate) mod record;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use rdu_crds::{JobResult, TrainingProgress};

use crate::train_events::{EpochDone, StepDone, TrainObserver};
use event::{Event, Summary, SummaryValue};

/// Writes one event file.
pub(crate) struct TensorBoardWriter {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    last_step: u64,
}

impl TensorBoardWriter {
    /// A new event file in `dir` (created if missing), `events.out.tfevents.<seconds>.<host>.<pid>`, as
    /// TensorBoard finds them.
    pub(crate) fn create(dir: &Path, host: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let path = dir.join(format!(
            "events.out.tfevents.{seconds}.{host}.{}",
            std::process::id()
        ));
        let mut writer = TensorBoardWriter {
            out: Some(BufWriter::new(File::create(&path)?)),
            path,
            last_step: 0,
        };
        writer.write(Event {
            wall_time: wall_time(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        });
        writer.flush();
        Ok(writer)
    }

    /// The event file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn scalars(&mut self, step: u64, values: &[(&str, f64)]) {
        let value = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(*v as f32),
            })
            .collect();
        self.write(Event {
            wall_time: wall_time(),
            step: i64::try_from(step).unwrap_or(i64::MAX),
            file_version: None,
            summary: Some(Summary { value }),
        });
    }

    fn write(&mut self, event: Event) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        if let Err(e) = out.write_all(&record::frame(&event.encode_to_vec())) {
            self.give_up(e);
        }
    }

    fn flush(&mut self) {
        if let Some(Err(e)) = self.out.as_mut().map(Write::flush) {
            self.give_up(e);
        }
    }

    fn give_up(&mut self, e: std::io::Error) {
        tracing::warn!(path = %self.path.display(), error = %rdu_error_chain::Chain(&e), "cannot write TensorBoard events; no more will be written");
        self.out = None;
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl TrainObserver for TensorBoardWriter {
    fn step_done(&mut self, step: &StepDone) {
        let progress = TrainingProgress::at(step.point);
        let mut values = vec![
            ("train/loss", step.batch.mean_loss()),
            ("train/learning_rate", step.learning_rate),
        ];
        if let Some(rate) = progress.samples_per_second {
            values.push(("train/samples_per_second", rate));
        }
        self.last_step = step.point.step;
        self.scalars(step.point.step, &values);
    }

    fn epoch_done(&mut self, epoch: &EpochDone) {
        self.scalars(
            epoch.step,
            &[
                ("train/accuracy", epoch.logged.accuracy()),
                ("train/epoch_loss", epoch.logged.mean_loss()),
            ],
        );
        self.flush();
    }

    fn finished(&mut self, result: &JobResult) {
        let step = self.last_step.max(result.global_steps);
        self.scalars(
            step,
            &[
                ("test/accuracy", result.test_accuracy),
                ("test/loss", result.final_loss),
            ],
        );
        self.flush();
        tracing::info!(path = %self.path.display(), "TensorBoard events written");
    }
}
