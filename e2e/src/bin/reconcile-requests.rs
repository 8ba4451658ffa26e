//! Bench: API requests the operator makes per reconcile, against a real control plane (etcd + kube-apiserver, no
//! node, no scheduler: pods stay Pending).
//!
//! Starts the operator binary of `RDU_OPERATOR_BIN` as the chart's ServiceAccount and warms it up with a 1-rank
//! job in another namespace (its caches are synced once it saw that job's pod; main's operator never turned
//! /readyz ready), then creates 20 RduJobs of 256 ranks (examples/synthetic.yaml with `workers: 256`), waits
//! until the operator has seen all 5120 pods (its `rdu_operator_job_pods_created_seconds_count` grew by 20) and
//! its reconcile counter has not moved for `QUIET`, then prints one JSON line. Requests are the API server's own `apiserver_request_total` (scraped before
//! the jobs are created and at the end) for the resources a reconcile reads or writes: pods, services, secrets,
//! networkpolicies, persistentvolumeclaims, podgroups, rdujobs and events. Leases (leader election) and other
//! resources are left out, and so are the bench's 20 creates of rdujobs; the bench makes no other request in
//! between (it waits on the operator's /metrics). The metric has no user label, so `watch` also counts the
//! re-watches of the API server's own Node-authorizer pod informer (a few per run). A watch is counted when it
//! ends: re-watches after the API server closed one, not the long-lived ones. Reconciles are the operator's
//! `rdu_operator_reconciles_total`; a reconcile that only waits for the cache to show its own writes counts too.
//!
//!     KUBEBUILDER_ASSETS=... RDU_E2E_HELM=... RDU_OPERATOR_BIN=target/debug/rdu-operator \
//!         cargo run -p rdu-e2e --bin reconcile-requests

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use rdu_crds::RduJob;
use rdu_e2e::metrics::{self, Sample};
use rdu_e2e::{
    Assets, Components, ControlPlane, SYSTEM_NAMESPACE, create_namespace, install_crd, poll_until,
    start_operator_as_chart, workspace_root,
};
use serde_json::json;

const JOBS: usize = 20;
const RANKS: u32 = 256;
const NAMESPACE: &str = "bench";
const WARM_UP_NAMESPACE: &str = "warm-up";
/// How long the reconcile counter must stay still to call the operator idle.
const QUIET: Duration = Duration::from_secs(5);
/// How long everything may take.
const DEADLINE: Duration = Duration::from_secs(900);
/// The resources a reconcile reads or writes.
const RESOURCES: [&str; 8] = [
    "pods",
    "services",
    "secrets",
    "networkpolicies",
    "persistentvolumeclaims",
    "podgroups",
    "rdujobs",
    "events",
];
/// The API server's verbs, as `apiserver_request_total` reports them, by the bench's names.
const VERBS: [(&str, &[&str]); 7] = [
    ("list", &["LIST"]),
    ("get", &["GET"]),
    ("watch", &["WATCH", "WATCHLIST"]),
    ("patch", &["PATCH", "APPLY"]),
    ("create", &["POST", "CREATE"]),
    ("update", &["PUT", "UPDATE"]),
    ("delete", &["DELETE", "DELETECOLLECTION"]),
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let assets =
        Assets::from_env().context("KUBEBUILDER_ASSETS must name the control plane's binaries")?;
    let components = Components {
        scheduler: false,
        controller_manager: false,
    };
    let mut plane = ControlPlane::start(&assets, components)
        .await
        .context("control plane")?;
    install_crd(&plane).await.context("CRD")?;
    create_namespace(&plane, SYSTEM_NAMESPACE).await?;
    create_namespace(&plane, NAMESPACE).await?;
    create_namespace(&plane, WARM_UP_NAMESPACE).await?;
    let operator = start_operator_as_chart(&mut plane, SYSTEM_NAMESPACE, &[], &[])
        .context("starting the operator (RDU_OPERATOR_BIN)")?
        .metrics;
    let admin = plane.admin_client().await?;
    let template = job_template()?;

    let mut warm_up = template.clone();
    warm_up.metadata.name = Some("warm-up".into());
    warm_up.spec.workers = 1;
    Api::<RduJob>::namespaced(admin.clone(), WARM_UP_NAMESPACE)
        .create(&PostParams::default(), &warm_up)
        .await
        .context("creating the warm-up job")?;
    poll_until(
        "the operator to see the warm-up job's pod",
        Duration::from_secs(120),
        || async {
            let seen = operator_value(operator, "rdu_operator_job_pods_created_seconds_count")
                .await
                .map_err(|e| e.to_string())?;
            if seen >= 1.0 {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        },
    )
    .await
    .with_context(|| plane.log_tail("rdu-operator", 20))?;
    wait_quiet(operator).await?;

    let before = metrics::parse(&metrics::apiserver_metrics(&admin).await?);
    let reconciles_before = operator_value(operator, "rdu_operator_reconciles_total").await?;
    let created_before =
        operator_value(operator, "rdu_operator_job_pods_created_seconds_count").await?;
    let started = Instant::now();
    let jobs: Api<RduJob> = Api::namespaced(admin.clone(), NAMESPACE);
    for i in 0..JOBS {
        let mut job = template.clone();
        job.metadata.name = Some(format!("bench-{i:02}"));
        job.metadata.namespace = Some(NAMESPACE.to_string());
        jobs.create(&PostParams::default(), &job)
            .await
            .with_context(|| format!("creating job {i}"))?;
    }

    poll_until("the operator to see every pod", DEADLINE, || async {
        let seen = operator_value(operator, "rdu_operator_job_pods_created_seconds_count")
            .await
            .map_err(|e| e.to_string())?;
        if seen - created_before >= JOBS as f64 {
            Ok(())
        } else {
            Err(format!(
                "{} of {JOBS} jobs with all pods",
                seen - created_before
            ))
        }
    })
    .await
    .with_context(|| plane.log_tail("rdu-operator", 20))?;
    wait_quiet(operator).await?;
    let after = metrics::parse(&metrics::apiserver_metrics(&admin).await?);
    let operator_cpu = operator_cpu_seconds();
    let reconciles =
        operator_value(operator, "rdu_operator_reconciles_total").await? - reconciles_before;
    let seconds = started.elapsed().as_secs_f64() - QUIET.as_secs_f64();

    // Outside the measured window: every pod exists.
    let pods: Api<Pod> = Api::namespaced(admin, NAMESPACE);
    let count = pods
        .list_metadata(&ListParams::default())
        .await?
        .items
        .len();
    if count != JOBS * RANKS as usize {
        bail!("{count} pods exist, not {}", JOBS * RANKS as usize);
    }

    let requests = request_deltas(&before, &after);
    let mut by_verb = serde_json::Map::new();
    let mut total = 0.0;
    for (name, verbs) in VERBS {
        let n: f64 = requests
            .iter()
            .filter(|((verb, _), _)| verbs.contains(&verb.as_str()))
            .map(|(_, n)| n)
            .sum();
        total += n;
        by_verb.insert(name.to_string(), json!(n as u64));
    }
    by_verb.insert("total".to_string(), json!(total as u64));
    let pod_lists = requests
        .get(&("LIST".to_string(), "pods".to_string()))
        .copied()
        .unwrap_or_default();
    println!(
        "{}",
        json!({
            "bench": "reconcile_requests",
            "jobs": JOBS,
            "ranks": RANKS,
            "reconciles": reconciles as u64,
            "api_requests": by_verb,
            "requests_per_reconcile": round2(total / reconciles.max(1.0)),
            "pod_list_requests": pod_lists as u64,
            "seconds": round2(seconds),
            "operator_cpu_seconds": operator_cpu.map(round2),
            "operator": rdu_e2e::operator_binary()?.display().to_string(),
        })
    );
    Ok(())
}

/// examples/synthetic.yaml with 256 ranks.
fn job_template() -> anyhow::Result<RduJob> {
    let path = workspace_root().join("examples/synthetic.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut job: RduJob =
        serde_yaml_ng::from_str(&text).with_context(|| path.display().to_string())?;
    job.spec.workers = RANKS;
    Ok(job)
}

/// Waits until the operator's reconcile counter has not moved for `QUIET`.
async fn wait_quiet(operator: SocketAddr) -> anyhow::Result<()> {
    let mut last = (f64::NAN, Instant::now());
    poll_until("the reconcile counter to stop", DEADLINE, async || {
        let n = operator_value(operator, "rdu_operator_reconciles_total")
            .await
            .map_err(|e| e.to_string())?;
        if n != last.0 {
            last = (n, Instant::now());
        }
        if last.1.elapsed() >= QUIET {
            Ok(())
        } else {
            Err(format!("{n} reconciles, still moving"))
        }
    })
    .await?;
    Ok(())
}

/// CPU time (user + system) the operator process used since it started, from /proc (None elsewhere).
fn operator_cpu_seconds() -> Option<f64> {
    let ticks_per_second = 100.0; // USER_HZ on Linux
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let ours = String::from_utf8_lossy(&cmdline).contains("--identity=e2e-operator");
            if !ours {
                return None;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // Fields after the command name (which is in parentheses): utime and stime are the 12th and 13th.
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks_per_second)
        })
}

/// One unlabelled value of the operator's /metrics.
async fn operator_value(operator: SocketAddr, name: &str) -> anyhow::Result<f64> {
    let text = metrics::scrape(operator).await?;
    Ok(metrics::sum(&metrics::parse(&text), name, &[]))
}

/// Requests between two scrapes of `apiserver_request_total`, by (verb, resource), for the resources a reconcile
/// touches, less the bench's own creates of RduJobs.
fn request_deltas(before: &[Sample], after: &[Sample]) -> BTreeMap<(String, String), f64> {
    let totals = |samples: &[Sample]| {
        let mut by = BTreeMap::<(String, String), f64>::new();
        for s in samples
            .iter()
            .filter(|s| s.name == "apiserver_request_total")
        {
            let resource = s.labels.get("resource").cloned().unwrap_or_default();
            if !RESOURCES.contains(&resource.as_str()) {
                continue;
            }
            let verb = s.labels.get("verb").cloned().unwrap_or_default();
            *by.entry((verb, resource)).or_default() += s.value;
        }
        by
    };
    let before = totals(before);
    let mut deltas = totals(after);
    for (key, n) in deltas.iter_mut() {
        *n -= before.get(key).copied().unwrap_or_default();
    }
    if let Some(n) = deltas.get_mut(&("POST".to_string(), "rdujobs".to_string())) {
        *n -= JOBS as f64;
    }
    deltas.retain(|_, n| *n > 0.0);
    deltas
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
