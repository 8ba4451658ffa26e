//! `spec.mode: inference`, the seeds' `run --inference`: rank 0 loads the newest checkpoint and broadcasts it, each
//! rank runs forward passes over its shard of the test split (in batches of `training.batchSize`, the first
//! `training.warmupSteps` untimed), and the job's accuracy, loss, throughput and rank 0's batch latency come out.

use std::time::Instant;

use rdu_collective::Communicator;
use rdu_crds::{JobResult, RunMode};

use crate::checkpoint;
use crate::data::Splits;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::latency::percentile;
use crate::measure::DEFAULT_WARMUP_STEPS;
use crate::model::{BatchStats, Mlp, checksum};
use crate::optim::Optimizer;
use crate::sampler::DistributedSampler;
use crate::train::{TrainOutcome, global_stats};

/// Evaluates the newest checkpoint's parameters on the test split.
pub async fn infer(
    env: &WorkerEnv,
    comm: &Communicator,
    splits: &Splits,
) -> Result<TrainOutcome, WorkerError> {
    let spec = &env.contract.spec;
    let model = Mlp::for_job(&spec.model, splits);
    let mut params = model.init(spec.data.seed);
    let mut optimizer = Optimizer::new(
        spec.training.optimizer,
        spec.training.learning_rate,
        spec.training.momentum,
        params.len(),
    );
    let found = match env.checkpoint_dir() {
        Some(dir) if env.contract.rank == 0 => {
            let lock_wait =
                std::time::Duration::from_secs(u64::from(spec.data_parallel.timeout_seconds));
            checkpoint::read_lineage(dir, params.len(), lock_wait)?
        }
        _ => None,
    };
    let trained_steps = checkpoint::resume(comm, found, &mut params, &mut optimizer).await?;
    if trained_steps == 0 {
        return Err(WorkerError::config(
            "spec.checkpoint",
            format!(
                "inference found no checkpoint of this model in {}: run the job in mode train with the same \
                 spec.checkpoint first",
                env.checkpoint_dir()
                    .map_or("(no checkpoint directory)".to_string(), |d| d
                        .display()
                        .to_string())
            ),
        ));
    }
    let test = if splits.test.is_empty() {
        tracing::warn!(
            "no held-out samples (testFraction 0 and no test files): inference runs on the training set"
        );
        &splits.train
    } else {
        &splits.test
    };
    let sampler = DistributedSampler {
        dataset_len: test.len(),
        world_size: env.contract.world_size as usize,
        rank: env.contract.rank as usize,
        shuffle: false,
        drop_last: false,
        seed: spec.data.seed,
    };
    let batch = spec.training.batch_size as usize;
    let indices = sampler.indices(0);
    // A small test split keeps at least half its batches timed.
    let batches = indices.len().div_ceil(batch.max(1));
    let warmup =
        (spec.training.warmup_steps.unwrap_or(DEFAULT_WARMUP_STEPS) as usize).min(batches / 2);
    tracing::info!(
        trained_steps,
        test_samples = test.len(),
        samples_per_rank = indices.len(),
        warmup,
        "inference starts"
    );
    let mut stats = BatchStats::default();
    let mut latencies = Vec::new();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut timed_samples = 0u64;
    let mut timed_since = Instant::now();
    for (n, chunk) in indices.chunks(batch.max(1)).enumerate() {
        if n == warmup {
            timed_since = Instant::now();
        }
        let started = Instant::now();
        x.clear();
        y.clear();
        for &i in chunk {
            x.extend_from_slice(test.row(i));
            y.push(test.labels[i]);
        }
        let batch_stats = model.evaluate(&params, &x, &y);
        stats.add(batch_stats);
        if n >= warmup {
            latencies.push(started.elapsed());
            timed_samples += batch_stats.samples;
        }
    }
    let seconds = timed_since.elapsed().as_secs_f64();
    let total = global_stats(comm, stats).await?;
    let samples_per_second = if latencies.is_empty() {
        0.0
    } else {
        timed_samples as f64 / seconds.max(1e-9) * f64::from(env.contract.world_size)
    };
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    tracing::info!(
        test_accuracy = format!("{:.4}", total.accuracy()),
        test_loss = format!("{:.4}", total.mean_loss()),
        "inference: {} batches timed, samples_per_sec: {samples_per_second:.1}, batch latency p50 {:.3} ms p99 {:.3} ms",
        latencies.len(),
        p50.unwrap_or_default() * 1e3,
        p99.unwrap_or_default() * 1e3,
    );
    let result = JobResult {
        final_loss: total.mean_loss(),
        test_accuracy: total.accuracy(),
        samples_per_second,
        train_seconds: seconds,
        global_steps: latencies.len() as u64,
        mode: Some(RunMode::Inference),
        step_latency_p50_seconds: p50,
        step_latency_p99_seconds: p99,
    };
    Ok(TrainOutcome {
        result,
        checksum: checksum(&params),
    })
}
