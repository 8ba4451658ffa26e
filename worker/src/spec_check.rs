//! Validation of an RduJob spec with the same rules as the CRD's CEL (so local mode refuses what
//! `kubectl apply` refuses), each error naming the field and the fix.

use std::fmt;

use rdu_crds::{DataSource, RduJobSpec};

/// One refused field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path in the manifest, e.g. `spec.tilesPerWorker`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every rule of the CRD, collecting all violations.
pub fn validate(spec: &RduJobSpec) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut check = |ok: bool, field: &str, message: String| {
        if !ok {
            errors.push(FieldError {
                field: field.to_string(),
                message,
            });
        }
    };
    check(
        spec.workers >= 1,
        "spec.workers",
        format!("must be at least 1 (got {})", spec.workers),
    );
    check(
        [1, 2, 4, 8].contains(&spec.tiles_per_worker),
        "spec.tilesPerWorker",
        format!("must be 1, 2, 4 or 8 (got {})", spec.tiles_per_worker),
    );
    let model = &spec.model;
    check(
        model.hidden_sizes.len() <= 16,
        "spec.model.hiddenSizes",
        format!(
            "at most 16 hidden layers (got {})",
            model.hidden_sizes.len()
        ),
    );
    check(
        model.hidden_sizes.iter().all(|&h| h >= 1),
        "spec.model.hiddenSizes",
        "entries must be at least 1".into(),
    );
    check(
        model.input_size.is_none_or(|v| v >= 1),
        "spec.model.inputSize",
        "must be at least 1, or omitted to take it from the data".into(),
    );
    check(
        model.classes.is_none_or(|v| v >= 2),
        "spec.model.classes",
        "must be at least 2, or omitted to take it from the data".into(),
    );
    let data = &spec.data;
    check(
        data.source == DataSource::Synthetic || data.path.is_some(),
        "spec.data.path",
        "is required for csv and idx sources: set it to the data file".into(),
    );
    check(
        data.source != DataSource::Idx || data.labels_path.is_some(),
        "spec.data.labelsPath",
        "is required for the idx source: set it to the labels file".into(),
    );
    check(
        (0.0..1.0).contains(&data.test_fraction),
        "spec.data.testFraction",
        format!("must be in [0, 1) (got {})", data.test_fraction),
    );
    check(
        data.samples.is_none_or(|s| s >= 1),
        "spec.data.samples",
        "must be at least 1".into(),
    );
    let training = &spec.training;
    check(
        training.epochs.is_some() || training.steps.is_some(),
        "spec.training",
        "needs epochs or steps".into(),
    );
    check(
        training.epochs.is_none_or(|e| e >= 1),
        "spec.training.epochs",
        "must be at least 1".into(),
    );
    check(
        training.steps.is_none_or(|s| s >= 1),
        "spec.training.steps",
        "must be at least 1".into(),
    );
    check(
        training.batch_size >= 1,
        "spec.training.batchSize",
        "must be at least 1".into(),
    );
    check(
        training.learning_rate > 0.0 && training.learning_rate.is_finite(),
        "spec.training.learningRate",
        format!("must be greater than 0 (got {})", training.learning_rate),
    );
    check(
        (0.0..1.0).contains(&training.momentum),
        "spec.training.momentum",
        format!("must be in [0, 1) (got {})", training.momentum),
    );
    let dp = &spec.data_parallel;
    check(
        dp.bucket_size_mib >= 1,
        "spec.dataParallel.bucketSizeMiB",
        "must be at least 1".into(),
    );
    check(
        dp.timeout_seconds >= 1,
        "spec.dataParallel.timeoutSeconds",
        "must be at least 1".into(),
    );
    if let Some(compile) = &spec.compile {
        check(
            compile.min_world_size >= 1,
            "spec.compile.minWorldSize",
            "must be at least 1".into(),
        );
        check(
            spec.workers >= compile.min_world_size,
            "spec.workers",
            format!(
                "must be at least spec.compile.minWorldSize ({}): raise workers or compile for a smaller world size",
                compile.min_world_size
            ),
        );
    }
    if let Some(ckpt) = &spec.checkpoint {
        check(
            ckpt.interval_steps >= 1,
            "spec.checkpoint.intervalSteps",
            "must be at least 1".into(),
        );
        check(
            ckpt.keep >= 1,
            "spec.checkpoint.keep",
            "must be at least 1".into(),
        );
    }
    let run = &spec.run_policy;
    check(
        run.active_deadline_seconds.is_none_or(|s| s >= 1),
        "spec.runPolicy.activeDeadlineSeconds",
        "must be at least 1".into(),
    );
    if let Some(sched) = &run.scheduling_policy {
        check(
            sched.min_available.is_none_or(|m| m >= 1),
            "spec.runPolicy.schedulingPolicy.minAvailable",
            "must be at least 1".into(),
        );
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MINIMAL: &str = r#"
apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata: {name: t}
spec:
  workers: 2
  model: {name: ffn-logreg, hiddenSizes: [8]}
  data: {source: synthetic, samples: 64}
  training: {epochs: 1, batchSize: 8, learningRate: 0.1}
"#;

    pub(crate) fn minimal() -> RduJobSpec {
        rdu_crds::parse_manifest(MINIMAL).unwrap().spec
    }

    fn fields(spec: &RduJobSpec) -> Vec<String> {
        validate(spec)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn a_minimal_spec_is_valid() {
        assert_eq!(validate(&minimal()), Ok(()));
    }

    #[test]
    fn each_rule_names_its_field() {
        type Mutation = fn(&mut RduJobSpec);
        let cases: &[(&str, Mutation)] = &[
            ("spec.workers", |s| s.workers = 0),
            ("spec.tilesPerWorker", |s| s.tiles_per_worker = 3),
            ("spec.data.path", |s| s.data.source = DataSource::Csv),
            ("spec.data.labelsPath", |s| {
                s.data.source = DataSource::Idx;
                s.data.path = Some("x".into());
            }),
            ("spec.data.testFraction", |s| s.data.test_fraction = 1.0),
            ("spec.training", |s| s.training.epochs = None),
            ("spec.training.batchSize", |s| s.training.batch_size = 0),
            ("spec.training.learningRate", |s| {
                s.training.learning_rate = 0.0
            }),
            ("spec.training.momentum", |s| s.training.momentum = 1.5),
            ("spec.dataParallel.timeoutSeconds", |s| {
                s.data_parallel.timeout_seconds = 0
            }),
            ("spec.model.hiddenSizes", |s| s.model.hidden_sizes = vec![0]),
        ];
        for (field, mutate) in cases {
            let mut spec = minimal();
            mutate(&mut spec);
            assert_eq!(fields(&spec), vec![field.to_string()], "{field}");
        }
    }

    #[test]
    fn min_world_size_above_workers_is_refused() {
        let mut spec = minimal();
        spec.compile = Some(rdu_crds::CompileSpec { min_world_size: 4 });
        let errors = validate(&spec).unwrap_err();
        assert_eq!(errors[0].field, "spec.workers");
        assert!(errors[0].to_string().contains("minWorldSize"));
    }
}
