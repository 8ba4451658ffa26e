//! Prometheus metrics of the operator: reconciles, errors by pipeline step, durations, time to all pods created,
//! and jobs by phase (counted from the controller's job cache at each scrape).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use kube::runtime::reflector::Store;
use rdu_crds::{JobPhase, RduJob};

use crate::step::Step;

/// Every phase of DESIGN 4.1, in the order /metrics lists them.
pub(crate) const PHASES: [JobPhase; 6] = [
    JobPhase::Pending,
    JobPhase::Running,
    JobPhase::Restarting,
    JobPhase::Succeeded,
    JobPhase::Failed,
    JobPhase::Suspended,
];

/// The `step` label of `rdu_operator_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: &'static str,
}

/// The `outcome` label of `rdu_operator_progress_reports_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// Every metric the operator exports, registered in one registry.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    /// Failed reconciles by the pipeline step that failed.
    pub errors: Family<StepLabel, Counter>,
    /// Reconciles whose write met a newer version of its object (409 `Conflict`) and were run again at once.
    pub conflicts: Counter,
    pub reconcile_seconds: Histogram,
    pub pods_created_seconds: Histogram,
    /// Progress reports by outcome (`accepted` or why they were refused).
    pub progress_reports: Family<OutcomeLabel, Counter>,
}

impl Metrics {
    /// The metrics, with `rdu_operator_jobs` counted from `jobs` (the controller's job cache) at each scrape.
    pub fn new(jobs: Store<RduJob>) -> Self {
        let mut registry = Registry::with_prefix("rdu_operator");
        let reconciles = Counter::default();
        let errors = Family::<StepLabel, Counter>::default();
        for step in Step::ALL {
            // Every step is listed from the start, at 0, so a rate() over it has a baseline.
            let _ = errors.get_or_create(&StepLabel {
                step: step.as_str(),
            });
        }
        let conflicts = Counter::default();
        registry.register(
            "reconcile_conflicts",
            "Reconciles whose write found its object changed since it was read (409 Conflict), run again from a fresh read",
            conflicts.clone(),
        );
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let pods_created_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by the pipeline step that failed (fetch, build, apply, status)",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile",
            reconcile_seconds.clone(),
        );
        registry.register_collector(Box::new(JobsByPhase { jobs }));
        registry.register(
            "job_pods_created_seconds",
            "Time from a job's creation to all its pods existing (first generation)",
            pods_created_seconds.clone(),
        );
        let progress_reports = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "progress_reports",
            "Progress reports from rank 0 by outcome (accepted, or the reason they were refused)",
            progress_reports.clone(),
        );
        Metrics {
            progress_reports,
            registry,
            reconciles,
            errors,
            conflicts,
            reconcile_seconds,
            pods_created_seconds,
        }
    }

    /// Counts a failed reconcile under the step that failed.
    pub fn count_error(&self, step: Step) {
        self.errors
            .get_or_create(&StepLabel {
                step: step.as_str(),
            })
            .inc();
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

/// `rdu_operator_jobs{phase}`: the jobs in the controller's cache by `status.phase` (Pending for a job without
/// one), counted when scraped, so a deleted job leaves the count as soon as the cache drops it. Every phase is
/// listed, 0 when no job is in it; a replica that is not the leader (its cache is empty) reports 0 for all.
struct JobsByPhase {
    jobs: Store<RduJob>,
}

impl std::fmt::Debug for JobsByPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobsByPhase")
            .field("jobs", &self.jobs.len())
            .finish()
    }
}

/// How many of `jobs` are in each phase, in the order of [`PHASES`].
pub(crate) fn count_by_phase<'a>(
    jobs: impl IntoIterator<Item = &'a RduJob>,
) -> [(JobPhase, u64); 6] {
    let mut counts = PHASES.map(|p| (p, 0u64));
    for job in jobs {
        let phase = job
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or(JobPhase::Pending);
        if let Some((_, n)) = counts.iter_mut().find(|(p, _)| *p == phase) {
            *n += 1;
        }
    }
    counts
}

impl Collector for JobsByPhase {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let jobs = self.jobs.state();
        let counts = count_by_phase(jobs.iter().map(|j| j.as_ref()));
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "jobs",
            "RduJobs by status.phase in the controller's cache (Pending: no status yet)",
            None,
            gauge.metric_type(),
        )?;
        for (phase, n) in counts {
            let labels = [("phase", phase.as_str())];
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher;
    use rdu_crds::RduJobStatus;

    fn job(name: &str, phase: Option<JobPhase>) -> RduJob {
        let mut job: RduJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"workers": 1, "tilesPerWorker": 1, "image": "img:1",
                     "model": {"name": "ffn-logreg"}, "data": {"source": "synthetic"},
                     "training": {"epochs": 1, "batchSize": 8, "learningRate": 0.1}}
        }))
        .expect("job parses");
        job.status = phase.map(|phase| RduJobStatus {
            phase: Some(phase),
            ..Default::default()
        });
        job
    }

    fn line(text: &str, phase: &str) -> String {
        text.lines()
            .find(|l| l.starts_with(&format!("rdu_operator_jobs{{phase=\"{phase}\"}}")))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn jobs_by_phase_are_counted_from_the_store_when_scraped() {
        let (store, mut writer) = reflector::store::<RduJob>();
        let m = Metrics::new(store);
        let text = m.render();
        for phase in PHASES {
            assert_eq!(
                line(&text, phase.as_str()),
                format!("rdu_operator_jobs{{phase=\"{}\"}} 0", phase.as_str()),
                "{text}"
            );
        }
        assert!(text.contains("# TYPE rdu_operator_jobs gauge"), "{text}");

        writer.apply_watcher_event(&watcher::Event::Apply(job("a", Some(JobPhase::Running))));
        writer.apply_watcher_event(&watcher::Event::Apply(job("b", Some(JobPhase::Running))));
        writer.apply_watcher_event(&watcher::Event::Apply(job("c", None)));
        let text = m.render();
        assert!(
            text.contains("rdu_operator_jobs{phase=\"Running\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("rdu_operator_jobs{phase=\"Pending\"} 1"),
            "a job without status is Pending: {text}"
        );

        // A job changes phase, another is deleted (no finalizer, no last reconcile): the next scrape follows.
        writer.apply_watcher_event(&watcher::Event::Apply(job("a", Some(JobPhase::Succeeded))));
        writer.apply_watcher_event(&watcher::Event::Delete(job("b", Some(JobPhase::Running))));
        let text = m.render();
        assert!(
            text.contains("rdu_operator_jobs{phase=\"Succeeded\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rdu_operator_jobs{phase=\"Running\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn errors_are_counted_by_step_and_every_step_starts_at_zero() {
        let (store, _writer) = reflector::store::<RduJob>();
        let m = Metrics::new(store);
        m.reconciles.inc();
        m.count_error(Step::Apply);
        m.count_error(Step::Apply);
        m.count_error(Step::Status);
        let text = m.render();
        assert!(text.contains("rdu_operator_reconciles_total 1"), "{text}");
        for (step, n) in [("fetch", 0), ("build", 0), ("apply", 2), ("status", 1)] {
            assert!(
                text.contains(&format!(
                    "rdu_operator_reconcile_errors_total{{step=\"{step}\"}} {n}"
                )),
                "{text}"
            );
        }
    }
}
