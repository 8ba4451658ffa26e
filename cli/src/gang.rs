//! Runs one generation of the gang: one process per rank (a re-exec of this binary's hidden
//! `worker` subcommand), their output merged line by line onto stderr with `[rank N] ` prefixes,
//! Ctrl-C/SIGTERM forwarded (a rank stops at its next step boundary and rank 0 checkpoints; one still running
//! after `stop_grace` is killed), and every rank's exit collected in the order they ended. With
//! `progressDeadlineSeconds`, rank 0's progress lines are watched as the operator watches `status.progress`: a step
//! that stands still that long while every rank runs stops the gang as hung.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use rdu_worker::modes::all_reduce_benchmark;

use crate::error::CliError;
use crate::launch::RankLaunch;
use rdu_gang::{GenerationEnd, Hang, RankExit, StepWatcher};

/// How to start and stop the ranks.
#[derive(Debug, Clone)]
pub(crate) struct GangOptions {
    /// Where rank lines, rank 0's progress and notes go.
    pub console: std::sync::Arc<crate::console::Console>,
    /// This executable, re-run as `worker`.
    pub exe: PathBuf,
    /// Working directory of every rank (the job file's directory).
    pub cwd: PathBuf,
    /// After the first failure, how long the others get to notice and exit on their own.
    pub failure_grace: Duration,
    /// After forwarding a signal, how long the ranks get before they are killed.
    pub stop_grace: Duration,
    /// spec.runPolicy.activeDeadlineSeconds from the job's start: then every rank is stopped.
    pub job_deadline: Option<Instant>,
    /// spec.runPolicy.progressDeadlineSeconds: how long rank 0's step may stand still while every rank runs.
    pub progress_deadline: Option<Duration>,
}

fn rank_exit(status: ExitStatus) -> RankExit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => RankExit::Code(c),
        (None, Some(s)) => RankExit::Signal(s),
        (None, None) => RankExit::Code(1),
    }
}

fn send_signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is touched.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Copies `reader`'s lines to stderr with the rank's prefix; rank 0's progress goes to the console, its step to
/// `steps`.
async fn forward_lines(
    rank: u32,
    reader: impl AsyncRead + Unpin,
    console: std::sync::Arc<crate::console::Console>,
    steps: mpsc::UnboundedSender<u64>,
) {
    let mut lines = BufReader::new(reader).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => match rdu_worker::progress_lines::ProgressLine::parse(&line) {
                Some(progress) if rank == 0 => {
                    let _ = steps.send(progress.step);
                    console.progress(&progress);
                }
                // `rdujob` prints the result's lines itself on stdout, once the job succeeded.
                _ if rank == 0 && all_reduce_benchmark::is_json_line(&line) => {
                    console.detail(rank, &line)
                }
                _ => console.rank_line(rank, &line),
            },
            Ok(None) => break,
            Err(e) => {
                console.rank_line(rank, &format!("<output unreadable: {e}>"));
                break;
            }
        }
    }
}

/// Starts every rank and waits for all of them to end.
pub(crate) async fn run(
    launches: &[RankLaunch],
    opts: &GangOptions,
) -> Result<GenerationEnd, CliError> {
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(io_err("installing the SIGINT handler"))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(io_err("installing the SIGTERM handler"))?;
    let mut logs = JoinSet::new();
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(u32, RankExit)>();
    let (step_tx, mut step_rx) = mpsc::unbounded_channel::<u64>();
    let mut running: Vec<(u32, u32)> = Vec::new(); // (rank, pid)
    for launch in launches {
        let mut child = Command::new(&opts.exe)
            .arg("worker")
            .current_dir(&opts.cwd)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| CliError::Spawn {
                rank: launch.rank,
                source,
            })?;
        let rank = launch.rank;
        if let Some(out) = child.stdout.take() {
            logs.spawn(forward_lines(
                rank,
                out,
                opts.console.clone(),
                step_tx.clone(),
            ));
        }
        if let Some(err) = child.stderr.take() {
            logs.spawn(forward_lines(
                rank,
                err,
                opts.console.clone(),
                step_tx.clone(),
            ));
        }
        running.push((rank, child.id().unwrap_or_default()));
        let tx = exit_tx.clone();
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => rank_exit(status),
                Err(_) => RankExit::Code(1),
            };
            let _ = tx.send((rank, exit));
        });
    }
    drop(exit_tx);
    drop(step_tx);

    let mut outcome = GenerationEnd::default();
    // Hang detection, judged as the operator judges it (`check_hang`): rank 0's last step and the watch on it.
    let mut hang = HangWatch::new(opts.progress_deadline);
    let mut hang_at = hang.start();
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let mut job_deadline = opts.job_deadline;
    let mut kill_at: Option<Instant> = None;
    while !running.is_empty() {
        if let Some(hung) = hang.take_hang() {
            opts.console.note(&format!(
                "{}: stopping {} rank(s)",
                hung.message(),
                running.len()
            ));
            for &(_, pid) in &running {
                send_signal(pid, libc::SIGTERM);
            }
            outcome.hung = Some(hung);
            let stop = Instant::now() + opts.stop_grace;
            kill_at = Some(kill_at.map_or(stop, |k| k.min(stop)));
        }
        let deadline =
            kill_at.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        tokio::select! {
            ended = exit_rx.recv() => {
                let Some((rank, exit)) = ended else { break };
                running.retain(|(r, _)| *r != rank);
                // Not every rank runs any more: no hang to watch for.
                hang_at = None;
                hang.stop();
                if !exit.is_success() {
                    opts.console.note(&format!("rank {rank} ended with {exit}"));
                    if kill_at.is_none() {
                        kill_at = Some(Instant::now() + opts.failure_grace);
                    }
                }
                outcome.exits.push((rank, exit));
            }
            _ = sleep_until(deadline), if kill_at.is_some() => {
                for &(rank, pid) in &running {
                    opts.console.note(&format!("rank {rank} still running after the grace period: killing it"));
                    send_signal(pid, libc::SIGKILL);
                }
                kill_at = None;
            }
            _ = sleep_until(job_deadline.unwrap_or(far)), if job_deadline.is_some() => {
                opts.console.note(&format!("activeDeadlineSeconds passed: stopping {} rank(s)", running.len()));
                for &(_, pid) in &running {
                    send_signal(pid, libc::SIGTERM);
                }
                outcome.deadline_exceeded = true;
                job_deadline = None;
                let stop = Instant::now() + opts.stop_grace;
                kill_at = Some(kill_at.map_or(stop, |k| k.min(stop)));
            }
            Some(step) = step_rx.recv() => {
                if hang_at.is_some() {
                    hang_at = hang.look(Some(step));
                }
            }
            _ = sleep_until(hang_at.unwrap_or(far)), if hang_at.is_some() => {
                hang_at = hang.look(None);
            }
            _ = sigint.recv() => forward(&running, libc::SIGINT, opts, &mut outcome, &mut kill_at),
            _ = sigterm.recv() => forward(&running, libc::SIGTERM, opts, &mut outcome, &mut kill_at),
        }
    }
    while logs.join_next().await.is_some() {}
    Ok(outcome)
}

/// Rank 0's progress under `progressDeadlineSeconds`: `rdu_gang::StepWatcher` on a clock of whole seconds from
/// the gang's start.
struct HangWatch {
    started: Instant,
    watcher: StepWatcher,
}

impl HangWatch {
    fn new(deadline: Option<Duration>) -> Self {
        Self {
            started: Instant::now(),
            watcher: StepWatcher::new(deadline.map(|d| d.as_secs())),
        }
    }

    /// Every rank runs: the watch starts; when to look next.
    fn start(&mut self) -> Option<Instant> {
        self.look(None)
    }

    /// Looks again, with rank 0's newest step if one came: when to look next, none when nothing is watched any
    /// more.
    fn look(&mut self, step: Option<u64>) -> Option<Instant> {
        let now = i64::try_from(self.started.elapsed().as_secs()).unwrap_or(i64::MAX);
        let at = self.watcher.look(now, step)?;
        Some(self.started + Duration::from_secs(at.unsigned_abs()))
    }

    /// Not every rank runs any more: nothing to watch.
    fn stop(&mut self) {
        self.watcher.stop();
    }

    /// The hang found by the last look, once.
    fn take_hang(&mut self) -> Option<Hang> {
        self.watcher.take_hang()
    }
}

fn forward(
    running: &[(u32, u32)],
    sig: i32,
    opts: &GangOptions,
    outcome: &mut GenerationEnd,
    kill_at: &mut Option<Instant>,
) {
    opts.console
        .note(&format!("signal {sig}: stopping {} rank(s)", running.len()));
    for &(_, pid) in running {
        send_signal(pid, sig);
    }
    outcome.interrupted.get_or_insert(sig);
    let stop = Instant::now() + opts.stop_grace;
    *kill_at = Some(kill_at.map_or(stop, |k| k.min(stop)));
}

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> CliError {
    move |source| CliError::Io {
        what: what.into(),
        source,
    }
}
