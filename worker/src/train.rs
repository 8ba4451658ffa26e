//! The training loop of one rank: its shard of every epoch, forward/backward on its tiles, the
//! gradient summed over all ranks, an optimizer step (which takes the mean); epoch logs, checkpoints, the final result.
//! Training stops at a step boundary when asked (`stop`), and whatever ends it early leaves the parameters and
//! optimizer of the last completed step for rank 0 to checkpoint (`checkpointing`).
//!
//! `training.lossOn` chooses where the logged loss is computed: `device` logs each rank's own shard
//! loss and accuracy (what a rank sees on its RDU); `host` averages them over all ranks through the
//! host (a small star all-reduce per epoch) so every rank logs the global figures.

use std::time::Instant;

use rdu_collective::{Algorithm, Communicator, Compression, ReduceOptions};
use rdu_crds::{
    DataParallelSpec, GradientCompression, JobResult, LossOn, ReduceAlgorithm, StepPoint,
};

use crate::buckets;
use crate::checkpoint;
use crate::checkpointing::Checkpointing;
use crate::data::Splits;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::model::{BatchStats, Mlp, checksum};
use crate::observe::{EpochDone, Observers, StepDone};
use crate::optim::Optimizer;
use crate::overlap::{ReducePlan, StepBuffers, summed_gradient};
use crate::sampler::DistributedSampler;
use crate::stop::StopRequest;

/// What a rank ends with.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    pub result: JobResult,
    pub checksum: u64,
}

/// The all-reduce algorithm of the spec: `reduceOnRdu: false` goes through the host (star via rank 0).
pub fn algorithm(dp: &DataParallelSpec) -> Algorithm {
    if !dp.reduce_on_rdu {
        return Algorithm::Star;
    }
    match dp.algorithm {
        ReduceAlgorithm::Auto => Algorithm::Auto,
        ReduceAlgorithm::Ring => Algorithm::Ring,
        ReduceAlgorithm::Hierarchical => Algorithm::Hierarchical,
        ReduceAlgorithm::Star => Algorithm::Star,
    }
}

/// How gradients travel: `spec.dataParallel.compression`.
pub fn compression(dp: &DataParallelSpec) -> Compression {
    match dp.compression {
        GradientCompression::None => Compression::None,
        GradientCompression::Bf16 => Compression::Bf16,
        GradientCompression::Fp16 => Compression::Fp16,
    }
}

/// How a step's gradient is computed and reduced: `tiles` threads, buckets of `bucketSizeMiB`.
pub fn reduce_plan(dp: &DataParallelSpec, tiles: usize) -> ReducePlan {
    ReducePlan {
        tiles,
        cap_bytes: buckets::cap_bytes(dp.bucket_size_mib),
        reduce: ReduceOptions {
            algorithm: algorithm(dp),
            compression: compression(dp),
        },
    }
}

/// Sums `stats` over all ranks (through rank 0).
pub(crate) async fn global_stats(
    comm: &Communicator,
    stats: BatchStats,
) -> Result<BatchStats, WorkerError> {
    let mut buf = [
        stats.loss_sum as f32,
        stats.correct as f32,
        stats.samples as f32,
    ];
    if comm.world_size() > 1 {
        comm.all_reduce_sum(&mut buf, Algorithm::Star).await?;
    }
    Ok(BatchStats {
        loss_sum: buf[0] as f64,
        correct: buf[1] as u64,
        samples: buf[2] as u64,
    })
}

/// How long training runs: steps per epoch, in all, and the epochs they span.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    batch: usize,
    steps_per_epoch: u64,
    total_steps: u64,
    epochs: u64,
}

/// Where training stands between steps: what a checkpoint holds.
struct TrainState {
    /// The parameters (in `bufs.params`) and the step's other buffers.
    bufs: StepBuffers,
    optimizer: Optimizer,
    /// Optimizer steps completed.
    step: u64,
}

/// What the epochs leave for the result.
struct Trained {
    /// The last epoch's stats, summed over all ranks.
    final_stats: BatchStats,
    local_samples: u64,
    train_seconds: f64,
}

/// Trains to the end, telling `observers` of every step and epoch, and returns the result every rank agrees on.
/// A stop requested through `stop` ends training at the next step boundary. When training ends early for a
/// retryable cause, rank 0 first checkpoints the last step it completed (`checkpointing`).
pub async fn train(
    env: &WorkerEnv,
    comm: &Communicator,
    splits: &Splits,
    observers: &mut Observers,
    stop: &StopRequest,
) -> Result<TrainOutcome, WorkerError> {
    let spec = &env.contract.spec;
    let model = Mlp::for_job(&spec.model, splits);
    let sampler = DistributedSampler {
        dataset_len: splits.train.len(),
        world_size: env.contract.world_size as usize,
        rank: env.contract.rank as usize,
        shuffle: spec.data.shuffle,
        drop_last: spec.data.drop_last,
        seed: spec.data.seed,
    };
    let per_rank = sampler.num_samples();
    if per_rank == 0 {
        return Err(WorkerError::config(
            "spec.data.dropLast",
            format!(
                "{} training samples leave no sample per rank for {} ranks: lower workers or set dropLast false",
                splits.train.len(),
                env.contract.world_size
            ),
        ));
    }
    let batch = spec.training.batch_size as usize;
    let steps_per_epoch = per_rank.div_ceil(batch) as u64;
    let total_steps = spec
        .training
        .steps
        .unwrap_or(u64::from(spec.training.epochs.unwrap_or(1)) * steps_per_epoch);
    let schedule = Schedule {
        batch,
        steps_per_epoch,
        total_steps,
        epochs: total_steps.div_ceil(steps_per_epoch),
    };
    let plan = reduce_plan(&spec.data_parallel, env.tiles);
    let mut params = model.init(spec.data.seed);
    let mut optimizer = Optimizer::new(
        spec.training.optimizer,
        spec.training.learning_rate,
        spec.training.momentum,
        params.len(),
    );
    let (mut checkpointing, found) = Checkpointing::start(env, params.len())?;
    // Every rank joins the resume broadcast when the spec checkpoints, with or without a directory of its own:
    // on a cluster with a checkpoint claim only rank 0 gets one.
    let start_step = if spec.checkpoint.is_some() {
        checkpoint::resume(comm, found, &mut params, &mut optimizer).await?
    } else {
        0
    };
    tracing::info!(
        params = params.len(),
        layers = ?model.sizes(),
        train_samples = splits.train.len(),
        test_samples = splits.test.len(),
        samples_per_rank = per_rank,
        steps_per_epoch,
        total_steps,
        tiles = env.tiles,
        tile_affinity = %env.tile_affinity,
        visible_tiles = %env.visible_tiles,
        algorithm = %plan.reduce.algorithm,
        compression = %plan.reduce.compression,
        buckets = buckets::partition(&model.layer_elems(), plan.cap_bytes).len(),
        "training starts"
    );

    let mut state = TrainState {
        bufs: StepBuffers {
            local_grad: vec![0.0f32; params.len()],
            params,
            x: Vec::with_capacity(batch * model.input_size()),
            y: Vec::with_capacity(batch),
            spare_buckets: Vec::new(),
        },
        optimizer,
        step: start_step,
    };
    let steps = Steps {
        env,
        comm,
        splits,
        model: &model,
        sampler: &sampler,
        schedule,
        plan,
        start_step,
        stop,
    };
    let trained = match steps
        .run(&mut state, observers, checkpointing.as_mut())
        .await
    {
        Ok(trained) => trained,
        Err(e) => {
            let e = stop.explain(e);
            if let Some(c) = checkpointing.as_mut() {
                c.after_failure(state.step, &state.bufs.params, &state.optimizer, &e);
            }
            return Err(e);
        }
    };
    let step = state.step;
    let params = state.bufs.params;
    let test = if splits.test.is_empty() {
        tracing::warn!(
            "no held-out samples (testFraction 0 and no test files): accuracy is on the training set"
        );
        model.evaluate(&params, &splits.train.features, &splits.train.labels)
    } else {
        model.evaluate(&params, &splits.test.features, &splits.test.labels)
    };
    let sum = checksum(&params);
    tracing::info!(checksum = format!("{sum:016x}"), "parameter checksum");
    tracing::info!(
        test_accuracy = format!("{:.4}", test.accuracy()),
        test_loss = format!("{:.4}", test.mean_loss()),
        "test"
    );
    let local_sps = trained.local_samples as f64 / trained.train_seconds.max(1e-9);
    let result = JobResult {
        final_loss: trained.final_stats.mean_loss(),
        test_accuracy: test.accuracy(),
        samples_per_second: local_sps * env.contract.world_size as f64,
        train_seconds: trained.train_seconds,
        global_steps: step,
        ..Default::default()
    };
    observers.finished(&result);
    Ok(TrainOutcome {
        result,
        checksum: sum,
    })
}

/// The step loop's fixed inputs.
struct Steps<'a> {
    env: &'a WorkerEnv,
    comm: &'a Communicator,
    splits: &'a Splits,
    model: &'a Mlp,
    sampler: &'a DistributedSampler,
    schedule: Schedule,
    plan: ReducePlan,
    start_step: u64,
    stop: &'a StopRequest,
}

impl Steps<'_> {
    /// Every remaining step of every remaining epoch, then the last epoch's stats over all ranks. `state` is at
    /// a step boundary whenever this returns, an error included.
    async fn run(
        &self,
        state: &mut TrainState,
        observers: &mut Observers,
        mut checkpointing: Option<&mut Checkpointing>,
    ) -> Result<Trained, WorkerError> {
        let Schedule {
            batch,
            steps_per_epoch,
            total_steps,
            epochs,
        } = self.schedule;
        let (env, splits) = (self.env, self.splits);
        let mut grad = vec![0.0f32; state.bufs.params.len()];
        let mut last_epoch = BatchStats::default();
        let mut local_samples = 0u64;
        let started = Instant::now();
        for epoch in state.step / steps_per_epoch..epochs {
            let epoch_started = Instant::now();
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
                let bufs = &mut state.bufs;
                bufs.x.clear();
                bufs.y.clear();
                for &i in chunk {
                    bufs.x.extend_from_slice(splits.train.row(i));
                    bufs.y.push(splits.train.labels[i]);
                }
                let batch_stats =
                    summed_gradient(self.comm, self.model, bufs, self.plan, &mut grad).await?;
                stats.add(batch_stats);
                state
                    .optimizer
                    .step(&mut state.bufs.params, &grad, env.contract.world_size);
                state.step += 1;
                observers.step_done(&StepDone {
                    point: StepPoint {
                        step: state.step,
                        total_steps,
                        start_step: self.start_step,
                        epoch: epoch + 1,
                        epochs,
                        loss: batch_stats.mean_loss(),
                        elapsed_seconds: started.elapsed().as_secs_f64(),
                        samples: (local_samples + stats.samples)
                            * u64::from(env.contract.world_size),
                    },
                    batch: batch_stats,
                    learning_rate: env.contract.spec.training.learning_rate,
                });
                if let Some(c) = checkpointing.as_deref_mut() {
                    c.after_step(state.step, &state.bufs.params, &state.optimizer)?;
                }
            }
            local_samples += stats.samples;
            let logged = match env.contract.spec.training.loss_on {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_crds::ReduceAlgorithm;

    #[test]
    fn reduce_off_the_rdu_goes_through_the_host() {
        let mut dp = DataParallelSpec {
            algorithm: ReduceAlgorithm::Ring,
            ..DataParallelSpec::default()
        };
        assert_eq!(algorithm(&dp), Algorithm::Ring);
        dp.reduce_on_rdu = false;
        assert_eq!(algorithm(&dp), Algorithm::Star);
    }

    #[test]
    fn the_compression_comes_from_the_spec() {
        let mut dp = DataParallelSpec::default();
        assert_eq!(reduce_plan(&dp, 1).reduce.compression, Compression::None);
        dp.compression = GradientCompression::Bf16;
        assert_eq!(reduce_plan(&dp, 1).reduce.compression, Compression::Bf16);
        dp.compression = GradientCompression::Fp16;
        assert_eq!(reduce_plan(&dp, 1).reduce.compression, Compression::Fp16);
    }

    #[test]
    fn the_bucket_size_comes_from_the_spec() {
        let mut dp = DataParallelSpec::default();
        assert_eq!(reduce_plan(&dp, 2).cap_bytes, 25 << 20);
        dp.bucket_size_mib = 3;
        let plan = reduce_plan(&dp, 4);
        assert_eq!((plan.cap_bytes, plan.tiles), (3 << 20, 4));
    }
}
