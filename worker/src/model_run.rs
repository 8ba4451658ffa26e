//! What the modes that run the model share (`train`, `measurePerformance`, `inference`): the data and the model,
//! loaded before the rank joins; this rank's shard of a split, refused with one message when it is empty; a
//! batch's rows gathered; the training state (parameters, optimizer, step buffers) and one data-parallel step.

use std::path::Path;
use std::time::Instant;

use rdu_collective::{Algorithm, Communicator};
use rdu_crds::{KernelChoice, RduJobSpec};

use crate::data::{self, Dataset, Splits};
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::kernels::KernelPlan;
use crate::model::{BatchStats, Mlp};
use crate::optim::Optimizer;
use crate::overlap::{ReducePlan, StepBuffers, summed_gradient};
use crate::pef;
use crate::sampler::DistributedSampler;
use crate::step_phases::StepPhases;

/// How long each kernel runs on each product when `spec.model.kernels` is measured, and how many times: the best
/// run counts. About 8 ms per product and kernel; the MLP of the examples makes 8 products.
const KERNEL_TIMING: std::time::Duration = std::time::Duration::from_millis(2);
const KERNEL_TIMING_REPEATS: usize = 4;

/// Untimed steps (or inference batches) when `training.warmupSteps` is unset.
pub(crate) const DEFAULT_WARMUP_STEPS: u32 = 5;

/// The job's data and the model it shapes.
#[derive(Debug)]
pub(crate) struct ModelJob {
    pub splits: Splits,
    pub model: Mlp,
}

impl ModelJob {
    /// Loads the job's data (relative paths from the working directory), checks it against `spec.pef` when set,
    /// and builds the model.
    pub(crate) fn load(env: &WorkerEnv) -> Result<ModelJob, WorkerError> {
        let spec = &env.contract.spec;
        let splits = data::load(&spec.data, &spec.model, Path::new("."))?;
        pef::check_job(spec, &splits, env.contract.world_size)?;
        let model = Mlp::for_job(&spec.model, &splits);
        let model = with_planned_kernels(model, spec, env.tiles);
        Ok(ModelJob { splits, model })
    }

    /// This rank's shard of the training split, cut as `spec.data` says (shuffled per epoch, the tail dropped or
    /// padded).
    pub(crate) fn train_shard(&self, env: &WorkerEnv) -> Result<DistributedSampler, WorkerError> {
        let data = &env.contract.spec.data;
        shard(self.splits.train.len(), env, data.shuffle, data.drop_last)
    }
}

/// `model` with the kernels `spec.model.kernels` asks for: the fixed plan, or one measured on the products a step
/// of the spec's batch split over `tiles` compute threads makes.
fn with_planned_kernels(model: Mlp, spec: &RduJobSpec, tiles: usize) -> Mlp {
    match spec.model.kernels {
        KernelChoice::Fixed => model,
        KernelChoice::Measured => {
            let started = Instant::now();
            let products = model.batch_products(spec.training.batch_size as usize, tiles);
            let plan = KernelPlan::measure(&products, KERNEL_TIMING, KERNEL_TIMING_REPEATS);
            tracing::info!(
                took_ms = started.elapsed().as_millis() as u64,
                kernels = %plan,
                "kernels measured on this rank's shapes"
            );
            model.with_kernels(plan)
        }
    }
}

/// This rank's shard of a split of `samples` samples; refused when it holds no sample.
pub(crate) fn shard(
    samples: usize,
    env: &WorkerEnv,
    shuffle: bool,
    drop_last: bool,
) -> Result<DistributedSampler, WorkerError> {
    let sampler = DistributedSampler {
        dataset_len: samples,
        world_size: env.contract.world_size as usize,
        rank: env.contract.rank as usize,
        shuffle,
        drop_last,
        seed: env.contract.spec.data.seed,
    };
    if sampler.num_samples() == 0 {
        return Err(empty_shard(samples, env.contract.world_size, drop_last));
    }
    Ok(sampler)
}

/// Why a shard is empty, and what to change: too few samples for the ranks with `dropLast`, or none at all.
pub(crate) fn empty_shard(samples: usize, world_size: u32, drop_last: bool) -> WorkerError {
    if drop_last && samples > 0 {
        WorkerError::config(
            "spec.data.dropLast",
            format!(
                "{samples} samples leave no sample per rank for {world_size} ranks: lower workers or set dropLast \
                 false"
            ),
        )
    } else {
        WorkerError::config(
            "spec.data",
            format!("{samples} samples leave none for the {world_size} ranks: add data"),
        )
    }
}

/// This rank's batches of `batch` samples, epoch after epoch, without end (the shard is not empty).
pub(crate) fn endless_batches(
    sampler: &DistributedSampler,
    batch: usize,
) -> impl Iterator<Item = Vec<usize>> + '_ {
    (0u64..).flat_map(move |epoch| {
        let indices = sampler.indices(epoch);
        indices
            .chunks(batch.max(1))
            .map(<[usize]>::to_vec)
            .collect::<Vec<_>>()
    })
}

/// Copies the rows and labels of `batch` (indices into `split`) into `x` and `y`.
pub(crate) fn gather(split: &Dataset, batch: &[usize], x: &mut Vec<f32>, y: &mut Vec<u32>) {
    x.clear();
    y.clear();
    for &i in batch {
        x.extend_from_slice(split.row(i));
        y.push(split.labels[i]);
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

/// Where training stands between steps: what a checkpoint holds.
#[derive(Debug)]
pub(crate) struct TrainState {
    /// The parameters (in `bufs.params`) and the step's other buffers.
    pub bufs: StepBuffers,
    pub optimizer: Optimizer,
    /// Optimizer steps completed.
    pub step: u64,
    /// The last step's gradient summed over the ranks.
    grad: Vec<f32>,
    /// Where the steps since the start (or the last reset) spent their time.
    pub phases: StepPhases,
}

impl TrainState {
    /// The model's initial parameters (the same on every rank for the spec's seed), a fresh optimizer, step 0.
    pub(crate) fn fresh(model: &Mlp, spec: &RduJobSpec) -> TrainState {
        let params = model.init(spec.data.seed);
        let training = &spec.training;
        let optimizer = Optimizer::new(
            training.optimizer,
            training.learning_rate,
            training.momentum,
            params.len(),
        );
        let batch = training.batch_size as usize;
        TrainState {
            grad: vec![0.0f32; params.len()],
            bufs: StepBuffers {
                local_grad: vec![0.0f32; params.len()],
                params,
                x: Vec::with_capacity(batch * model.input_size()),
                y: Vec::with_capacity(batch),
                spare_buckets: Vec::new(),
            },
            optimizer,
            step: 0,
            phases: StepPhases::default(),
        }
    }

    /// One data-parallel step on `batch` (indices into `split`): forward and backward on this rank's tiles, the
    /// gradient summed over every rank as `plan` says, the optimizer's step. Returns this rank's batch stats. On an
    /// error the state is still that of the last completed step.
    pub(crate) async fn step(
        &mut self,
        comm: &Communicator,
        model: &Mlp,
        plan: ReducePlan,
        split: &Dataset,
        batch: &[usize],
    ) -> Result<BatchStats, WorkerError> {
        let started = Instant::now();
        gather(split, batch, &mut self.bufs.x, &mut self.bufs.y);
        let gathered = started.elapsed();
        let (stats, gradient) =
            summed_gradient(comm, model, &mut self.bufs, plan, &mut self.grad).await?;
        let stepped = Instant::now();
        self.optimizer
            .step(&mut self.bufs.params, &self.grad, comm.world_size());
        self.phases.record(gathered, gradient, stepped.elapsed());
        self.step += 1;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_kernels_time_the_products_of_each_threads_rows_and_fixed_ones_time_nothing() {
        let mut spec = crate::test_fixtures::minimal();
        spec.training.batch_size = 10;
        let model = Mlp::new(12, &[8], 3);
        let fixed = with_planned_kernels(model.clone(), &spec, 4);
        assert_eq!(fixed.kernels(), &KernelPlan::fixed());
        spec.model.kernels = KernelChoice::Measured;
        let measured = with_planned_kernels(model.clone(), &spec, 4);
        // 10 rows over 4 threads: 3, 3, 3 and 1 rows, so the products of 3 rows and of 1 row.
        let timed: Vec<_> = measured
            .kernels()
            .choices()
            .iter()
            .map(|c| c.product)
            .collect();
        let want: Vec<_> = [model.step_products(3), model.step_products(1)].concat();
        assert_eq!(timed, want);
    }

    #[test]
    fn an_empty_shard_names_what_to_change() {
        for (samples, drop_last, field, fix) in [
            (3, true, "spec.data.dropLast", "set dropLast false"),
            (0, true, "spec.data", "add data"),
            (0, false, "spec.data", "add data"),
        ] {
            match empty_shard(samples, 4, drop_last) {
                WorkerError::Config { field: f, reason } => {
                    assert_eq!(f, field, "{samples} samples");
                    assert!(reason.contains(fix), "{reason}");
                    assert!(reason.contains(&format!("{samples} samples")), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn batches_go_on_past_the_epoch_and_cover_the_shard_each_epoch() {
        let sampler = DistributedSampler {
            dataset_len: 10,
            world_size: 2,
            rank: 1,
            shuffle: true,
            drop_last: false,
            seed: 7,
        };
        let batches: Vec<Vec<usize>> = endless_batches(&sampler, 2).take(9).collect();
        // 5 samples per epoch: batches of 2, 2, 1, then the next epoch.
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 1, 2, 2, 1, 2, 2, 1]);
        let first: Vec<usize> = batches[..3].concat();
        assert_eq!(first, sampler.indices(0));
        assert_eq!(batches[3..6].concat(), sampler.indices(1));
    }

    #[test]
    fn a_batch_is_gathered_in_its_order() {
        let split = Dataset {
            features: vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5],
            labels: vec![7, 8, 9],
            dim: 2,
        };
        let (mut x, mut y) = (vec![9.0], vec![1]);
        gather(&split, &[2, 0], &mut x, &mut y);
        assert_eq!((x, y), (vec![2.0, 2.5, 0.0, 0.5], vec![9, 7]));
    }
}
