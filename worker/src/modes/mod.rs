//! The run modes (`spec.mode`), one file each, every one a [`Mode`](crate::session::Mode) that the rank's session runs
//! (`session::run`). A new mode is a file here, its arm in [`run`], and its value in `rdu_crds::RunMode`.

pub(crate) mod all_reduce_benchmark;
pub(crate) mod inference;
pub(crate) mod measure;
pub(crate) mod train;

use rdu_crds::RunMode;

use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::observe::Observers;
use crate::session::{self, RankOutcome};
use crate::stop::StopRequest;

/// Runs the mode of `env`'s spec for its rank, telling `observers`, stopped early by `stop`.
pub(crate) async fn run(
    env: &WorkerEnv,
    observers: &mut Observers,
    stop: &StopRequest,
) -> Result<RankOutcome, WorkerError> {
    match env.contract.spec.mode {
        RunMode::Train => session::run::<train::Train>(env, observers, stop).await,
        RunMode::MeasurePerformance => {
            session::run::<measure::MeasurePerformance>(env, observers, stop).await
        }
        RunMode::Inference => session::run::<inference::Inference>(env, observers, stop).await,
        RunMode::AllReduceBenchmark => {
            session::run::<all_reduce_benchmark::AllReduceBenchmark>(env, observers, stop).await
        }
    }
}
