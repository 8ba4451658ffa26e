//! The command-line tools the tests drive: kubectl (installed), helm (built by e2e/control-plane/build.sh)
//! and the operator binary (built by `cargo build -p rdu-operator`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Env var naming the helm binary; else `$KUBEBUILDER_ASSETS/helm`, else `helm` on PATH.
pub const HELM_ENV: &str = "RDU_E2E_HELM";
/// Env var naming the operator binary; else `<workspace>/target/debug/rdu-operator`.
pub const OPERATOR_ENV: &str = "RDU_OPERATOR_BIN";

/// Errors running a tool.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("cannot run {tool}")]
    Spawn {
        tool: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(
        "the operator binary {0} does not exist: run `cargo build -p rdu-operator` (or set {OPERATOR_ENV})"
    )]
    NoOperator(PathBuf),
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs `program args` with optional stdin; returns the output whatever the exit status.
pub fn run(program: &Path, args: &[&str], stdin: Option<&str>) -> Result<Output, ToolError> {
    let spawn_error = |source| ToolError::Spawn {
        tool: program.display().to_string(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(spawn_error)?;
    }
    child.wait_with_output().map_err(spawn_error)
}

/// Like [`run`], but a non-zero exit is an error carrying stderr; returns stdout.
pub fn run_ok(program: &Path, args: &[&str], stdin: Option<&str>) -> Result<String, ToolError> {
    let out = run(program, args, stdin)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ToolError::Failed {
            command: format!("{} {}", program.display(), args.join(" ")),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// How long one kubectl request may take: a connection to an API server that went away and came back can hang
/// for minutes without one (seen in the soak after an API server restart). Longer than any `kubectl wait
/// --timeout` the tests pass.
pub const KUBECTL_REQUEST_TIMEOUT: &str = "--request-timeout=90s";

/// kubectl with `--kubeconfig` and a request timeout prepended to `args`; returns the output whatever the exit
/// status.
pub fn kubectl_in(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<Output, ToolError> {
    let flag = format!("--kubeconfig={}", kubeconfig.display());
    let mut all = vec![flag.as_str(), KUBECTL_REQUEST_TIMEOUT];
    all.extend_from_slice(args);
    run(Path::new("kubectl"), &all, stdin)
}

/// The helm binary to use.
pub fn helm_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(HELM_ENV) {
        return PathBuf::from(path);
    }
    if let Some(dir) = std::env::var_os(crate::assets::ASSETS_ENV) {
        let candidate = Path::new(&dir).join("helm");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("helm")
}

/// `helm template <release> charts/rdu-operator --namespace <ns> <extra...>`: the rendered manifests.
pub fn helm_template(release: &str, namespace: &str, extra: &[&str]) -> Result<String, ToolError> {
    let chart = workspace_root().join("charts/rdu-operator");
    let chart = chart.display().to_string();
    let mut args = vec![
        "template",
        release,
        chart.as_str(),
        "--namespace",
        namespace,
    ];
    args.extend_from_slice(extra);
    run_ok(&helm_binary(), &args, None)
}

/// The operator binary, which must exist.
pub fn operator_binary() -> Result<PathBuf, ToolError> {
    let path = std::env::var_os(OPERATOR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/rdu-operator"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(ToolError::NoOperator(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ok_reports_stderr_of_a_failing_command() {
        let err = run_ok(Path::new("sh"), &["-c", "echo bad thing >&2; exit 3"], None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("bad thing") && text.contains("exit status: 3"),
            "{text}"
        );
    }

    #[test]
    fn run_passes_stdin() {
        let out = run_ok(Path::new("cat"), &[], Some("hello")).unwrap();
        assert_eq!(out, "hello");
    }

    #[test]
    fn the_workspace_root_holds_the_chart() {
        assert!(
            workspace_root()
                .join("charts/rdu-operator/values.yaml")
                .is_file()
        );
    }
}
