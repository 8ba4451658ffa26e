//! `rdu-worker run`: read the env contract, run the rank's session in its job (`session`: its mode, `modes`) on
//! the rank's runtime, and turn its end into the exit code (DESIGN 4.6).

use std::path::Path;

use rdu_crds::consts::{TERMINATION_LOG_PATH, exit_code};

use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::modes;
use crate::observe::Observers;
use crate::session::RankOutcome;
use crate::stop::StopRequest;

/// Runs one rank from the process environment and returns the exit code; SIGTERM and SIGINT stop it
/// (`stop`).
pub fn run_from_process_env() -> i32 {
    run_stoppable(|k| std::env::var(k).ok(), &StopRequest::on_signals())
}

/// Runs one rank from `get`'s variables (working directory = the process's) and returns the exit code. The
/// process's signals are left alone (several ranks may share the process, as in tests).
pub fn run(get: impl Fn(&str) -> Option<String>) -> i32 {
    run_stoppable(get, &StopRequest::manual())
}

/// [`run`], stopped early by `stop` (the rank then exits 128 + the signal).
pub fn run_stoppable(get: impl Fn(&str) -> Option<String>, stop: &StopRequest) -> i32 {
    let env = match WorkerEnv::from_vars(get) {
        Ok(env) => env,
        Err(e) => {
            tracing::error!(error = %rdu_error_chain::Chain(&e), exit_code = e.exit_code(), "cannot start");
            return e.exit_code();
        }
    };
    // Every line of the rank's log carries the rank, job and generation (`kubectl logs` shows no other
    // prefix).
    let span = tracing::info_span!(
        "worker",
        rank = env.contract.rank,
        job = %env.contract.job_name,
        generation = env.contract.generation
    );
    let _entered = span.enter();
    // One thread for the collective and its socket readers: the rank's compute runs on its tile threads, and on
    // small hosts extra runtime threads only contend with them and with the peer ranks (allreduce-bench, 2 ranks
    // x 16 MiB: 2.0-2.8 GB/s single-threaded against 1.6-2.1 GB/s with 2 runtime threads per rank; a 7 MB
    // gradient at 2 ranks trained 7.8-8.1k samples/s against 6.1-7.0k).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %rdu_error_chain::Chain(&e), "cannot start the async runtime");
            return exit_code::RETRYABLE;
        }
    };
    match runtime.block_on(run_rank_observed(
        &env,
        &mut Observers::for_rank(&env),
        stop,
    )) {
        Ok(outcome) => {
            tracing::info!(
                final_loss = outcome.result.final_loss,
                test_accuracy = outcome.result.test_accuracy,
                "rank done"
            );
            exit_code::SUCCESS
        }
        Err(e) => {
            if let WorkerError::Stopped { .. } = e {
                tracing::warn!(reason = %rdu_error_chain::Chain(&e), exit_code = e.exit_code(), "rank stopped");
            } else {
                tracing::error!(error = %rdu_error_chain::Chain(&e), exit_code = e.exit_code(), "rank failed");
            }
            // In a pod the reason goes to the termination message too, where the operator reads it into the job's
            // Failed condition (a successful rank 0 writes its result there instead).
            if env.result_path() == Path::new(TERMINATION_LOG_PATH) {
                let _ = std::fs::write(env.result_path(), rdu_error_chain::chain(&e));
            }
            e.exit_code()
        }
    }
}

/// The rank's session in its job (`session`), running the spec's mode (`modes`), observed by what `env` asks for.
pub async fn run_rank(env: &WorkerEnv) -> Result<RankOutcome, WorkerError> {
    run_rank_observed(env, &mut Observers::for_rank(env), &StopRequest::manual()).await
}

/// [`run_rank`] with the given observers, stopped early by `stop`: at once while it joins the job, at the next
/// step boundary while it runs, and with the collective in flight aborted (the peers are told, retryably).
pub async fn run_rank_observed(
    env: &WorkerEnv,
    observers: &mut Observers,
    stop: &StopRequest,
) -> Result<RankOutcome, WorkerError> {
    modes::run(env, observers, stop).await
}
