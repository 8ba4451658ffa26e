//! Several ranks of one job in one process (each on its own thread and runtime), over loopback gRPC:
//! training converges, replicas stay identical, rank 0 writes the result, and a wrong token is refused.

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
