//! Runs one generation of the gang: one process per rank (a re-exec of this binary's hidden
//! `worker` subcommand), their output merged line by line onto stderr with `[rank N] ` prefixes,
//! Ctrl-C/SIGTERM forwarded (a rank stops at its next step boundary and rank 0 checkpoints; one still running
//! after `stop_grace` is killed). After every rank's end, the deadline and a hang, the gang is looked at as the
//! operator looks at pods (`rdu_gang::turn`): a failed generation is stopped, and its last turn says what follows.
//! With `progressDeadlineSeconds`, rank 0's progress lines are watched as the operator watches `status.progress`:
//! a step that stands still that long while every rank runs stops the gang as hung.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use crate::error::CliError;
use crate::launch::RankLaunch;
use rdu_crds::failure_policy::HUNG;
use rdu_crds::{EndCause, RunPolicy};
use rdu_gang::{Culprit, Deadline, Hang, Look, RankExit, RankTally, Restarts, StepWatcher, Turn};

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
    /// The job's run policy: its failure rules and budgets decide each turn.
    pub policy: RunPolicy,
}

fn rank_exit(status: ExitStatus) -> RankExit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => RankExit::Code(c),
        (None, Some(s)) => RankExit::Signal(s),
        (None, None) => RankExit::Code(1),
    }
}

/// Sends `sig` to process `pid`. Pid 0 (a child whose id was not known) or one past `pid_t` is skipped: kill(2)
/// would read it as this process's group, or a group.
fn send_signal(pid: u32, sig: i32) {
    let Ok(pid @ 1..) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is touched.
    unsafe {
        libc::kill(pid, sig);
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
            Ok(Some(line)) => match rdu_worker::ProgressLine::parse(&line) {
                Some(progress) if rank == 0 => {
                    let _ = steps.send(progress.step);
                    console.progress(&progress);
                }
                // `rdujob` prints the result's lines itself on stdout, once the job succeeded.
                _ if rank == 0 && rdu_worker::is_benchmark_json_line(&line) => {
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

/// Starts `launch`'s rank: its output forwarded by tasks in `logs` (rank 0's steps to `steps`), its exit sent to
/// `exits` once it ends. Returns its pid.
fn spawn_rank(
    launch: &RankLaunch,
    opts: &GangOptions,
    logs: &mut JoinSet<()>,
    exits: &mpsc::UnboundedSender<(u32, RankExit)>,
    steps: &mpsc::UnboundedSender<u64>,
) -> Result<u32, CliError> {
    let rank = launch.rank;
    let mut child = Command::new(&opts.exe)
        .arg("worker")
        .current_dir(&opts.cwd)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CliError::Spawn { rank, source })?;
    if let Some(out) = child.stdout.take() {
        logs.spawn(forward_lines(
            rank,
            out,
            opts.console.clone(),
            steps.clone(),
        ));
    }
    if let Some(err) = child.stderr.take() {
        logs.spawn(forward_lines(
            rank,
            err,
            opts.console.clone(),
            steps.clone(),
        ));
    }
    let pid = child.id().unwrap_or_default();
    let exits = exits.clone();
    tokio::spawn(async move {
        let exit = match child.wait().await {
            Ok(status) => rank_exit(status),
            Err(_) => RankExit::Code(1),
        };
        let _ = exits.send((rank, exit));
    });
    Ok(pid)
}

/// How a generation of local ranks ended.
#[derive(Debug)]
pub(crate) enum GenerationOutcome {
    /// The user stopped the run with this signal (forwarded to the ranks).
    Stopped { signal: i32 },
    /// The gang's last turn (`rdu_gang::turn`, the operator's decision too): the deadline passed, a rule failed
    /// the job, the failed generation's end was settled, or every rank succeeded.
    Turned(Turn<Culprit>),
}

/// What local mode has seen of a generation, looked at after every event as the operator looks at pods.
struct Watch<'a> {
    opts: &'a GangOptions,
    restarts: Restarts,
    workers: u32,
    /// Ranks still running: (rank, pid).
    running: Vec<(u32, u32)>,
    /// Ranks this process told to stop (the deadline, a hang, the user's signal): their ends are the stop's
    /// doing, not evidence (as the operator does not blame pods it deleted itself).
    stopped: HashSet<u32>,
    /// Failed ends of ranks nobody stopped, and rank 0's hang.
    evidence: Vec<Culprit>,
    succeeded: u32,
    /// What the generation is blamed on since it started stopping.
    stopping: Option<Culprit>,
    deadline_passed: Option<u64>,
    interrupted: Option<i32>,
    /// A turn that ends the job whatever comes after (the deadline, a rule that fails at once).
    last: Option<Turn<Culprit>>,
    /// When the ranks still running are killed.
    kill_at: Option<Instant>,
    /// Signals decided and not yet sent: (pid, signal). The loop sends them; a test reads them.
    signals: Vec<(u32, i32)>,
}

impl<'a> Watch<'a> {
    fn new(opts: &'a GangOptions, restarts: Restarts, workers: u32) -> Self {
        Watch {
            opts,
            restarts,
            workers,
            running: Vec::new(),
            stopped: HashSet::new(),
            evidence: Vec::new(),
            succeeded: 0,
            stopping: None,
            deadline_passed: None,
            interrupted: None,
            last: None,
            kill_at: None,
            signals: Vec::new(),
        }
    }

    /// Sends the signals decided since the last call.
    fn send_signals(&mut self) {
        for (pid, sig) in self.signals.drain(..) {
            send_signal(pid, sig);
        }
    }

    /// The gang's turn now.
    fn turn(&self) -> Turn<Culprit> {
        let running = self.running.len() as u32;
        rdu_gang::turn(Look {
            policy: &self.opts.policy,
            restarts: self.restarts,
            deadline: self
                .deadline_passed
                .map_or(Deadline::None, |limit| Deadline::Passed { limit }),
            stopping: self.stopping.clone(),
            evidence: self.evidence.clone(),
            ranks: RankTally {
                workers: self.workers,
                started: self.workers,
                succeeded: self.succeeded,
                present: running,
            },
        })
    }

    /// Looks at the gang after an event and applies its turn: a generation that fails gives its other ranks
    /// `failure_grace` to notice and exit on their own (a hang or the deadline stops them at once, with
    /// `stop_grace`); the first turn that ends the job is kept.
    fn look(&mut self) {
        if self.last.is_some() || self.interrupted.is_some() {
            return;
        }
        match self.turn() {
            Turn::Stop { culprit, news } if news => {
                let first = self.stopping.is_none();
                self.opts.console.note(&format!(
                    "{}: stopping generation ({} rank(s) running)",
                    describe(&culprit),
                    self.running.len()
                ));
                let hung = culprit.reason == HUNG;
                self.stopping = Some(culprit);
                if hung {
                    self.signal_all(libc::SIGTERM, self.opts.stop_grace);
                } else if first {
                    self.kill_in(self.opts.failure_grace);
                }
            }
            turn @ Turn::DeadlineExceeded { .. } => {
                self.opts.console.note(&format!(
                    "activeDeadlineSeconds passed: stopping {} rank(s)",
                    self.running.len()
                ));
                self.signal_all(libc::SIGTERM, self.opts.stop_grace);
                self.last = Some(turn);
            }
            turn @ Turn::Fail { .. } => {
                self.kill_in(self.opts.failure_grace);
                self.last = Some(turn);
            }
            _ => {}
        }
    }

    /// A rank ended.
    fn ended(&mut self, rank: u32, exit: RankExit) {
        self.running.retain(|(r, _)| *r != rank);
        if exit.is_success() {
            self.succeeded += 1;
        } else {
            self.opts
                .console
                .note(&format!("rank {rank} ended with {exit}"));
            if !self.stopped.contains(&rank) {
                self.evidence
                    .push(Culprit::from_exit(rank, exit, EndCause::Failure));
            }
        }
        self.look();
    }

    /// Sends `sig` to every running rank; the ones still running after `grace` are killed.
    fn signal_all(&mut self, sig: i32, grace: Duration) {
        for &(rank, pid) in &self.running {
            self.signals.push((pid, sig));
            self.stopped.insert(rank);
        }
        self.kill_in(grace);
    }

    /// Kills the ranks still running after `grace` (or sooner, when a kill was due sooner).
    fn kill_in(&mut self, grace: Duration) {
        let at = Instant::now() + grace;
        self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
    }

    /// Kills the ranks still running after the grace. A rank not told to stop that outlived the failure grace did
    /// not give up on a failed peer: it is the one its peers gave up on (frozen, hung in a kernel), so its kill is
    /// evidence, as the surest end (killed) it is blamed before the peers' retryable exits.
    fn kill_the_rest(&mut self) {
        for &(rank, pid) in &self.running {
            self.opts.console.note(&format!(
                "rank {rank} still running after the grace period: killing it"
            ));
            self.signals.push((pid, libc::SIGKILL));
        }
        self.kill_at = None;
    }

    /// The user's Ctrl-C or SIGTERM: forwarded to every rank (a rank stops at its next step boundary and rank 0
    /// checkpoints); the run ends with it.
    fn forward(&mut self, sig: i32) {
        self.opts.console.note(&format!(
            "signal {sig}: stopping {} rank(s)",
            self.running.len()
        ));
        self.interrupted.get_or_insert(sig);
        self.signal_all(sig, self.opts.stop_grace);
    }

    /// Every rank ended: how the generation did.
    fn outcome(self) -> GenerationOutcome {
        if let Some(signal) = self.interrupted {
            return GenerationOutcome::Stopped { signal };
        }
        GenerationOutcome::Turned(match self.last {
            Some(turn) => turn,
            None => self.turn(),
        })
    }
}

/// How local mode tells of a rank's end: `rank 2 ended with exit code 75`, `rank 0 hung`.
pub(crate) fn describe(culprit: &Culprit) -> String {
    if culprit.reason == HUNG {
        format!("rank {} hung", culprit.rank)
    } else {
        format!("rank {} ended with {}", culprit.rank, culprit.exit)
    }
}

/// Starts every rank and waits for all of them to end, looking at the gang after every event as the operator
/// does (`rdu_gang::turn`); `restarts`: the gang's restarts so far.
pub(crate) async fn run(
    launches: &[RankLaunch],
    opts: &GangOptions,
    restarts: Restarts,
) -> Result<GenerationOutcome, CliError> {
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(io_err("installing the SIGINT handler"))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(io_err("installing the SIGTERM handler"))?;
    let mut logs = JoinSet::new();
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(u32, RankExit)>();
    let (step_tx, mut step_rx) = mpsc::unbounded_channel::<u64>();
    let workers = u32::try_from(launches.len()).unwrap_or(u32::MAX);
    let mut watch = Watch::new(opts, restarts, workers);
    for launch in launches {
        let pid = spawn_rank(launch, opts, &mut logs, &exit_tx, &step_tx)?;
        watch.running.push((launch.rank, pid));
    }
    drop(exit_tx);
    drop(step_tx);

    // Hang detection, judged as the operator judges it (`check_hang`): rank 0's last step and the watch on it.
    let mut hang = HangWatch::new(opts.progress_deadline);
    let mut hang_at = hang.start();
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let mut job_deadline = opts.job_deadline;
    while !watch.running.is_empty() {
        if let Some(hung) = hang.take_hang() {
            opts.console.note(&hung.message());
            watch.evidence.push(hung.culprit());
            watch.look();
            watch.send_signals();
        }
        tokio::select! {
            ended = exit_rx.recv() => {
                let Some((rank, exit)) = ended else { break };
                // Not every rank runs any more: no hang to watch for.
                hang_at = None;
                hang.stop();
                watch.ended(rank, exit);
            }
            _ = sleep_until(watch.kill_at.unwrap_or(far)), if watch.kill_at.is_some() => {
                watch.kill_the_rest();
            }
            _ = sleep_until(job_deadline.unwrap_or(far)), if job_deadline.is_some() => {
                watch.deadline_passed = opts.policy.active_deadline_seconds;
                job_deadline = None;
                watch.look();
            }
            Some(step) = step_rx.recv() => {
                if hang_at.is_some() {
                    hang_at = hang.look(Some(step));
                }
            }
            _ = sleep_until(hang_at.unwrap_or(far)), if hang_at.is_some() => {
                hang_at = hang.look(None);
            }
            _ = sigint.recv() => watch.forward(libc::SIGINT),
            _ = sigterm.recv() => watch.forward(libc::SIGTERM),
        }
        watch.send_signals();
    }
    while logs.join_next().await.is_some() {}
    Ok(watch.outcome())
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

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> CliError {
    move |source| CliError::Io {
        what: what.into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::Console;
    use rdu_gang::Next;
    use rdu_gang::scenarios::{self, Scenario, Want};
    use std::sync::Arc;

    fn options(policy: RunPolicy) -> GangOptions {
        GangOptions {
            console: Arc::new(Console::new(false)),
            exe: PathBuf::new(),
            cwd: PathBuf::new(),
            failure_grace: Duration::from_secs(5),
            stop_grace: Duration::from_secs(10),
            job_deadline: None,
            progress_deadline: None,
            policy,
        }
    }

    /// A watch over `workers` ranks that run; their pids are never signalled (the test reads `signals`).
    fn watching(opts: &GangOptions, restarts: Restarts, workers: u32) -> Watch<'_> {
        let mut watch = Watch::new(opts, restarts, workers);
        watch.running = (0..workers).map(|rank| (rank, 4_000_000 + rank)).collect();
        watch
    }

    fn want(turn: Turn<Culprit>, before: Restarts) -> Want {
        match turn {
            Turn::Succeeded => Want::Succeeded,
            Turn::Fail {
                culprit, reason, ..
            } => Want::Fail {
                rank: culprit.rank,
                reason,
            },
            Turn::Ended {
                culprit,
                settlement,
                ..
            } => match settlement.next {
                Next::Restart { .. } => Want::Restart {
                    rank: culprit.rank,
                    counted: settlement.restarts.counted > before.counted,
                },
                Next::Fail(reason) => Want::Fail {
                    rank: culprit.rank,
                    reason,
                },
            },
            other => panic!("no outcome: {other:?}"),
        }
    }

    /// What the watch's generation came to, after `before` restarts.
    fn outcome(watch: Watch<'_>, before: Restarts) -> Want {
        match watch.outcome() {
            GenerationOutcome::Turned(turn) => want(turn, before),
            other => panic!("{other:?}"),
        }
    }

    /// Plays `s` on the watch: the listed ends one at a time; the ranks not listed give up on their peers (75)
    /// within the failure grace.
    fn play(s: &Scenario) -> Want {
        let opts = options(s.policy.clone());
        let mut watch = watching(&opts, s.restarts, s.workers);
        for &(rank, code) in &s.ends {
            watch.ended(rank, RankExit::Code(code));
        }
        let left: Vec<u32> = watch.running.iter().map(|(rank, _)| *rank).collect();
        assert!(
            left.is_empty() || watch.kill_at.is_some(),
            "{}: the others were given no grace",
            s.name
        );
        for rank in left {
            watch.ended(rank, RankExit::Code(75));
        }
        assert!(watch.signals.is_empty(), "{}: {:?}", s.name, watch.signals);
        outcome(watch, s.restarts)
    }

    #[test]
    fn the_gangs_cases_come_out_on_processes_as_on_pods() {
        for s in scenarios::all() {
            assert_eq!(play(&s), s.want, "{}", s.name);
        }
    }

    #[test]
    fn a_rank_stopped_for_a_hang_is_no_evidence_against_rank_0() {
        let opts = options(RunPolicy::default());
        let mut watch = watching(&opts, Restarts::default(), 3);
        let hang = Hang {
            step: Some(4),
            still_seconds: 30,
            deadline_seconds: 30,
        };
        watch.evidence.push(hang.culprit());
        watch.look();
        let terms: Vec<i32> = watch.signals.iter().map(|(_, sig)| *sig).collect();
        assert_eq!(terms, vec![libc::SIGTERM; 3]);
        // Rank 2 dies badly on the way down: it was told to stop, so the hang stays the cause.
        watch.ended(2, RankExit::Code(1));
        watch.ended(1, RankExit::Code(143));
        watch.ended(0, RankExit::Code(143));
        assert_eq!(
            outcome(watch, Restarts::default()),
            Want::Restart {
                rank: 0,
                counted: true
            }
        );
    }

    #[test]
    fn a_rank_that_outlived_the_failure_grace_is_blamed_for_its_kill() {
        let opts = options(RunPolicy::default());
        let mut watch = watching(&opts, Restarts::default(), 3);
        watch.ended(2, RankExit::Code(75));
        watch.ended(0, RankExit::Code(75));
        assert!(watch.kill_at.is_some());
        watch.kill_the_rest();
        assert_eq!(watch.signals, vec![(4_000_001, libc::SIGKILL)]);
        watch.ended(1, RankExit::Signal(9));
        assert_eq!(
            outcome(watch, Restarts::default()),
            Want::Restart {
                rank: 1,
                counted: true
            }
        );
    }
}
