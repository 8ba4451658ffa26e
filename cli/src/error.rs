//! The CLI's error type and the exit code of each failure.

use rdu_crds::consts::exit_code;

/// Everything that stops `rdujob` before or around the ranks.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot read {path}: {reason}")]
    ReadManifest { path: String, reason: String },
    #[error("{path}: {source}")]
    Manifest {
        path: String,
        #[source]
        source: rdu_crds::ManifestError,
    },
    #[error("{path}: invalid RduJob:\n  {}", .errors.join("\n  "))]
    Invalid { path: String, errors: Vec<String> },
    #[error("tiles: {0}")]
    Tiles(String),
    #[error(transparent)]
    Token(#[from] rdu_crds::token::TokenError),
    #[error("cannot start rank {rank}: {reason}")]
    Spawn { rank: u32, reason: String },
    #[error("{what}: {reason}")]
    Io { what: String, reason: String },
    /// The job's ranks do not fit this machine (memory, open files): the message says which.
    #[error("{0}")]
    Capacity(String),
    /// A setting of this process's environment is unusable.
    #[error(transparent)]
    Environment(#[from] rdu_collective::CollectiveError),
}

impl CliError {
    /// 64 for anything wrong with the job file or its resources, 1 for the machine failing us.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::ReadManifest { .. }
            | CliError::Manifest { .. }
            | CliError::Invalid { .. }
            | CliError::Tiles(_)
            | CliError::Capacity(_)
            | CliError::Environment(_) => exit_code::BAD_CONFIG,
            CliError::Spawn { .. } | CliError::Io { .. } | CliError::Token(_) => 1,
        }
    }
}
