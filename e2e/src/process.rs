//! Child processes of a test (etcd, the API server, the operator...): output to a log file, killed on drop.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running child that is killed (and reaped) when dropped.
#[derive(Debug)]
pub struct Managed {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Managed {
    /// Starts `command` with stdout and stderr appended to `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, mut command: Command, log_dir: &Path) -> std::io::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()?;
        Ok(Self {
            name: name.to_string(),
            log,
            child,
        })
    }

    /// `Some(description)` when the process has already exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited ({status}); log tail:\n{}",
                self.name,
                self.log_tail(40)
            )),
            Ok(None) => None,
            Err(e) => Some(format!("{} cannot be waited on: {e}", self.name)),
        }
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The OS process ID.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_process_is_killed_and_its_output_logged() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; exec sleep 600"]);
        let mut managed = Managed::spawn("sleeper", cmd, dir.path()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while managed.log_tail(1) != "started" {
            assert!(
                std::time::Instant::now() < deadline,
                "no output from the child"
            );
            std::thread::yield_now();
        }
        assert!(managed.exited().is_none());
        let pid = managed.id();
        drop(managed);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still exists"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sleeper.log")).unwrap(),
            "started\n"
        );
    }
}
