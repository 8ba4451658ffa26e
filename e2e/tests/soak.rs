//! Jobs through random faults (issue 35): a kind cluster of three RDU nodes, the chart with two operator
//! replicas and Kueue, three jobs at once (4 ranks; 2 ranks under a memory limit with a `RestartJob` rule for
//! `OOMKilled`; 2 ranks queued through Kueue), each submitted again whenever it succeeds, while an injector lands
//! faults drawn from a seed: node crashes, partitions, kubelet and containerd restarts, the device plugin killed,
//! ranks SIGKILLed and OOM-killed, drains, the operator's leader killed, the API server, etcd and the scheduler
//! restarted. Every finished job must end at its planned step with the parameters of an undisturbed run of its
//! spec, no stale checkpoint accepted and no failure counted that its history does not show; at the end nothing of
//! the jobs is left, and every reconcile error the operator logged falls while the API server was away.
//!
//! `bash e2e/soak/run.sh` runs it (`RDU_SOAK_FAULTS`, default 20; `RDU_SOAK_SEED` replays a run) and prints the
//! JSON line it writes to `RDU_SOAK_BENCH_OUT`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdu_e2e::kueue;
use rdu_e2e::testbed::{Testbed, TestbedSpec};
use serde_json::{Value, json};

#[path = "soak/audit.rs"]
mod audit;
#[path = "soak/inject.rs"]
mod inject;
#[path = "soak/jobs.rs"]
mod jobs;
#[path = "soak/monitor.rs"]
mod monitor;
#[path = "soak/plan.rs"]
mod plan;

use jobs::{Jobs, SLOTS};
use monitor::Monitor;
use plan::{FaultKind, Ranges};

const BENCH_OUT_ENV: &str = "RDU_SOAK_BENCH_OUT";
const NODES: u8 = 3;
const RDUS: u32 = 2;
const TILES_PER_RDU: u32 = 2;
pub(crate) const TILES_PER_NODE: u32 = RDUS * TILES_PER_RDU;
pub(crate) const LONG: Duration = Duration::from_secs(300);
/// How long the jobs may take to end once the faults stop.
const WIND_DOWN: Duration = Duration::from_secs(600);
/// The draws' ranges: holds long enough for the control plane to notice (a crashed node's pods are lost once
/// it is gone, a partition outlasts a heartbeat), gaps short enough that recoveries overlap the next fault.
const RANGES: Ranges = Ranges {
    nodes: NODES,
    slots: SLOTS.len(),
    hold_seconds: (5, 15),
    gap_seconds: (0, 4),
};

/// A whole number from env var `var`, else `default`.
fn env_number(var: &str, default: u64) -> u64 {
    std::env::var(var).map_or(default, |v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a whole number"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kind, podman or docker, the images of docker/Dockerfile and Kueue: bash e2e/soak/run.sh"]
async fn jobs_end_as_planned_through_random_faults() {
    let seed = std::env::var("RDU_SOAK_SEED").map_or_else(
        |_| fastrand::u64(..),
        |v| v.trim().parse().expect("RDU_SOAK_SEED is a whole number"),
    );
    let count = usize::try_from(env_number("RDU_SOAK_FAULTS", 20)).expect("fault count");
    let steps = env_number("RDU_SOAK_STEPS", 100_000);
    let interval = env_number("RDU_SOAK_CHECKPOINT_STEPS", 4_000);
    let faults = plan::plan(seed, count, RANGES);
    eprintln!("soak: seed {seed} ({count} faults; RDU_SOAK_SEED={seed} replays them)");

    let kueue_dir = kueue::kueue_dir().unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let mut bed = Testbed::start(&TestbedSpec {
        name: "rdu-soak",
        nodes: NODES,
    })
    .await;
    let _kueue = kueue::start(&mut bed.plane, &kueue_dir, None)
        .await
        .unwrap_or_else(|e| panic!("Kueue starts: {}", rdu_error_chain::Chain(&e)));
    bed.helm_install(&[
        format!("devicePlugin.rdusPerNode={RDUS}"),
        format!("devicePlugin.tilesPerRdu={TILES_PER_RDU}"),
        "kueue.enabled=true".to_string(),
        "kueue.manageJobsWithoutQueueName=false".to_string(),
        "operator.replicas=2".to_string(),
    ]);
    for node in &bed.nodes {
        bed.wait_tiles(&node.name, TILES_PER_NODE, "after helm install", LONG)
            .await;
    }
    bed.apply(jobs::QUEUES);
    let mut jobs = Jobs::new(steps, interval);
    for slot in 0..SLOTS.len() {
        jobs.submit(&bed, slot);
    }
    let ready_seconds = started.elapsed().as_secs_f64();

    let monitor = Monitor::start(
        bed.plane.admin_kubeconfig.clone(),
        bed.nodes.iter().map(|n| n.name.clone()).collect(),
    );
    let mut audit = audit::Audit::default();
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut heal_seconds: Vec<f64> = Vec::new();
    let soak = Instant::now();
    for (i, fault) in faults.iter().enumerate() {
        jobs.tend(&bed, true).await;
        audit.gather(&bed);
        monitor.fault(marks(&bed, &jobs).await);
        let landed = inject::land(&mut bed, &mut jobs, fault).await;
        heal_seconds.push(
            landed
                .healed
                .duration_since(landed.started)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        if fault.kind.takes_the_api_away() {
            audit.api_away(landed.started, landed.healed);
        }
        eprintln!(
            "soak: fault {}/{count} {} on {} at {:.0} s{}",
            i + 1,
            fault.kind.name(),
            landed.target,
            soak.elapsed().as_secs_f64(),
            landed
                .skipped
                .as_deref()
                .map_or(String::new(), |why| format!(" (skipped: {why})"))
        );
        match landed.skipped {
            Some(why) => skipped.push(format!("{}: {why}", fault.kind.name())),
            None => *by_kind.entry(fault.kind.name()).or_default() += 1,
        }
        tokio::time::sleep(fault.gap).await;
    }
    let faults_seconds = soak.elapsed().as_secs_f64();

    // No more faults: every job still running must end as planned.
    let wind_down = Instant::now();
    while jobs.tend(&bed, false).await > 0 {
        assert!(
            wind_down.elapsed() < WIND_DOWN,
            "jobs still running {WIND_DOWN:?} after the last fault: {:?}\n{}",
            jobs.current,
            bed.diagnose()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let report = monitor.finish();
    audit.gather(&bed);

    let left = bed
        .wait("nothing of the jobs left", LONG, async || {
            let left = audit::leftovers(&bed);
            if left.is_empty() {
                Ok(left)
            } else {
                Err(format!("{left:?}"))
            }
        })
        .await;
    let errors = audit.reconcile_errors();
    let unexplained: Vec<&str> = errors
        .iter()
        .filter(|e| !e.explained)
        .map(|e| e.line.as_str())
        .collect();

    let summary = json!({
        "bench": "soak",
        "seed": seed,
        "faults": by_kind.values().sum::<u64>(),
        "faults_skipped": skipped.len(),
        "by_kind": by_kind,
        "jobs_succeeded": jobs.checked.len(),
        "jobs": jobs.submitted(),
        "checksums_equal": jobs.checked.iter().filter(|c| c.checksum_equal).count(),
        "gang_restarts": jobs.checked.iter().map(|c| c.restarts).sum::<u64>(),
        "failure_restarts": jobs.checked.iter().map(|c| c.failure_restarts).sum::<u64>(),
        "counted_faults_landed": jobs.checked.iter().map(|c| u64::from(c.counted_faults)).sum::<u64>(),
        "job_seconds": percentiles(jobs.checked.iter().map(|c| c.seconds).collect()),
        "recovery_seconds": percentiles(report.recovery_seconds.clone()),
        "fault_to_healed_seconds": percentiles(heal_seconds),
        "leftovers": left.len(),
        "operator_peak_rss_mib": report.operator_peak_rss_kib as f64 / 1024.0,
        "reconcile_errors": errors.len(),
        "reconcile_errors_unexplained": unexplained.len(),
        "cluster_ready_seconds": ready_seconds,
        "faults_seconds": faults_seconds,
        "wind_down_seconds": wind_down.elapsed().as_secs_f64(),
    });
    let line = summary.to_string();
    println!("{line}");
    if let Some(path) = std::env::var_os(BENCH_OUT_ENV) {
        std::fs::write(path, format!("{line}\n")).expect("write the summary");
    }
    assert!(!jobs.checked.is_empty(), "no job finished during the soak");
    assert_eq!(
        report.unresolved, 0,
        "a fault after which a job never trained again"
    );
    assert!(
        unexplained.is_empty(),
        "reconcile errors no fault explains:\n{}",
        unexplained.join("\n")
    );
    for kind in FaultKind::ALL {
        if faults.iter().any(|f| f.kind == kind) {
            assert!(
                by_kind.contains_key(kind.name()),
                "{} was drawn but never landed: {skipped:?}",
                kind.name()
            );
        }
    }
}

/// The step each running job reached, as its status says.
async fn marks(bed: &Testbed, jobs: &Jobs) -> BTreeMap<String, u64> {
    let mut marks = BTreeMap::new();
    for job in jobs.current.iter().flatten() {
        let step = bed.job(&job.name).await.map_or(0, |j| {
            j["status"]["progress"]["step"].as_u64().unwrap_or_default()
        });
        marks.insert(job.name.clone(), step);
    }
    marks
}

/// p50, p95 and max of `values` (nulls when there are none).
fn percentiles(mut values: Vec<f64>) -> Value {
    if values.is_empty() {
        return json!({"p50": null, "p95": null, "max": null});
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    json!({"p50": at(0.5), "p95": at(0.95), "max": at(1.0)})
}
