//! The seeds' other run modes over several ranks in threads: `measurePerformance` (timed steps after a warm-up),
//! `inference` (forward only, from the newest checkpoint), and `training.minThroughput` failing a slow run.

use crate::common;

use rdu_crds::consts::exit_code;
use serde_json::{Value, json};

fn read(result: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(result).expect("result")).expect("JSON")
}

#[test]
fn measure_performance_times_the_steps_after_the_warm_up() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let codes = common::run_job(
        2,
        |spec| {
            spec["mode"] = json!("measurePerformance");
            spec["training"]["steps"] = json!(12);
            spec["training"]["warmupSteps"] = json!(3);
        },
        &result,
        None,
    );
    assert_eq!(codes, vec![0, 0]);
    let json = read(&result);
    assert_eq!(json["mode"], "measurePerformance", "{json}");
    assert_eq!(json["globalSteps"], 12, "only the timed steps: {json}");
    let p50 = json["stepLatencyP50Seconds"].as_f64().expect("p50");
    let p99 = json["stepLatencyP99Seconds"].as_f64().expect("p99");
    assert!(0.0 < p50 && p50 <= p99, "{json}");
    assert!(json["samplesPerSecond"].as_f64().expect("throughput") > 0.0);
    // Where the timed steps went: phases measured inside each step, so they add up to at most its mean time.
    let phases = &json["stepPhases"];
    assert_eq!(phases["steps"], 12, "the timed steps only: {json}");
    let seconds = |name: &str| phases[name].as_f64().unwrap_or(-1.0);
    let parts = [
        "gatherSeconds",
        "computeSeconds",
        "exposedReduceSeconds",
        "optimizerSeconds",
    ];
    assert!(parts.iter().all(|p| seconds(p) >= 0.0), "{json}");
    assert!(seconds("computeSeconds") > 0.0, "{json}");
    let mean_step = json["trainSeconds"].as_f64().expect("seconds") / 12.0;
    let sum: f64 = parts.iter().map(|p| seconds(p)).sum();
    assert!(
        sum <= mean_step,
        "phases {sum} s beyond the mean step {mean_step} s: {json}"
    );
}

#[test]
fn inference_reproduces_the_trained_models_test_accuracy_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let trained = dir.path().join("trained.json");
    // 480 training samples over 2 ranks, batches of 16: 15 steps per epoch, 45 in all; a checkpoint every 15
    // steps leaves the final parameters in the newest one.
    let checkpointed = |spec: &mut Value| {
        spec["checkpoint"] = json!({"intervalSteps": 15, "keep": 1});
    };
    assert_eq!(
        common::run_job(2, checkpointed, &trained, Some(&checkpoints)),
        vec![0, 0]
    );
    let inferred = dir.path().join("inferred.json");
    let codes = common::run_job(
        2,
        |spec| {
            checkpointed(spec);
            spec["mode"] = json!("inference");
            spec["training"]["warmupSteps"] = json!(1);
        },
        &inferred,
        Some(&checkpoints),
    );
    assert_eq!(codes, vec![0, 0]);
    let (trained, inferred) = (read(&trained), read(&inferred));
    assert_eq!(inferred["mode"], "inference");
    assert_eq!(
        inferred["testAccuracy"], trained["testAccuracy"],
        "the same parameters on the same test split: {trained} vs {inferred}"
    );
    assert!(
        inferred["stepLatencyP99Seconds"].as_f64().is_some(),
        "{inferred}"
    );
}

#[test]
fn inference_without_a_checkpoint_is_a_permanent_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let empty = dir.path().join("empty");
    let codes = common::run_job(
        2,
        |spec| {
            spec["checkpoint"] = json!({"intervalSteps": 15});
            spec["mode"] = json!("inference");
        },
        &result,
        Some(&empty),
    );
    assert_eq!(codes, vec![exit_code::BAD_CONFIG, exit_code::BAD_CONFIG]);
    assert!(!result.exists());
}

#[test]
fn a_run_below_min_throughput_fails_permanently_and_names_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let codes = common::run_job(
        2,
        |spec| spec["training"]["minThroughput"] = json!(1e12),
        &result,
        None,
    );
    assert_eq!(codes[0], exit_code::BELOW_MIN_THROUGHPUT, "{codes:?}");
    assert_eq!(
        codes[1],
        exit_code::RETRYABLE,
        "rank 0 aborted the others: {codes:?}"
    );

    let ok = dir.path().join("ok.json");
    let codes = common::run_job(
        2,
        |spec| spec["training"]["minThroughput"] = json!(1.0),
        &ok,
        None,
    );
    assert_eq!(codes, vec![0, 0], "above the minimum");
}

#[test]
fn the_all_reduce_benchmark_times_every_size_and_reports_bus_bandwidth() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let codes = common::run_job(
        3,
        |spec| {
            spec["mode"] = json!("allReduceBenchmark");
            spec["allReduceBenchmark"] =
                json!({"sizes": ["4Ki", "64Ki", "1Mi"], "warmupIterations": 1, "iterations": 3});
            // Not read in this mode: a data file that does not exist is no failure.
            spec["data"] = json!({"source": "csv", "path": "no/such/file.csv"});
        },
        &result,
        None,
    );
    assert_eq!(codes, vec![0, 0, 0]);
    let json = read(&result);
    assert_eq!(json["mode"], "allReduceBenchmark", "{json}");
    let bench = &json["allReduce"];
    assert_eq!(
        (bench["ranks"].as_u64(), bench["iterations"].as_u64()),
        (Some(3), Some(3))
    );
    // The default warm-up (250 ms of the largest size) ran, and all ranks left it together (or the sizes after
    // it would not line up and the job would fail).
    assert!(bench["warmupRounds"].as_u64() >= Some(1), "{json}");
    let sizes = bench["sizes"].as_array().expect("sizes");
    let bytes: Vec<u64> = sizes.iter().map(|s| s["bytes"].as_u64().unwrap()).collect();
    assert_eq!(bytes, [4096, 65536, 1 << 20]);
    for size in sizes {
        let busbw = size["busbwGbps"].as_f64().expect("busbw");
        let algbw = size["algbwGbps"].as_f64().expect("algbw");
        assert!(busbw > 0.0 && busbw.is_finite(), "{size}");
        assert!(
            (busbw - algbw * 4.0 / 3.0).abs() <= 1e-3 * busbw,
            "2(n-1)/n at 3 ranks: {size}"
        );
        assert_eq!(size["wrongValues"], 0, "{size}");
    }
}
