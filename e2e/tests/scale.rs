//! One RduJob of 4,096 ranks, the API's ceiling, against the real API server (issue 26, item 4), with the
//! operator binary (`e2e/control-plane/run.sh` gives it the release build users run) running as the chart's
//! ServiceAccount and the test reporting a pod's state as a kubelet would. Prints one JSON line (`"bench":
//! "scale"`): how long until every pod existed (the operator's own `job_pods_created_seconds`), the operator's
//! memory per rank and CPU per pod event, and what one pod's change cost. Checks what must hold at any speed:
//! every pod is created and counted, creating them runs no admission policy's match conditions (the chart's
//! device-plugin policy matches updates only), and one pod turning Running makes the operator neither list pods
//! nor write any pod (the API server's own request counters).
//!
//! And a bench of a 256-rank job (`"bench": "apply_to_pods_256"`): from the RduJob's create to its 256th pod as a
//! watch sees them, beside the same 256 pods created straight through the API.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
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

/// Waits until the operator answers /readyz.
async fn wait_ready(plane: &rdu_e2e::ControlPlane, operator: SocketAddr) {
    poll_until("the operator's /readyz", TIMEOUT, || async {
        match metrics::http_get(operator, "/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{}\noperator log:\n{}",
            rdu_error_chain::Chain(&e),
            kit::operator_log(plane)
        )
    });
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
    .unwrap_or_else(|e| panic!("{}", rdu_error_chain::Chain(&e)))
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
    wait_ready(&plane, operator.metrics).await;
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
    .unwrap_or_else(|e| {
        panic!(
            "{}\noperator log:\n{}",
            rdu_error_chain::Chain(&e),
            kit::operator_log(&plane)
        )
    });
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

/// A watch of the pods `selector` picks in `pods`' namespace, its initial (empty) list already read.
async fn watch_from_now(
    pods: &Api<Pod>,
    selector: &str,
) -> impl futures::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + use<> {
    let mut events = Box::pin(watcher(
        pods.clone(),
        watcher::Config::default().labels(selector),
    ));
    loop {
        // Errors are the watcher's to recover from (it relists), as in `watch_pods_appear`.
        if let Ok(watcher::Event::InitDone) = events.next().await.expect("the pod watch never ends")
        {
            return events;
        }
    }
}

/// Seconds from `start` until `pods` (a watch started before it) has seen `count` distinct pods: (first, last).
async fn watch_pods_appear(
    events: impl futures::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
    start: Instant,
    count: usize,
) -> (f64, f64) {
    let mut seen = std::collections::HashSet::new();
    let mut first = None;
    let mut events = std::pin::pin!(events);
    let waited = tokio::time::timeout(CREATION, async {
        while let Some(event) = events.next().await {
            // A watch error (a dropped connection) is the watcher's to recover from: it relists and goes on.
            if let Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event {
                seen.insert(pod.metadata.name.unwrap_or_default());
                first.get_or_insert_with(|| start.elapsed().as_secs_f64());
                if seen.len() >= count {
                    return start.elapsed().as_secs_f64();
                }
            }
        }
        panic!("the pod watch ended");
    })
    .await;
    let last = waited.unwrap_or_else(|_| panic!("{} of {count} pods in {CREATION:?}", seen.len()));
    (first.unwrap_or(last), last)
}

/// One round of the 256-pod bench: the operator's job `name` and the same pods created directly.
struct Round {
    /// From the RduJob's create to its last pod seen.
    operator: f64,
    /// From the RduJob's create to its first pod seen.
    first_pod: f64,
    /// From the first direct create to the last pod seen.
    direct: f64,
}

/// The median of `values` (sorted here).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Times `name`'s pods as the operator creates them, then the same pods created straight through the API by the
/// admin in namespace `direct_ns`, 16 requests in flight, with no reconcile or status in between. Both are timed
/// from the first request (the RduJob's create, or the first pod's) to the last pod a watch opened before sees.
async fn apply_to_pods_round(
    admin: &kube::Client,
    name: &str,
    pods: u32,
    direct_ns: &str,
) -> Round {
    let selector = format!("rdu.dev/job-name={name}");
    let operated: Api<Pod> = Api::namespaced(admin.clone(), JOBS);
    let events = watch_from_now(&operated, &selector).await;
    let job: RduJob =
        serde_json::from_value(JobFixture::new(JOBS, name).workers(pods).value()).expect("job");
    let jobs: Api<RduJob> = Api::namespaced(admin.clone(), JOBS);
    // The chart's admission policies take effect a second or two after they are created (the API server loads
    // them on a timer), and the first create waits for them: a dry run of the same create waits here instead.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    jobs.create(&dry_run, &job)
        .await
        .expect("dry run of the job's create");
    let start = Instant::now();
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("create the job");
    let (first_pod, operator) = watch_pods_appear(events, start, pods as usize).await;
    let listed = operated
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .expect("list");
    assert_eq!(
        listed.items.len(),
        pods as usize,
        "every rank of {name} has its pod"
    );

    let valid =
        rdu_operator::validate(&created, &rdu_operator::Limits::default()).expect("valid job");
    let built: Vec<Pod> = (0..pods)
        .map(|rank| {
            let mut pod = rdu_operator::worker_pod(&valid, rank, 0);
            pod.metadata.namespace = Some(direct_ns.into());
            pod.metadata.owner_references = None;
            pod
        })
        .collect();
    let direct: Api<Pod> = Api::namespaced(admin.clone(), direct_ns);
    let events = watch_from_now(&direct, &selector).await;
    let post = PostParams::default();
    let start = Instant::now();
    futures::stream::iter(built.iter().map(|pod| direct.create(&post, pod)))
        .buffer_unordered(16)
        .for_each(|r| async move {
            r.expect("direct create");
        })
        .await;
    let (_, direct) = watch_pods_appear(events, start, pods as usize).await;
    Round {
        operator,
        first_pod,
        direct,
    }
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn bench_apply_to_pods_256() {
    const PODS: u32 = 256;
    const ROUNDS: usize = 3;
    let (mut plane, operator) = kit::plane("apply to pods")
        .namespaces(&[JOBS, "baseline"])
        .start_operator()
        .await;
    let admin = plane.admin_client().await.expect("client");
    wait_ready(&plane, operator.metrics).await;

    // Interleaved rounds, each a job of its own (the pods of earlier rounds stay, as in a busy namespace).
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        rounds
            .push(apply_to_pods_round(&admin, &format!("{NAME}-{round}"), PODS, "baseline").await);
    }
    let operated: Vec<f64> = rounds.iter().map(|r| r.operator).collect();
    let direct: Vec<f64> = rounds.iter().map(|r| r.direct).collect();
    let mut first: Vec<f64> = rounds.iter().map(|r| r.first_pod).collect();
    let (seconds, baseline) = (median(&mut operated.clone()), median(&mut direct.clone()));
    println!(
        "{}",
        json!({"bench": "apply_to_pods_256", "pods": PODS, "rounds": ROUNDS,
               "seconds": seconds, "baseline_direct_create_seconds": baseline, "ratio": seconds / baseline,
               "first_pod_seconds": median(&mut first),
               "operator_seconds_by_round": operated, "direct_seconds_by_round": direct})
    );
    assert!(plane.dead_process().is_none(), "{:?}", plane.dead_process());
}
