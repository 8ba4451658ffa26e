//! The worker's error type and how each failure maps onto the exit-code contract (DESIGN 4.6).

use rdu_collective::CollectiveError;
use rdu_crds::consts::exit_code;

use crate::checkpoint::CheckpointError;
use crate::data::DataError;

/// Everything that stops one rank.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The env contract or the job spec is unusable: permanent.
    #[error("bad config: {field}: {reason}")]
    Config { field: String, reason: String },
    /// The training data is missing or malformed: permanent.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Rendezvous or a collective failed.
    #[error("collective failed")]
    Collective(#[from] CollectiveError),
    /// The result or a PEF could not be written.
    #[error("cannot write {path}")]
    Write {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The run was slower than `spec.training.minThroughput` (the seeds' `--min-throughput`): permanent.
    #[error(
        "throughput {measured:.1} samples/s is below spec.training.minThroughput {required:.1} samples/s"
    )]
    BelowMinThroughput { measured: f64, required: f64 },
    /// A compute task was cancelled (the runtime is shutting down): a retry may succeed.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// Checkpoints could not be read or written, or a newer generation fenced their directory.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// SIGTERM or SIGINT asked the rank to stop (`stop`): it ends as the signal would have ended it.
    #[error("stopped by signal {signal}")]
    Stopped { signal: i32 },
}

impl WorkerError {
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        WorkerError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The process exit code for this failure: 64 config, 65 data, 74 a file, 75 retryable, 128 + N stopped
    /// by signal N.
    pub fn exit_code(&self) -> i32 {
        match self {
            WorkerError::Config { .. } => exit_code::BAD_CONFIG,
            WorkerError::Data(_) => exit_code::BAD_DATA,
            WorkerError::Collective(e) if e.is_retryable() => exit_code::RETRYABLE,
            WorkerError::Collective(_) => exit_code::BAD_CONFIG,
            WorkerError::Write { .. } => exit_code::IO_ERROR,
            WorkerError::Interrupted(_) => exit_code::RETRYABLE,
            WorkerError::BelowMinThroughput { .. } => exit_code::BELOW_MIN_THROUGHPUT,
            WorkerError::Checkpoint(e) => e.exit_code(),
            WorkerError::Stopped { signal } => exit_code::SIGNAL_BASE + signal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_kind_of_failure_has_its_exit_code() {
        assert_eq!(WorkerError::config("RANK", "x").exit_code(), 64);
        let data = DataError::Missing {
            file: "a.csv".into(),
            source: std::io::ErrorKind::NotFound.into(),
        };
        assert_eq!(WorkerError::from(data).exit_code(), 65);
        let lost = CollectiveError::PeerLost {
            rank: 1,
            reason: "reset".into(),
        };
        assert_eq!(WorkerError::from(lost).exit_code(), 75);
        let timeout = CollectiveError::Timeout {
            op: "all_reduce",
            after: Duration::from_secs(1),
        };
        assert_eq!(WorkerError::from(timeout).exit_code(), 75);
        let protocol = CollectiveError::Protocol {
            rank: 0,
            reason: "size".into(),
        };
        assert_eq!(WorkerError::from(protocol).exit_code(), 64);
        assert_eq!(WorkerError::Interrupted("backward".into()).exit_code(), 75);
        assert_eq!(WorkerError::Stopped { signal: 15 }.exit_code(), 143);
        assert_eq!(WorkerError::Stopped { signal: 2 }.exit_code(), 130);
    }
}
