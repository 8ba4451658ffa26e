//! One RduJob of 4,096 ranks, the API's ceiling, against the real API server (issue 26, item 4), with the
//! operator binary (`e2e/control-plane/run.sh` gives it the release build users run) running as the chart's
//! ServiceAccount and the test reporting a pod's state as a kubelet would. Prints one JSON line (`"bench":
//! "scale"`): how long until every pod existed (the operator's own `job_pods_created_seconds`), the operator's
//! memory per rank and CPU per pod event, and what one pod's change cost. Checks what must hold at any speed:
//! every pod is created and counted, creating them runs no admission policy's match conditions (the chart's
//! device-plugin policy matches updates only), and one pod turning Running makes the operator neither list pods
//! nor write any pod (the API server's own request counters).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use rdu_crds::RduJob;
use rdu_crds::consts::MAX_WORKERS;
use rdu_e2e::kit::{self, JobFixture, TIMEOUT, wait_status};
use rdu_e2e::metrics::{self, Sample};
use rdu_e2e::poll_until;
use serde_json::json;

const JOBS: &str = "scale";
const NAME: &str = "wide";
/// The largest job the API accepts.
const RANKS: u32 = MAX_WORKERS;
/// How long the operator's reconcile counter must stay still to call it idle.
const QUIET: Duration = Duration::from_secs(3);
/// Everything the creation of the pods may take on a slow machine.
const CREATION: Duration = Duration::from_secs(600);
/// The pod the test turns Running.
const CHANGED_RANK: u32 = 1234;

/// Seconds of CPU (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the operator's stat");
    // Fields after the command (which may hold spaces) start after its closing parenthesis; utime and stime
    // are the 14th and 15th fields of the line, the 12th and 13th after it.
    let after = &stat[stat.rfind(')').expect("stat's command") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0 // USER_HZ
}

/// `VmHWM` (peak resident memory) of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"))
}

async fn operator_value(operator: SocketAddr, name: &str) -> Result<f64, String> {
    let text = metrics::scrape(operator).await.map_err(|e| e.to_string())?;
    Ok(metrics::sum(&metrics::parse(&text), name, &[]))
}

/// Waits until the operator's reconcile counter has not moved for [`QUIET`]; returns it.
async fn wait_quiet(operator: SocketAddr) -> f64 {
    let mut last = (f64::NAN, Instant::now());
    poll_until("the operator to go idle", CREATION, async || {
        let n = operator_value(operator, "rdu_operator_reconciles_total").await?;
        if n != last.0 {
            last = (n, Instant::now());
        }
        if last.1.elapsed() >= QUIET {
            Ok(n)
        } else {
            Err(format!("{n} reconciles, still moving"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Requests for pods of `verbs` counted by the API server.
fn pod_requests(samples: &[Sample], verbs: &[&str]) -> f64 {
    verbs
        .iter()
        .map(|verb| {
            metrics::sum(
                samples,
                "apiserver_request_total",
                &[("resource", "pods"), ("verb", verb)],
            )
        })
        .sum()
}

const POD_WRITES: [&str; 7] = [
    "POST", "CREATE", "PATCH", "APPLY", "PUT", "UPDATE", "DELETE",
];

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_job_of_4096_ranks_is_created_and_one_pods_change_touches_no_other_pod() {
    let limit = format!("--max-workers-per-job={RANKS}");
    let (mut plane, operator) = kit::plane("scale")
        .namespaces(&[JOBS])
        .operator_flags(&[&limit])
        .start_operator()
        .await;
    let admin = plane.admin_client().await.expect("client");
    poll_until("the operator's /readyz", TIMEOUT, || async {
        match metrics::http_get(operator.metrics, "/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", kit::operator_log(&plane)));
    let (idle_kib, idle_cpu) = (peak_rss_kib(operator.pid), cpu_seconds(operator.pid));

    // Creation: every pod, counted in the job's status.
    let applied = Instant::now();
    kit::apply(
        &plane,
        &JobFixture::new(JOBS, NAME).workers(RANKS).manifest(),
    )
    .expect("apply");
    // The job's own CREATE was judged by the chart's pod policy (an RduJob policy): counted from here, the pods'.
    let evaluations = |samples: &[metrics::Sample], operation: &str| {
        metrics::sum(
            samples,
            "apiserver_admission_match_condition_evaluation_seconds_count",
            &[("operation", operation)],
        )
    };
    let job_created = metrics::parse(&metrics::apiserver_metrics(&admin).await.expect("metrics"));
    let created_seconds = poll_until("every pod created", CREATION, async || {
        let n = operator_value(
            operator.metrics,
            "rdu_operator_job_pods_created_seconds_count",
        )
        .await?;
        if n >= 1.0 {
            operator_value(
                operator.metrics,
                "rdu_operator_job_pods_created_seconds_sum",
            )
            .await
        } else {
            Err("not all pods yet".to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", kit::operator_log(&plane)));
    let apply_to_all_pods = applied.elapsed().as_secs_f64();
    // The chart's device-plugin policy matches pod updates only: creating the pods evaluated none of its match
    // conditions (each evaluation converts the pod, about a tenth of the API server's CPU per create).
    let created = metrics::parse(&metrics::apiserver_metrics(&admin).await.expect("metrics"));
    let policy_evaluations = evaluations(&created, "CREATE") - evaluations(&job_created, "CREATE");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), JOBS);
    let listed = pods
        .list_metadata(&ListParams::default().labels(&format!("rdu.dev/job-name={NAME}")))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), RANKS as usize);
    let jobs: Api<RduJob> = Api::namespaced(admin.clone(), JOBS);
    let pending = format!("0/{RANKS}");
    wait_status(&plane, &jobs, NAME, "every pod counted", |s| {
        s["workers"]["active"] == RANKS && s["ready"] == pending.as_str()
    })
    .await;
    wait_quiet(operator.metrics).await;
    let creation_cpu = cpu_seconds(operator.pid) - idle_cpu;
    let created_kib = peak_rss_kib(operator.pid);

    // One pod's change: rank CHANGED_RANK turns Running and Ready.
    let before = metrics::parse(&metrics::apiserver_metrics(&admin).await.expect("metrics"));
    let (cpu_before, reconciles_before) = (
        cpu_seconds(operator.pid),
        operator_value(operator.metrics, "rdu_operator_reconciles_total")
            .await
            .expect("reconciles"),
    );
    kit::report_running(&pods, &format!("{NAME}-worker-{CHANGED_RANK}")).await;
    let one_ready = format!("1/{RANKS}");
    wait_status(&plane, &jobs, NAME, "the one Running pod counted", |s| {
        s["ready"] == one_ready.as_str()
    })
    .await;
    let reconciles = wait_quiet(operator.metrics).await - reconciles_before;
    let change_cpu = cpu_seconds(operator.pid) - cpu_before;
    let after = metrics::parse(&metrics::apiserver_metrics(&admin).await.expect("metrics"));
    let lists = pod_requests(&after, &["LIST"]) - pod_requests(&before, &["LIST"]);
    let writes = pod_requests(&after, &POD_WRITES) - pod_requests(&before, &POD_WRITES);
    // The positive control of the CREATE count: the same metric counts the device-plugin policy's match
    // condition on the one pod update (the test's status patch).
    let update_evaluations = evaluations(&after, "UPDATE") - evaluations(&before, "UPDATE");
    let peak_kib = peak_rss_kib(operator.pid);

    println!(
        "{}",
        json!({"bench": "scale", "ranks": RANKS,
               "pods_created_seconds": created_seconds,
               "apply_to_all_pods_seconds": apply_to_all_pods,
               "policy_match_evaluations_during_creation": policy_evaluations as u64,
               "policy_match_evaluations_on_one_pod_update": update_evaluations as u64,
               "operator_cpu_ms_per_pod_during_creation": creation_cpu * 1000.0 / f64::from(RANKS),
               "operator_idle_rss_mib": idle_kib / 1024,
               "operator_peak_rss_mib": peak_kib / 1024,
               "operator_kib_per_rank": (created_kib.saturating_sub(idle_kib)) as f64 / f64::from(RANKS),
               "one_pod_change": {"reconciles": reconciles, "operator_cpu_ms": change_cpu * 1000.0,
                                   "pod_lists": lists, "pod_writes": writes}})
    );
    // The test's own status patch is the one write to a pod; the operator wrote none and listed none.
    assert_eq!(lists, 0.0, "a one-pod change made the operator list pods");
    assert_eq!(
        writes, 1.0,
        "a one-pod change made the operator write pods (the test's own status patch is 1)"
    );
    assert_eq!(
        policy_evaluations, 0.0,
        "creating the pods evaluated an admission policy's match conditions"
    );
    assert!(
        update_evaluations > 0.0,
        "the metric counts no evaluation even where one happens: the CREATE count above proves nothing"
    );
    assert!(plane.dead_process().is_none(), "{:?}", plane.dead_process());
}
