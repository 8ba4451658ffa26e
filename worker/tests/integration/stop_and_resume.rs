//! A rank asked to stop mid-run (as SIGTERM asks it) ends at the step boundary with 128 + 15, its peers exit
//! retryably at once, rank 0 checkpoints the last step the gang completed, and the next generation resumes there
//! and ends bitwise where an undisturbed run ends. The model has two gradient buckets, so rank 0 is stopped
//! inside the overlapped reduction, the path that used to lose its buffers with the error.

use crate::common;

use std::path::Path;

use crate::common::rank_vars;
use rdu_crds::consts::env;
use rdu_worker::checkpoint_file_name as file_name;
use rdu_worker::{Observers, StepDone, StopRequest, TrainObserver, WorkerEnv};

/// 300 inputs × 1000 hidden (layer 0 over 1 MiB: two buckets of 1 MiB); 80 samples per rank, batch 8:
/// 10 steps an epoch, 40 in all; a checkpoint interval no run reaches.
const SPEC: &str = r#"{"workers":3,"tilesPerWorker":1,
 "model":{"name":"ffn-logreg","hiddenSizes":[1000],"inputSize":300,"classes":4},
 "data":{"source":"synthetic","samples":300,"testFraction":0.2,"seed":5},
 "training":{"epochs":4,"batchSize":8,"learningRate":0.01,"optimizer":"adam"},
 "dataParallel":{"timeoutSeconds":30,"bucketSizeMiB":1},
 "checkpoint":{"intervalSteps":1000,"keep":2}}"#;
const TOTAL_STEPS: u64 = 40;
const STOP_AFTER: u64 = 15;
const SIGTERM: i32 = 15;

/// Asks its rank to stop, as SIGTERM would, once step `at` is done.
struct StopAt {
    at: u64,
    stop: StopRequest,
}

impl TrainObserver for StopAt {
    fn step_done(&mut self, step: &StepDone) {
        if step.point.step == self.at {
            self.stop.request(SIGTERM);
        }
    }
}

/// One generation of 3 ranks; `stopped` asks to stop after step STOP_AFTER. Returns each rank's exit code and
/// final checksum (when it succeeded).
fn generation(
    generation: u32,
    checkpoints: &Path,
    result: &Path,
    stopped: Option<u32>,
) -> Vec<(i32, Option<u64>)> {
    let master_port = common::free_port();
    let handles: Vec<_> = (0..3u32)
        .map(|rank| {
            let mut vars = rank_vars(rank, 3, master_port, "tok", result);
            vars.insert(env::JOB_SPEC.into(), SPEC.into());
            vars.insert(env::GENERATION.into(), generation.to_string());
            if rank == 0 {
                vars.insert(
                    env::CHECKPOINT_DIR.into(),
                    checkpoints.display().to_string(),
                );
            }
            std::thread::spawn(move || {
                let env = WorkerEnv::from_vars(|k| vars.get(k).cloned()).unwrap();
                let stop = StopRequest::manual();
                let mut observers = Observers::default();
                if stopped == Some(rank) {
                    observers.push(StopAt {
                        at: STOP_AFTER,
                        stop: stop.clone(),
                    });
                }
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                match runtime.block_on(rdu_worker::run_rank_observed(&env, &mut observers, &stop)) {
                    Ok(outcome) => (0, outcome.checksum),
                    Err(e) => (e.exit_code(), None),
                }
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The checkpoint files of `dir`, by name.
fn checkpoint_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    names.sort();
    names
}

fn global_steps(result: &Path) -> u64 {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(result).unwrap()).unwrap();
    json["globalSteps"].as_u64().unwrap()
}

#[test]
fn a_stopped_rank_leaves_a_checkpoint_of_the_last_step_and_the_next_generation_ends_undisturbed() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let undisturbed = generation(0, &dir.path().join("undisturbed"), &result, None);
    assert!(
        undisturbed.iter().all(|(code, _)| *code == 0),
        "{undisturbed:?}"
    );
    assert_eq!(global_steps(&result), TOTAL_STEPS);
    assert!(
        checkpoint_files(&dir.path().join("undisturbed")).is_empty(),
        "the interval is never reached"
    );
    let expected = undisturbed[0].1;

    // Rank 1 is stopped, then rank 0 itself: the checkpoint is saved either way.
    for (stopped, codes) in [(1, [75, 143, 75]), (0, [143, 75, 75])] {
        let checkpoints = dir.path().join(format!("stopped-{stopped}"));
        std::fs::remove_file(&result).unwrap();
        let ended = generation(0, &checkpoints, &result, Some(stopped));
        let got: Vec<i32> = ended.iter().map(|(code, _)| *code).collect();
        assert_eq!(got, codes, "rank {stopped} stopped");
        assert_eq!(
            checkpoint_files(&checkpoints),
            [file_name(STOP_AFTER, 0)],
            "rank 0 saves the last completed step"
        );
        assert!(!result.exists());

        let resumed = generation(1, &checkpoints, &result, None);
        assert!(resumed.iter().all(|(code, _)| *code == 0), "{resumed:?}");
        assert_eq!(global_steps(&result), TOTAL_STEPS);
        for (rank, (_, checksum)) in resumed.iter().enumerate() {
            assert_eq!(
                *checksum, expected,
                "rank {rank} after resuming from step {STOP_AFTER} differs from the undisturbed run"
            );
        }
    }
}
