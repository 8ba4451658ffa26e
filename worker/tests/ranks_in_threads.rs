//! Several ranks of one job in one process (each on its own thread and runtime), over loopback gRPC:
//! training converges, replicas stay identical, rank 0 writes the result, a wrong token is refused, and
//! checkpoints work when only rank 0 has a checkpoint directory (as with a checkpoint claim on a cluster).

use std::collections::HashMap;
use std::net::TcpListener;

use rdu_crds::consts::env;

const SPEC: &str = r#"{"workers":3,"tilesPerWorker":2,
 "model":{"name":"ffn-logreg","hiddenSizes":[16],"inputSize":8,"classes":3},
 "data":{"source":"synthetic","samples":600,"seed":3},
 "training":{"epochs":3,"batchSize":16,"learningRate":0.01,"optimizer":"adam"},
 "dataParallel":{"timeoutSeconds":5}}"#;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rank_vars(
    rank: u32,
    world: u32,
    master_port: u16,
    token: &str,
    result: &std::path::Path,
) -> HashMap<String, String> {
    [
        (env::RANK, rank.to_string()),
        (env::WORLD_SIZE, world.to_string()),
        (env::MASTER_ADDR, "127.0.0.1".into()),
        (env::MASTER_PORT, master_port.to_string()),
        (env::COLLECTIVE_PORT, free_port().to_string()),
        (env::JOB_NAME, "t".into()),
        (env::JOB_UID, "uid-t".into()),
        (env::JOB_TOKEN, token.into()),
        (env::GENERATION, "0".into()),
        (
            env::JOB_SPEC,
            SPEC.replace("\"workers\":3", &format!("\"workers\":{world}")),
        ),
        (env::RESULT_PATH, result.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Runs `world` ranks, rank r with `tokens[r]`; returns their exit codes.
fn run_ranks(world: u32, tokens: &[&str], result: &std::path::Path) -> Vec<i32> {
    let master_port = free_port();
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
    let master_port = free_port();
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
    let written: Vec<_> = std::fs::read_dir(&checkpoints).unwrap().flatten().collect();
    assert_eq!(written.len(), 2, "keep 2: {written:?}");

    // A second gang finds rank 0's newest checkpoint (step 30, the end) and every rank resumes from it.
    std::fs::remove_file(&result).unwrap();
    assert_eq!(run_checkpointed(&result, &checkpoints), vec![0, 0, 0]);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert_eq!(json["globalSteps"], 30, "{json}");
    assert!(json["testAccuracy"].as_f64().unwrap() > 0.9, "{json}");
}
