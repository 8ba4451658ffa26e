//! A job's run in local mode (`rdujob run`, built beside the test binaries), as a user compares a cluster run
//! with a laptop run.

use serde_json::Value;

use crate::logs::field_of;
use crate::workspace_root;

/// What a local run printed.
#[derive(Debug, Clone)]
pub struct LocalRun {
    /// The result JSON (the last stdout line).
    pub result: Value,
    /// The ranks' merged log (stderr, with every rank's lines: `-v`).
    pub log: String,
}

impl LocalRun {
    /// The final parameter checksum of every rank that logged one, in log order.
    pub fn checksums(&self) -> Vec<String> {
        checksums(&self.log)
    }
}

/// The values of the `parameter checksum` lines of a rank's (or the ranks' merged) log.
pub fn checksums(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("parameter checksum"))
        .filter_map(|l| field_of(l, "checksum"))
        .collect()
}

/// Runs `job` in local mode with extra env `env`; its result line. See [`run_local_logged`].
pub fn run_local(job: &Value, env: &[(&str, &str)]) -> Value {
    run_local_logged(job, env).result
}

/// Runs `job` in local mode (`rdujob run`, built beside the test binaries) with extra env `env`; panics when it
/// fails. The template is dropped: local mode ignores the claim, its checkpoints go to its scratch directory.
pub fn run_local_logged(job: &Value, env: &[(&str, &str)]) -> LocalRun {
    let mut local = job.clone();
    local["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("template");
    let dir = workspace_root().join("examples");
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile_in(&dir)
        .expect("job file beside the example data");
    std::fs::write(file.path(), serde_yaml_ng::to_string(&local).expect("YAML")).expect("write");
    let exe = std::env::current_exe().expect("test binary");
    let target = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let out = std::process::Command::new(target.join("rdujob"))
        .args(["run", "-v"])
        .arg(file.path())
        .envs(env.iter().copied())
        .output()
        .expect("rdujob runs (cargo build -p rdujob)");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rdujob run: {log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| {
            panic!(
                "rdujob's last line is not its result ({}): {stdout}",
                rdu_error_chain::Chain(&e)
            )
        });
    LocalRun { result, log }
}
