//! `kubectl-rdujob` (`kubectl rdujob`, `rdujob status|logs`) against a real API server and the operator: the
//! status table of a job whose pods the test moves as a kubelet would, and the logs command's refusals (no such
//! job, a rank out of range, a pod not on a node). Logs themselves need a kubelet: the real-node test reads them.

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use rdu_crds::RduJob;
use rdu_e2e::ControlPlane;
use rdu_e2e::kit::{self, JobFixture, WORKER_IMAGE, wait_pods};
use serde_json::json;

const JOBS: &str = "jobs";

/// `kubectl-rdujob`, built beside this test's binary (`cargo build -p kubectl-rdujob`).
fn cluster_cli() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let binary = dir.join("kubectl-rdujob");
    assert!(
        binary.is_file(),
        "{} is missing: cargo build -p kubectl-rdujob",
        binary.display()
    );
    binary
}

/// Runs `kubectl-rdujob args…` as the admin: (exit code, stdout, stderr).
fn run(plane: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(cluster_cli())
        .arg("--kubeconfig")
        .arg(&plane.admin_kubeconfig)
        .args(["-n", JOBS])
        .args(args)
        .output()
        .expect("kubectl-rdujob runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn status_shows_the_ranks_and_logs_explain_what_they_cannot_show() {
    let (plane, _) = kit::plane("cluster_cli")
        .controller_manager()
        .namespaces(&[JOBS])
        .start_operator()
        .await;
    kit::apply(&plane, &JobFixture::new(JOBS, "shown").manifest()).expect("apply");
    let client = plane.admin_client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    wait_pods(&plane, &pods, "shown", 2, 0).await;

    // Before any pod is on a node: logs say why there is nothing to read.
    let (code, _, err) = run(&plane, &["logs", "shown", "--rank", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("pod shown-worker-1 (rank 1) is not on a node yet"),
        "{err}"
    );
    let (_, _, err) = run(&plane, &["logs", "shown", "--rank", "2"]);
    assert!(
        err.contains("--rank 2: job shown has ranks 0 to 1"),
        "{err}"
    );
    let (_, _, err) = run(&plane, &["logs", "missing"]);
    assert!(err.contains("no RduJob missing in namespace jobs"), "{err}");
    let (_, _, err) = run(&plane, &["status", "missing"]);
    assert!(err.contains("no RduJob missing in namespace jobs"), "{err}");

    // Rank 0 runs, rank 1 waits: the table shows it, and the job's phase.
    let now = "2026-01-01T00:00:00Z";
    let running = json!({"status": {"phase": "Running", "podIP": "10.1.0.1", "startTime": now,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "worker", "ready": true, "restartCount": 2,
            "image": WORKER_IMAGE, "imageID": "", "state": {"running": {"startedAt": now}}}]}});
    pods.patch_status(
        "shown-worker-0",
        &PatchParams::default(),
        &Patch::Merge(&running),
    )
    .await
    .expect("pod status");
    let (code, out, err) = run(&plane, &["status", "shown"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Job:        jobs/shown\n"), "{out}");
    let row = |rank: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{rank} ")))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(
        row("0"),
        ["0", "shown-worker-0", "-", "-", "Running", "2"],
        "{out}"
    );
    assert_eq!(
        row("1"),
        ["1", "shown-worker-1", "-", "-", "Pending", "0"],
        "{out}"
    );

    let (code, out, _) = run(&plane, &["status", "shown", "-o", "json"]);
    assert_eq!(code, 0);
    let status: serde_json::Value = serde_json::from_str(&out).expect("JSON status");
    let jobs: Api<RduJob> = Api::namespaced(client, JOBS);
    let live = jobs.get("shown").await.expect("job");
    assert_eq!(
        status["restarts"],
        json!(live.status.map_or(0, |s| s.restarts))
    );
}
