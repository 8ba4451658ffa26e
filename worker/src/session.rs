//! One rank's session in its job, the frame every run mode plugs into: the mode prepares what it reads from disk,
//! the rank joins the job, the mode runs, and rank 0's result is checked (`training.minThroughput`) and written;
//! then every rank leaves together. A stop request (`stop`) ends the session at once while the rank joins, at the
//! mode's next boundary while it runs, and with the collective in flight aborted; any failure aborts the peers
//! (permanently for a bad spec or bad data, which are every rank's).

use std::future::Future;
use std::time::Duration;

use rdu_collective::{CommConfig, Communicator, ConnectOptions, DEFAULT_CHUNK_BYTES, JobIdentity};
use rdu_crds::{JobResult, RduJobSpec};

use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::observe::Observers;
use crate::result::write_result;
use crate::stop::StopRequest;

/// What a rank ends with.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// The job's result when this is rank 0 (every rank computes one).
    pub result: JobResult,
    /// The checksum of the rank's parameters at the end, in the modes that hold a model.
    pub checksum: Option<u64>,
}

/// What a mode works with once the rank joined its job.
pub(crate) struct RankSession<'a> {
    pub env: &'a WorkerEnv,
    pub comm: &'a Communicator,
    /// Read at every boundary of the mode's work (a step, an iteration).
    pub stop: &'a StopRequest,
    /// Told of the mode's steps, epochs and end.
    pub observers: &'a mut Observers,
}

/// One run mode (`spec.mode`): a value made before the rank joins, then run on the joined rank.
pub(crate) trait Mode: Sized {
    /// What the mode reads from disk (data, a PEF), checked before the rank joins: a bad file ends the rank before
    /// any peer waits for it.
    fn prepare(env: &WorkerEnv) -> Result<Self, WorkerError>;

    /// The mode's work on the joined rank, to the rank's outcome. A stop request ends it with
    /// [`WorkerError::Stopped`] at its next boundary.
    fn run(
        self,
        session: RankSession<'_>,
    ) -> impl Future<Output = Result<RankOutcome, WorkerError>>;
}

/// Runs mode `M` for the rank `env` describes, telling `observers`, stopped early by `stop`.
pub(crate) async fn run<M: Mode>(
    env: &WorkerEnv,
    observers: &mut Observers,
    stop: &StopRequest,
) -> Result<RankOutcome, WorkerError> {
    // From the start a signal asks the rank to stop: a container's first process (as the worker is, with no init)
    // ignores SIGTERM while it has no handler, so the kubelet would wait out the whole grace period to kill a
    // rank that was still loading its data.
    let _signals = stop.listen();
    let _ballast = env.faults.allocate();
    let mode = M::prepare(env)?;
    if let Some(signal) = stop.requested() {
        return Err(WorkerError::Stopped { signal });
    }
    let comm = join(env, stop).await?;
    let work = async {
        let session = RankSession {
            env,
            comm: &comm,
            stop,
            observers,
        };
        let ran = mode.run(session).await;
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
    let ended = stop.abort_on_stop(&comm, work).await;
    leave(comm, ended).await
}

/// Joins the job: the rendezvous at rank 0, then a link to every peer.
async fn join(env: &WorkerEnv, stop: &StopRequest) -> Result<Communicator, WorkerError> {
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
    Ok(comm)
}

/// Leaves the job: a clean shutdown after success, or after a stop at a step boundary (the peers take in every
/// byte of the steps this rank finished, then see its streams end), else an abort that tells the peers why.
async fn leave(
    comm: Communicator,
    ended: Result<RankOutcome, WorkerError>,
) -> Result<RankOutcome, WorkerError> {
    match ended {
        Ok(outcome) => {
            comm.shutdown().await;
            Ok(outcome)
        }
        Err(e @ WorkerError::Stopped { .. }) if comm.failure().is_none() => {
            comm.shutdown().await;
            Err(e)
        }
        Err(e) => {
            // A bad spec or bad data is every rank's: the peers fail permanently too, even one
            // that had not yet received what would have shown it the same failure.
            if matches!(e, WorkerError::Config { .. } | WorkerError::Data(_)) {
                comm.abort_permanently(&rdu_error_chain::chain(&e)).await;
            } else {
                comm.abort(&rdu_error_chain::chain(&e)).await;
            }
            Err(e)
        }
    }
}

/// The outcome, unless its throughput is below `spec.training.minThroughput` (every rank computes the same job
/// throughput, so every rank fails alike).
pub(crate) fn check_min_throughput(
    spec: &RduJobSpec,
    outcome: RankOutcome,
) -> Result<RankOutcome, WorkerError> {
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
pub(crate) fn comm_config(env: &WorkerEnv) -> CommConfig {
    let contract = &env.contract;
    CommConfig {
        identity: JobIdentity {
            job_uid: contract.job_uid.clone(),
            token: env.supplied.token.clone(),
            generation: u64::from(contract.generation),
        },
        rank: contract.rank,
        world_size: contract.world_size,
        master_addr: contract.master_addr.clone(),
        master_port: contract.master_port,
        advertise_host: env.supplied.pod_ip.clone(),
        collective_port: contract.collective_port,
        node: env.supplied.node_name.clone(),
        timeout: Duration::from_secs(u64::from(contract.spec.data_parallel.timeout_seconds)),
        chunk_bytes: DEFAULT_CHUNK_BYTES,
    }
}
