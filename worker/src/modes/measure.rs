//! `spec.mode: measurePerformance`, the seeds' `measure-performance`: `training.warmupSteps` untimed training
//! steps, then `training.steps` (default 50) timed ones, each a full data-parallel step (forward, backward,
//! gradient all-reduce, optimizer) cycling through this rank's shard; the result is the job's throughput and rank
//! 0's step latency, no accuracy.

use std::time::Instant;

use rdu_crds::{JobResult, RunMode};

use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::latency::percentile;
use crate::model::{BatchStats, checksum};
use crate::model_run::{
    DEFAULT_WARMUP_STEPS, ModelJob, TrainState, empty_shard, endless_batches, global_stats,
};
use crate::reduce::reduce_plan;
use crate::session::{Mode, RankOutcome, RankSession};
use crate::step_phases::StepPhases;

/// Timed steps when `training.steps` is unset.
pub(crate) const DEFAULT_TIMED_STEPS: u64 = 50;

/// The measuring mode: the job's data and model, loaded before the rank joins.
pub(crate) struct MeasurePerformance {
    job: ModelJob,
}

impl Mode for MeasurePerformance {
    fn prepare(env: &WorkerEnv) -> Result<Self, WorkerError> {
        Ok(MeasurePerformance {
            job: ModelJob::load(env)?,
        })
    }

    /// Runs the warm-up and timed steps and returns the measured result (the same on every rank but the latency,
    /// which is each rank's own; rank 0's is the job's).
    async fn run(self, session: RankSession<'_>) -> Result<RankOutcome, WorkerError> {
        let RankSession {
            env, comm, stop, ..
        } = session;
        let spec = &env.contract.spec;
        let world = env.contract.world_size;
        let sampler = self.job.train_shard(env)?;
        let warmup = u64::from(spec.training.warmup_steps.unwrap_or(DEFAULT_WARMUP_STEPS));
        let timed = spec.training.steps.unwrap_or(DEFAULT_TIMED_STEPS);
        let plan = reduce_plan(&spec.data_parallel, env.tiles);
        let mut state = TrainState::fresh(&self.job.model, spec);
        let mut batches = endless_batches(&sampler, spec.training.batch_size as usize);
        tracing::info!(warmup, timed, "measure-performance starts");
        let mut latencies = Vec::with_capacity(timed as usize);
        let mut local_samples = 0u64;
        let mut last = BatchStats::default();
        let mut timed_since = Instant::now();
        for step in 0..warmup + timed {
            if let Some(signal) = stop.requested() {
                return Err(WorkerError::Stopped { signal });
            }
            if step == warmup {
                state.phases = StepPhases::default();
                timed_since = Instant::now();
            }
            let batch = batches
                .next()
                .ok_or_else(|| empty_shard(sampler.dataset_len, world, sampler.drop_last))?;
            let started = Instant::now();
            let stats = state
                .step(comm, &self.job.model, plan, &self.job.splits.train, &batch)
                .await?;
            if step >= warmup {
                latencies.push(started.elapsed());
                local_samples += stats.samples;
                last = stats;
            }
        }
        let seconds = timed_since.elapsed().as_secs_f64();
        let total = global_stats(comm, last).await?;
        let samples_per_second = local_samples as f64 / seconds.max(1e-9) * f64::from(world);
        let p50 = percentile(&latencies, 0.5);
        let p99 = percentile(&latencies, 0.99);
        tracing::info!(
            "measure-performance: {timed} timed steps in {seconds:.3} s, samples_per_sec: {samples_per_second:.1}, \
             step latency p50 {:.3} ms p99 {:.3} ms",
            p50.unwrap_or_default() * 1e3,
            p99.unwrap_or_default() * 1e3,
        );
        Ok(RankOutcome {
            result: JobResult {
                final_loss: total.mean_loss(),
                test_accuracy: 0.0,
                samples_per_second,
                train_seconds: seconds,
                global_steps: timed,
                mode: Some(RunMode::MeasurePerformance),
                step_latency_p50_seconds: p50,
                step_latency_p99_seconds: p99,
                step_phases: state.phases.per_step(),
                ..Default::default()
            },
            checksum: Some(checksum(&state.bufs.params)),
        })
    }
}
