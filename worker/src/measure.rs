//! `spec.mode: measurePerformance`, the seeds' `measure-performance`: `training.warmupSteps` untimed training
//! steps, then `training.steps` (default 50) timed ones, each a full data-parallel step (forward, backward,
//! gradient all-reduce, optimizer); the result is the job's throughput and rank 0's step latency, no accuracy.

use std::time::Instant;

use rdu_collective::Communicator;
use rdu_crds::{JobResult, RunMode};

use crate::data::Splits;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::latency::percentile;
use crate::model::Mlp;
use crate::optim::Optimizer;
use crate::overlap::{StepBuffers, summed_gradient};
use crate::sampler::DistributedSampler;
use crate::train::{TrainOutcome, global_stats, reduce_plan};

/// Timed steps when `training.steps` is unset.
pub const DEFAULT_TIMED_STEPS: u64 = 50;
/// Untimed steps when `training.warmupSteps` is unset.
pub const DEFAULT_WARMUP_STEPS: u32 = 5;

/// Runs the warm-up and timed steps and returns the measured result (the same on every rank but the latency,
/// which is each rank's own; rank 0's is the job's).
pub async fn measure_performance(
    env: &WorkerEnv,
    comm: &Communicator,
    splits: &Splits,
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
    let batch = spec.training.batch_size as usize;
    let warmup = u64::from(spec.training.warmup_steps.unwrap_or(DEFAULT_WARMUP_STEPS));
    let timed = spec.training.steps.unwrap_or(DEFAULT_TIMED_STEPS);
    if sampler.num_samples() == 0 {
        return Err(WorkerError::config(
            "spec.data",
            format!(
                "{} training samples leave none for some of the {} ranks: lower workers or add data",
                splits.train.len(),
                env.contract.world_size
            ),
        ));
    }
    let plan = reduce_plan(&spec.data_parallel, env.tiles);
    let params = model.init(spec.data.seed);
    let mut optimizer = Optimizer::new(
        spec.training.optimizer,
        spec.training.learning_rate,
        spec.training.momentum,
        params.len(),
    );
    let mut grad = vec![0.0f32; params.len()];
    let mut bufs = StepBuffers {
        local_grad: vec![0.0f32; params.len()],
        params,
        x: Vec::with_capacity(batch * model.input_size()),
        y: Vec::with_capacity(batch),
        spare_buckets: Vec::new(),
    };
    // Batches cycle through this rank's shard, epoch after epoch, for as many steps as asked.
    let mut batches = (0u64..)
        .flat_map(|epoch| {
            let indices = sampler.indices(epoch);
            indices
                .chunks(batch)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .filter(|b| !b.is_empty());
    tracing::info!(warmup, timed, "measure-performance starts");
    let mut latencies = Vec::with_capacity(timed as usize);
    let mut local_samples = 0u64;
    let mut last = Default::default();
    let mut timed_since = Instant::now();
    for step in 0..warmup + timed {
        if step == warmup {
            timed_since = Instant::now();
        }
        let Some(chunk) = batches.next() else {
            return Err(WorkerError::config(
                "spec.data",
                "this rank's shard holds no sample: lower workers or add data",
            ));
        };
        let started = Instant::now();
        bufs.x.clear();
        bufs.y.clear();
        for &i in &chunk {
            bufs.x.extend_from_slice(splits.train.row(i));
            bufs.y.push(splits.train.labels[i]);
        }
        let stats = summed_gradient(comm, &model, &mut bufs, plan, &mut grad).await?;
        optimizer.step(&mut bufs.params, &grad, env.contract.world_size);
        if step >= warmup {
            latencies.push(started.elapsed());
            local_samples += stats.samples;
            last = stats;
        }
    }
    let seconds = timed_since.elapsed().as_secs_f64();
    let total = global_stats(comm, last).await?;
    let samples_per_second =
        local_samples as f64 / seconds.max(1e-9) * f64::from(env.contract.world_size);
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    tracing::info!(
        "measure-performance: {timed} timed steps in {seconds:.3} s, samples_per_sec: {samples_per_second:.1}, \
         step latency p50 {:.3} ms p99 {:.3} ms",
        p50.unwrap_or_default() * 1e3,
        p99.unwrap_or_default() * 1e3,
    );
    let result = JobResult {
        final_loss: total.mean_loss(),
        test_accuracy: 0.0,
        samples_per_second,
        train_seconds: seconds,
        global_steps: timed,
        mode: Some(RunMode::MeasurePerformance),
        step_latency_p50_seconds: p50,
        step_latency_p99_seconds: p99,
    };
    Ok(TrainOutcome {
        result,
        checksum: crate::model::checksum(&bufs.params),
    })
}
