//! The spec rules of the CRD's schema and CEL, checked in Rust too, so that the operator, local mode and the worker
//! refuse exactly what `kubectl apply` refuses. Every message names the field and says how to fix it.

use std::fmt;

use crate::{DataSource, RduJobSpec, byte_size, consts};

mod job;
mod rules;
mod tiles;
pub use job::validate_job;
pub use rules::shadows;

/// One rule a spec breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field in the manifest, e.g. `spec.tilesPerWorker`.
    pub field: String,
    /// A sentence that starts with the field, says what is wrong and how to fix it.
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Collects the errors of one validation pass.
#[derive(Default)]
pub struct Checks(Vec<FieldError>);

impl Checks {
    /// Records `message` for `field` unless `ok`.
    pub fn check(&mut self, ok: bool, field: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.0.push(FieldError::new(field, message()));
        }
    }

    /// How many errors were recorded so far.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok` when nothing was recorded, else every error in the order found.
    pub fn finish(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// Every rule of the CRD's schema and CEL for the spec; collects all failures.
pub fn validate_spec(spec: &RduJobSpec) -> Result<(), Vec<FieldError>> {
    let mut c = Checks::default();
    check_world(&mut c, spec);
    check_model_and_data(&mut c, spec);
    check_training(&mut c, spec);
    check_benchmark(&mut c, spec);
    check_policies(&mut c, spec);
    rules::check_failure_policy(&mut c, spec);
    c.finish()
}

fn check_world(c: &mut Checks, spec: &RduJobSpec) {
    c.check(spec.workers >= 1, "spec.workers", || {
        format!("spec.workers must be at least 1 (got {})", spec.workers)
    });
    c.check(spec.workers <= consts::MAX_WORKERS, "spec.workers", || {
        format!("{} (got {})", consts::MAX_WORKERS_MESSAGE, spec.workers)
    });
    c.check(
        [1, 2, 4, 8].contains(&spec.tiles_per_worker),
        "spec.tilesPerWorker",
        || {
            format!(
                "spec.tilesPerWorker must be 1, 2, 4 or 8 (got {})",
                spec.tiles_per_worker
            )
        },
    );
    tiles::check(c, &spec.tile_allocation);
    if let Some(compile) = &spec.compile {
        c.check(
            compile.min_world_size >= 1,
            "spec.compile.minWorldSize",
            || "spec.compile.minWorldSize must be at least 1".into(),
        );
        c.check(spec.workers >= compile.min_world_size, "spec.workers", || {
            format!(
                "spec.workers must be at least spec.compile.minWorldSize ({} < {}): raise workers or compile for a \
                 smaller world size",
                spec.workers, compile.min_world_size
            )
        });
    }
}

fn check_model_and_data(c: &mut Checks, spec: &RduJobSpec) {
    let model = &spec.model;
    c.check(
        model.hidden_sizes.len() <= 16,
        "spec.model.hiddenSizes",
        || {
            format!(
                "spec.model.hiddenSizes has {} entries, at most 16 are allowed",
                model.hidden_sizes.len()
            )
        },
    );
    c.check(
        model.hidden_sizes.iter().all(|h| *h >= 1),
        "spec.model.hiddenSizes",
        || "spec.model.hiddenSizes entries must be at least 1".into(),
    );
    let widest = model.hidden_sizes.iter().copied().max().unwrap_or(0);
    c.check(
        widest <= consts::MAX_HIDDEN_SIZE,
        "spec.model.hiddenSizes",
        || format!("{} (got {widest})", consts::MAX_HIDDEN_SIZE_MESSAGE),
    );
    c.check(
        model.input_size.is_none_or(|v| v >= 1),
        "spec.model.inputSize",
        || "spec.model.inputSize must be at least 1, or omitted to take it from the data".into(),
    );
    c.check(
        model.classes.is_none_or(|v| v >= 2),
        "spec.model.classes",
        || "spec.model.classes must be at least 2, or omitted to take it from the data".into(),
    );

    let data = &spec.data;
    c.check(
        data.source == DataSource::Synthetic || data.path.is_some(),
        "spec.data.path",
        || "spec.data.path is required for csv and idx sources: set it to the data file".into(),
    );
    c.check(
        data.source != DataSource::Idx || data.labels_path.is_some(),
        "spec.data.labelsPath",
        || "spec.data.labelsPath is required for the idx source: set it to the labels file".into(),
    );
    c.check(
        (0.0..1.0).contains(&data.test_fraction),
        "spec.data.testFraction",
        || {
            format!(
                "spec.data.testFraction must be in [0, 1) (got {})",
                data.test_fraction
            )
        },
    );
    c.check(
        data.samples.is_none_or(|s| s >= 1),
        "spec.data.samples",
        || "spec.data.samples must be at least 1".into(),
    );
    c.check(
        data.max_file_mib
            .is_none_or(|m| (1..=consts::MAX_DATA_FILE_MIB).contains(&m)),
        "spec.data.maxFileMiB",
        || {
            format!(
                "{} (got {})",
                consts::DATA_FILE_MIB_MESSAGE,
                data.max_file_mib.unwrap_or_default()
            )
        },
    );
}

fn check_training(c: &mut Checks, spec: &RduJobSpec) {
    let training = &spec.training;
    c.check(
        training.epochs.is_some() || training.steps.is_some(),
        "spec.training",
        || "spec.training needs epochs or steps".into(),
    );
    c.check(
        training.epochs.is_none_or(|e| e >= 1),
        "spec.training.epochs",
        || "spec.training.epochs must be at least 1".into(),
    );
    c.check(
        training.steps.is_none_or(|s| s >= 1),
        "spec.training.steps",
        || "spec.training.steps must be at least 1".into(),
    );
    c.check(training.batch_size >= 1, "spec.training.batchSize", || {
        "spec.training.batchSize must be at least 1".into()
    });
    c.check(
        training.learning_rate > 0.0 && training.learning_rate.is_finite(),
        "spec.training.learningRate",
        || {
            format!(
                "spec.training.learningRate must be greater than 0 (got {})",
                training.learning_rate
            )
        },
    );
    c.check(
        (0.0..1.0).contains(&training.momentum),
        "spec.training.momentum",
        || {
            format!(
                "spec.training.momentum must be in [0, 1) (got {})",
                training.momentum
            )
        },
    );
    c.check(
        training
            .min_throughput
            .is_none_or(|t| t > 0.0 && t.is_finite()),
        "spec.training.minThroughput",
        || "spec.training.minThroughput must be greater than 0 (samples per second)".into(),
    );
    c.check(
        spec.mode != crate::RunMode::Inference || spec.checkpoint.is_some(),
        "spec.checkpoint",
        || INFERENCE_NEEDS_CHECKPOINT.into(),
    );
    c.check(
        spec.mode != crate::RunMode::AllReduceBenchmark || training.min_throughput.is_none(),
        "spec.training.minThroughput",
        || BENCHMARK_HAS_NO_THROUGHPUT.into(),
    );
}

/// The message of the rule that `spec.mode: allReduceBenchmark` sets no training throughput to reach.
pub const BENCHMARK_HAS_NO_THROUGHPUT: &str = "spec.training.minThroughput is a training throughput (samples per \
    second) and spec.mode allReduceBenchmark trains nothing: remove minThroughput, or run another mode";

/// Largest number of sizes one benchmark lists.
pub const MAX_BENCHMARK_SIZES: usize = 32;

fn check_benchmark(c: &mut Checks, spec: &RduJobSpec) {
    let Some(bench) = &spec.all_reduce_benchmark else {
        return;
    };
    c.check(
        (1..=MAX_BENCHMARK_SIZES).contains(&bench.sizes.len()),
        "spec.allReduceBenchmark.sizes",
        || {
            format!(
                "spec.allReduceBenchmark.sizes must list 1 to {MAX_BENCHMARK_SIZES} sizes (got {})",
                bench.sizes.len()
            )
        },
    );
    if let Some(error) = bench.sizes.iter().find_map(|s| byte_size::parse(s).err()) {
        c.check(false, "spec.allReduceBenchmark.sizes", || error);
    }
    c.check(
        bench.warmup_milliseconds <= 60_000,
        "spec.allReduceBenchmark.warmupMilliseconds",
        || "spec.allReduceBenchmark.warmupMilliseconds must be at most 60000".into(),
    );
    c.check(
        bench.warmup_iterations <= 1000,
        "spec.allReduceBenchmark.warmupIterations",
        || "spec.allReduceBenchmark.warmupIterations must be at most 1000".into(),
    );
    c.check(
        (1..=10_000).contains(&bench.iterations),
        "spec.allReduceBenchmark.iterations",
        || "spec.allReduceBenchmark.iterations must be between 1 and 10000".into(),
    );
}

/// The message of the rule that `spec.mode: inference` names its checkpoints.
pub const INFERENCE_NEEDS_CHECKPOINT: &str = "spec.mode inference loads the newest checkpoint: set spec.checkpoint to the storage a training run of this job wrote";

fn check_policies(c: &mut Checks, spec: &RduJobSpec) {
    let dp = &spec.data_parallel;
    c.check(
        dp.bucket_size_mib >= 1,
        "spec.dataParallel.bucketSizeMiB",
        || "spec.dataParallel.bucketSizeMiB must be at least 1".into(),
    );
    c.check(
        dp.timeout_seconds >= 1,
        "spec.dataParallel.timeoutSeconds",
        || "spec.dataParallel.timeoutSeconds must be at least 1".into(),
    );
    if let Some(ckpt) = &spec.checkpoint {
        c.check(
            ckpt.interval_steps >= 1,
            "spec.checkpoint.intervalSteps",
            || "spec.checkpoint.intervalSteps must be at least 1".into(),
        );
        c.check(ckpt.keep >= 1, "spec.checkpoint.keep", || {
            "spec.checkpoint.keep must be at least 1".into()
        });
        c.check(
            ckpt.volume.is_none() || ckpt.volume_claim_template.is_none(),
            "spec.checkpoint",
            || {
                "spec.checkpoint.volume and spec.checkpoint.volumeClaimTemplate cannot both be set: keep volume to \
                 write into a volume of spec.template, or volumeClaimTemplate for a claim the operator creates, and \
                 remove the other"
                    .into()
            },
        );
        if let Some(claim) = &ckpt.volume_claim_template {
            let sized = claim
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some_and(|r| r.contains_key("storage"));
            c.check(
                sized,
                "spec.checkpoint.volumeClaimTemplate.resources.requests.storage",
                || {
                    "spec.checkpoint.volumeClaimTemplate.resources.requests.storage is required: set the size of \
                     the checkpoint volume, e.g. 1Gi"
                        .into()
                },
            );
        }
    }
    let run = &spec.run_policy;
    c.check(
        run.active_deadline_seconds.is_none_or(|s| s >= 1),
        "spec.runPolicy.activeDeadlineSeconds",
        || "spec.runPolicy.activeDeadlineSeconds must be at least 1".into(),
    );
    if let Some(min) = run.scheduling_policy.as_ref().and_then(|s| s.min_available) {
        c.check(
            (1..=spec.workers).contains(&min),
            "spec.runPolicy.schedulingPolicy.minAvailable",
            || {
                format!(
                    "spec.runPolicy.schedulingPolicy.minAvailable must be between 1 and spec.workers ({}), got {min}",
                    spec.workers
                )
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckpointSpec, CompileSpec, SchedulingPolicy};
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

    const MINIMAL: &str = r#"
apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata: {name: t}
spec:
  workers: 4
  model: {name: ffn-logreg, hiddenSizes: [8]}
  data: {source: synthetic, samples: 64}
  training: {epochs: 1, batchSize: 8, learningRate: 0.1}
"#;

    fn minimal() -> RduJobSpec {
        crate::parse_manifest(MINIMAL).expect("fixture").spec
    }

    fn fields(spec: &RduJobSpec) -> Vec<String> {
        validate_spec(spec)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    fn bench(
        sizes: &[&str],
        warmup_iterations: u32,
        iterations: u32,
    ) -> crate::AllReduceBenchmarkSpec {
        crate::AllReduceBenchmarkSpec {
            sizes: sizes.iter().map(|s| s.to_string()).collect(),
            warmup_milliseconds: 0,
            warmup_iterations,
            iterations,
        }
    }

    #[test]
    fn a_benchmark_needs_no_throughput_and_its_defaults_are_valid() {
        let mut spec = minimal();
        spec.mode = crate::RunMode::AllReduceBenchmark;
        assert_eq!(validate_spec(&spec), Ok(()), "the defaults, unset");
        spec.all_reduce_benchmark = Some(Default::default());
        assert_eq!(validate_spec(&spec), Ok(()), "the defaults, written");
        spec.training.min_throughput = Some(10.0);
        let errors = validate_spec(&spec).expect_err("a throughput to reach");
        assert_eq!(errors[0].message, BENCHMARK_HAS_NO_THROUGHPUT);
        // Training modes keep their minThroughput, and ignore the benchmark's settings.
        spec.mode = crate::RunMode::Train;
        assert_eq!(validate_spec(&spec), Ok(()));
    }

    #[test]
    fn a_bad_size_is_refused_with_the_crds_message_and_the_entry() {
        let mut spec = minimal();
        spec.all_reduce_benchmark = Some(bench(&["64Mi", "512Mi"], 5, 20));
        let errors = validate_spec(&spec).expect_err("512Mi");
        assert_eq!(
            errors[0].message,
            format!("{} (got \"512Mi\")", byte_size::SIZE_MESSAGE)
        );
    }

    fn sized_claim() -> PersistentVolumeClaimSpec {
        serde_json::from_value(serde_json::json!({"resources": {"requests": {"storage": "64Mi"}}}))
            .expect("claim")
    }

    #[test]
    fn a_minimal_spec_is_valid() {
        assert_eq!(validate_spec(&minimal()), Ok(()));
    }

    #[test]
    fn the_world_size_ceiling_is_inclusive_and_says_what_the_crd_says() {
        let mut spec = minimal();
        spec.workers = consts::MAX_WORKERS;
        assert_eq!(validate_spec(&spec), Ok(()));
        spec.workers = consts::MAX_WORKERS + 1;
        let errors = validate_spec(&spec).expect_err("above the ceiling");
        assert_eq!(
            errors,
            vec![FieldError::new(
                "spec.workers",
                format!("{} (got 4097)", consts::MAX_WORKERS_MESSAGE)
            )]
        );
        spec.workers = u32::MAX;
        assert_eq!(validate_spec(&spec).map_err(|e| e.len()), Err(1));
    }

    #[test]
    fn the_widest_layer_is_inclusive_and_says_what_the_crd_says() {
        let mut spec = minimal();
        spec.model.hidden_sizes = vec![consts::MAX_HIDDEN_SIZE, 16];
        assert_eq!(validate_spec(&spec), Ok(()));
        spec.model.hidden_sizes = vec![16, u32::MAX];
        assert_eq!(
            validate_spec(&spec),
            Err(vec![FieldError::new(
                "spec.model.hiddenSizes",
                format!("{} (got 4294967295)", consts::MAX_HIDDEN_SIZE_MESSAGE)
            )])
        );
    }

    #[test]
    fn the_data_file_cap_defaults_to_a_gibibyte_and_is_bounded() {
        let mut spec = minimal();
        assert_eq!(spec.data.max_file_bytes(), 1 << 30);
        spec.data.max_file_mib = Some(consts::MAX_DATA_FILE_MIB);
        assert_eq!(validate_spec(&spec), Ok(()));
        assert_eq!(spec.data.max_file_bytes(), 64 << 30);
        spec.data.max_file_mib = Some(0);
        assert_eq!(
            validate_spec(&spec),
            Err(vec![FieldError::new(
                "spec.data.maxFileMiB",
                format!("{} (got 0)", consts::DATA_FILE_MIB_MESSAGE)
            )])
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        type Breaker = fn(&mut RduJobSpec);
        let cases: Vec<(Breaker, &str)> = vec![
            (|s| s.workers = 0, "spec.workers"),
            (|s| s.workers = consts::MAX_WORKERS + 1, "spec.workers"),
            (|s| s.tiles_per_worker = 3, "spec.tilesPerWorker"),
            (
                |s| s.training.min_throughput = Some(0.0),
                "spec.training.minThroughput",
            ),
            (|s| s.mode = crate::RunMode::Inference, "spec.checkpoint"),
            (
                |s| {
                    s.mode = crate::RunMode::AllReduceBenchmark;
                    s.training.min_throughput = Some(100.0);
                },
                "spec.training.minThroughput",
            ),
            (
                |s| s.all_reduce_benchmark = Some(bench(&[], 0, 1)),
                "spec.allReduceBenchmark.sizes",
            ),
            (
                |s| s.all_reduce_benchmark = Some(bench(&["4Ki"; 33], 0, 1)),
                "spec.allReduceBenchmark.sizes",
            ),
            (
                |s| s.all_reduce_benchmark = Some(bench(&["4Ki", "3"], 0, 1)),
                "spec.allReduceBenchmark.sizes",
            ),
            (
                |s| {
                    s.all_reduce_benchmark = Some(crate::AllReduceBenchmarkSpec {
                        warmup_milliseconds: 60_001,
                        ..bench(&["4Ki"], 0, 1)
                    })
                },
                "spec.allReduceBenchmark.warmupMilliseconds",
            ),
            (
                |s| s.all_reduce_benchmark = Some(bench(&["4Ki"], 1001, 1)),
                "spec.allReduceBenchmark.warmupIterations",
            ),
            (
                |s| s.all_reduce_benchmark = Some(bench(&["4Ki"], 0, 0)),
                "spec.allReduceBenchmark.iterations",
            ),
            (
                |s| s.all_reduce_benchmark = Some(bench(&["4Ki"], 0, 10_001)),
                "spec.allReduceBenchmark.iterations",
            ),
            (
                |s| s.compile = Some(CompileSpec { min_world_size: 8 }),
                "spec.workers",
            ),
            (
                |s| s.compile = Some(CompileSpec { min_world_size: 0 }),
                "spec.compile.minWorldSize",
            ),
            (|s| s.model.hidden_sizes = vec![0], "spec.model.hiddenSizes"),
            (
                |s| s.model.hidden_sizes = vec![1; 17],
                "spec.model.hiddenSizes",
            ),
            (
                |s| s.model.hidden_sizes = vec![8, consts::MAX_HIDDEN_SIZE + 1],
                "spec.model.hiddenSizes",
            ),
            (|s| s.data.max_file_mib = Some(0), "spec.data.maxFileMiB"),
            (
                |s| s.data.max_file_mib = Some(consts::MAX_DATA_FILE_MIB + 1),
                "spec.data.maxFileMiB",
            ),
            (|s| s.model.input_size = Some(0), "spec.model.inputSize"),
            (|s| s.model.classes = Some(1), "spec.model.classes"),
            (|s| s.data.source = DataSource::Csv, "spec.data.path"),
            (
                |s| {
                    s.data.source = DataSource::Idx;
                    s.data.path = Some("x".into());
                },
                "spec.data.labelsPath",
            ),
            (|s| s.data.test_fraction = 1.0, "spec.data.testFraction"),
            (|s| s.data.samples = Some(0), "spec.data.samples"),
            (|s| s.training.epochs = None, "spec.training"),
            (|s| s.training.epochs = Some(0), "spec.training.epochs"),
            (|s| s.training.steps = Some(0), "spec.training.steps"),
            (|s| s.training.batch_size = 0, "spec.training.batchSize"),
            (
                |s| s.training.learning_rate = 0.0,
                "spec.training.learningRate",
            ),
            (
                |s| s.training.learning_rate = f64::NAN,
                "spec.training.learningRate",
            ),
            (|s| s.training.momentum = 1.0, "spec.training.momentum"),
            (
                |s| s.data_parallel.bucket_size_mib = 0,
                "spec.dataParallel.bucketSizeMiB",
            ),
            (
                |s| s.data_parallel.timeout_seconds = 0,
                "spec.dataParallel.timeoutSeconds",
            ),
            (
                |s| {
                    s.checkpoint = Some(CheckpointSpec {
                        interval_steps: 0,
                        volume: None,
                        volume_claim_template: None,
                        keep: 1,
                    })
                },
                "spec.checkpoint.intervalSteps",
            ),
            (
                |s| {
                    s.checkpoint = Some(CheckpointSpec {
                        interval_steps: 5,
                        volume: None,
                        volume_claim_template: None,
                        keep: 0,
                    })
                },
                "spec.checkpoint.keep",
            ),
            (
                |s| {
                    s.checkpoint = Some(CheckpointSpec {
                        interval_steps: 5,
                        volume: Some("ckpt".into()),
                        volume_claim_template: Some(sized_claim()),
                        keep: 1,
                    })
                },
                "spec.checkpoint",
            ),
            (
                |s| {
                    s.checkpoint = Some(CheckpointSpec {
                        interval_steps: 5,
                        volume: None,
                        volume_claim_template: Some(PersistentVolumeClaimSpec::default()),
                        keep: 1,
                    })
                },
                "spec.checkpoint.volumeClaimTemplate.resources.requests.storage",
            ),
            (
                |s| s.run_policy.active_deadline_seconds = Some(0),
                "spec.runPolicy.activeDeadlineSeconds",
            ),
            (
                |s| {
                    s.run_policy.scheduling_policy = Some(SchedulingPolicy {
                        min_available: Some(5),
                        ..Default::default()
                    })
                },
                "spec.runPolicy.schedulingPolicy.minAvailable",
            ),
        ];
        for (i, (breaker, field)) in cases.into_iter().enumerate() {
            let mut spec = minimal();
            breaker(&mut spec);
            assert_eq!(fields(&spec), vec![field.to_string()], "case {i}: {field}");
        }
    }

    #[test]
    fn a_sized_claim_template_alone_is_valid_and_the_refusal_names_both_fields() {
        let mut spec = minimal();
        spec.checkpoint = Some(CheckpointSpec {
            interval_steps: 5,
            volume: None,
            volume_claim_template: Some(sized_claim()),
            keep: 2,
        });
        assert_eq!(validate_spec(&spec), Ok(()));
        if let Some(c) = spec.checkpoint.as_mut() {
            c.volume = Some("ckpt".into());
        }
        let errors = validate_spec(&spec).expect_err("both set");
        let text = errors[0].to_string();
        assert!(
            text.contains(
                "spec.checkpoint.volume and spec.checkpoint.volumeClaimTemplate cannot both be set"
            ) && text.contains("remove the other"),
            "{text}"
        );
    }

    #[test]
    fn every_failure_is_reported_with_a_message_that_starts_with_its_field() {
        let mut spec = minimal();
        spec.workers = 0;
        spec.tiles_per_worker = 5;
        spec.training.batch_size = 0;
        let errors = validate_spec(&spec).expect_err("invalid");
        assert_eq!(errors.len(), 3, "{errors:?}");
        for e in &errors {
            assert!(e.to_string().starts_with(&e.field), "{e:?}");
        }
        assert_eq!(
            errors[1].to_string(),
            "spec.tilesPerWorker must be 1, 2, 4 or 8 (got 5)"
        );
    }
}
