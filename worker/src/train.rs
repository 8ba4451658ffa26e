//! The training loop of one rank: its shard of every epoch, forward/backward on its tiles, the
//! gradient summed over all ranks, an optimizer step (which takes the mean); epoch logs, checkpoints, the final result.
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
use crate::checkpoint::{self, Checkpoint};
use crate::data::Splits;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::model::{BatchStats, Mlp, checksum};
use crate::observe::{EpochDone, Observers, StepDone};
use crate::optim::Optimizer;
use crate::overlap::{ReducePlan, StepBuffers, summed_gradient};
use crate::sampler::DistributedSampler;

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

/// Trains to the end, telling `observers` of every step and epoch, and returns the result every rank agrees on.
pub async fn train(
    env: &WorkerEnv,
    comm: &Communicator,
    splits: &Splits,
    observers: &mut Observers,
) -> Result<TrainOutcome, WorkerError> {
    let spec = &env.spec;
    let model = Mlp::for_job(&spec.model, splits);
    let sampler = DistributedSampler {
        dataset_len: splits.train.len(),
        world_size: env.world_size as usize,
        rank: env.rank as usize,
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
                env.world_size
            ),
        ));
    }
    let batch = spec.training.batch_size as usize;
    let steps_per_epoch = per_rank.div_ceil(batch) as u64;
    let total_steps = spec
        .training
        .steps
        .unwrap_or(u64::from(spec.training.epochs.unwrap_or(1)) * steps_per_epoch);
    let epochs = total_steps.div_ceil(steps_per_epoch);
    let plan = reduce_plan(&spec.data_parallel, env.tiles);
    let mut params = model.init(spec.data.seed);
    let mut optimizer = Optimizer::new(
        spec.training.optimizer,
        spec.training.learning_rate,
        spec.training.momentum,
        params.len(),
    );
    let ckpt_policy = spec.checkpoint.as_ref().zip(env.checkpoint_dir.as_ref());
    let found = match ckpt_policy {
        Some((_, dir)) if env.rank == 0 => checkpoint::latest(dir, params.len()),
        _ => None,
    };
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

    let mut grad = vec![0.0f32; params.len()];
    let mut bufs = StepBuffers {
        local_grad: vec![0.0f32; params.len()],
        params,
        x: Vec::with_capacity(batch * model.input_size()),
        y: Vec::with_capacity(batch),
        spare_buckets: Vec::new(),
    };
    let mut step = start_step;
    let mut last_epoch = BatchStats::default();
    let mut local_samples = 0u64;
    let started = Instant::now();
    for epoch in step / steps_per_epoch..epochs {
        let epoch_started = Instant::now();
        let indices = sampler.indices(epoch);
        let skip = (step - epoch * steps_per_epoch) as usize;
        let mut stats = BatchStats::default();
        for chunk in indices.chunks(batch).skip(skip) {
            if step >= total_steps {
                break;
            }
            bufs.x.clear();
            bufs.y.clear();
            for &i in chunk {
                bufs.x.extend_from_slice(splits.train.row(i));
                bufs.y.push(splits.train.labels[i]);
            }
            let (back, batch_stats) = summed_gradient(comm, &model, bufs, plan, &mut grad).await?;
            bufs = back;
            stats.add(batch_stats);
            optimizer.step(&mut bufs.params, &grad, env.world_size);
            step += 1;
            observers.step_done(&StepDone {
                point: StepPoint {
                    step,
                    total_steps,
                    start_step,
                    epoch: epoch + 1,
                    epochs,
                    loss: batch_stats.mean_loss(),
                    elapsed_seconds: started.elapsed().as_secs_f64(),
                    samples: (local_samples + stats.samples) * u64::from(env.world_size),
                },
                batch: batch_stats,
                learning_rate: spec.training.learning_rate,
            });
            if let Some((policy, dir)) = ckpt_policy
                && env.rank == 0
                && step % policy.interval_steps == 0
            {
                let ckpt = Checkpoint {
                    step,
                    params: bufs.params.clone(),
                    optimizer_state: optimizer.state().into_iter().map(<[f32]>::to_vec).collect(),
                };
                let path = checkpoint::save(dir, &ckpt, policy.keep as usize)?;
                tracing::debug!(step, path = %path.display(), "checkpoint written");
            }
        }
        local_samples += stats.samples;
        let logged = match spec.training.loss_on {
            LossOn::Device => stats,
            LossOn::Host => global_stats(comm, stats).await?,
        };
        let secs = epoch_started.elapsed().as_secs_f64();
        observers.epoch_done(&EpochDone {
            epoch: epoch + 1,
            epochs,
            step,
            logged,
            samples_per_second: stats.samples as f64 / secs.max(1e-9),
        });
        last_epoch = stats;
    }
    let train_seconds = started.elapsed().as_secs_f64();
    let local_sps = local_samples as f64 / train_seconds.max(1e-9);
    tracing::info!(
        "inner train loop time : {train_seconds:.3} for {} epochs, number of global steps: {step}, e2e samples_per_sec: {local_sps:.1}",
        epochs.saturating_sub(start_step / steps_per_epoch)
    );
    let params = bufs.params;
    let final_stats = global_stats(comm, last_epoch).await?;
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
    let result = JobResult {
        final_loss: final_stats.mean_loss(),
        test_accuracy: test.accuracy(),
        samples_per_second: local_sps * env.world_size as f64,
        train_seconds,
        global_steps: step,
        ..Default::default()
    };
    observers.finished(&result);
    Ok(TrainOutcome {
        result,
        checksum: sum,
    })
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
