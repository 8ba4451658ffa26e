//! Rank 0's checkpoints while training: the directory fenced for this generation at the start, a checkpoint
//! every `intervalSteps`, and one more when training stops early for a retryable cause (a SIGTERM, a peer's
//! abort, a lost peer, a collective timeout), so that the next generation loses no step the gang finished; and
//! at the start, the checkpoint rank 0 chose shared with every rank (`resume`).

use std::time::Duration;

use rdu_crds::consts::exit_code;

use rdu_collective::Communicator;

use crate::checkpoint::{Checkpoint, CheckpointStore, Snapshot, Writer};
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::model::checksum;
use crate::optim::Optimizer;

/// Rank 0's checkpoint policy and its fenced store.
#[derive(Debug)]
pub(crate) struct Checkpointing {
    store: CheckpointStore,
    interval_steps: u64,
    /// The newest step on disk (or resumed from): a save of it again would add nothing.
    saved_step: u64,
}

impl Checkpointing {
    /// For rank 0 of a job that checkpoints into a directory: fences it for this generation and returns the
    /// policy with the checkpoint to resume from (of `params` parameters). Other ranks get neither.
    pub(crate) fn start(
        env: &WorkerEnv,
        params: usize,
    ) -> Result<(Option<Checkpointing>, Option<Checkpoint>), WorkerError> {
        let (Some(policy), Some(dir), 0) = (
            &env.contract.spec.checkpoint,
            env.checkpoint_dir(),
            env.contract.rank,
        ) else {
            return Ok((None, None));
        };
        let me = Writer {
            job_uid: env.contract.job_uid.clone(),
            generation: u64::from(env.contract.generation),
        };
        // A lock is held for a rename or a fence: waiting as long as a collective may is plenty.
        let lock_wait =
            Duration::from_secs(u64::from(env.contract.spec.data_parallel.timeout_seconds));
        let (store, found) =
            CheckpointStore::fence(dir, me, policy.keep as usize, params, lock_wait)?;
        let checkpointing = Checkpointing {
            store,
            interval_steps: policy.interval_steps.max(1),
            saved_step: found.as_ref().map_or(0, |c| c.step),
        };
        Ok((Some(checkpointing), found))
    }

    /// After optimizer step `step`: a checkpoint when one is due.
    pub(crate) fn after_step(
        &mut self,
        step: u64,
        params: &[f32],
        optimizer: &Optimizer,
    ) -> Result<(), WorkerError> {
        if step.is_multiple_of(self.interval_steps) {
            let path = self.save(step, params, optimizer)?;
            tracing::debug!(step, path = %path.display(), "checkpoint written");
        }
        Ok(())
    }

    /// Training stopped at step `step` with `error`: when its cause is retryable (the gang will go on as a new
    /// generation) and the step is newer than the last checkpoint, saves it. `params` and `optimizer` are those
    /// after step `step`, the last one this rank completed: its all-reduce held every rank's gradient, so every
    /// rank that applied it holds the same bits.
    pub(crate) fn after_failure(
        &mut self,
        step: u64,
        params: &[f32],
        optimizer: &Optimizer,
        error: &WorkerError,
    ) {
        let params_intact = optimizer
            .state()
            .first()
            .is_none_or(|s| s.len() == params.len());
        match on_the_way_out(step, self.saved_step, error, params_intact) {
            WayOut::NothingToKeep => return,
            WayOut::SavedAlready => {
                tracing::info!(
                    step,
                    cause = %rdu_error_chain::Chain(error),
                    "the last completed step is checkpointed already"
                );
                return;
            }
            WayOut::ParametersLost => {
                tracing::warn!(
                    step,
                    "the parameters did not survive the failure: no checkpoint"
                );
                return;
            }
            WayOut::Save => {}
        }
        match self.save(step, params, optimizer) {
            Ok(path) => tracing::info!(
                step,
                path = %path.display(),
                cause = %rdu_error_chain::Chain(error),
                "checkpoint of the last completed step saved on the way out"
            ),
            Err(e) => {
                tracing::warn!(step, error = %rdu_error_chain::Chain(&e), "cannot save a checkpoint on the way out")
            }
        }
    }

    fn save(
        &mut self,
        step: u64,
        params: &[f32],
        optimizer: &Optimizer,
    ) -> Result<std::path::PathBuf, WorkerError> {
        let snapshot = Snapshot {
            step,
            params,
            optimizer_state: optimizer.state(),
        };
        let path = self.store.save(&snapshot)?;
        self.saved_step = step;
        Ok(path)
    }
}

/// What rank 0 does with its last completed step when training stops early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WayOut {
    /// The cause ends the job (or is the checkpoint directory's own): no new generation would read it.
    NothingToKeep,
    /// The step is on disk already (a periodic checkpoint, or the one resumed from): said in the log, so the
    /// next generation's resume step is explained.
    SavedAlready,
    /// The parameters and the optimizer's state disagree in length: saving them would write garbage.
    ParametersLost,
    /// Save it.
    Save,
}

/// The decision of [`Checkpointing::after_failure`] for step `step` with `saved_step` on disk.
fn on_the_way_out(step: u64, saved_step: u64, error: &WorkerError, params_intact: bool) -> WayOut {
    if !saves_progress(error) {
        WayOut::NothingToKeep
    } else if step <= saved_step {
        WayOut::SavedAlready
    } else if !params_intact {
        WayOut::ParametersLost
    } else {
        WayOut::Save
    }
}

/// Whether training that ended with `error` is worth a checkpoint: a new generation will carry on (a signal,
/// or a retryable failure), and the failure was not the checkpoint directory's own.
fn saves_progress(error: &WorkerError) -> bool {
    match error {
        WorkerError::Stopped { .. } => true,
        WorkerError::Checkpoint(_) => false,
        other => other.exit_code() == exit_code::RETRYABLE,
    }
}

/// The checkpoint rank 0 chose (`found`: its lineage's newest intact one, if any) copied into every rank's
/// parameters and optimizer; returns the global step to resume from (0 without a checkpoint).
pub(crate) async fn resume(
    comm: &Communicator,
    found: Option<Checkpoint>,
    params: &mut [f32],
    optimizer: &mut Optimizer,
) -> Result<u64, WorkerError> {
    // The step in 16-bit pieces: f32 holds them exactly.
    let mut header = [0.0f32; 4];
    if let Some(c) = &found {
        header[0] = 1.0;
        for (i, h) in header[1..].iter_mut().enumerate() {
            *h = ((c.step >> (16 * i)) & 0xffff) as f32;
        }
    }
    if comm.world_size() > 1 {
        comm.broadcast(&mut header, 0).await?;
    }
    if header[0] != 1.0 {
        return Ok(0);
    }
    let step = header[1..]
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, &h)| acc | ((h as u64) << (16 * i)));
    let state_lens: Vec<usize> = optimizer.state().iter().map(|s| s.len()).collect();
    let mut state: Vec<Vec<f32>> = state_lens.iter().map(|&n| vec![0.0; n]).collect();
    if let Some(c) = found {
        params.copy_from_slice(&c.params);
        if c.optimizer_state.len() == state.len()
            && c.optimizer_state
                .iter()
                .zip(&state)
                .all(|(a, b)| a.len() == b.len())
        {
            state = c.optimizer_state;
        } else {
            tracing::warn!(
                "checkpoint's optimizer state does not fit; optimizer restarts from zero"
            );
        }
    }
    if comm.world_size() > 1 {
        comm.broadcast(params, 0).await?;
        for s in state.iter_mut() {
            comm.broadcast(s, 0).await?;
        }
    }
    optimizer.restore(&state, step);
    tracing::info!(
        step,
        checksum = format!("{:016x}", checksum(params)),
        "resumed from checkpoint"
    );
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_collective::CollectiveError;

    #[test]
    fn only_a_retryable_stop_is_worth_a_checkpoint() {
        let table: [(WorkerError, bool); 7] = [
            (WorkerError::Stopped { signal: 15 }, true),
            (
                WorkerError::Collective(CollectiveError::AbortedByPeer {
                    by_rank: 1,
                    reason: "stopped".into(),
                    permanent: false,
                }),
                true,
            ),
            (
                WorkerError::Collective(CollectiveError::Timeout {
                    op: "all_reduce",
                    after: Duration::from_secs(1),
                }),
                true,
            ),
            (
                WorkerError::Collective(CollectiveError::PeerLost {
                    rank: 2,
                    reason: "reset".into(),
                }),
                true,
            ),
            (
                WorkerError::Collective(CollectiveError::AbortedByPeer {
                    by_rank: 1,
                    reason: "bad data".into(),
                    permanent: true,
                }),
                false,
            ),
            (WorkerError::config("spec.data", "x"), false),
            (
                WorkerError::Checkpoint(crate::checkpoint::CheckpointError::Superseded {
                    dir: "d".into(),
                    mine: 0,
                    fence: 1,
                }),
                false,
            ),
        ];
        for (error, expected) in table {
            assert_eq!(saves_progress(&error), expected, "{error}");
        }
    }

    #[test]
    fn on_the_way_out_saves_only_a_new_step_of_intact_parameters() {
        let sigterm = WorkerError::Stopped { signal: 15 };
        let fatal = WorkerError::config("spec.data", "x");
        // (step, saved step, error, parameters intact) -> decision
        let table = [
            (12, 10, &sigterm, true, WayOut::Save),
            (10, 10, &sigterm, true, WayOut::SavedAlready),
            (9, 10, &sigterm, true, WayOut::SavedAlready),
            (0, 0, &sigterm, true, WayOut::SavedAlready),
            (12, 10, &sigterm, false, WayOut::ParametersLost),
            (10, 10, &sigterm, false, WayOut::SavedAlready),
            (12, 10, &fatal, true, WayOut::NothingToKeep),
            (10, 10, &fatal, true, WayOut::NothingToKeep),
        ];
        for (step, saved, error, intact, expected) in table {
            assert_eq!(
                on_the_way_out(step, saved, error, intact),
                expected,
                "step {step}, saved {saved}, {error}, intact {intact}"
            );
        }
    }
}
