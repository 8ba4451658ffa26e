//! `spec.mode: inference`, the seeds' `run --inference`: rank 0 loads the newest checkpoint and broadcasts it, each
//! rank runs forward passes over its shard of the test split (in batches of `training.batchSize`, the first
//! `training.warmupSteps` untimed), and the job's accuracy, loss, throughput and rank 0's batch latency come out.

use std::time::{Duration, Instant};

use rdu_collective::Communicator;
use rdu_crds::{JobResult, RunMode};

use crate::checkpoint;
use crate::data::Dataset;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::latency::percentile;
use crate::model::{BatchStats, checksum};
use crate::model_run::{DEFAULT_WARMUP_STEPS, ModelJob, TrainState, gather, global_stats, shard};
use crate::session::{Mode, RankOutcome, RankSession};
use crate::stop::StopRequest;

/// The inference mode: the job's data and model, loaded before the rank joins.
pub(crate) struct Inference {
    job: ModelJob,
}

impl Mode for Inference {
    fn prepare(env: &WorkerEnv) -> Result<Self, WorkerError> {
        Ok(Inference {
            job: ModelJob::load(env)?,
        })
    }

    /// Evaluates the newest checkpoint's parameters on the test split.
    async fn run(self, session: RankSession<'_>) -> Result<RankOutcome, WorkerError> {
        let RankSession {
            env, comm, stop, ..
        } = session;
        let spec = &env.contract.spec;
        let mut state = TrainState::fresh(&self.job.model, spec);
        let trained_steps = load_newest_checkpoint(env, comm, &mut state).await?;
        let test = self.test_split();
        let sampler = shard(test.len(), env, false, false)?;
        let indices = sampler.indices(0);
        let batch = (spec.training.batch_size as usize).max(1);
        // A small test split keeps at least half its batches timed.
        let warmup = (spec.training.warmup_steps.unwrap_or(DEFAULT_WARMUP_STEPS) as usize)
            .min(indices.len().div_ceil(batch) / 2);
        tracing::info!(
            trained_steps,
            test_samples = test.len(),
            samples_per_rank = indices.len(),
            warmup,
            "inference starts"
        );
        let params = &state.bufs.params;
        let passes = self.forward(params, test, &indices, batch, warmup, stop)?;
        let total = global_stats(comm, passes.stats).await?;
        let samples_per_second = if passes.latencies.is_empty() {
            0.0
        } else {
            passes.timed_samples as f64 / passes.seconds.max(1e-9)
                * f64::from(env.contract.world_size)
        };
        let (p50, p99) = (
            percentile(&passes.latencies, 0.5),
            percentile(&passes.latencies, 0.99),
        );
        tracing::info!(
            test_accuracy = format!("{:.4}", total.accuracy()),
            test_loss = format!("{:.4}", total.mean_loss()),
            "inference: {} batches timed, samples_per_sec: {samples_per_second:.1}, batch latency p50 {:.3} ms p99 {:.3} ms",
            passes.latencies.len(),
            p50.unwrap_or_default() * 1e3,
            p99.unwrap_or_default() * 1e3,
        );
        Ok(RankOutcome {
            result: JobResult {
                final_loss: total.mean_loss(),
                test_accuracy: total.accuracy(),
                samples_per_second,
                train_seconds: passes.seconds,
                global_steps: passes.latencies.len() as u64,
                mode: Some(RunMode::Inference),
                step_latency_p50_seconds: p50,
                step_latency_p99_seconds: p99,
                ..Default::default()
            },
            checksum: Some(checksum(params)),
        })
    }
}

impl Inference {
    /// The held-out split, or the training split when none is held out.
    fn test_split(&self) -> &Dataset {
        let splits = &self.job.splits;
        if splits.test.is_empty() {
            tracing::warn!(
                "no held-out samples (testFraction 0 and no test files): inference runs on the training set"
            );
            &splits.train
        } else {
            &splits.test
        }
    }

    /// Forward passes over this rank's `indices` of `split` in batches of `batch`, the first `warmup` untimed.
    fn forward(
        &self,
        params: &[f32],
        split: &Dataset,
        indices: &[usize],
        batch: usize,
        warmup: usize,
        stop: &StopRequest,
    ) -> Result<Passes, WorkerError> {
        let mut passes = Passes {
            stats: BatchStats::default(),
            latencies: Vec::new(),
            timed_samples: 0,
            seconds: 0.0,
        };
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let mut timed_since = Instant::now();
        for (n, chunk) in indices.chunks(batch).enumerate() {
            if let Some(signal) = stop.requested() {
                return Err(WorkerError::Stopped { signal });
            }
            if n == warmup {
                timed_since = Instant::now();
            }
            let started = Instant::now();
            gather(split, chunk, &mut x, &mut y);
            let batch_stats = self.job.model.evaluate(params, &x, &y);
            passes.stats.add(batch_stats);
            if n >= warmup {
                passes.latencies.push(started.elapsed());
                passes.timed_samples += batch_stats.samples;
            }
        }
        passes.seconds = timed_since.elapsed().as_secs_f64();
        Ok(passes)
    }
}

/// What the forward passes leave: this rank's stats over every batch, and the timed batches' latencies, samples
/// and seconds.
struct Passes {
    stats: BatchStats,
    latencies: Vec<Duration>,
    timed_samples: u64,
    seconds: f64,
}

/// Rank 0 reads the newest checkpoint of the directory's lineage (without fencing it: inference writes nothing)
/// and every rank gets it into `state`; returns the steps it was trained for. No checkpoint is a config error
/// naming where rank 0 looked.
async fn load_newest_checkpoint(
    env: &WorkerEnv,
    comm: &Communicator,
    state: &mut TrainState,
) -> Result<u64, WorkerError> {
    let spec = &env.contract.spec;
    let found = match env.checkpoint_dir() {
        Some(dir) if env.contract.rank == 0 => {
            let lock_wait = Duration::from_secs(u64::from(spec.data_parallel.timeout_seconds));
            checkpoint::read_lineage(dir, state.bufs.params.len(), lock_wait)?
        }
        _ => None,
    };
    let trained_steps = crate::checkpoint_schedule::resume(
        comm,
        found,
        &mut state.bufs.params,
        &mut state.optimizer,
    )
    .await?;
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
    Ok(trained_steps)
}
