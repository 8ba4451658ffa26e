//! Failure rules and hang detection on a real kubelet (issue 24), on `node.rs`'s one-node cluster after its own
//! stages (one cluster, not two: a bring-up and a helm install fewer): a rank the kubelet OOM-kills fails its job
//! at once under a `FailJob` rule for `OOMKilled`; a gang whose ranks stop making progress without exiting is
//! judged `Hung` by the first report after `progressDeadlineSeconds`, restarted, and then succeeds; a pod deleted
//! with `kubectl delete pod` restarts the gang without spending `backoffLimit` under a `RestartJobNotCounted` rule.
//! The faults come from the worker's test flags (`RDU_TEST_ALLOCATE_MIB`, `RDU_TEST_HANG_AT_STEP`). Its summary is
//! `node.rs`'s second JSON line (`{"bench":"node_failure_rules",…}`).

use std::time::{Duration, Instant};

use jiff::Timestamp;

use rdu_e2e::testbed::Testbed;
use rdu_e2e::workspace_root;
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(300);
/// The hang test's `progressDeadlineSeconds` (the least the API accepts).
const PROGRESS_DEADLINE: u64 = 20;
/// How much later than the operator this test may see the step's last advance: its poll (250 ms) and request.
const HANG_EARLY_TOLERANCE: f64 = 2.0;
/// Steps of generation 0 before its ranks hang.
const HANG_AT_STEP: u64 = 60;

/// The failure-rule stages on the node's cluster (the chart installed as `node.rs` installs it); their summary.
pub(crate) async fn run(bed: &Testbed) -> serde_json::Map<String, Value> {
    let mut summary = serde_json::Map::new();
    summary.insert("bench".into(), json!("node_failure_rules"));
    summary.insert(
        "oom_apply_to_failed_seconds".into(),
        json!(oom_killed_rank_fails_the_job_at_once(bed).await),
    );
    let (judged, restarted) = hung_gang_restarts_after_the_deadline(bed).await;
    summary.insert("hang_stall_to_judged_seconds".into(), json!(judged));
    summary.insert("hang_stall_to_restart_seconds".into(), json!(restarted));
    summary.insert(
        "pod_delete_to_generation_1_running_seconds".into(),
        json!(deleted_pod_restarts_without_counting(bed).await),
    );
    summary
}

/// examples/digits.yaml named `name`, trained `epochs_factor` times as long, with `run_policy` and the worker
/// container of `template` merged into every rank's pod.
fn digits(name: &str, epochs_factor: u64, run_policy: Value, worker: Value) -> String {
    let yaml = std::fs::read_to_string(workspace_root().join("examples/digits.yaml"))
        .expect("examples/digits.yaml");
    let mut job: Value = serde_yaml_ng::from_str(&yaml).expect("example YAML");
    job["metadata"]["name"] = json!(name);
    let epochs = job["spec"]["training"]["epochs"].as_u64().expect("epochs");
    job["spec"]["training"]["epochs"] = json!(epochs * epochs_factor);
    job["spec"]["runPolicy"] = run_policy;
    job["spec"]["template"] = json!({"spec": {"containers": [worker]}});
    serde_json::to_string(&job).expect("JSON")
}

/// The last entry of `status.history`.
fn last_end(job: &Value) -> Value {
    job["status"]["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_else(|| panic!("no status.history: {}", job["status"]))
}

/// Waits until the job is Failed (a Succeeded job fails the test).
async fn wait_failed(bed: &Testbed, name: &str) -> Value {
    bed.wait(&format!("RduJob {name} to fail"), LONG, async || {
        let job = bed.job(name).await?;
        match job["status"]["phase"].as_str() {
            Some("Failed") => Ok(job),
            Some("Succeeded") => panic!("RduJob {name} succeeded: {}", job["status"]),
            phase => Err(format!("phase {phase:?}")),
        }
    })
    .await
}

/// A rank allocating 512 MiB under a 128 MiB limit is OOM-killed (exit 137, which the defaults restart); the
/// `FailJob` rule for `OOMKilled` fails the job at once. Returns seconds from apply to Failed.
async fn oom_killed_rank_fails_the_job_at_once(bed: &Testbed) -> f64 {
    let name = "oom";
    let applied = Instant::now();
    bed.apply(&digits(
        name,
        1,
        json!({"backoffLimit": 3, "failurePolicy": {"rules": [
            {"name": "oom-is-fatal", "action": "FailJob", "onContainerReasons": ["OOMKilled"]}]}}),
        json!({"name": "worker",
               "env": [{"name": "RDU_TEST_ALLOCATE_MIB", "value": "512"}],
               "resources": {"limits": {"memory": "128Mi"}}}),
    ));
    let job = wait_failed(bed, name).await;
    let seconds = applied.elapsed().as_secs_f64();
    let failed = job["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Failed"))
        .cloned()
        .expect("Failed condition");
    assert_eq!(failed["reason"], "FailurePolicy", "{failed}");
    assert_eq!(job["status"]["restarts"], 0, "{}", job["status"]);
    let end = last_end(&job);
    assert_eq!(end["containerReason"], "OOMKilled", "{end}");
    assert_eq!(end["action"], "FailJob", "{end}");
    assert_eq!(end["rule"]["source"], "FailurePolicy", "{end}");
    assert_eq!(end["rule"]["name"], "oom-is-fatal", "{end}");
    let shown = bed.cluster_cli(&["status", name]);
    assert!(
        shown.contains("failurePolicy.rules[0] (oom-is-fatal)"),
        "{shown}"
    );
    bed.kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
    seconds
}

/// Every rank stops making progress after step `HANG_AT_STEP` of generation 0 without exiting; the operator
/// judges the gang `Hung` once a report taken `progressDeadlineSeconds` after the step stood still says so (on its
/// own clock: no sooner than the deadline, no later than reports are overdue), not before the deadline after the
/// last advance this test saw, and the next generation (past the flag) succeeds. Returns seconds from the last
/// advance to the judgement and to the restart this test saw (the pods' teardown on a busy kubelet between).
async fn hung_gang_restarts_after_the_deadline(bed: &Testbed) -> (f64, f64) {
    let name = "hang";
    bed.apply(&digits(
        name,
        4,
        json!({"backoffLimit": 2, "progressDeadlineSeconds": PROGRESS_DEADLINE}),
        json!({"name": "worker",
               "env": [{"name": "RDU_TEST_HANG_AT_STEP", "value": HANG_AT_STEP.to_string()}]}),
    ));
    // Follow status.progress.step: when it last advanced in generation 0 (or, before any report, when every rank
    // first ran: where the operator's window starts too), until generation 1 exists. Wall-clock time: the
    // operator's timestamps come from the same host's clock.
    let mut last: Option<(u64, Timestamp)> = None;
    let mut running_at: Option<Timestamp> = None;
    let restarted = bed.wait("the hung gang to be restarted", LONG, async || {
        let job = bed.job(name).await?;
        let status = &job["status"];
        if status["restarts"].as_u64() >= Some(1) {
            return Ok(Timestamp::now());
        }
        Err(format!("{status}"))
    });
    // Poll the step beside the wait: the wait alone would not see when the step stood still.
    let watch = async {
        loop {
            if let Ok(job) = bed.job(name).await {
                if job["status"]["restarts"].as_u64() >= Some(1) {
                    break;
                }
                if running_at.is_none() && job["status"]["phase"] == "Running" {
                    running_at = Some(Timestamp::now());
                }
                if let Some(step) = job["status"]["progress"]["step"].as_u64()
                    && last.is_none_or(|(s, _)| s != step)
                {
                    last = Some((step, Timestamp::now()));
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let (restarted_at, ()) = tokio::join!(restarted, watch);
    let (step, advanced_at) = match (last, running_at) {
        (Some(last), _) => last,
        (None, Some(running)) => (0, running),
        (None, None) => panic!("generation 0 was never seen running"),
    };
    assert!(
        step <= HANG_AT_STEP,
        "step {step} reported past the hang at {HANG_AT_STEP}"
    );
    let job = bed.wait_phase(name, "Succeeded", LONG).await;
    let end = job["status"]["history"][0].clone();
    assert_eq!(end["reason"], "Hung", "{end}");
    assert_eq!(end["rank"], 0, "{end}");
    assert_eq!(end["action"], "RestartJob", "{end}");
    assert_eq!(end["failureRestarts"], 1, "{end}");
    let message = end["message"].as_str().unwrap_or_default();
    let stood = format!("rank 0 hung: its step stayed at {step} for ");
    let still_seconds: u64 = message
        .split_once(&stood)
        .and_then(|(_, rest)| rest.split_once(" s ")?.0.parse().ok())
        .unwrap_or_else(|| panic!("the end says where the step stood ({stood}...): {end}"));
    let overdue = PROGRESS_DEADLINE + rdu_gang::REPORTS_OVERDUE_SECONDS.unsigned_abs();
    assert!(
        (PROGRESS_DEADLINE..=overdue).contains(&still_seconds),
        "judged hung after the step stood still {still_seconds} s on the operator's clock: not between the \
         deadline ({PROGRESS_DEADLINE} s) and reports overdue ({overdue} s): {end}"
    );
    // The end's time is whole seconds (up to 1 s early); this test sees a new step up to one poll and request late.
    let judged_at: Timestamp = end["time"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the end has a time: {end}"));
    let judged_after = seconds_between(advanced_at, judged_at);
    assert!(
        judged_after >= PROGRESS_DEADLINE as f64 - 1.0 - HANG_EARLY_TOLERANCE,
        "judged hung {judged_after:.1} s after this test saw the step last advance: before the deadline \
         ({PROGRESS_DEADLINE} s)"
    );
    bed.kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
    (judged_after, seconds_between(advanced_at, restarted_at))
}

fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

/// `kubectl delete pod` of rank 1 under a `RestartJobNotCounted` rule for `PodDeleted` and `backoffLimit: 0`: the
/// gang restarts, `failureRestarts` stays 0, and the job succeeds. Returns seconds from the delete to generation 1
/// running.
async fn deleted_pod_restarts_without_counting(bed: &Testbed) -> f64 {
    let name = "deleted";
    bed.apply(&digits(
        name,
        200,
        json!({"backoffLimit": 0, "maxInfrastructureRestarts": 1, "failurePolicy": {"rules": [
            {"action": "RestartJobNotCounted", "onReasons": ["PodDeleted"]}]}}),
        json!({"name": "worker"}),
    ));
    bed.wait_phase(name, "Running", LONG).await;
    let deleted = Instant::now();
    bed.kubectl(&[
        "delete",
        "pod",
        &format!("{name}-worker-1"),
        "-n",
        "default",
        "--wait=false",
    ]);
    bed.wait_restarted_running(name, LONG).await;
    let seconds = deleted.elapsed().as_secs_f64();
    let job = bed.wait_phase(name, "Succeeded", LONG).await;
    let status = &job["status"];
    assert_eq!(status["failureRestarts"], 0, "{status}");
    assert_eq!(status["disruptionRestarts"], 1, "{status}");
    let end = last_end(&job);
    assert_eq!(end["reason"], "PodDeleted", "{end}");
    assert_eq!(end["action"], "RestartJobNotCounted", "{end}");
    assert_eq!(end["rule"]["source"], "FailurePolicy", "{end}");
    bed.kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
    seconds
}
