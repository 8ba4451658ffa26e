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
             gang: generation 1 (not counted: 1 of at most 1 (maxInfrastructureRestarts))"
        ),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains("resumed from checkpoint"), "{}", f.stderr);
}
