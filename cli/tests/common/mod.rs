//! The harness of the `rdujob run` tests: job files, the `rdujob` process and its merged output, its ranks.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub(crate) const RDUJOB: &str = env!("CARGO_BIN_EXE_rdujob");
/// Bound on any one job in these tests; reaching it fails the test instead of hanging it.
pub(crate) const JOB_DEADLINE: Duration = Duration::from_secs(240);

pub(crate) struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub(crate) fn job_yaml(spec: &str) -> String {
    format!("apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata:\n  name: t\nspec:\n{spec}")
}

pub(crate) const SMALL: &str = "  workers: 3
  tilesPerWorker: 2
  model: {name: ffn-logreg, hiddenSizes: [16], inputSize: 8, classes: 3}
  data: {source: synthetic, samples: 600, seed: 3}
  training: {epochs: 3, batchSize: 16, learningRate: 0.01, optimizer: adam}
  dataParallel: {timeoutSeconds: 20}
";

pub(crate) fn write_job(dir: &Path, spec: &str) -> std::path::PathBuf {
    let path = dir.join("job.yaml");
    std::fs::write(&path, job_yaml(spec)).unwrap();
    path
}

/// `rdujob` with every rank's log (RUST_LOG set: what most tests here read).
pub(crate) fn spawn(args: &[&str]) -> Child {
    Command::new(RDUJOB)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads `child`'s stderr lines into a channel as they come.
pub(crate) fn stream_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for the end (bounded by JOB_DEADLINE), collecting the remaining stderr lines.
pub(crate) fn finish(
    mut child: Child,
    lines: mpsc::Receiver<String>,
    mut seen: Vec<String>,
) -> Finished {
    let deadline = Instant::now() + JOB_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "rdujob did not finish within {JOB_DEADLINE:?}:\n{}",
                seen.join("\n")
            );
        }
        while let Ok(line) = lines.try_recv() {
            seen.push(line);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    seen.extend(lines.iter());
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    Finished {
        code: status.code(),
        stdout,
        stderr: seen.join("\n"),
    }
}

pub(crate) fn run(args: &[&str]) -> Finished {
    let child = spawn(args);
    finish_streaming(child)
}

pub(crate) fn finish_streaming(mut child: Child) -> Finished {
    let lines = stream_lines(&mut child);
    finish(child, lines, Vec::new())
}

pub(crate) fn run_job(spec: &str, extra: &[&str]) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), spec);
    let mut args = vec!["run", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(&args)
}

pub(crate) fn result_json(f: &Finished) -> serde_json::Value {
    let last = f.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last stdout line {last:?}: {e}\n{}", f.stderr))
}

/// A job long enough to kill a rank mid-run.
pub(crate) fn long_job(backoff_limit: u32) -> String {
    long_job_with_timeout(backoff_limit, 10)
}

pub(crate) fn long_job_with_timeout(backoff_limit: u32, timeout_seconds: u32) -> String {
    format!(
        "  workers: 3
  model: {{name: ffn-logreg, hiddenSizes: [128], inputSize: 32, classes: 4}}
  data: {{source: synthetic, samples: 6000, seed: 5}}
  training: {{epochs: 40, batchSize: 8, learningRate: 0.01, optimizer: sgd}}
  dataParallel: {{timeoutSeconds: {timeout_seconds}}}
  checkpoint: {{intervalSteps: 50, keep: 2}}
  runPolicy: {{restartPolicy: ExitCode, backoffLimit: {backoff_limit}}}
"
    )
}

/// The pid of the child of `parent` whose environment says RANK=`rank`.
pub(crate) fn rank_pid(parent: u32, rank: u32) -> Option<i32> {
    let wanted = format!("RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        if ppid != parent {
            return None;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        environ
            .split(|&b| b == 0)
            .any(|kv| kv == wanted.as_bytes())
            .then_some(pid)
    })
}

/// Reads lines until rank 1 logged its first epoch; returns them.
pub(crate) fn wait_for_first_epoch(lines: &mpsc::Receiver<String>) -> Vec<String> {
    let mut seen = Vec::new();
    wait_for_line(lines, &mut seen, "a first epoch from rank 1", |line| {
        line.starts_with("[rank 1]") && line.contains("epoch done")
    });
    seen
}

/// Reads lines into `seen` until one is `wanted` (described as `what`), and returns it; fails after JOB_DEADLINE.
pub(crate) fn wait_for_line(
    lines: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + JOB_DEADLINE;
    loop {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no {what}:\n{}", seen.join("\n")));
        seen.push(line.clone());
        if wanted(&line) {
            return line;
        }
    }
}

/// The value of `name=` in a tracing line.
pub(crate) fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..].split_whitespace().next()
}
