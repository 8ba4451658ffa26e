//! The status view of a running 2-rank job with progress, and of a finished one with a result.

use super::*;

const JOB: &str = r#"
apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata: {name: digits, namespace: ml, creationTimestamp: "2026-11-24T10:00:00Z"}
spec:
  workers: 2
  model: {name: ffn-logreg, hiddenSizes: [64]}
  data: {source: synthetic, samples: 64}
  training: {epochs: 1, batchSize: 8, learningRate: 0.1}
status:
  phase: Running
  restarts: 1
  disruptionRestarts: 1
  history:
  - {generation: 0, rank: 3, exitCode: null, reason: NodeLost, node: node-c, cause: Disruption,
     action: RestartJobNotCounted, time: "2026-11-24T10:00:02Z",
     rule: {source: RestartPolicy, index: 0, name: disruption}, failureRestarts: 0, disruptionRestarts: 1,
     message: "rank 3 was lost (NodeLost: node node-c is unreachable)"}
  ranks: [{rank: 0, pod: digits-worker-0, node: node-a, tiles: [rdu0-tile0, rdu0-tile1]}]
  conditions:
  - {type: Running, status: "True", reason: AllRanksRunning, message: every rank runs, lastTransitionTime: "2026-11-24T10:00:05Z"}
  - {type: Restarting, status: "False", reason: GangRestart, message: x, lastTransitionTime: "2026-11-24T10:00:04Z"}
  progress: {step: 120, totalSteps: 480, epoch: 2, epochs: 8, percent: 25, estimatedRemainingSeconds: 75,
             loss: 0.25, samplesPerSecond: 2140.5, updateTime: "2026-11-24T10:02:57Z"}
"#;

fn pod(rank: u32, generation: u32, node: Option<&str>, phase: &str, restarts: i32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("digits-worker-{rank}"), "namespace": "ml",
                     "labels": {"rdu.dev/job-name": "digits", "rdu.dev/rank": rank.to_string(),
                                "rdu.dev/generation": generation.to_string()}},
        "spec": {"containers": [{"name": "worker"}], "nodeName": node},
        "status": {"phase": phase, "containerStatuses": [{"name": "worker", "restartCount": restarts,
                   "ready": true, "image": "w", "imageID": ""}]}
    }))
    .expect("pod")
}

fn now() -> Timestamp {
    "2026-11-24T10:03:00Z".parse().expect("time")
}

#[test]
fn a_running_job_shows_progress_true_conditions_and_a_row_per_rank() {
    let job: RduJob = serde_yaml_ng::from_str(JOB).expect("job");
    let pods = [
        pod(0, 1, Some("node-a"), "Running", 0),
        pod(1, 1, None, "Pending", 0),
        pod(1, 0, Some("node-b"), "Failed", 2),
    ];
    let text = render(&job, &pods, now());
    let expected = "\
Job:        ml/digits
Phase:      Running
Generation: 1 (gang restarts: 0 counted against backoffLimit, 1 not counted)
Age:        3m00s
Progress:   25% (step 120/480, epoch 2/8), ETA 1m15s, loss 0.2500, 2140.5 samples/s, reported 3s ago
Condition:  Running (AllRanksRunning): every rank runs

RANK  POD              NODE    TILES                  PHASE    RESTARTS
0     digits-worker-0  node-a  rdu0-tile0,rdu0-tile1  Running  0
1     digits-worker-1  -       -                      Pending  0

Generations:
GEN  TIME                  RANK  NODE    CAUSE       RULE                                  ACTION                COUNTED  NOT-COUNTED  MESSAGE
0    2026-11-24T10:00:02Z  3     node-c  Disruption  restartPolicy default 0 (disruption)  RestartJobNotCounted  0        1            rank 3 was lost (NodeLost: node node-c is unreachable)
";
    assert_eq!(text, expected);
}

#[test]
fn a_missing_pod_and_a_result_are_shown() {
    let mut job: RduJob = serde_yaml_ng::from_str(JOB).expect("job");
    if let Some(s) = job.status.as_mut() {
        s.result = Some(JobResult {
            final_loss: 0.03,
            test_accuracy: 0.9777,
            samples_per_second: 1234.5,
            train_seconds: 2.5,
            global_steps: 480,
            ..Default::default()
        });
        s.progress = None;
    }
    let text = render(&job, &[], now());
    assert!(
        text.contains("1     digits-worker-1  -     -                      (no pod)  -\n"),
        "{text}"
    );
    assert!(
        text.ends_with(
            "Result:     test accuracy 0.9777, loss 0.0300, 1234.5 samples/s, 480 steps in 2.50 s\n"
        ),
        "{text}"
    );
}

#[test]
fn an_all_reduce_benchmark_shows_a_row_per_size() {
    let mut job: RduJob = serde_yaml_ng::from_str(JOB).expect("job");
    if let Some(s) = job.status.as_mut() {
        s.result = Some(JobResult {
            mode: Some(rdu_crds::RunMode::AllReduceBenchmark),
            all_reduce: Some(rdu_crds::AllReduceResult {
                ranks: 2,
                nodes: 2,
                algorithm: "auto".into(),
                compression: "none".into(),
                data_path: "auto".into(),
                shared_memory_peers: 0,
                warmup_rounds: 12,
                warmup_iterations: 5,
                iterations: 20,
                sizes: vec![
                    rdu_crds::AllReduceTiming {
                        bytes: 4096,
                        median_seconds: 0.0000543,
                        algbw_gbps: 0.07543,
                        busbw_gbps: 0.07543,
                        wrong_values: 0,
                    },
                    rdu_crds::AllReduceTiming {
                        bytes: 64 << 20,
                        median_seconds: 0.05,
                        algbw_gbps: 1.342,
                        busbw_gbps: 1.342,
                        wrong_values: 0,
                    },
                ],
            }),
            ..Default::default()
        });
    }
    let text = render(&job, &[], now());
    assert!(
        text.ends_with(
            "Result:     all-reduce across 2 rank(s) on 2 node(s), algorithm auto, compression none, data path \
             auto, 20 timed (median) after 5 untimed\n\n\
             SIZE  BYTES     MEDIAN(us)  ALGBW(GB/s)  BUSBW(GB/s)  WRONG\n\
             4Ki   4096      54.3        0.075        0.075        0\n\
             64Mi  67108864  50000.0     1.342        1.342        0\n"
        ),
        "{text}"
    );
}
