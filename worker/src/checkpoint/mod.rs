//! Checkpoints: rank 0 writes parameters, optimizer state and the global step, durably and atomically, keeps
//! the newest N of its lineage; which one a generation resumes from (`checkpoint_schedule::resume` shares it).
//!
//! The directory is fenced by generation (DESIGN 5, "Fencing"): a rank 0 of an older generation still alive
//! (a partitioned node, a pod not yet killed) never gets a checkpoint accepted once a newer generation
//! started, and a newer generation never resumes from one. `format` is the bytes and names, `files` the
//! untrusted directory, `fence` the decisions, `store` the two operations (fence at start, save).

mod fence;
mod files;
mod format;
mod store;

use std::path::Path;
use std::time::Duration;

use rdu_crds::consts::exit_code;

pub use format::file_name;
pub(crate) use format::{Checkpoint, Snapshot, Writer};
pub(crate) use store::{CheckpointStore, read_lineage};

/// Everything reading, writing or fencing checkpoints fails with.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A newer generation of this job fenced the directory: this rank 0 is stale (a partitioned node, a pod
    /// not yet killed), and the job has moved on without it.
    #[error(
        "generation {fence} of this job fenced the checkpoint directory {dir}: this rank 0 of generation {mine} is stale"
    )]
    Superseded { dir: String, mine: u64, fence: u64 },
    /// Another job (another UID) started in the directory since this one did.
    #[error(
        "the checkpoint directory {dir} is now used by job uid {by} (generation {generation}): two jobs share it; give each job its own checkpoint directory"
    )]
    TakenOver {
        dir: String,
        by: String,
        generation: u64,
    },
    /// Another process held the directory's lock longer than the job's timeout.
    #[error("cannot lock {path} within {waited:?}: another process holds it")]
    LockTimeout {
        path: std::path::PathBuf,
        waited: Duration,
    },
    /// The fence file is not one (it may name a newer generation, so nothing is written past it).
    #[error(
        "{path} is not a checkpoint fence ({source}): delete it to resume from the newest checkpoint"
    )]
    BadFence {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl CheckpointError {
    fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        CheckpointError::Io {
            action,
            path: path.display().to_string(),
            source,
        }
    }

    /// The rank's exit code: a stale rank 0 or a lock held too long is retryable (75), two jobs sharing a
    /// directory a config error (64), a file that cannot be read or written an I/O error (74).
    pub fn exit_code(&self) -> i32 {
        match self {
            CheckpointError::Superseded { .. } | CheckpointError::LockTimeout { .. } => {
                exit_code::RETRYABLE
            }
            CheckpointError::TakenOver { .. } => exit_code::BAD_CONFIG,
            CheckpointError::BadFence { .. } | CheckpointError::Io { .. } => exit_code::IO_ERROR,
        }
    }
}
