//! Progress in status (DESIGN 4.8) against a real API server: the operator runs as the chart's ServiceAccount with
//! `--progress-url`, rank 0's pod gets the projected token, and reports are sent to the operator's progress
//! listener with real pod-bound tokens from the TokenRequest API (as the kubelet mints them). Forged, foreign,
//! malformed, stale, oversized and too frequent reports are refused and leave `status.progress` as it was; an
//! accepted one shows in the status, in `kubectl get rj` and survives the reconciler's own status writes.
//! (`progress_flood.rs` floods the endpoint.)

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use rdu_crds::{RduJob, consts};
use rdu_e2e::kit::{
    self, JobFixture, TIMEOUT, or_operator_log, pod_token, post_progress, progress_report,
    progress_url_flag, report_running, wait_pods,
};
use rdu_e2e::metrics::http_post;
use rdu_e2e::{kubectl, poll_until};
use serde_json::Value;

const JOBS: &str = "jobs";

fn job_yaml(name: &str) -> String {
    JobFixture::new(JOBS, name).epochs(2).manifest()
}

fn report(generation: u32, step: u64) -> Vec<u8> {
    progress_report(generation, step)
}

async fn post(operator: SocketAddr, token: Option<&str>, body: &[u8]) -> (u16, String) {
    post_progress(operator, JOBS, "watched", token, body).await
}

async fn progress_of(jobs: &Api<RduJob>) -> Value {
    let job = jobs.get("watched").await.expect("job");
    serde_json::to_value(job.status.and_then(|s| s.progress)).expect("json")
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn only_rank_zero_of_the_current_generation_sets_status_progress() {
    let (plane, addrs) = kit::plane("progress")
        // The ServiceAccount controller makes each namespace's `default` account, which the pods run as.
        .controller_manager()
        .namespaces(&[JOBS])
        .operator_flags(&[&progress_url_flag()])
        .start_operator()
        .await;
    let operator = addrs.progress;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    kit::apply(&plane, &job_yaml("watched")).expect("apply");
    // Sorted by name: watched-worker-0, watched-worker-1.
    let created = wait_pods(&plane, &pods, "watched", 2, 0).await;
    let (rank0, rank1) = (created[0].clone(), created[1].clone());

    // Only rank 0 is given the means to report.
    let has_token_volume = |pod: &Pod| {
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.projected.is_some() && v.name == "rdu-progress-token")
    };
    assert!(has_token_volume(&rank0), "rank 0 mounts the progress token");
    assert!(!has_token_volume(&rank1), "rank 1 does not");

    let token0 = pod_token(&client, &rank0, consts::PROGRESS_TOKEN_AUDIENCE).await;
    let token1 = pod_token(&client, &rank1, consts::PROGRESS_TOKEN_AUDIENCE).await;
    let api_audience = pod_token(&client, &rank0, "https://kubernetes.default.svc").await;

    // Refusals, each with its status and a message naming what is wrong.
    let oversized = vec![b' '; consts::PROGRESS_REPORT_MAX_BYTES + 1];
    /// (what is wrong, the bearer token, the body, the status, what the message says).
    type Case<'a> = (&'a str, Option<&'a str>, Vec<u8>, u16, &'a str);
    let cases: [Case; 8] = [
        ("no token", None, report(0, 10), 401, "bearer"),
        ("forged token", Some("not-a-token"), report(0, 10), 401, "not a ServiceAccount token"),
        ("the API server's audience", Some(&api_audience), report(0, 10), 401, "not rdu.dev/progress"),
        ("rank 1", Some(&token1), report(0, 10), 403, "does not name rank 0"),
        ("not JSON", Some(&token0), b"{\"generation\":".to_vec(), 400, "not valid JSON"),
        ("another generation", Some(&token0), report(3, 10), 409, "generation 3"),
        ("inconsistent", Some(&token0), br#"{"generation":0,"progress":{"step":9,"totalSteps":8,"epoch":1,"epochs":1,"percent":100}}"#.to_vec(), 422, "past progress.totalSteps"),
        ("oversized", Some(&token0), oversized, 413, ""),
    ];
    // The operator takes reports once its caches are synced (503 before).
    poll_until("the operator's progress endpoint", TIMEOUT, || async {
        match post(operator, None, &report(0, 1)).await {
            (401, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .expect("endpoint ready");
    for (what, token, body, code, says) in &cases {
        let (got, message) = post(operator, *token, body).await;
        assert_eq!(got, *code, "{what}: {message}");
        assert!(
            message.contains(says),
            "{what}: {message:?} should say {says:?}"
        );
    }
    assert_eq!(
        progress_of(&jobs).await,
        Value::Null,
        "no refused report changed the status"
    );
    // The probes' listener does not take reports: the endpoint has a listener of its own.
    let (code, _) = http_post(
        addrs.metrics,
        &consts::progress_path(JOBS, "watched"),
        &[("Authorization", &format!("Bearer {token0}"))],
        &report(0, 10),
    )
    .await
    .expect("the metrics listener answers");
    assert_eq!(code, 404);

    // Rank 0's report shows in the status, stamped by the operator.
    let (code, message) = post(operator, Some(&token0), &report(0, 32)).await;
    assert_eq!(code, 202, "{message}");
    let progress = poll_until("status.progress", TIMEOUT, || async {
        let p = progress_of(&jobs).await;
        if p["step"] == 32 {
            Ok(p)
        } else {
            Err(p.to_string())
        }
    })
    .await
    .expect("progress written");
    assert_eq!(progress["percent"], 25);
    assert_eq!(progress["estimatedRemainingSeconds"], 12);
    assert!(progress["updateTime"].is_string(), "{progress}");

    // A second report within a second is rate-limited.
    let (code, _) = post(operator, Some(&token0), &report(0, 33)).await;
    assert_eq!(code, 429);

    // The printer columns show it.
    let table =
        kubectl(&plane, &["get", "rj", "watched", "-n", JOBS], None).expect("kubectl get rj");
    eprintln!("kubectl get rj during the run:\n{table}");
    let column = |name: &str| kit::table::cell(&table, "watched", name);
    assert_eq!(column("PROGRESS%").as_deref(), Some("25"), "{table}");
    assert_eq!(column("ETA(S)").as_deref(), Some("12"), "{table}");

    // The reconciler's own status writes (the job turning Running) keep it.
    for pod in ["watched-worker-0", "watched-worker-1"] {
        report_running(&pods, pod).await;
    }
    let waited = poll_until("Running with progress kept", TIMEOUT, || async {
        let job = jobs.get("watched").await.map_err(|e| e.to_string())?;
        let status = job.status.unwrap_or_default();
        match (status.phase, status.progress) {
            (Some(rdu_crds::JobPhase::Running), Some(p)) if p.step == 32 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    or_operator_log(&plane, waited);

    let metrics = rdu_e2e::metrics::scrape(addrs.metrics)
        .await
        .expect("metrics");
    for (outcome, n) in [
        ("accepted", 1),
        ("forbidden", 1),
        ("stale", 1),
        ("malformed", 2),
        ("rate_limited", 1),
    ] {
        let line = format!("rdu_operator_progress_reports_total{{outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}
