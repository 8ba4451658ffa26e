//! The harness of the multi-rank tests: one job's env for each rank, on loopback.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::net::TcpListener;
use std::sync::Mutex;

use rdu_crds::consts::env;

pub(crate) const SPEC: &str = r#"{"workers":3,"tilesPerWorker":2,
 "model":{"name":"ffn-logreg","hiddenSizes":[16],"inputSize":8,"classes":3},
 "data":{"source":"synthetic","samples":600,"seed":3},
 "training":{"epochs":3,"batchSize":16,"learningRate":0.01,"optimizer":"adam"},
 "dataParallel":{"timeoutSeconds":5}}"#;

/// A loopback port free now and never handed out before in this process: the kernel may give a port just
/// released to the next `bind(0)`, and a job's master and collective ports must differ (tests run in parallel).
pub(crate) fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

pub(crate) fn rank_vars(
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

/// Runs `world` ranks of SPEC, edited by `edit`, in threads; rank 0 with `checkpoints` as its checkpoint
/// directory. Returns the exit codes.
pub(crate) fn run_job(
    world: u32,
    edit: impl Fn(&mut serde_json::Value),
    result: &std::path::Path,
    checkpoints: Option<&std::path::Path>,
) -> Vec<i32> {
    run_job_with(world, edit, result, checkpoints, &[])
}

/// [`run_job`] with extra variables for rank 0.
pub(crate) fn run_job_with(
    world: u32,
    edit: impl Fn(&mut serde_json::Value),
    result: &std::path::Path,
    checkpoints: Option<&std::path::Path>,
    rank0_vars: &[(&str, String)],
) -> Vec<i32> {
    let master_port = free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let mut vars = rank_vars(rank, world, master_port, "tok", result);
            let mut spec: serde_json::Value = serde_json::from_str(&vars[env::JOB_SPEC]).unwrap();
            edit(&mut spec);
            vars.insert(env::JOB_SPEC.into(), spec.to_string());
            if let (0, Some(dir)) = (rank, checkpoints) {
                vars.insert(env::CHECKPOINT_DIR.into(), dir.display().to_string());
            }
            if rank == 0 {
                vars.extend(rank0_vars.iter().map(|(k, v)| (k.to_string(), v.clone())));
            }
            std::thread::spawn(move || rdu_worker::run(|k| vars.get(k).cloned()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
