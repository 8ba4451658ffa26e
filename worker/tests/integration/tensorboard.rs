//! Rank 0's TensorBoard event files, read back by TensorBoard's own `EventAccumulator` (Python): every scalar
//! at the global steps it belongs to. Skips when the `tensorboard` package is missing, unless
//! `RDU_REQUIRE_TENSORBOARD=1` (CI); `RDU_TENSORBOARD_PYTHON` names the interpreter (default `python3`).

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;

use rdu_crds::consts::env;

type Scalars = BTreeMap<String, Vec<(u64, f64)>>;

fn python() -> String {
    std::env::var("RDU_TENSORBOARD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether TensorBoard can be imported; panics when it cannot but is required.
fn tensorboard_available() -> bool {
    let ok = Command::new(python())
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var("RDU_REQUIRE_TENSORBOARD").as_deref() == Ok("1") {
        panic!(
            "RDU_REQUIRE_TENSORBOARD=1 but `{} -c 'import tensorboard'` fails",
            python()
        );
    }
    if !ok {
        eprintln!(
            "skipped: the tensorboard Python package is not installed (pip install tensorboard)"
        );
    }
    ok
}

fn read_scalars(dir: &std::path::Path) -> Scalars {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/tensorboard/read_scalars.py"
    );
    let out = Command::new(python())
        .arg(script)
        .arg(dir)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw: BTreeMap<String, Vec<(u64, f64)>> =
        serde_json::from_slice(&out.stdout).expect("scalars as JSON");
    raw
}

#[test]
fn tensorboard_reads_every_scalar_at_its_step() {
    if !tensorboard_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("tensorboard");
    let result = dir.path().join("result.json");
    // SPEC over 2 ranks: 480 training samples, 240 per rank, batches of 16: 15 steps per epoch, 3 epochs.
    let codes = common::run_job_with(
        2,
        |spec| {
            spec["tensorboard"] = serde_json::json!({});
            // Rank 0 writes event files between collectives: on a loaded machine that can outlast SPEC's 5 s.
            spec["dataParallel"]["timeoutSeconds"] = serde_json::json!(30);
        },
        &result,
        None,
        &[(env::TENSORBOARD_DIR, logs.display().to_string())],
    );
    assert_eq!(codes, vec![0, 0]);
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    let scalars = read_scalars(&logs);

    let steps = |tag: &str| -> Vec<u64> {
        scalars
            .get(tag)
            .unwrap_or_else(|| panic!("no {tag} in {:?}", scalars.keys()))
            .iter()
            .map(|(s, _)| *s)
            .collect()
    };
    let every_step: Vec<u64> = (1..=45).collect();
    assert_eq!(steps("train/loss"), every_step);
    assert_eq!(steps("train/learning_rate"), every_step);
    assert_eq!(steps("train/samples_per_second"), every_step);
    assert_eq!(steps("train/accuracy"), [15, 30, 45]);
    assert_eq!(steps("train/epoch_loss"), [15, 30, 45]);
    assert_eq!(steps("test/accuracy"), [45]);
    assert!(
        scalars["train/learning_rate"]
            .iter()
            .all(|(_, v)| (*v - 0.01).abs() < 1e-6)
    );
    let test_accuracy = scalars["test/accuracy"][0].1;
    let want = result["testAccuracy"].as_f64().unwrap();
    assert!(
        (test_accuracy - want).abs() < 1e-6,
        "{test_accuracy} vs {want}"
    );
    let losses: Vec<f64> = scalars["train/epoch_loss"]
        .iter()
        .map(|(_, v)| *v)
        .collect();
    assert!(
        losses[2] < losses[0],
        "training lowers the loss: {losses:?}"
    );
}
