//! Child processes of a test (etcd, the API server, the operator...): output to a log file, killed on drop, and
//! killed too when the test process is interrupted (SIGINT, SIGTERM, SIGHUP), so that a run stopped by hand or by
//! a CI timeout leaves no server, kubelet or container behind.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, Once};

/// Every live child's PID, for the interruption handler.
static LIVE: Mutex<Option<HashSet<u32>>> = Mutex::new(None);
/// Extra clean-up steps the interruption handler runs after killing the children (the nodes' sweep).
static SWEEPS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());
static HANDLER: Once = Once::new();

/// Runs `sweep` (after every child is killed) if the test process is interrupted.
pub fn on_interrupt(sweep: fn()) {
    if let Ok(mut sweeps) = SWEEPS.lock()
        && !sweeps.contains(&sweep)
    {
        sweeps.push(sweep);
    }
    install_handler();
}

/// From the first child on, SIGINT, SIGTERM and SIGHUP kill every live child, run the sweeps, and end the test
/// process as the signal would have (128 + N). Drops do not run then; this does their work.
fn install_handler() {
    HANDLER.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("e2e-interrupt".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    let pids: Vec<u32> = LIVE
                        .lock()
                        .map(|live| live.iter().flatten().copied().collect())
                        .unwrap_or_default();
                    eprintln!(
                        "interrupted by signal {signal}: killing {} child process(es) and sweeping",
                        pids.len()
                    );
                    for pid in pids {
                        // SAFETY: kill(2) on a PID this process spawned and has not reaped; no memory is touched.
                        unsafe {
                            libc::kill(pid as libc::pid_t, libc::SIGKILL);
                        }
                    }
                    let sweeps: Vec<fn()> = SWEEPS.lock().map(|s| s.clone()).unwrap_or_default();
                    for sweep in sweeps {
                        sweep();
                    }
                    std::process::exit(128 + signal);
                }
            });
        if let Err(e) = spawned {
            eprintln!(
                "cannot watch for interruptions ({e}): an interrupted run leaves its processes"
            );
        }
    });
}

fn register(pid: u32) {
    if let Ok(mut live) = LIVE.lock() {
        live.get_or_insert_with(HashSet::new).insert(pid);
    }
    install_handler();
}

fn unregister(pid: u32) {
    if let Ok(mut live) = LIVE.lock()
        && let Some(live) = live.as_mut()
    {
        live.remove(&pid);
    }
}

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
        register(child.id());
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
            Err(e) => Some(format!(
                "{} cannot be waited on: {}",
                self.name,
                rdu_error_chain::Chain(&e)
            )),
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
        unregister(self.child.id());
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
