//! The observers of one rank, chosen from its contract: the epoch log line for every rank; rank 0's progress
//! lines, progress reports and TensorBoard files. What they hear is `train_events`.

use rdu_crds::JobResult;

use crate::env::WorkerEnv;
use crate::progress_lines::ProgressLines;
use crate::progress_reporter::{ProgressReporter, ReportTarget};
use crate::tensorboard::TensorBoardWriter;
use crate::train_events::{EpochDone, StepDone, TrainObserver};

/// The observers of one rank, told in order.
#[derive(Default)]
pub struct Observers(Vec<Box<dyn TrainObserver>>);

impl Observers {
    /// What a rank run from `env` reports: its epoch log lines, and rank 0 its progress to the operator when
    /// the operator takes reports.
    pub fn for_rank(env: &WorkerEnv) -> Observers {
        let mut observers = Observers::default();
        observers.push(EpochLog);
        if let (0, Some(dir)) = (env.contract.rank, env.tensorboard_dir()) {
            match TensorBoardWriter::create(dir, &env.supplied.node_name) {
                Ok(writer) => {
                    tracing::info!(path = %writer.path().display(), "writing TensorBoard events");
                    observers.push(writer);
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %rdu_error_chain::Chain(&e), "cannot create a TensorBoard event file; training goes on without it")
                }
            }
        }
        if env.contract.rank == 0 && env.contract.progress_lines {
            observers.push(ProgressLines::default());
        }
        if let (0, Some(endpoint)) = (env.contract.rank, &env.contract.progress) {
            let c = &env.contract;
            let target = ReportTarget::new(endpoint, &c.job_namespace, &c.job_name, c.generation);
            match ProgressReporter::start(target) {
                Ok(reporter) => observers.push(reporter),
                Err(e) => {
                    tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot start the progress reporter; training goes on without it")
                }
            }
        }
        observers
    }

    pub fn push(&mut self, observer: impl TrainObserver + 'static) {
        self.0.push(Box::new(observer));
    }

    pub fn step_done(&mut self, step: &StepDone) {
        self.0.iter_mut().for_each(|o| o.step_done(step));
    }

    pub fn epoch_done(&mut self, epoch: &EpochDone) {
        self.0.iter_mut().for_each(|o| o.epoch_done(epoch));
    }

    pub fn finished(&mut self, result: &JobResult) {
        self.0.iter_mut().for_each(|o| o.finished(result));
    }
}

/// The `epoch done` line of every rank's log.
pub(crate) struct EpochLog;

impl TrainObserver for EpochLog {
    fn epoch_done(&mut self, e: &EpochDone) {
        tracing::info!(
            epoch = e.epoch,
            epochs = e.epochs,
            loss = format!("{:.4}", e.logged.mean_loss()),
            train_accuracy = format!("{:.4}", e.logged.accuracy()),
            samples_per_sec = format!("{:.1}", e.samples_per_second),
            global_steps = e.step,
            "epoch done"
        );
    }
}
