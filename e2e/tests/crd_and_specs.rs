//! The generated CRD installs as a structural schema, the shipped examples are accepted by
//! `kubectl apply`, and bad specs are refused by the API server with the CRD's CEL messages.

use rdu_crds::failure_policy as fp;
use rdu_e2e::kit::{self, JobFixture};
use rdu_e2e::{Components, ControlPlane, create_namespace, install_crd, kubectl, workspace_root};
use serde_json::{Value, json};

const NAMESPACE: &str = "specs";

/// A valid job; each bad case changes one field of it.
fn base_job(name: &str) -> Value {
    JobFixture::new(NAMESPACE, name)
        .without("image")
        .tiles_per_worker(4)
        .model(json!({"name": "ffn-logreg", "hiddenSizes": [32]}))
        .data(json!({"source": "synthetic", "samples": 256}))
        .training(json!({"epochs": 1, "batchSize": 16, "learningRate": 0.1}))
        .value()
}

/// Sets `value` at the JSON pointer `path` (parents created as objects); `Value::Null` removes it.
fn with(mut job: Value, path: &str, value: Value) -> Value {
    let (parent, key) = path.rsplit_once('/').expect("a pointer with a parent");
    let mut target = &mut job;
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        target = target
            .as_object_mut()
            .expect("an object on the path")
            .entry(part)
            .or_insert_with(|| json!({}));
    }
    let object = target.as_object_mut().expect("an object at the parent");
    if value.is_null() {
        object.remove(key);
    } else {
        object.insert(key.to_string(), value);
    }
    job
}

/// (what is wrong, the changed job, the message the API must answer with).
fn bad_specs() -> Vec<(&'static str, Value, &'static str)> {
    let b = || base_job("bad");
    vec![
        (
            "zero workers",
            with(b(), "/spec/workers", json!(0)),
            "spec.workers must be at least 1",
        ),
        (
            "3 tiles",
            with(b(), "/spec/tilesPerWorker", json!(3)),
            "spec.tilesPerWorker must be 1, 2, 4 or 8",
        ),
        (
            "a benchmark warm-up over a minute",
            with(
                b(),
                "/spec/allReduceBenchmark",
                json!({"warmupMilliseconds": 60_001}),
            ),
            "spec.allReduceBenchmark.warmupMilliseconds must be at most 60000",
        ),
        (
            "no epochs nor steps",
            with(b(), "/spec/training/epochs", Value::Null),
            "spec.training needs epochs or steps",
        ),
        (
            "batch 0",
            with(b(), "/spec/training/batchSize", json!(0)),
            "spec.training.batchSize must be at least 1",
        ),
        (
            "learning rate 0",
            with(b(), "/spec/training/learningRate", json!(0.0)),
            "spec.training.learningRate must be greater than 0",
        ),
        (
            "momentum 1",
            with(b(), "/spec/training/momentum", json!(1.0)),
            "spec.training.momentum must be in [0, 1)",
        ),
        (
            "minThroughput 0",
            with(b(), "/spec/training/minThroughput", json!(0.0)),
            "spec.training.minThroughput must be greater than 0",
        ),
        (
            "inference without checkpoints",
            with(b(), "/spec/mode", json!("inference")),
            "spec.mode inference loads the newest checkpoint",
        ),
        (
            "csv without a path",
            with(b(), "/spec/data", json!({"source": "csv"})),
            "spec.data.path is required for csv and idx sources",
        ),
        (
            "idx without labels",
            with(
                b(),
                "/spec/data",
                json!({"source": "idx", "path": "train-images-idx3-ubyte.gz"}),
            ),
            "spec.data.labelsPath is required for the idx source",
        ),
        (
            "test fraction 1",
            with(b(), "/spec/data/testFraction", json!(1.0)),
            "spec.data.testFraction must be in [0, 1)",
        ),
        (
            "zero samples",
            with(b(), "/spec/data/samples", json!(0)),
            "spec.data.samples must be at least 1",
        ),
        (
            "hidden size 0",
            with(b(), "/spec/model/hiddenSizes", json!([16, 0])),
            "spec.model.hiddenSizes entries must be at least 1",
        ),
        (
            "a hidden layer wider than the ceiling",
            with(b(), "/spec/model/hiddenSizes", json!([16, 16385])),
            rdu_crds::consts::MAX_HIDDEN_SIZE_MESSAGE,
        ),
        (
            "a data file cap of 0 MiB",
            with(b(), "/spec/data/maxFileMiB", json!(0)),
            rdu_crds::consts::DATA_FILE_MIB_MESSAGE,
        ),
        (
            "checkpoint every 0 steps",
            with(b(), "/spec/checkpoint", json!({"intervalSteps": 0})),
            "spec.checkpoint.intervalSteps must be at least 1",
        ),
        (
            "a template volume and a claim template for checkpoints",
            with(
                b(),
                "/spec/checkpoint",
                json!({"intervalSteps": 10, "volume": "ckpt",
                       "volumeClaimTemplate": {"resources": {"requests": {"storage": "1Gi"}}}}),
            ),
            "spec.checkpoint.volume and spec.checkpoint.volumeClaimTemplate cannot both be set: keep volume to \
             write into a volume of spec.template, or volumeClaimTemplate for a claim the operator creates, and \
             remove the other",
        ),
        (
            "a claim template without a size",
            with(
                b(),
                "/spec/checkpoint",
                json!({"intervalSteps": 10, "volumeClaimTemplate": {"accessModes": ["ReadWriteOnce"]}}),
            ),
            "spec.checkpoint.volumeClaimTemplate.resources.requests.storage is required",
        ),
        (
            "world size below the compiled minimum",
            with(b(), "/spec/compile", json!({"minWorldSize": 4})),
            "spec.workers must be at least spec.compile.minWorldSize",
        ),
        (
            "deadline 0",
            with(b(), "/spec/runPolicy/activeDeadlineSeconds", json!(0)),
            "spec.runPolicy.activeDeadlineSeconds must be at least 1",
        ),
        (
            "collective timeout 0",
            with(b(), "/spec/dataParallel/timeoutSeconds", json!(0)),
            "spec.dataParallel.timeoutSeconds must be at least 1",
        ),
        (
            "bucket 0 MiB",
            with(b(), "/spec/dataParallel/bucketSizeMiB", json!(0)),
            "spec.dataParallel.bucketSizeMiB must be at least 1",
        ),
        (
            "input size 0",
            with(b(), "/spec/model/inputSize", json!(0)),
            "spec.model.inputSize must be at least 1",
        ),
        (
            "one class",
            with(b(), "/spec/model/classes", json!(1)),
            "spec.model.classes must be at least 2",
        ),
        (
            "a gang larger than the job",
            with(
                b(),
                "/spec/runPolicy/schedulingPolicy/minAvailable",
                json!(3),
            ),
            "spec.runPolicy.schedulingPolicy.minAvailable must be between 1 and spec.workers",
        ),
        (
            "tiles on one RDU through the device plugin",
            with(b(), "/spec/tileAllocation", json!({"sameRdu": true})),
            rdu_crds::tile_allocation::SAME_RDU_NEEDS_DRA,
        ),
        (
            "an RDU model through the device plugin",
            with(
                b(),
                "/spec/tileAllocation",
                json!({"api": "devicePlugin", "model": "SN30"}),
            ),
            rdu_crds::tile_allocation::MODEL_NEEDS_DRA,
        ),
        (
            "an RDU model that would break out of its selector",
            with(
                b(),
                "/spec/tileAllocation",
                json!({"api": "dra", "model": "SN30\" || true || \""}),
            ),
            rdu_crds::tile_allocation::MODEL_FORM,
        ),
        (
            "a failure rule with no exit code",
            rules(json!([{"action": "FailJob", "onExitCodes": {"operator": "In"}}])),
            fp::EMPTY_EXIT_CODES,
        ),
        (
            "exit codes and signals with nothing in common",
            rules(
                json!([{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}, "onSignals": [9]}]),
            ),
            fp::CODES_AND_SIGNALS_DISJOINT,
        ),
        (
            "a catch-all rule before another",
            rules(json!([{"action": "FailJob"}, {"action": "RestartJob", "onReasons": ["Hung"]}])),
            fp::CATCH_ALL_NOT_LAST,
        ),
        (
            "a rule on a rank the job does not have",
            rules(json!([{"action": "FailJob", "onRanks": [9]}])),
            fp::RANK_BEYOND_WORKERS,
        ),
        (
            "RestartJob with backoffLimit 0",
            with(
                rules(json!([{"action": "RestartJob", "onReasons": ["Hung"]}])),
                "/spec/runPolicy/backoffLimit",
                json!(0),
            ),
            fp::RESTART_WITHOUT_BACKOFF,
        ),
        (
            "RestartJobNotCounted with maxInfrastructureRestarts 0",
            with(
                rules(json!([{"action": "RestartJobNotCounted", "onReasons": ["PodDeleted"]}])),
                "/spec/runPolicy/maxInfrastructureRestarts",
                json!(0),
            ),
            fp::NOT_COUNTED_WITHOUT_BUDGET,
        ),
        (
            "a progress deadline too short to see progress",
            with(b(), "/spec/runPolicy/progressDeadlineSeconds", json!(5)),
            fp::PROGRESS_DEADLINE_MINIMUM,
        ),
    ]
}

/// The base job with these `spec.runPolicy.failurePolicy.rules`.
fn rules(rules: Value) -> Value {
    with(
        base_job("bad"),
        "/spec/runPolicy/failurePolicy/rules",
        rules,
    )
}

/// Local mode, the operator and the worker validate with `rdu_crds::validate_spec`; it must refuse every spec the
/// API refuses, with the API's message (runs without a control plane).
#[test]
fn the_rust_validation_refuses_what_the_api_refuses_with_the_same_message() {
    let base: rdu_crds::RduJob = serde_json::from_value(base_job("base")).expect("base job");
    assert_eq!(rdu_crds::validate_spec(&base.spec), Ok(()));
    for (what, job, message) in bad_specs() {
        let job: rdu_crds::RduJob = serde_json::from_value(job).expect(what);
        let errors = rdu_crds::validate_spec(&job.spec).expect_err(what);
        assert!(
            errors.iter().any(|e| e.message.contains(message)),
            "{what}: expected {message:?} in {errors:?}"
        );
    }
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn crd_installs_examples_apply_and_bad_specs_are_refused_with_the_cel_message() {
    let assets = kit::require_assets("crd_and_specs");
    let plane = ControlPlane::start(&assets, Components::default())
        .await
        .expect("control plane");

    // 1. The CRD is accepted and structural (a non-structural schema would be flagged by a condition).
    let crd = install_crd(&plane).await.expect("CRD installs");
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        !conditions
            .iter()
            .any(|c| c.type_ == "NonStructuralSchema" && c.status == "True"),
        "{conditions:?}"
    );
    create_namespace(&plane, NAMESPACE)
        .await
        .expect("namespace");

    // 2. Every shipped example is accepted as-is.
    let examples_dir = workspace_root().join("examples");
    let mut examples: Vec<_> = std::fs::read_dir(&examples_dir)
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    examples.sort();
    assert!(!examples.is_empty(), "no examples/*.yaml to apply");
    for example in &examples {
        let out = kubectl(
            &plane,
            &[
                "apply",
                "-n",
                NAMESPACE,
                "-f",
                &example.display().to_string(),
            ],
            None,
        )
        .unwrap_or_else(|e| {
            panic!(
                "{} refused: {}",
                example.display(),
                rdu_error_chain::Chain(&e)
            )
        });
        assert!(out.contains("created"), "{}: {out}", example.display());
    }

    // 3. The base of the bad cases is itself valid, so each refusal is due to its one change.
    let base = serde_json::to_string(&base_job("base")).unwrap();
    kit::apply(&plane, &base).expect("the base job is valid");

    let cases = bad_specs();
    assert!(cases.len() >= 10);
    for (what, job, message) in cases {
        let input = serde_json::to_string(&job).unwrap();
        match kit::apply(&plane, &input) {
            Ok(out) => panic!("{what}: accepted ({out}), expected {message:?}"),
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("is invalid"), "{what}: {text}");
                assert!(
                    text.contains(message),
                    "{what}: expected {message:?} in {text}"
                );
            }
        }
    }

    // 4. Transition rule: workers cannot change while the job runs, only when suspended.
    let grown = serde_json::to_string(&with(base_job("base"), "/spec/workers", json!(4))).unwrap();
    let refused = kit::apply(&plane, &grown).expect_err("resize while running");
    assert!(
        refused
            .to_string()
            .contains("immutable while the job runs: set spec.runPolicy.suspend to true first"),
        "{refused}"
    );
    let suspended = with(
        with(base_job("base"), "/spec/workers", json!(4)),
        "/spec/runPolicy/suspend",
        json!(true),
    );
    kit::apply(&plane, &serde_json::to_string(&suspended).unwrap())
        .expect("resize while suspended");
}
