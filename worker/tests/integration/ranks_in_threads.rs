//! Several ranks of one job in one process (each on its own thread and runtime), over loopback gRPC:
//! training converges, replicas stay identical, rank 0 writes the result, a wrong token is refused, and
//! checkpoints work when only rank 0 has a checkpoint directory (as with a checkpoint claim on a cluster).

use rdu_crds::consts::env;

use crate::common;
use crate::common::rank_vars;

/// Runs `world` ranks, rank r with `tokens[r]`; returns their exit codes.
fn run_ranks(world: u32, tokens: &[&str], result: &std::path::Path) -> Vec<i32> {
    let master_port = common::free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let vars = rank_vars(rank, world, master_port, tokens[rank as usize], result);
            std::thread::spawn(move || rdu_worker::run(|k| vars.get(k).cloned()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn three_ranks_train_and_rank_0_writes_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let codes = run_ranks(3, &["tok", "tok", "tok"], &result);
    assert_eq!(codes, vec![0, 0, 0]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert!(json["testAccuracy"].as_f64().unwrap() > 0.9, "{json}");
    // 480 training samples over 3 ranks, 16 per batch: 10 steps per epoch.
    assert_eq!(json["globalSteps"], 30);
}

#[test]
fn a_rank_with_the_wrong_token_is_refused_and_nobody_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let codes = run_ranks(2, &["tok", "other"], &result);
    assert!(codes.iter().all(|&c| c != 0), "{codes:?}");
    assert!(!result.exists());
}

/// Runs 3 checkpointing ranks where only rank 0 has a checkpoint directory; returns their exit codes.
fn run_checkpointed(result: &std::path::Path, checkpoints: &std::path::Path) -> Vec<i32> {
    let master_port = common::free_port();
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let mut vars = rank_vars(rank, 3, master_port, "tok", result);
            let mut spec: serde_json::Value = serde_json::from_str(&vars[env::JOB_SPEC]).unwrap();
            spec["checkpoint"] = serde_json::json!({"intervalSteps": 10, "keep": 2});
            vars.insert(env::JOB_SPEC.into(), spec.to_string());
            if rank == 0 {
                vars.insert(
                    env::CHECKPOINT_DIR.into(),
                    checkpoints.display().to_string(),
                );
            }
            std::thread::spawn(move || rdu_worker::run(|k| vars.get(k).cloned()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn only_rank_0_needs_a_checkpoint_directory_to_checkpoint_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let result = dir.path().join("result.json");
    assert_eq!(run_checkpointed(&result, &checkpoints), vec![0, 0, 0]);
    let written: Vec<_> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ckpt-"))
        .collect();
    assert_eq!(written.len(), 2, "keep 2: {written:?}");

    // A second gang finds rank 0's newest checkpoint (step 30, the end) and every rank resumes from it.
    std::fs::remove_file(&result).unwrap();
    assert_eq!(run_checkpointed(&result, &checkpoints), vec![0, 0, 0]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert_eq!(json["globalSteps"], 30, "{json}");
    assert!(json["testAccuracy"].as_f64().unwrap() > 0.9, "{json}");
}
