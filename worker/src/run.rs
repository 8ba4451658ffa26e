//! `rdu-worker run`: read the env contract, load the data, join the job, train, write the result;
//! every failure becomes its exit code (DESIGN 4.6).

use std::path::Path;
use std::time::Duration;

use rdu_collective::{CommConfig, Communicator, ConnectOptions, DEFAULT_CHUNK_BYTES, JobIdentity};
use rdu_crds::consts::{TERMINATION_LOG_PATH, exit_code};

use crate::data;
use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::inference::infer;
use crate::measure::measure_performance;
use crate::observe::Observers;
use crate::pef;
use crate::result::write_result;
use crate::stop::StopRequest;
use crate::train::{TrainOutcome, train};
use rdu_crds::{RduJobSpec, RunMode};

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
            tracing::error!(error = %e, exit_code = e.exit_code(), "cannot start");
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
            tracing::error!(error = %e, "cannot start the async runtime");
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
                tracing::warn!(reason = %e, exit_code = e.exit_code(), "rank stopped");
            } else {
                tracing::error!(error = %e, exit_code = e.exit_code(), "rank failed");
            }
            // In a pod the reason goes to the termination message too, where the operator reads it into the job's
            // Failed condition (a successful rank 0 writes its result there instead).
            if env.result_path() == Path::new(TERMINATION_LOG_PATH) {
                let _ = std::fs::write(env.result_path(), e.to_string());
            }
            e.exit_code()
        }
    }
}

/// Data, rendezvous, training, result: the rank's pipeline, observed by what `env` asks for.
pub async fn run_rank(env: &WorkerEnv) -> Result<TrainOutcome, WorkerError> {
    run_rank_observed(env, &mut Observers::for_rank(env), &StopRequest::manual()).await
}

/// [`run_rank`] with the given observers, stopped early by `stop`: at once while it joins the job, at the next
/// step boundary while it trains, and with the collective in flight aborted (the peers are told, retryably).
pub async fn run_rank_observed(
    env: &WorkerEnv,
    observers: &mut Observers,
    stop: &StopRequest,
) -> Result<TrainOutcome, WorkerError> {
    // From the start a signal asks the rank to stop: a container's first process (as the worker is, with no init)
    // ignores SIGTERM while it has no handler, so the kubelet would wait out the whole grace period to kill a
    // rank that was still loading its data.
    let _signals = stop.listen();
    let splits = data::load(
        &env.contract.spec.data,
        &env.contract.spec.model,
        Path::new("."),
    )?;
    pef::check_job(&env.contract.spec, &splits, env.contract.world_size)?;
    if let Some(signal) = stop.requested() {
        return Err(WorkerError::Stopped { signal });
    }
    let options = ConnectOptions {
        data_path: env.data_path,
        ..ConnectOptions::default()
    };
    let comm = tokio::select! {
        comm = Communicator::connect_with(comm_config(env), options) => comm?,
        signal = stop.wait() => return Err(WorkerError::Stopped { signal }),
    };
    tracing::info!(
        world_size = env.contract.world_size,
        generation = env.contract.generation,
        peers = comm.peers().len(),
        "joined the job"
    );
    let work = async {
        let ran = match env.contract.spec.mode {
            RunMode::Train => train(env, &comm, &splits, observers, stop).await,
            RunMode::MeasurePerformance => measure_performance(env, &comm, &splits).await,
            RunMode::Inference => infer(env, &comm, &splits).await,
        };
        // Rank 0's throughput is the job's (status.result); a rank 0 below the minimum aborts the others.
        let outcome = match env.contract.rank {
            0 => ran.and_then(|o| check_min_throughput(&env.contract.spec, o))?,
            _ => ran?,
        };
        if env.contract.rank == 0 {
            write_result(env.result_path(), &outcome.result)?;
        }
        if comm.world_size() > 1 {
            comm.barrier().await?;
        }
        Ok(outcome)
    };
    match stop.abort_on_stop(&comm, work).await {
        Ok(outcome) => {
            comm.shutdown().await;
            Ok(outcome)
        }
        Err(e) => {
            // A bad spec or bad data is every rank's: the peers fail permanently too, even one
            // that had not yet received what would have shown it the same failure.
            if matches!(e, WorkerError::Config { .. } | WorkerError::Data(_)) {
                comm.abort_permanently(&e.to_string()).await;
            } else {
                comm.abort(&e.to_string()).await;
            }
            Err(e)
        }
    }
}

/// The outcome, unless its throughput is below `spec.training.minThroughput` (every rank computes the same job
/// throughput, so every rank fails alike).
pub fn check_min_throughput(
    spec: &RduJobSpec,
    outcome: TrainOutcome,
) -> Result<TrainOutcome, WorkerError> {
    match spec.training.min_throughput {
        Some(required) if outcome.result.samples_per_second < required => {
            Err(WorkerError::BelowMinThroughput {
                measured: outcome.result.samples_per_second,
                required,
            })
        }
        _ => Ok(outcome),
    }
}

/// The communicator's settings from the env contract.
pub fn comm_config(env: &WorkerEnv) -> CommConfig {
    CommConfig {
        identity: JobIdentity {
            job_uid: env.contract.job_uid.clone(),
            token: env.supplied.token.clone(),
            generation: u64::from(env.contract.generation),
        },
        rank: env.contract.rank,
        world_size: env.contract.world_size,
        master_addr: env.contract.master_addr.clone(),
        master_port: env.contract.master_port,
        advertise_host: env.supplied.pod_ip.clone(),
        collective_port: env.contract.collective_port,
        node: env.supplied.node_name.clone(),
        timeout: Duration::from_secs(u64::from(env.contract.spec.data_parallel.timeout_seconds)),
        chunk_bytes: DEFAULT_CHUNK_BYTES,
    }
}
