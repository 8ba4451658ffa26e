//! `rdujob run` under failure rules (issue 24): local mode judges a failed generation's culprit by the same
//! `failurePolicy` as the operator, with the same budgets.

mod common;

use common::*;

/// The long job with `run_policy` as its runPolicy; SIGKILLs rank 1 once it logged its first epoch.
fn run_and_kill_rank_1(run_policy: &str) -> Finished {
    let spec = long_job(0).replace(
        "runPolicy: {restartPolicy: ExitCode, backoffLimit: 0}",
        &format!("runPolicy: {run_policy}"),
    );
    assert!(spec.contains(run_policy), "the fixture changed: {spec}");
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), &spec);
    let mut child = spawn(&["run", path.to_str().unwrap()]);
    let lines = stream_lines(&mut child);
    let seen = wait_for_first_epoch(&lines);
    let pid = rank_pid(child.id(), 1).expect("rank 1's process");
    // SAFETY: kill(2) on a pid that is our grandchild and still running.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    finish(child, lines, seen)
}

#[test]
fn a_fail_job_rule_fails_at_once_what_the_defaults_would_restart() {
    let f = run_and_kill_rank_1(
        "{backoffLimit: 3, failurePolicy: {rules: [{name: kill-is-fatal, action: FailJob, onSignals: [9]}]}}",
    );
    assert_eq!(f.code, Some(128 + 9), "{}", f.stderr);
    assert!(
        f.stderr.contains(
            "job t failed: rank 1 ended with signal 9 after 0 restart(s) (FailurePolicy; rule \
             failurePolicy.rules[0] (kill-is-fatal): FailJob)"
        ),
        "{}",
        f.stderr
    );
    assert!(!f.stderr.contains("restarting the gang"), "{}", f.stderr);
}

#[test]
fn a_not_counted_rule_restarts_past_backoff_limit_0_within_its_own_budget() {
    let f = run_and_kill_rank_1(
        "{backoffLimit: 0, maxInfrastructureRestarts: 1, failurePolicy: {rules: [{action: RestartJobNotCounted, onExitCodes: {operator: In, values: [137]}}]}}",
    );
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert!(
        f.stderr.contains(
            "rank 1 ended with signal 9: rule failurePolicy.rules[0]: RestartJobNotCounted: restarting the \
             gang: generation 1 (not counted against backoffLimit; maxInfrastructureRestarts: 1 of 1)"
        ),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains("resumed from checkpoint"), "{}", f.stderr);
}

/// The small job with checkpoints every 5 steps and `run_policy`, run with `RDU_TEST_HANG_AT_STEP=20` (every rank
/// stops making progress after step 20 of generation 0, without exiting).
fn run_hanging_at_step_20(run_policy: &str) -> (Finished, std::time::Duration) {
    let spec =
        format!("{SMALL}  checkpoint: {{intervalSteps: 5, keep: 2}}\n  runPolicy: {run_policy}\n");
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), &spec);
    let started = std::time::Instant::now();
    let child = std::process::Command::new(RDUJOB)
        .arg("run")
        .arg(&path)
        .env("RDU_TEST_HANG_AT_STEP", "20")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let f = finish_streaming(child);
    (f, started.elapsed())
}

#[test]
fn a_gang_whose_step_stands_still_past_the_progress_deadline_restarts_as_hung_and_succeeds() {
    let (f, took) = run_hanging_at_step_20("{backoffLimit: 1, progressDeadlineSeconds: 20}");
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let hung = f
        .stderr
        .lines()
        .find(|l| l.contains("rank 0 hung: its step stayed at "))
        .unwrap_or_else(|| panic!("no hang noted:\n{}", f.stderr));
    // Detected at the deadline, not before, and not much later (the last line may precede step 20 a little).
    let seconds: u64 = hung
        .split(" for ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{hung}"));
    assert!((20..=21).contains(&seconds), "{hung}");
    assert!(
        f.stderr.contains(
            "rank 0 hung: rule restartPolicy default 3 (no-exit-code): RestartJob: restarting the gang: \
             generation 1 (counted against backoffLimit: 1 of 1)"
        ),
        "{}",
        f.stderr
    );
    assert!(took.as_secs() < 20 + 60, "took {took:?}");
}

#[test]
fn a_rule_on_hung_fails_the_job_instead() {
    let (f, _) = run_hanging_at_step_20(
        "{backoffLimit: 1, progressDeadlineSeconds: 20, failurePolicy: {rules: [{action: FailJob, onReasons: [Hung]}]}}",
    );
    assert_eq!(f.code, Some(137), "{}", f.stderr);
    assert!(
        f.stderr.contains(
            "job t failed: rank 0 hung after 0 restart(s) (FailurePolicy; rule failurePolicy.rules[0]: FailJob)"
        ),
        "{}",
        f.stderr
    );
}
