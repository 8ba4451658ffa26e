//! Jobs through random faults (issue 35) on the three-node cluster ([`crate::three_nodes`]): three jobs at once
//! (4 ranks; 2 ranks under a memory limit with a `RestartJob` rule for `OOMKilled`; 2 ranks queued through Kueue),
//! each submitted again whenever it succeeds, while an injector lands faults drawn from a seed: node crashes,
//! partitions, kubelet and containerd restarts, the device plugin killed, ranks SIGKILLed and OOM-killed, drains,
//! the operator's leader killed, the API server, etcd and the scheduler restarted. Every finished job must end at
//! its planned step with the parameters of an undisturbed run of its spec, no stale checkpoint accepted and no
//! failure counted that its history does not show; at the end nothing of the jobs is left, and every reconcile
//! error the operator logged during the soak falls while the API server was away.
//!
//! The three-node test runs a short soak after its own faults (CI); `e2e/tests/soak.rs` runs one on a cluster of
//! its own (`bash e2e/soak/run.sh`, for long soaks). Both take [`Soak::from_env`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::testbed::Testbed;
use crate::three_nodes::{LONG, NODES};

mod audit;
mod inject;
mod jobs;
mod monitor;
mod plan;

use jobs::{Jobs, SLOTS};
use monitor::Monitor;
use plan::{FaultKind, Ranges};

/// Env var naming the file the summary JSON line is written to.
pub const BENCH_OUT_ENV: &str = "RDU_SOAK_BENCH_OUT";
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

/// One soak's settings.
#[derive(Debug, Clone, Copy)]
pub struct Soak {
    /// Draws the faults; the same seed replays them.
    pub seed: u64,
    /// How many faults.
    pub faults: usize,
    /// Steps of every job.
    pub steps: u64,
    /// Steps between checkpoints.
    pub checkpoint_interval: u64,
}

impl Soak {
    /// From `RDU_SOAK_FAULTS` (else `default_faults`), `RDU_SOAK_SEED` (else a random one), `RDU_SOAK_STEPS`
    /// (else `default_steps`) and `RDU_SOAK_CHECKPOINT_STEPS` (4000).
    pub fn from_env(default_faults: u64, default_steps: u64) -> Soak {
        Soak {
            seed: env_number("RDU_SOAK_SEED").unwrap_or_else(|| fastrand::u64(..)),
            faults: usize::try_from(env_number("RDU_SOAK_FAULTS").unwrap_or(default_faults))
                .expect("RDU_SOAK_FAULTS fits a usize"),
            steps: env_number("RDU_SOAK_STEPS").unwrap_or(default_steps),
            checkpoint_interval: env_number("RDU_SOAK_CHECKPOINT_STEPS").unwrap_or(4_000),
        }
    }

    /// Runs the soak on `bed` (the three-node cluster, its `default` namespace free of jobs), writes its summary
    /// to [`BENCH_OUT_ENV`] and returns it; panics when a check fails (after the summary is written).
    pub async fn run(&self, bed: &mut Testbed) -> Value {
        let count = self.faults;
        let faults = plan::plan(self.seed, count, RANGES);
        eprintln!(
            "soak: seed {} ({count} faults; RDU_SOAK_SEED={} replays them)",
            self.seed, self.seed
        );
        let begun = SystemTime::now();
        let started_after = bed.started.elapsed().as_secs_f64();
        bed.apply(&jobs::QUEUE.yaml());
        let mut jobs = Jobs::new(self.steps, self.checkpoint_interval);
        for slot in 0..SLOTS.len() {
            jobs.submit(bed, slot);
        }

        let monitor = Monitor::start(
            bed.plane.admin_kubeconfig.clone(),
            bed.nodes.iter().map(|n| n.name.clone()).collect(),
        );
        let mut audit = audit::Audit::since(begun);
        let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
        let mut skipped: Vec<String> = Vec::new();
        let mut heal_seconds: Vec<f64> = Vec::new();
        let soak = Instant::now();
        for (i, fault) in faults.iter().enumerate() {
            jobs.tend(bed, true).await;
            audit.gather(bed);
            monitor.fault(marks(bed, &jobs).await);
            let landed = inject::land(bed, &mut jobs, fault).await;
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
        while jobs.tend(bed, false).await > 0 {
            assert!(
                wind_down.elapsed() < WIND_DOWN,
                "jobs still running {WIND_DOWN:?} after the last fault: {:?}\n{}",
                jobs.current,
                bed.diagnose()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let report = monitor.finish();
        audit.gather(bed);

        let left = bed
            .wait("nothing of the jobs left", LONG, async || {
                let left = audit::leftovers(bed);
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
            "seed": self.seed,
            "faults": by_kind.values().sum::<u64>(),
            "faults_skipped": skipped.len(),
            "by_kind": by_kind,
            "jobs_succeeded": jobs.checked.len(),
            "jobs": jobs.submitted(),
            // Each of these jobs' checksums was asserted equal to the undisturbed run's.
            "checksums_equal": jobs.checked.iter().filter(|c| c.checksum_checked).count(),
            "rank_pods_gone_before_read": jobs.checked.iter().map(|c| u64::from(c.pods_gone)).sum::<u64>(),
            "rank_logs_without_checksum": jobs.checked.iter().map(|c| u64::from(c.logs_without_checksum)).sum::<u64>(),
            "gang_restarts": jobs.checked.iter().map(|c| c.restarts).sum::<u64>(),
            "failure_restarts": jobs.checked.iter().map(|c| c.failure_restarts).sum::<u64>(),
            "oom_kills_blamed_otherwise": jobs.oom_blamed_otherwise,
            "counted_faults_landed": jobs.checked.iter().map(|c| u64::from(c.counted_faults)).sum::<u64>(),
            "job_seconds": percentiles(jobs.checked.iter().map(|c| c.seconds).collect()),
            "recovery_seconds": percentiles(report.recovery_seconds.clone()),
            "fault_to_healed_seconds": percentiles(heal_seconds),
            "leftovers": left.len(),
            "operator_peak_rss_mib": report.operator_peak_rss_kib as f64 / 1024.0,
            "reconcile_errors": errors.len(),
            "reconcile_errors_unexplained": unexplained.len(),
            "reconcile_conflicts_retried": audit.conflicts_retried(),
            "started_after_cluster_seconds": started_after,
            "faults_seconds": faults_seconds,
            "wind_down_seconds": wind_down.elapsed().as_secs_f64(),
        });
        let line = summary.to_string();
        println!("{line}");
        if let Some(path) = std::env::var_os(BENCH_OUT_ENV) {
            std::fs::write(path, format!("{line}\n")).expect("write the soak's summary");
        }
        assert!(!jobs.checked.is_empty(), "no job finished during the soak");
        assert!(
            jobs.checked.iter().any(|c| c.checksum_checked),
            "no finished job left a rank's log to compare with the undisturbed run"
        );
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
        summary
    }
}

/// A whole number from env var `var`, if set.
fn env_number(var: &str) -> Option<u64> {
    std::env::var(var).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a whole number"))
    })
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
