//! Validation of an RduJob before anything is built: the CRD's CEL rules, plus what only the operator can check
//! (names that must fit a DNS label, the checkpoint volume in the template). Every message names the field and the fix.

use std::fmt;

use rdu_crds::{DataSource, RduJob};

/// One rule a job breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// Path of the field, e.g. `spec.tilesPerWorker`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Every rule a job breaks (never empty when returned as an error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let messages: Vec<&str> = self.0.iter().map(|e| e.message.as_str()).collect();
        write!(f, "invalid RduJob: {}", messages.join("; "))
    }
}

/// Longest pod name usable as a hostname (a DNS-1123 label).
const MAX_LABEL: usize = 63;

/// Checks every rule of the CRD's schema and CEL, and the operator's own; collects all failures.
pub fn validate(job: &RduJob) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    let mut check = |ok: bool, field: &str, message: String| {
        if !ok {
            errors.push(ValidationError {
                field: field.to_string(),
                message,
            });
        }
    };
    let spec = &job.spec;

    let name = job.metadata.name.as_deref().unwrap_or_default();
    check(
        !name.is_empty(),
        "metadata.name",
        "metadata.name is required: name the job".into(),
    );
    if !name.is_empty() {
        let longest_pod = rdu_crds::consts::pod_name(name, spec.workers.saturating_sub(1));
        check(
            is_dns_label(name) && longest_pod.len() <= MAX_LABEL,
            "metadata.name",
            format!(
                "metadata.name {name:?} must be lowercase letters, digits and '-', start with a letter, and short \
                 enough that pod {longest_pod:?} has at most {MAX_LABEL} characters: use a shorter name"
            ),
        );
    }

    check(
        spec.workers >= 1,
        "spec.workers",
        "spec.workers must be at least 1".into(),
    );
    check(
        [1, 2, 4, 8].contains(&spec.tiles_per_worker),
        "spec.tilesPerWorker",
        format!(
            "spec.tilesPerWorker must be 1, 2, 4 or 8 (got {})",
            spec.tiles_per_worker
        ),
    );
    if let Some(compile) = &spec.compile {
        check(
            compile.min_world_size >= 1,
            "spec.compile.minWorldSize",
            "spec.compile.minWorldSize must be at least 1".into(),
        );
        check(
            spec.workers >= compile.min_world_size,
            "spec.workers",
            format!(
                "spec.workers must be at least spec.compile.minWorldSize ({} < {}): raise workers or compile for a \
                 smaller world size",
                spec.workers, compile.min_world_size
            ),
        );
    }

    let model = &spec.model;
    check(
        model.hidden_sizes.len() <= 16,
        "spec.model.hiddenSizes",
        format!(
            "spec.model.hiddenSizes has {} entries, at most 16 are allowed",
            model.hidden_sizes.len()
        ),
    );
    check(
        model.hidden_sizes.iter().all(|h| *h >= 1),
        "spec.model.hiddenSizes",
        "spec.model.hiddenSizes entries must be at least 1".into(),
    );

    let data = &spec.data;
    check(
        data.source == DataSource::Synthetic || data.path.is_some(),
        "spec.data.path",
        "spec.data.path is required for csv and idx sources".into(),
    );
    check(
        data.source != DataSource::Idx || data.labels_path.is_some(),
        "spec.data.labelsPath",
        "spec.data.labelsPath is required for the idx source".into(),
    );
    check(
        (0.0..1.0).contains(&data.test_fraction),
        "spec.data.testFraction",
        format!(
            "spec.data.testFraction must be in [0, 1) (got {})",
            data.test_fraction
        ),
    );
    check(
        data.samples.is_none_or(|s| s >= 1),
        "spec.data.samples",
        "spec.data.samples must be at least 1".into(),
    );

    let training = &spec.training;
    check(
        training.epochs.is_some() || training.steps.is_some(),
        "spec.training",
        "spec.training needs epochs or steps".into(),
    );
    check(
        training.epochs.is_none_or(|e| e >= 1),
        "spec.training.epochs",
        "spec.training.epochs must be at least 1".into(),
    );
    check(
        training.steps.is_none_or(|s| s >= 1),
        "spec.training.steps",
        "spec.training.steps must be at least 1".into(),
    );
    check(
        training.batch_size >= 1,
        "spec.training.batchSize",
        "spec.training.batchSize must be at least 1".into(),
    );
    check(
        training.learning_rate > 0.0,
        "spec.training.learningRate",
        format!(
            "spec.training.learningRate must be greater than 0 (got {})",
            training.learning_rate
        ),
    );
    check(
        (0.0..1.0).contains(&training.momentum),
        "spec.training.momentum",
        format!(
            "spec.training.momentum must be in [0, 1) (got {})",
            training.momentum
        ),
    );

    let dp = &spec.data_parallel;
    check(
        dp.bucket_size_mib >= 1,
        "spec.dataParallel.bucketSizeMiB",
        "spec.dataParallel.bucketSizeMiB must be at least 1".into(),
    );
    check(
        dp.timeout_seconds >= 1,
        "spec.dataParallel.timeoutSeconds",
        "spec.dataParallel.timeoutSeconds must be at least 1".into(),
    );

    if let Some(ckpt) = &spec.checkpoint {
        check(
            ckpt.interval_steps >= 1,
            "spec.checkpoint.intervalSteps",
            "spec.checkpoint.intervalSteps must be at least 1".into(),
        );
        check(
            ckpt.keep >= 1,
            "spec.checkpoint.keep",
            "spec.checkpoint.keep must be at least 1".into(),
        );
        if let Some(volume) = &ckpt.volume {
            let declared = spec
                .template
                .as_ref()
                .and_then(|t| t.spec.as_ref())
                .and_then(|s| s.volumes.as_ref())
                .is_some_and(|vs| vs.iter().any(|v| &v.name == volume));
            check(
                declared,
                "spec.checkpoint.volume",
                format!(
                    "spec.checkpoint.volume {volume:?} is not a volume of spec.template.spec.volumes: add it there \
                     or omit the field for an emptyDir"
                ),
            );
        }
    }

    let run = &spec.run_policy;
    check(
        run.active_deadline_seconds.is_none_or(|s| s >= 1),
        "spec.runPolicy.activeDeadlineSeconds",
        "spec.runPolicy.activeDeadlineSeconds must be at least 1".into(),
    );
    if let Some(min) = run.scheduling_policy.as_ref().and_then(|s| s.min_available) {
        check(
            (1..=spec.workers).contains(&min),
            "spec.runPolicy.schedulingPolicy.minAvailable",
            format!(
                "spec.runPolicy.schedulingPolicy.minAvailable must be between 1 and spec.workers ({}), got {min}",
                spec.workers
            ),
        );
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

/// RFC 1035 label: what a Service name and a pod's subdomain must be.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::test_fixtures::job;

    fn fields(job: &RduJob) -> Vec<String> {
        match validate(job) {
            Ok(()) => vec![],
            Err(e) => e.0.into_iter().map(|e| e.field).collect(),
        }
    }

    #[test]
    fn fixture_is_valid() {
        assert_eq!(validate(&job("mnist", Some("ml"), 4)), Ok(()));
    }

    #[test]
    fn each_rule_names_its_field() {
        type Breaker = fn(&mut RduJob);
        let cases: Vec<(Breaker, &str)> = vec![
            (|j| j.spec.workers = 0, "spec.workers"),
            (|j| j.spec.tiles_per_worker = 3, "spec.tilesPerWorker"),
            (
                |j| j.spec.compile = Some(rdu_crds::CompileSpec { min_world_size: 8 }),
                "spec.workers",
            ),
            (
                |j| j.spec.model.hidden_sizes = vec![0],
                "spec.model.hiddenSizes",
            ),
            (
                |j| j.spec.model.hidden_sizes = vec![1; 17],
                "spec.model.hiddenSizes",
            ),
            (|j| j.spec.data.source = DataSource::Csv, "spec.data.path"),
            (
                |j| {
                    j.spec.data.source = DataSource::Idx;
                    j.spec.data.path = Some("x".into());
                },
                "spec.data.labelsPath",
            ),
            (
                |j| j.spec.data.test_fraction = 1.0,
                "spec.data.testFraction",
            ),
            (|j| j.spec.data.samples = Some(0), "spec.data.samples"),
            (|j| j.spec.training.epochs = None, "spec.training"),
            (|j| j.spec.training.epochs = Some(0), "spec.training.epochs"),
            (|j| j.spec.training.steps = Some(0), "spec.training.steps"),
            (
                |j| j.spec.training.batch_size = 0,
                "spec.training.batchSize",
            ),
            (
                |j| j.spec.training.learning_rate = 0.0,
                "spec.training.learningRate",
            ),
            (|j| j.spec.training.momentum = 1.0, "spec.training.momentum"),
            (
                |j| j.spec.data_parallel.bucket_size_mib = 0,
                "spec.dataParallel.bucketSizeMiB",
            ),
            (
                |j| j.spec.data_parallel.timeout_seconds = 0,
                "spec.dataParallel.timeoutSeconds",
            ),
            (
                |j| {
                    j.spec.checkpoint = Some(rdu_crds::CheckpointSpec {
                        interval_steps: 0,
                        volume: None,
                        keep: 1,
                    })
                },
                "spec.checkpoint.intervalSteps",
            ),
            (
                |j| {
                    j.spec.checkpoint = Some(rdu_crds::CheckpointSpec {
                        interval_steps: 5,
                        volume: Some("ckpt".into()),
                        keep: 1,
                    })
                },
                "spec.checkpoint.volume",
            ),
            (
                |j| j.spec.run_policy.active_deadline_seconds = Some(0),
                "spec.runPolicy.activeDeadlineSeconds",
            ),
            (
                |j| {
                    j.spec.run_policy.scheduling_policy = Some(rdu_crds::SchedulingPolicy {
                        min_available: Some(5),
                        ..Default::default()
                    })
                },
                "spec.runPolicy.schedulingPolicy.minAvailable",
            ),
            (|j| j.metadata.name = None, "metadata.name"),
            (|j| j.metadata.name = Some("Mnist".into()), "metadata.name"),
            (|j| j.metadata.name = Some("a".repeat(60)), "metadata.name"),
        ];
        for (i, (breaker, field)) in cases.into_iter().enumerate() {
            let mut j = job("mnist", Some("ml"), 4);
            breaker(&mut j);
            assert_eq!(fields(&j), vec![field.to_string()], "case {i}");
        }
    }

    #[test]
    fn all_failures_are_reported_and_messages_name_fields() {
        let mut j = job("mnist", None, 4);
        j.spec.workers = 0;
        j.spec.tiles_per_worker = 5;
        let err = validate(&j).expect_err("invalid");
        assert_eq!(err.0.len(), 2);
        let text = err.to_string();
        assert!(text.contains("spec.workers must be at least 1"), "{text}");
        assert!(
            text.contains("spec.tilesPerWorker must be 1, 2, 4 or 8 (got 5)"),
            "{text}"
        );
    }

    #[test]
    fn checkpoint_volume_declared_in_template_is_accepted() {
        let mut j = job("mnist", None, 2);
        j.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"containers": [], "volumes": [{"name": "ckpt", "emptyDir": {}}]}
            }))
            .expect("template"),
        );
        j.spec.checkpoint = Some(rdu_crds::CheckpointSpec {
            interval_steps: 5,
            volume: Some("ckpt".into()),
            keep: 1,
        });
        assert_eq!(validate(&j), Ok(()));
    }
}
