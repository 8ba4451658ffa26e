//! `rdujob run` stopped early: a rank that gets SIGTERM (as a pod does when its node is drained) stops at once,
//! rank 0 checkpoints the last step the gang completed, and the next generation resumes there; Ctrl-C leaves a
//! checkpoint that a second `rdujob run --checkpoint-dir` resumes from.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rdu_worker::checkpoint_file_name as file_name;

/// 1600 training samples over 3 ranks, batch 8: 67 steps an epoch, 6700 in all; a checkpoint interval no run
/// reaches, and a timeout far longer than any stop may take.
const JOB: &str = "  workers: 3
  model: {name: ffn-logreg, hiddenSizes: [128], inputSize: 32, classes: 4}
  data: {source: synthetic, samples: 2000, seed: 5}
  training: {epochs: 100, batchSize: 8, learningRate: 0.01, optimizer: sgd}
  dataParallel: {timeoutSeconds: 60}
  checkpoint: {intervalSteps: 1000000, keep: 2}
  runPolicy: {restartPolicy: ExitCode, backoffLimit: 1}
";
const PLANNED_STEPS: u64 = 100 * 534u64.div_ceil(8);
/// Far below the 60 s timeout a rank waiting for its peers would take.
const PROMPT: Duration = Duration::from_secs(5);

/// The `step=` of rank 0's line containing `message`.
fn rank_0_step(stderr: &str, message: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("[rank 0]") && l.contains(message))
        .unwrap_or_else(|| panic!("no {message:?} from rank 0:\n{stderr}"));
    field(line, "step")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no step in {line:?}"))
}

const SAVED: &str = "checkpoint of the last completed step saved on the way out";
const RESUMED: &str = "resumed from checkpoint";

#[test]
fn a_sigtermed_rank_exits_143_at_once_and_the_next_generation_resumes_from_rank_0s_last_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), JOB);
    let mut child = spawn(&["run", path.to_str().unwrap()]);
    let lines = stream_lines(&mut child);
    let mut seen = wait_for_first_epoch(&lines);
    let pid = rank_pid(child.id(), 1).expect("rank 1's process");
    let sent = Instant::now();
    // SAFETY: kill(2) on our grandchild, still running.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_for_line(&lines, &mut seen, "exit of rank 1", |l| {
        l.contains("rank 1 ended with")
    });
    let took = sent.elapsed();
    let f = finish(child, lines, seen);
    assert!(
        f.stderr.contains("rank 1 ended with exit code 143"),
        "{}",
        f.stderr
    );
    assert!(took < PROMPT, "rank 1 took {took:?} to stop:\n{}", f.stderr);
    for rank in [0, 2] {
        assert!(
            f.stderr
                .contains(&format!("rank {rank} ended with exit code 75")),
            "rank {rank} must exit 75 when told: {}",
            f.stderr
        );
    }
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let saved = rank_0_step(&f.stderr, SAVED);
    assert!(saved > 0, "{}", f.stderr);
    assert_eq!(rank_0_step(&f.stderr, RESUMED), saved, "{}", f.stderr);
    assert_eq!(result_json(&f)["globalSteps"], PLANNED_STEPS);
}

#[test]
fn ctrl_c_leaves_a_checkpoint_that_a_second_run_resumes_from() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), JOB);
    let checkpoints = dir.path().join("ckpt");
    let args = [
        "run",
        path.to_str().unwrap(),
        "--checkpoint-dir",
        checkpoints.to_str().unwrap(),
    ];
    // In a group of its own, as a terminal's foreground job: Ctrl-C signals rdujob and its ranks alike.
    let mut child = Command::new(RDUJOB)
        .args(args)
        .env("RUST_LOG", "info")
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stream_lines(&mut child);
    let seen = wait_for_first_epoch(&lines);
    // SAFETY: kill(2) on the process group of our child, still running.
    assert_eq!(unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) }, 0);
    let f = finish(child, lines, seen);
    assert_eq!(f.code, Some(128 + 2), "{}", f.stderr);
    assert!(f.stderr.contains("stopped by signal 2"), "{}", f.stderr);
    assert!(
        f.stderr.contains(&format!(
            "checkpoints are in {}: the same command resumes",
            checkpoints.display()
        )),
        "{}",
        f.stderr
    );
    let saved = rank_0_step(&f.stderr, SAVED);
    assert!(saved > 0, "{}", f.stderr);
    assert!(
        checkpoints.join(file_name(saved, 0)).is_file(),
        "{}",
        f.stderr
    );

    let again = run(&args);
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert_eq!(
        rank_0_step(&again.stderr, RESUMED),
        saved,
        "{}",
        again.stderr
    );
    assert_eq!(result_json(&again)["globalSteps"], PLANNED_STEPS);
}
