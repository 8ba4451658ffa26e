//! One step's gradient summed over the ranks with communication overlapped with compute
//! (DESIGN 3 step 5): backward runs on a blocking thread and hands over gradient buckets, last
//! layer first; this task all-reduces each bucket as it arrives, while backward goes on.
//!
//! With one bucket (or one rank) there is nothing to overlap and backward runs in place as before:
//! the hand-over costs two copies of the gradient per step.
//!
//! The communicator runs one collective at a time (its op ids must line up on every rank), so the
//! buckets are reduced one after another, in the same order on every rank.

use std::ops::Range;
use std::time::Instant;

use rdu_collective::{Communicator, ReduceOptions};

use crate::buckets;
use crate::error::WorkerError;
use crate::model::{BatchStats, Mlp};
use crate::step_phases::GradientTimes;

/// What backward reads and writes in a step; moved to the compute thread and back.
#[derive(Debug, Default)]
pub(crate) struct StepBuffers {
    pub params: Vec<f32>,
    /// The batch's rows.
    pub x: Vec<f32>,
    pub y: Vec<u32>,
    /// This rank's own (not yet averaged) gradient.
    pub local_grad: Vec<f32>,
    /// Buffers that carried last step's buckets, first bucket's last (reused: no fresh pages).
    pub spare_buckets: Vec<Vec<f32>>,
}

/// How backward is split and its gradient reduced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReducePlan {
    /// Compute threads (the rank's tiles).
    pub tiles: usize,
    /// Bucket size in bytes (`spec.dataParallel.bucketSizeMiB`).
    pub cap_bytes: usize,
    /// The all-reduce's algorithm and compression.
    pub reduce: ReduceOptions,
}

/// Writes the gradient of the batch in `bufs`, summed over all ranks, into `grad` (overwritten;
/// parameter-sized; the optimizer step takes the mean, in the pass it makes anyway); returns this
/// rank's batch stats and how long backward and the reduction left after it took.
///
/// `bufs` is whole again when this returns, whether the reduction succeeded or not: the parameters
/// it holds are those of the last completed step, which a rank stopping early checkpoints. On an
/// error `grad` is partly written and must not be applied.
pub(crate) async fn summed_gradient(
    comm: &Communicator,
    model: &Mlp,
    bufs: &mut StepBuffers,
    plan: ReducePlan,
    grad: &mut [f32],
) -> Result<(BatchStats, GradientTimes), WorkerError> {
    let started = Instant::now();
    if comm.world_size() == 1 || buckets::partition(&model.layer_elems(), plan.cap_bytes).len() == 1
    {
        // Nothing to overlap: backward straight into `grad`, then one all-reduce of it all.
        let stats = model.batch_grad(&bufs.params, &bufs.x, &bufs.y, plan.tiles, grad);
        let computed = Instant::now();
        comm.all_reduce_sum(grad, plan.reduce).await?;
        let times = GradientTimes {
            compute: computed - started,
            exposed_reduce: computed.elapsed(),
        };
        return Ok((stats, times));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Range<usize>, Vec<f32>)>();
    let model = model.clone();
    let mut moved = std::mem::take(bufs);
    let compute = tokio::task::spawn_blocking(move || {
        let StepBuffers {
            params,
            x,
            y,
            local_grad,
            spare_buckets,
        } = &mut moved;
        let stats = model.batch_grad_bucketed(
            params,
            (x, y),
            plan.tiles,
            plan.cap_bytes,
            local_grad,
            |bucket, pieces| {
                // The receiver is gone only when the reduction already failed.
                let mut buf = spare_buckets.pop().unwrap_or_default();
                buf.clear();
                for piece in pieces {
                    buf.extend_from_slice(piece);
                }
                let _ = tx.send((bucket.range.clone(), buf));
            },
        );
        (moved, stats, Instant::now())
    });
    let mut used = Vec::new();
    let mut reduced = Ok(());
    while let Some((range, mut bucket)) = rx.recv().await {
        if let Err(e) = comm.all_reduce_sum(&mut bucket, plan.reduce).await {
            reduced = Err(e);
            break;
        }
        grad[range].copy_from_slice(&bucket);
        used.push(bucket);
    }
    // After a failed reduction backward's remaining buckets go nowhere; it still ends within one
    // backward pass, and hands the buffers back.
    drop(rx);
    let reduced_at = Instant::now();
    match compute.await {
        Ok((back, stats, computed)) => {
            *bufs = back;
            used.reverse();
            bufs.spare_buckets = used;
            reduced?;
            let times = GradientTimes {
                compute: computed - started,
                exposed_reduce: reduced_at.saturating_duration_since(computed),
            };
            Ok((stats, times))
        }
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only a runtime shutting down cancels the task: the buffers are gone with it.
            Err(e) => Err(WorkerError::Interrupted(format!("backward: {e}"))),
        },
    }
}
