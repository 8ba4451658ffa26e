//! Prometheus metrics of the operator: reconciles, errors, durations, jobs by phase, time to all pods created.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use rdu_crds::JobPhase;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

/// Every metric the operator exports, registered in one registry.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub errors: Counter,
    pub reconcile_seconds: Histogram,
    pub jobs: Family<PhaseLabel, Gauge>,
    pub pods_created_seconds: Histogram,
    phases: Mutex<HashMap<String, JobPhase>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("rdu_operator");
        let reconciles = Counter::default();
        let errors = Counter::default();
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let jobs = Family::<PhaseLabel, Gauge>::default();
        let pods_created_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register("reconcile_errors", "Reconciles that failed", errors.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile",
            reconcile_seconds.clone(),
        );
        registry.register("jobs", "RduJobs by phase", jobs.clone());
        registry.register(
            "job_pods_created_seconds",
            "Time from a job's creation to all its pods existing (first generation)",
            pods_created_seconds.clone(),
        );
        Metrics {
            registry,
            reconciles,
            errors,
            reconcile_seconds,
            jobs,
            pods_created_seconds,
            phases: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Records a job's phase (None: the job is gone) and refreshes the jobs-by-phase gauge.
    pub fn set_phase(&self, job: &str, phase: Option<JobPhase>) {
        let Ok(mut phases) = self.phases.lock() else {
            return;
        };
        match phase {
            Some(p) => phases.insert(job.to_string(), p),
            None => phases.remove(job),
        };
        let all = [
            JobPhase::Pending,
            JobPhase::Running,
            JobPhase::Restarting,
            JobPhase::Succeeded,
            JobPhase::Failed,
            JobPhase::Suspended,
        ];
        for p in all {
            let n = phases.values().filter(|v| **v == p).count();
            self.jobs
                .get_or_create(&PhaseLabel {
                    phase: p.as_str().to_string(),
                })
                .set(n as i64);
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_by_phase_follow_updates() {
        let m = Metrics::default();
        m.set_phase("ml/a", Some(JobPhase::Running));
        m.set_phase("ml/b", Some(JobPhase::Running));
        m.set_phase("ml/a", Some(JobPhase::Succeeded));
        m.set_phase("ml/b", None);
        m.reconciles.inc();
        let text = m.render();
        assert!(
            text.contains("rdu_operator_jobs{phase=\"Succeeded\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rdu_operator_jobs{phase=\"Running\"} 0"),
            "{text}"
        );
        assert!(text.contains("rdu_operator_reconciles_total 1"), "{text}");
    }
}
