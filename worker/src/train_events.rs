//! What the training loop tells as it goes: a [`TrainObserver`] hears of every step, every epoch and the end.
//! Observers run on the training loop's thread between steps, so they must not block: one that does I/O over
//! the network hands its work to a task.

use rdu_crds::{JobResult, StepPoint};

use crate::model::BatchStats;

/// The end of one optimizer step.
#[derive(Clone, Copy, Debug)]
pub struct StepDone {
    /// Where the run is (global step, epoch, this rank's batch loss, time and samples so far).
    pub point: StepPoint,
    /// This rank's batch.
    pub batch: BatchStats,
    /// The optimizer's learning rate for this step.
    pub learning_rate: f64,
}

/// The end of one epoch.
#[derive(Clone, Copy, Debug)]
pub struct EpochDone {
    /// From 1.
    pub epoch: u64,
    pub epochs: u64,
    /// Global steps done.
    pub step: u64,
    /// The epoch's loss and accuracy as `training.lossOn` defines them (this rank's, or every rank's).
    pub logged: BatchStats,
    /// This rank's samples per second over the epoch.
    pub samples_per_second: f64,
}

/// Hears the training loop's events; every method defaults to doing nothing.
pub trait TrainObserver: Send {
    fn step_done(&mut self, _step: &StepDone) {}
    fn epoch_done(&mut self, _epoch: &EpochDone) {}
    fn finished(&mut self, _result: &JobResult) {}
}
