//! The training loop tells its observers of every step in order, of every epoch and of the end, with progress
//! that reaches 100 % at the last step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdu_crds::consts::env;
use rdu_crds::{JobResult, TrainingProgress};
use rdu_worker::{EpochDone, Observers, StepDone, TrainObserver, WorkerEnv};

use crate::common;

#[derive(Default)]
struct Heard {
    steps: Vec<StepDone>,
    epochs: Vec<EpochDone>,
    results: Vec<JobResult>,
}

struct Recorder(Arc<Mutex<Heard>>);

impl TrainObserver for Recorder {
    fn step_done(&mut self, step: &StepDone) {
        self.0.lock().unwrap().steps.push(*step);
    }
    fn epoch_done(&mut self, epoch: &EpochDone) {
        self.0.lock().unwrap().epochs.push(*epoch);
    }
    fn finished(&mut self, result: &JobResult) {
        self.0.lock().unwrap().results.push(result.clone());
    }
}

#[test]
fn observers_hear_every_step_epoch_and_the_end() {
    let dir = tempfile::tempdir().unwrap();
    // From the harness's ports: the other files' tests now run in this process beside this one.
    let port = common::free_port();
    let spec = r#"{"workers":1,"model":{"name":"ffn-logreg","hiddenSizes":[8],"inputSize":4,"classes":2},
      "data":{"source":"synthetic","samples":200,"testFraction":0.2,"seed":1},
      "training":{"epochs":3,"batchSize":32,"learningRate":0.05}}"#;
    let vars: HashMap<&str, String> = [
        (env::RANK, "0".to_string()),
        (env::WORLD_SIZE, "1".into()),
        (env::MASTER_ADDR, "127.0.0.1".into()),
        (env::MASTER_PORT, port.to_string()),
        (env::COLLECTIVE_PORT, "0".into()),
        (env::JOB_NAME, "obs".into()),
        (env::JOB_UID, "uid-obs".into()),
        (env::JOB_TOKEN, "tok".into()),
        (env::GENERATION, "0".into()),
        (env::JOB_SPEC, spec.into()),
        (
            env::RESULT_PATH,
            dir.path().join("result.json").display().to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let worker_env = WorkerEnv::from_vars(|k| vars.get(k).cloned()).unwrap();
    let heard = Arc::new(Mutex::new(Heard::default()));
    let mut observers = Observers::default();
    observers.push(Recorder(heard.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime
        .block_on(rdu_worker::run_rank_observed(
            &worker_env,
            &mut observers,
            &rdu_worker::StopRequest::manual(),
        ))
        .unwrap();

    let heard = heard.lock().unwrap();
    // 160 training samples, batch 32: 5 steps per epoch, 15 in all.
    let steps: Vec<u64> = heard.steps.iter().map(|s| s.point.step).collect();
    assert_eq!(steps, (1..=15).collect::<Vec<_>>());
    let epochs: Vec<u64> = heard.steps.iter().map(|s| s.point.epoch).collect();
    assert_eq!(epochs, [[1; 5], [2; 5], [3; 5]].concat());
    assert!(
        heard
            .steps
            .iter()
            .all(|s| s.batch.samples == 32 && s.learning_rate == 0.05)
    );
    let last = TrainingProgress::at(heard.steps.last().unwrap().point);
    assert_eq!((last.percent, last.total_steps, last.epochs), (100, 15, 3));
    let epoch_numbers: Vec<u64> = heard.epochs.iter().map(|e| e.epoch).collect();
    assert_eq!(epoch_numbers, vec![1, 2, 3]);
    assert_eq!(heard.results, vec![outcome.result]);
}
