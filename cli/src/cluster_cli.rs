//! `rdujob logs|status`: runs `kubectl-rdujob` (next to this executable, else on PATH) with the same arguments, so
//! that `rdujob` itself needs no Kubernetes client.

use std::path::PathBuf;
use std::process::Command;

use crate::error::CliError;

/// The cluster CLI's binary name (also what makes it `kubectl rdujob`).
pub(crate) const CLUSTER_CLI: &str = "kubectl-rdujob";

/// Where `kubectl-rdujob` is: beside this executable (a `cargo build` or `cargo install` puts both there), else
/// on PATH.
pub(crate) fn find() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(CLUSTER_CLI)))
        .filter(|p| p.is_file());
    beside.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(CLUSTER_CLI))
                .find(|p| p.is_file())
        })
    })
}

/// Runs `kubectl-rdujob <command> <args…>` and returns its exit code.
pub(crate) fn run(command: &str, args: &[String]) -> Result<i32, CliError> {
    let binary = find().ok_or_else(|| CliError::ClusterCliMissing {
        command: command.to_string(),
        binary: CLUSTER_CLI,
    })?;
    let status = Command::new(&binary)
        .arg(command)
        .args(args)
        .status()
        .map_err(|source| CliError::Io {
            what: format!("running {}", binary.display()),
            source,
        })?;
    Ok(status.code().unwrap_or(1))
}
