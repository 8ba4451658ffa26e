//! `spec.mode: train` (the default; the seeds' `run`): every epoch of this rank's shard, each step forward and
//! backward on its tiles, the gradient summed over all ranks, an optimizer step (which takes the mean); epoch
//! logs, checkpoints, then the test split's accuracy. Training stops at a step boundary when asked (`stop`), and
//! whatever ends it early leaves the parameters and optimizer of the last completed step for rank 0 to checkpoint
//! (`checkpointing`).
//!
//! `training.lossOn` chooses where the logged loss is computed: `device` logs each rank's own shard
//! loss and accuracy (what a rank sees on its RDU); `host` averages them over all ranks through the
//! host (a small star all-reduce per epoch) so every rank logs the global figures.

use std::time::Instant;

use rdu_collective::Communicator;
use rdu_crds::{JobResult, LossOn, StepPoint, TrainingSpec};

use crate::buckets;
use crate::checkpoint_schedule::Checkpointing;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::model::{BatchStats, checksum};
use crate::model_run::{ModelJob, TrainState, global_stats};
use crate::observe::Observers;
use crate::overlap::ReducePlan;
use crate::reduce::reduce_plan;
use crate::sampler::DistributedSampler;
use crate::session::{Mode, RankOutcome, RankSession};
use crate::stop::StopRequest;
use crate::train_events::{EpochDone, StepDone};

/// The training mode: the job's data and model, loaded before the rank joins.
pub(crate) struct Train {
    job: ModelJob,
}

impl Mode for Train {
    fn prepare(env: &WorkerEnv) -> Result<Self, WorkerError> {
        Ok(Train {
            job: ModelJob::load(env)?,
        })
    }

    /// Trains to the end, telling the observers of every step and epoch, and returns the result every rank
    /// agrees on. When training ends early for a retryable cause, rank 0 first checkpoints the last step it
    /// completed.
    async fn run(self, session: RankSession<'_>) -> Result<RankOutcome, WorkerError> {
        let RankSession {
            env,
            comm,
            stop,
            observers,
        } = session;
        let sampler = self.job.train_shard(env)?;
        let schedule = Schedule::of(&env.contract.spec.training, sampler.num_samples());
        let plan = reduce_plan(&env.contract.spec.data_parallel, env.tiles);
        let (mut state, mut checkpointing) = self.start(env, comm).await?;
        self.log_start(env, &sampler, schedule, plan);
        let epochs = Epochs {
            env,
            comm,
            stop,
            job: &self.job,
            sampler: &sampler,
            schedule,
            plan,
            start_step: state.step,
        };
        let trained = match epochs
            .run(&mut state, observers, checkpointing.as_mut())
            .await
        {
            Ok(trained) => trained,
            Err(e) => return Err(save_on_the_way_out(stop, checkpointing, &state, e)),
        };
        let outcome = self.finish(env, state, trained);
        observers.finished(&outcome.result);
        Ok(outcome)
    }
}

impl Train {
    /// The state training starts from: fresh, or the checkpoint rank 0 resumes from (rank 0 fences the directory
    /// for this generation first; every rank joins the broadcast of what it found when the spec checkpoints, with
    /// or without a directory of its own: on a cluster with a checkpoint claim only rank 0 gets one).
    async fn start(
        &self,
        env: &WorkerEnv,
        comm: &Communicator,
    ) -> Result<(TrainState, Option<Checkpointing>), WorkerError> {
        let spec = &env.contract.spec;
        let mut state = TrainState::fresh(&self.job.model, spec);
        let (checkpointing, found) = Checkpointing::start(env, state.bufs.params.len())?;
        if spec.checkpoint.is_some() {
            state.step = crate::checkpoint_schedule::resume(
                comm,
                found,
                &mut state.bufs.params,
                &mut state.optimizer,
            )
            .await?;
        }
        Ok((state, checkpointing))
    }

    fn log_start(
        &self,
        env: &WorkerEnv,
        sampler: &DistributedSampler,
        schedule: Schedule,
        plan: ReducePlan,
    ) {
        let (model, splits) = (&self.job.model, &self.job.splits);
        tracing::info!(
            params = model.param_count(),
            layers = ?model.sizes(),
            train_samples = splits.train.len(),
            test_samples = splits.test.len(),
            samples_per_rank = sampler.num_samples(),
            steps_per_epoch = schedule.steps_per_epoch,
            total_steps = schedule.total_steps,
            tiles = env.tiles,
            tile_affinity = %env.tile_affinity,
            visible_tiles = %env.visible_tiles,
            algorithm = %plan.reduce.algorithm,
            compression = %plan.reduce.compression,
            buckets = buckets::partition(&model.layer_elems(), plan.cap_bytes).len(),
            "training starts"
        );
    }

    /// The trained parameters evaluated on the test split (the training split when none is held out), and the
    /// result every rank agrees on.
    fn finish(&self, env: &WorkerEnv, state: TrainState, trained: Trained) -> RankOutcome {
        let (model, splits) = (&self.job.model, &self.job.splits);
        let params = &state.bufs.params;
        let held_out = if splits.test.is_empty() {
            tracing::warn!(
                "no held-out samples (testFraction 0 and no test files): accuracy is on the training set"
            );
            &splits.train
        } else {
            &splits.test
        };
        let test = model.evaluate(params, &held_out.features, &held_out.labels);
        let sum = checksum(params);
        tracing::info!(checksum = format!("{sum:016x}"), "parameter checksum");
        tracing::info!(
            test_accuracy = format!("{:.4}", test.accuracy()),
            test_loss = format!("{:.4}", test.mean_loss()),
            "test"
        );
        let local_sps = trained.local_samples as f64 / trained.train_seconds.max(1e-9);
        RankOutcome {
            result: JobResult {
                final_loss: trained.final_stats.mean_loss(),
                test_accuracy: test.accuracy(),
                samples_per_second: local_sps * f64::from(env.contract.world_size),
                train_seconds: trained.train_seconds,
                global_steps: state.step,
                step_phases: state.phases.per_step(),
                ..Default::default()
            },
            checksum: Some(sum),
        }
    }
}

/// Training ended early with `error` at `state`'s step: rank 0 checkpoints that step when the cause is retryable
/// (`checkpointing`); the error says the stop when one was requested.
fn save_on_the_way_out(
    stop: &StopRequest,
    checkpointing: Option<Checkpointing>,
    state: &TrainState,
    error: WorkerError,
) -> WorkerError {
    let error = stop.explain(error);
    if let Some(mut c) = checkpointing {
        c.after_failure(state.step, &state.bufs.params, &state.optimizer, &error);
    }
    error
}

/// How long training runs: steps per epoch, in all, and the epochs they span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schedule {
    batch: usize,
    steps_per_epoch: u64,
    total_steps: u64,
    epochs: u64,
}

impl Schedule {
    /// The schedule of `training` over a shard of `per_rank` samples (at least 1): `steps`, else `epochs` (1
    /// when neither is set) of full passes.
    fn of(training: &TrainingSpec, per_rank: usize) -> Schedule {
        let batch = (training.batch_size as usize).max(1);
        let steps_per_epoch = per_rank.div_ceil(batch).max(1) as u64;
        let total_steps = training
            .steps
            .unwrap_or(u64::from(training.epochs.unwrap_or(1)) * steps_per_epoch);
        Schedule {
            batch,
            steps_per_epoch,
            total_steps,
            epochs: total_steps.div_ceil(steps_per_epoch),
        }
    }
}

/// What the epochs leave for the result.
struct Trained {
    /// The last epoch's stats, summed over all ranks.
    final_stats: BatchStats,
    local_samples: u64,
    train_seconds: f64,
}

/// The epoch loop's fixed inputs.
struct Epochs<'a> {
    env: &'a WorkerEnv,
    comm: &'a Communicator,
    stop: &'a StopRequest,
    job: &'a ModelJob,
    sampler: &'a DistributedSampler,
    schedule: Schedule,
    plan: ReducePlan,
    start_step: u64,
}

impl Epochs<'_> {
    /// Every remaining step of every remaining epoch, then the last epoch's stats over all ranks. `state` is at
    /// a step boundary whenever this returns, an error included.
    async fn run(
        &self,
        state: &mut TrainState,
        observers: &mut Observers,
        mut checkpointing: Option<&mut Checkpointing>,
    ) -> Result<Trained, WorkerError> {
        let Schedule {
            steps_per_epoch,
            epochs,
            ..
        } = self.schedule;
        let mut last_epoch = BatchStats::default();
        let mut local_samples = 0u64;
        let started = Instant::now();
        for epoch in state.step / steps_per_epoch..epochs {
            let epoch_started = Instant::now();
            let clock = Clock {
                started,
                samples_before: local_samples,
            };
            let stats = self
                .epoch(epoch, state, observers, checkpointing.as_deref_mut(), clock)
                .await?;
            local_samples += stats.samples;
            let logged = match self.env.contract.spec.training.loss_on {
                LossOn::Device => stats,
                LossOn::Host => global_stats(self.comm, stats).await?,
            };
            let secs = epoch_started.elapsed().as_secs_f64();
            observers.epoch_done(&EpochDone {
                epoch: epoch + 1,
                epochs,
                step: state.step,
                logged,
                samples_per_second: stats.samples as f64 / secs.max(1e-9),
            });
            last_epoch = stats;
        }
        let train_seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            "inner train loop time : {train_seconds:.3} for {} epochs, number of global steps: {}, e2e samples_per_sec: {:.1}",
            epochs.saturating_sub(self.start_step / steps_per_epoch),
            state.step,
            local_samples as f64 / train_seconds.max(1e-9)
        );
        let final_stats = global_stats(self.comm, last_epoch).await?;
        Ok(Trained {
            final_stats,
            local_samples,
            train_seconds,
        })
    }

    /// The remaining steps of `epoch` (a resumed run skips the ones done), each told to the observers and
    /// offered to rank 0's checkpointing; returns this rank's stats over them.
    async fn epoch(
        &self,
        epoch: u64,
        state: &mut TrainState,
        observers: &mut Observers,
        mut checkpointing: Option<&mut Checkpointing>,
        clock: Clock,
    ) -> Result<BatchStats, WorkerError> {
        let Schedule {
            batch,
            steps_per_epoch,
            total_steps,
            epochs,
        } = self.schedule;
        let world = u64::from(self.env.contract.world_size);
        let indices = self.sampler.indices(epoch);
        let skip = (state.step - epoch * steps_per_epoch) as usize;
        let mut stats = BatchStats::default();
        for chunk in indices.chunks(batch).skip(skip) {
            if state.step >= total_steps {
                break;
            }
            if let Some(signal) = self.stop.requested() {
                return Err(WorkerError::Stopped { signal });
            }
            let batch_stats = state
                .step(
                    self.comm,
                    &self.job.model,
                    self.plan,
                    &self.job.splits.train,
                    chunk,
                )
                .await?;
            stats.add(batch_stats);
            observers.step_done(&StepDone {
                point: StepPoint {
                    step: state.step,
                    total_steps,
                    start_step: self.start_step,
                    epoch: epoch + 1,
                    epochs,
                    loss: batch_stats.mean_loss(),
                    elapsed_seconds: clock.started.elapsed().as_secs_f64(),
                    samples: (clock.samples_before + stats.samples) * world,
                },
                batch: batch_stats,
                learning_rate: self.env.contract.spec.training.learning_rate,
            });
            if let Some(c) = checkpointing.as_deref_mut() {
                c.after_step(state.step, &state.bufs.params, &state.optimizer)?;
            }
            if self
                .env
                .faults
                .hangs_after(self.env.contract.generation, state.step)
            {
                tracing::warn!(
                    step = state.step,
                    "{}: making no progress until stopped (test fault injection)",
                    rdu_crds::consts::env::TEST_HANG_AT_STEP
                );
                let signal = self.stop.wait().await;
                return Err(WorkerError::Stopped { signal });
            }
        }
        Ok(stats)
    }
}

/// Where the run's clock stands when an epoch starts: for the progress each step reports.
#[derive(Clone, Copy)]
struct Clock {
    started: Instant,
    /// This rank's samples in the epochs before.
    samples_before: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn training(steps: Option<u64>, epochs: Option<u32>, batch_size: u32) -> TrainingSpec {
        let mut spec = crate::test_fixtures::minimal().training;
        spec.steps = steps;
        spec.epochs = epochs;
        spec.batch_size = batch_size;
        spec
    }

    #[test]
    fn the_schedule_counts_steps_from_epochs_or_takes_them_as_given() {
        let table = [
            // 100 samples per rank, batch 16: 7 steps an epoch (the last one short).
            (training(None, Some(3), 16), 100, (7, 21, 3)),
            // steps win over epochs, and span as many epochs as they need.
            (training(Some(10), Some(3), 16), 100, (7, 10, 2)),
            (training(Some(7), None, 16), 100, (7, 7, 1)),
            // Neither: one epoch.
            (training(None, None, 16), 100, (7, 7, 1)),
            // A batch larger than the shard: one step an epoch.
            (training(None, Some(2), 64), 5, (1, 2, 2)),
        ];
        for (spec, per_rank, (steps_per_epoch, total_steps, epochs)) in table {
            let s = Schedule::of(&spec, per_rank);
            assert_eq!(
                (s.steps_per_epoch, s.total_steps, s.epochs),
                (steps_per_epoch, total_steps, epochs),
                "{spec:?} over {per_rank}"
            );
            assert_eq!(s.batch, spec.batch_size as usize);
        }
    }
}
