//! The CLI's error type, the exit code of each failure, and the cause chain `rdujob` prints for one.

use std::path::PathBuf;

use rdu_crds::consts::exit_code;

/// Everything that stops `rdujob` before or around the ranks. A variant that wraps another error keeps it as its
/// `source` and leaves its text out of its own message: [`chain`] prints both, `outer: inner`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error("cannot read {}", .path.display())]
    ReadManifest {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", .path.display())]
    Manifest {
        path: PathBuf,
        #[source]
        source: rdu_crds::ManifestError,
    },
    #[error("{}: invalid RduJob:\n  {}", .path.display(), .errors.join("\n  "))]
    Invalid { path: PathBuf, errors: Vec<String> },
    /// The job needs a node of more tiles than the simulated one can have.
    #[error("cannot simulate a node of {rdus} RDUs × {tiles_per_rdu} tiles")]
    SimulatedNode {
        rdus: u32,
        tiles_per_rdu: u32,
        #[source]
        source: rdu_tiles::topology::TopologyError,
    },
    #[error("tiles")]
    Tiles(#[source] rdu_tiles::simulated::AllocationError),
    #[error(transparent)]
    Token(#[from] rdu_crds::token::TokenError),
    #[error("cannot start rank {rank}")]
    Spawn {
        rank: u32,
        #[source]
        source: std::io::Error,
    },
    /// `what` is what was being done: `creating a scratch directory`.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// `what` is what was being encoded or decoded: `decoding rank 0's result …`.
    #[error("{what}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// `rdujob logs|status` without the cluster CLI (`binary`, `kubectl-rdujob`) beside this executable or on
    /// PATH.
    #[error(
        "rdujob {command}: {binary} is not installed: `cargo install --path kubectl-rdujob` (it also makes \
         `kubectl rdujob {command}` work)"
    )]
    ClusterCliMissing {
        command: String,
        binary: &'static str,
    },
    /// A run of `rdujob bench` ended without a result.
    #[error(
        "the job with {ranks} rank(s) ended with {status} (run `rdujob run {} --workers {ranks}` to see its logs)",
        .path.display()
    )]
    BenchRun {
        ranks: u32,
        status: std::process::ExitStatus,
        path: PathBuf,
    },
    /// The generation counter is unbounded in form but bounded by `backoffLimit` (a u32) in practice.
    #[error("the gang ran out of generation numbers")]
    OutOfGenerations,
    /// Every rank of a generation ended and the gang's turn still said neither success nor failure.
    #[error("generation {generation} ended with every rank gone and no verdict: {turn}")]
    NoVerdict { generation: u32, turn: String },
    /// The job's ranks do not fit this machine (memory, open files): the message says which.
    #[error("{0}")]
    Capacity(String),
    /// A setting of this process's environment is unusable.
    #[error(transparent)]
    Environment(#[from] rdu_collective::CollectiveError),
}

impl CliError {
    /// 64 for anything wrong with the job file or its resources, 1 for the machine failing us.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            CliError::ReadManifest { .. }
            | CliError::Manifest { .. }
            | CliError::Invalid { .. }
            | CliError::SimulatedNode { .. }
            | CliError::Tiles(_)
            | CliError::Capacity(_)
            | CliError::Environment(_) => exit_code::BAD_CONFIG,
            CliError::Spawn { .. }
            | CliError::Io { .. }
            | CliError::Json { .. }
            | CliError::ClusterCliMissing { .. }
            | CliError::BenchRun { .. }
            | CliError::OutOfGenerations
            | CliError::NoVerdict { .. }
            | CliError::Token(_) => 1,
        }
    }
}

/// `error` and its causes as one line, the way `rdujob` prints a failure (`rdu_error_chain`).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    rdu_error_chain::chain(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_every_cause_once() {
        let missing =
            || std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let read = CliError::ReadManifest {
            path: "/nonexistent/job.yaml".into(),
            source: missing(),
        };
        assert_eq!(
            chain(&read),
            "cannot read /nonexistent/job.yaml: No such file or directory"
        );
        // A cause that already shows its own source's text (as rdu-crds' ManifestError does) is not doubled.
        let yaml = serde_yaml_ng::from_str::<u32>("[").unwrap_err();
        let manifest = CliError::Manifest {
            path: "job.yaml".into(),
            source: rdu_crds::ManifestError::Yaml(yaml),
        };
        let line = chain(&manifest);
        let yaml_text = serde_yaml_ng::from_str::<u32>("[").unwrap_err().to_string();
        assert_eq!(
            line,
            format!("job.yaml: the file is not a valid RduJob manifest: {yaml_text}")
        );
    }
}
