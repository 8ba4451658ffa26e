//! Real pods on a real kubelet (the shared testbed, a kind cluster, with one RDU node), everything as a user does it:
//! the three images built from `docker/Dockerfile`, `helm install` of the chart (the operator and the device plugin run
//! as pods), the node's `rdu.dev/tile` from the kubelet, `kubectl apply -f examples/digits.yaml`, the job's result from
//! rank 0's termination message, `kubectl logs` of every rank; then faults with real processes and bad input; then the
//! failure rules (`node/failure_rules.rs`) and Dynamic Resource Allocation (`node/dra.rs`, with jobs' shared-memory
//! domains in `node/shm_domain.rs`) on the same node. `bash e2e/node/run.sh` runs it (with kind and podman or docker)
//! and prints the three JSON lines it appends to `RDU_NODE_BENCH_OUT`.

#[path = "node/dra.rs"]
mod dra;
#[path = "node/failure_rules.rs"]
mod failure_rules;
#[path = "node/shm_domain.rs"]
mod shm_domain;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use rdu_e2e::logs::field_of;
use rdu_e2e::testbed::{SYSTEM_NAMESPACE, Testbed, TestbedSpec, cpu_limited_worker, set_mode};
use rdu_e2e::{poll_while_progressing, workspace_root};
use serde_json::{Value, json};

/// The simulated node: one RDU of four tiles, so a rank asking for eight never fits.
const RDUS: u32 = 1;
const TILES_PER_RDU: u32 = 4;
/// Env var naming the file the summary JSON line is written to.
const BENCH_OUT_ENV: &str = "RDU_NODE_BENCH_OUT";
/// The checkpointed job trains this many times the example's epochs under
/// [`rdu_e2e::testbed::FAULT_JOB_RANK_CPU`], to be running through the faults: 69,000 steps took 108 to 126 s
/// (2026-12-07, alone and in CI) for faults that took 8 to 10 s.
const LONG_RUN_FACTOR: u64 = 100;
const SHORT: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kind, podman or docker, and the images of docker/Dockerfile: bash e2e/node/run.sh"]
async fn the_chart_and_the_digits_job_run_on_a_real_node() {
    let mut cluster = Cluster {
        bed: Testbed::start(&TestbedSpec {
            name: "rdu-node",
            nodes: 1,
        })
        .await,
        undisturbed_steps: None,
    };
    let mut summary = serde_json::Map::new();
    summary.insert("bench".into(), json!("node_digits"));
    summary.insert(
        "node_ready_seconds".into(),
        json!(cluster.bed.started.elapsed().as_secs_f64()),
    );

    let installed = Instant::now();
    cluster.bed.helm_install(&[
        format!("devicePlugin.rdusPerNode={RDUS}"),
        format!("devicePlugin.tilesPerRdu={TILES_PER_RDU}"),
    ]);
    cluster
        .wait_tiles(TILES_PER_RDU * RDUS, "after helm install")
        .await;
    summary.insert(
        "helm_install_to_tiles_seconds".into(),
        json!(installed.elapsed().as_secs_f64()),
    );

    let digits = cluster.digits_run().await;
    summary.extend(digits);

    let faults = cluster
        .gang_restart_resumes_from_a_checkpoint_that_outlives_the_pods()
        .await;
    summary.extend(faults);

    let seconds = cluster.kubelet_restart_brings_the_tiles_back().await;
    summary.insert("kubelet_restart_to_tiles_seconds".into(), json!(seconds));

    let (image_seconds, unschedulable_seconds) = cluster.bad_input_gets_a_reason().await;
    summary.insert("image_error_reported_seconds".into(), json!(image_seconds));
    summary.insert(
        "unschedulable_reported_seconds".into(),
        json!(unschedulable_seconds),
    );

    summary.insert(
        "kube_forward_invalid_drops".into(),
        json!(cluster.bed.invalid_forward_drops(1)),
    );
    write_summary(&summary);

    // The failure rules on the same node: one cluster for both.
    write_summary(&failure_rules::run(&cluster.bed).await);
    write_summary(&dra::run(&cluster.bed).await);
}

/// Prints `summary` as a JSON line, and appends it to `RDU_NODE_BENCH_OUT` when set.
fn write_summary(summary: &serde_json::Map<String, Value>) {
    let line = Value::Object(summary.clone()).to_string();
    println!("{line}");
    if let Some(path) = std::env::var_os(BENCH_OUT_ENV) {
        use std::io::Write as _;
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open the summary");
        writeln!(out, "{line}").expect("write the summary");
    }
}

/// The one-node testbed and what the stages learn.
struct Cluster {
    bed: Testbed,
    /// The digits run's global steps (the undisturbed run).
    undisturbed_steps: Option<u64>,
}

impl std::ops::Deref for Cluster {
    type Target = Testbed;
    fn deref(&self) -> &Testbed {
        &self.bed
    }
}

impl Cluster {
    /// The node's name.
    fn node_name(&self) -> String {
        self.bed.node(1).name.clone()
    }

    /// Waits until the node's allocatable `rdu.dev/tile` is `count`.
    async fn wait_tiles(&self, count: u32, when: &str) {
        self.bed
            .wait_tiles(&self.node_name(), count, when, LONG)
            .await;
    }

    /// `kubectl logs <pod>`: what a user reads.
    fn kubectl_logs(&self, pod: &str) -> String {
        self.kubectl(&["logs", pod, "-n", "default"])
    }

    /// The digits example as a user runs it; checks the result, the ranks' tiles and every rank's log.
    async fn digits_run(&mut self) -> serde_json::Map<String, Value> {
        let yaml = std::fs::read_to_string(workspace_root().join("examples/digits.yaml"))
            .expect("example");
        let applied = Instant::now();
        self.apply(&yaml);
        self.wait_phase("digits", "Running", LONG).await;
        let running = applied.elapsed().as_secs_f64();
        let job = self.wait_phase("digits", "Succeeded", LONG).await;
        let succeeded = applied.elapsed().as_secs_f64();
        let workers = job["spec"]["workers"].as_u64().expect("workers") as u32;

        // status.result is rank 0's termination message.
        let rank0 = self.pod("digits-worker-0").await.expect("rank 0's pod");
        let message = rank0["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("rank 0 left no termination message: {}", rank0["status"]));
        let from_rank0: Value = serde_json::from_str(message).expect("termination message is JSON");
        let result = &job["status"]["result"];
        for field in [
            "finalLoss",
            "testAccuracy",
            "samplesPerSecond",
            "trainSeconds",
            "globalSteps",
        ] {
            assert_eq!(
                result[field], from_rank0[field],
                "status.result.{field}: {result} vs {from_rank0}"
            );
        }
        let steps = result["globalSteps"].as_u64().expect("globalSteps");
        self.undisturbed_steps = Some(steps);

        // The finished job shows every step done: rank 0's last report (through the chart's Service, with the
        // projected token the kubelet mounted; DESIGN 4.8), or the operator's own word at the end, whichever came
        // last. That reports reach status.progress at all is checked while a job runs (the gang restart below).
        let progress = self
            .wait("status.progress at the last step", LONG, async || {
                let job = self.job("digits").await?;
                let progress = &job["status"]["progress"];
                if progress["step"] == steps {
                    Ok(progress.clone())
                } else {
                    Err(format!("status.progress {progress}"))
                }
            })
            .await;
        assert_eq!(progress["percent"], 100, "{progress}");
        assert_eq!(progress["totalSteps"], steps, "{progress}");

        // `kubectl rdujob logs` merges every rank's log with `[rank N]` prefixes; `status` shows the ranks.
        let merged = self.cluster_cli(&["logs", "digits"]);
        for rank in 0..workers {
            let prefix = format!("[rank {rank}] ");
            assert!(
                merged
                    .lines()
                    .any(|l| l.starts_with(&prefix) && l.contains("inner train loop time")),
                "no final line of rank {rank} in `kubectl rdujob logs digits`:\n{merged}"
            );
        }
        let one = self.cluster_cli(&["logs", "digits", "--rank", "1"]);
        assert!(
            !one.is_empty() && one.lines().all(|l| l.starts_with("[rank 1] ")),
            "{one}"
        );
        let shown = self.cluster_cli(&["status", "digits"]);
        assert!(shown.contains("Phase:      Succeeded"), "{shown}");
        assert!(shown.contains("Result:     test accuracy"), "{shown}");

        // Every rank: its tiles in status, its log with the rank on every line, the seeds' final line, and
        // the SF_RNT_TILE_AFFINITY it was given matching those tiles.
        let ranks = job["status"]["ranks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(ranks.len(), workers as usize, "status.ranks: {ranks:?}");
        let mut all_tiles = Vec::new();
        for rank in 0..workers {
            let entry = ranks
                .iter()
                .find(|r| r["rank"] == rank)
                .expect("rank in status");
            let tiles: Vec<String> = entry["tiles"]
                .as_array()
                .unwrap_or_else(|| panic!("status.ranks[{rank}].tiles is empty: {entry}"))
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
            assert_eq!(tiles.len(), 1, "rank {rank} tiles {tiles:?}");
            let pod = format!("digits-worker-{rank}");
            let log = self.kubectl_logs(&pod);
            assert!(!log.trim().is_empty(), "no log for {pod}");
            for line in log.lines() {
                assert!(
                    line.contains(&format!("rank={rank}")),
                    "{pod}: a line without its rank: {line}"
                );
            }
            assert!(
                log.lines()
                    .any(|l| l.contains("inner train loop time")
                        && l.contains("e2e samples_per_sec")),
                "{pod}: no final line\n{log}"
            );
            let affinity = field_of(&log, "tile_affinity")
                .unwrap_or_else(|| panic!("{pod}: no tile_affinity\n{log}"));
            assert_eq!(
                parse_mask(&affinity),
                mask_of(&tiles),
                "{pod}: SF_RNT_TILE_AFFINITY {affinity} vs tiles {tiles:?}"
            );
            all_tiles.extend(tiles);
        }
        all_tiles.sort();
        all_tiles.dedup();
        assert_eq!(
            all_tiles.len(),
            workers as usize,
            "ranks share tiles: {all_tiles:?}"
        );

        let mut out = serde_json::Map::new();
        out.insert("apply_to_running_seconds".into(), json!(running));
        out.insert("apply_to_succeeded_seconds".into(), json!(succeeded));
        out.insert("digits_result".into(), result.clone());
        out.insert("digits_progress".into(), progress);
        out
    }

    /// A job whose checkpoints live on a claim. One worker's process is killed once two checkpoints
    /// exist: the gang restarts with generation + 1 and resumes from the last checkpoint. While generation
    /// 1 runs, the device plugin's pod is deleted: the DaemonSet's next pod finds every allocation. The job
    /// ends with the steps it planned, the undisturbed run's per epoch.
    async fn gang_restart_resumes_from_a_checkpoint_that_outlives_the_pods(
        &mut self,
    ) -> serde_json::Map<String, Value> {
        let mut out = serde_json::Map::new();
        self.kubectl(&["delete", "rdujob", "digits", "-n", "default", "--wait=true"]);
        let pv_dir = self.bed.shared_dir().join("pv-checkpoints");
        std::fs::create_dir_all(&pv_dir).expect("pv dir");
        set_mode(&pv_dir, 0o777);
        self.apply(&static_volume(&pv_dir));

        let example = workspace_root().join("examples/digits-checkpointed.yaml");
        let yaml = std::fs::read_to_string(&example).expect("examples/digits-checkpointed.yaml");
        let mut job: Value = serde_yaml_ng::from_str(&yaml).expect("example YAML");
        let name = job["metadata"]["name"].as_str().expect("name").to_string();
        // Long enough for the faults (the digits example trains 690 steps in under a second here), with
        // the undisturbed run's steps per epoch.
        let epochs = job["spec"]["training"]["epochs"].as_u64().expect("epochs");
        let longer = epochs * LONG_RUN_FACTOR;
        job["spec"]["training"]["epochs"] = json!(longer);
        job["spec"]["template"] = json!({"spec": {"containers": cpu_limited_worker()}});
        self.apply(&serde_json::to_string(&job).expect("JSON"));
        self.wait_phase(&name, "Running", LONG).await;

        // Kill rank 1's process once two checkpoints exist.
        let interval = job["spec"]["checkpoint"]["intervalSteps"]
            .as_u64()
            .expect("intervalSteps");
        let rank0 = format!("{name}-worker-0");
        // Two checkpoints in the claim's directory (the files themselves, not a log line about them).
        self.wait("two checkpoints on the claim", LONG, async || {
            let files = checkpoint_files(&pv_dir);
            if files.len() >= 2 {
                Ok(())
            } else {
                Err(format!("checkpoint files {files:?}"))
            }
        })
        .await;
        // While it runs, rank 0's reports show in `kubectl get rj` (DESIGN 4.8).
        self.wait("status.progress while the job runs", LONG, async || {
            let job = self.job(&name).await?;
            let progress = &job["status"]["progress"];
            match progress["percent"].as_f64() {
                Some(percent) if percent < 100.0 && job["status"]["phase"] == "Running" => Ok(()),
                _ => Err(format!("status.progress {progress}")),
            }
        })
        .await;
        let table = self.kubectl(&["get", "rj", &name, "-n", "default"]);
        eprintln!("kubectl get rj during the run:\n{table}");
        let planned = field_of(&self.kubectl_logs(&rank0), "total_steps")
            .and_then(|s| s.parse::<u64>().ok())
            .expect("total_steps in rank 0's log");
        let victim = self
            .pod(&format!("{name}-worker-1"))
            .await
            .expect("rank 1's pod");
        let container = victim["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .expect("containerID")
            .to_string();
        self.bed.kill_container(1, &container);
        let killed_at = Instant::now();
        self.wait_restarted_running(&name, LONG).await;
        out.insert(
            "kill_to_generation_1_running_seconds".into(),
            json!(killed_at.elapsed().as_secs_f64()),
        );

        // The device plugin's pod goes; the DaemonSet's next one finds every allocation.
        let deleted = Instant::now();
        let old = self.plugin_pod().await.expect("a ready device plugin pod");
        self.kubectl(&[
            "delete",
            "pod",
            &old,
            "-n",
            SYSTEM_NAMESPACE,
            "--wait=false",
        ]);
        let workers = job["spec"]["workers"].as_u64().expect("workers") as u32;
        let status = self
            .wait(
                "a new device plugin pod that knows the job's allocations",
                LONG,
                async || {
                    let pod = self.plugin_pod().await?;
                    if pod == old {
                        return Err("the old pod is still there".into());
                    }
                    // Through the API server's proxy to the pod, as from outside the cluster.
                    let path = format!(
                        "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{pod}:9464/proxy/status"
                    );
                    let request = http::Request::get(path)
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?;
                    let text = self
                        .client
                        .request_text(request)
                        .await
                        .map_err(|e| e.to_string())?;
                    let status: rdu_tiles::tilestat::NodeStatus = serde_json::from_str(&text)
                        .map_err(|e| format!("{}: {text}", rdu_error_chain::Chain(&e)))?;
                    if status.tiles_allocated == workers {
                        Ok(status)
                    } else {
                        Err(format!("{} tiles allocated", status.tiles_allocated))
                    }
                },
            )
            .await;
        out.insert(
            "plugin_pod_back_seconds".into(),
            json!(deleted.elapsed().as_secs_f64()),
        );
        assert_eq!(status.tiles_total, RDUS * TILES_PER_RDU);
        self.wait_tiles(RDUS * TILES_PER_RDU, "with the new device plugin")
            .await;
        let phase = self.job(&name).await.expect("job")["status"]["phase"].clone();
        assert_eq!(
            phase, "Running",
            "the job must outlive the plugin's restart"
        );

        let job = self.wait_succeeded_keeping_logs(&name, workers).await;
        let restarts = job["status"]["restarts"].as_u64().expect("restarts");
        let log = self.kubectl_logs(&rank0);
        assert!(
            log.contains(&format!("generation={restarts}")),
            "rank 0's last log is not generation {restarts}:\n{log}"
        );
        let resumed = log
            .lines()
            .find(|l| l.contains("resumed from checkpoint"))
            .and_then(|l| field_of(l, "step"))
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("generation 1 did not resume from a checkpoint:\n{log}"));
        // Rank 0 saves the last step the gang completed when it loses a peer, so the resume step is at least the
        // second periodic checkpoint's, not necessarily a multiple of the interval.
        assert!(resumed >= 2 * interval, "resumed from step {resumed}");
        assert_eq!(
            restarts, 1,
            "the gang restarted {restarts} times; the test killed one rank once"
        );
        let steps = job["status"]["result"]["globalSteps"]
            .as_u64()
            .expect("globalSteps");
        assert_eq!(
            steps, planned,
            "the restarted run ended at another step than planned"
        );
        let per_epoch = self.undisturbed_steps.expect("digits ran") / epochs;
        assert_eq!(
            steps,
            per_epoch * longer,
            "steps differ from the undisturbed run's per epoch"
        );
        let claim = serde_json::from_str::<Value>(&self.kubectl(&[
            "get",
            "pvc",
            &format!("{name}-checkpoints"),
            "-n",
            "default",
            "-o",
            "json",
        ]))
        .expect("claim JSON");
        assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
        self.kubectl(&["delete", "rdujob", &name, "-n", "default", "--wait=true"]);
        out.insert("restart_resumed_from_step".into(), json!(resumed));
        out.insert("restart_planned_steps".into(), json!(planned));
        // How long the CPU-limited job trained: what LONG_RUN_FACTOR buys against the faults' minute.
        out.insert(
            "restart_job_train_seconds".into(),
            job["status"]["result"]["trainSeconds"].clone(),
        );
        out.insert("gang_restarts".into(), json!(restarts));
        out
    }

    /// Waits for Succeeded (Failed fails the test). Another gang restart after the first does not fail it:
    /// each is printed with every rank's last log lines (the pods, and their logs, are gone once the
    /// operator restarts the gang), so that a run that shows one leaves the evidence in the CI log.
    async fn wait_succeeded_keeping_logs(&self, name: &str, workers: u32) -> Value {
        let tails = std::sync::Mutex::new(vec![String::new(); workers as usize]);
        let reported = std::sync::Mutex::new(1u64);
        let pods = Api::<Pod>::namespaced(self.client.clone(), "default");
        // Bounded by progress, not by the clock: beside two other kind clusters and the control plane's tests the
        // job's 138,000 steps (unlimited then) ran at 290 per second (a fresh machine, 2026-12-03) and outlasted a
        // fixed 300 s.
        let what = format!("RduJob {name} to succeed");
        let job = poll_while_progressing(&what, LONG, LONG * 4, async || {
            let job = self.job(name).await.map_err(|e| (e, None))?;
            let status = &job["status"];
            let restarts = status["restarts"].as_u64().unwrap_or_default();
            {
                let mut seen = reported.lock().expect("reported");
                if restarts > *seen {
                    let tails = tails.lock().expect("tails");
                    eprintln!(
                        "EXTRA GANG RESTART of {name} (restarts {restarts}): {status}; kube-proxy's INVALID drops so far: {:?}",
                        self.bed.invalid_forward_drops(1)
                    );
                    for (rank, tail) in tails.iter().enumerate() {
                        eprintln!(
                            "--- rank {rank} of the previous generation, last lines seen\n{tail}"
                        );
                    }
                    *seen = restarts;
                }
            }
            match status["phase"].as_str() {
                Some("Succeeded") => return Ok(job),
                Some("Failed") => panic!("RduJob {name} failed: {status}\n{}", self.diagnose()),
                _ => {}
            }
            for rank in 0..workers {
                let params = LogParams {
                    tail_lines: Some(12),
                    ..LogParams::default()
                };
                if let Ok(tail) = pods.logs(&format!("{name}-worker-{rank}"), &params).await {
                    tails.lock().expect("tails")[rank as usize] = tail;
                }
            }
            let step = status["progress"]["step"].as_u64();
            Err((format!("phase {}, step {step:?}", status["phase"]), step))
        })
        .await;
        job.unwrap_or_else(|e| panic!("{}\n{}", rdu_error_chain::Chain(&e), self.diagnose()))
    }

    /// The device plugin's ready pod (not being deleted).
    async fn plugin_pod(&self) -> Result<String, String> {
        self.bed.plugin_pod(&self.node_name()).await
    }

    /// The kubelet restarts: the plugin registers again and the tiles come back.
    async fn kubelet_restart_brings_the_tiles_back(&mut self) -> f64 {
        let pod = self.plugin_pod().await.expect("a ready device plugin pod");
        let registrations = async |cluster: &Self| {
            let log = cluster.logs_in(SYSTEM_NAMESPACE, &pod).await?;
            Ok::<_, String>(log.matches("registered with the kubelet").count())
        };
        let before = registrations(self).await.expect("the plugin's log");
        let restarted = Instant::now();
        let restarted_at = std::time::SystemTime::now();
        self.bed.restart_kubelet(1);
        // The allocatable read below must be the new kubelet's, not the one from before the restart.
        self.bed
            .wait_ready_heartbeat_after(&self.node_name(), restarted_at, SHORT)
            .await;
        self.wait("the device plugin to register again", SHORT, async || {
            let now = registrations(self).await?;
            if now > before {
                Ok(())
            } else {
                Err(format!("{now} registrations"))
            }
        })
        .await;
        self.wait_tiles(RDUS * TILES_PER_RDU, "after the kubelet restarted")
            .await;
        restarted.elapsed().as_secs_f64()
    }

    /// A missing image and a job too big for any node each get a reason in the job's status and a
    /// Warning event, within seconds.
    async fn bad_input_gets_a_reason(&self) -> (f64, f64) {
        let job = |name: &str, image: &str, tiles: u32| {
            format!(
                "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {{name: {name}, namespace: default}}\n\
                 spec:\n  workers: 1\n  tilesPerWorker: {tiles}\n  image: {image}\n  imagePullPolicy: Never\n  \
                 model: {{name: ffn-logreg, hiddenSizes: [8]}}\n  data: {{source: synthetic}}\n  training: {{steps: 5, batchSize: 4, learningRate: 0.1}}\n"
            )
        };
        self.apply(&job("no-such-image", "rdu-worker:does-not-exist", 1));
        let image_seconds = self.reported("no-such-image", "ErrImageNeverPull").await;
        self.apply(&job("too-many-tiles", "rdu-worker:0.1.0", 8));
        // The operator sees that no node can hold the gang before it creates any pod.
        let unschedulable_seconds = self
            .reported("too-many-tiles", "InsufficientCapacity")
            .await;
        // Gone with their pods, so the node's tiles are free for the failure rules' jobs.
        self.kubectl(&[
            "delete",
            "rdujob",
            "no-such-image",
            "too-many-tiles",
            "-n",
            "default",
            "--cascade=foreground",
            "--wait=true",
        ]);
        (image_seconds, unschedulable_seconds)
    }

    /// Seconds until the job has a condition with `reason` and a Warning event with it.
    async fn reported(&self, name: &str, reason: &str) -> f64 {
        let started = Instant::now();
        let events = Api::<Event>::namespaced(self.client.clone(), "default");
        self.wait(
            &format!("{name}: reason {reason} in status and an event"),
            SHORT,
            async || {
                let job = self.job(name).await?;
                let conditions = job["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !conditions.iter().any(|c| c["reason"] == reason) {
                    return Err(format!("conditions {conditions:?}"));
                }
                let selector = format!("involvedObject.name={name},reason={reason}");
                let found = events
                    .list(&ListParams::default().fields(&selector))
                    .await
                    .map_err(|e| e.to_string())?;
                if found
                    .items
                    .iter()
                    .any(|e| e.type_.as_deref() == Some("Warning"))
                {
                    Ok(())
                } else {
                    Err("no Warning event yet".into())
                }
            },
        )
        .await;
        started.elapsed().as_secs_f64()
    }
}

/// A PersistentVolume on the node's disk, for the checkpoint claim (no provisioner runs here).
fn static_volume(dir: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: rdu-e2e-checkpoints}}\nspec:\n  capacity: {{storage: 1Gi}}\n  \
         accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Retain\n  hostPath: {{path: {}, type: Directory}}\n",
        dir.display()
    )
}

/// The checkpoint files in `dir` (`ckpt-*.bin`).
fn checkpoint_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-") && n.ends_with(".bin"))
        .collect();
    names.sort();
    names
}

fn parse_mask(text: &str) -> u128 {
    u128::from_str_radix(text.trim_start_matches("0x"), 16)
        .unwrap_or_else(|_| panic!("mask {text}"))
}

/// SF_RNT_TILE_AFFINITY of tiles `rdu<R>-tile<T>`: bit R × tilesPerRdu + T.
fn mask_of(tiles: &[String]) -> u128 {
    tiles.iter().fold(0, |mask, id| {
        let (rdu, tile) = id
            .strip_prefix("rdu")
            .and_then(|rest| rest.split_once("-tile"))
            .unwrap_or_else(|| panic!("tile id {id}"));
        let bit =
            rdu.parse::<u32>().expect("rdu") * TILES_PER_RDU + tile.parse::<u32>().expect("tile");
        mask | 1 << bit
    })
}

#[test]
fn tile_masks_are_read_and_made() {
    assert_eq!(mask_of(&["rdu0-tile3".into()]), 0x8);
    assert_eq!(parse_mask("0x0000000a"), 0xa);
}
