//! The faults of nodes under running jobs, each measured from the fault to training running again: a kubelet
//! restart (no gang restart), a drain, a crash, a node that does not come back while another goes (too little
//! capacity), and a partition. Every job ends at the step count it planned, resumed from a checkpoint, and no
//! disruption counts against `backoffLimit` (the jobs run with `backoffLimit: 0`, so one counted restart fails
//! them). Before a node crashes or is cut off, the operator is moved off it (`Testbed::keep_operator_off`): the
//! fault under test is the loss of ranks; losing the operator's own node is the Deployment's and the Lease's
//! business, and a lost leader's Lease lapses in 15 s for a standby (`operator.replicas: 2`).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use rdu_e2e::checkpoints::stale_checkpoints;
use rdu_e2e::logs::field_of;
use rdu_e2e::testbed::Testbed;
use serde_json::{Value, json};

use super::spread_job;

pub(crate) use rdu_e2e::three_nodes::LONG;
/// How long a fault job trains when nothing disturbs it: long enough to be running through a fault, whatever
/// this machine's speed (measured by the spread stage).
pub(crate) const TRAIN_SECONDS: f64 = 60.0;
/// How many checkpoints a fault job writes in its undisturbed run.
const CHECKPOINTS: f64 = 30.0;
/// A partition lasts at least this long (and until the next generation trains elsewhere).
const PARTITION: Duration = Duration::from_secs(60);

/// The testbed and what the fault stages share.
pub(crate) struct Faults {
    pub bed: Testbed,
    /// The directory behind the shared checkpoint volume.
    pub shared: PathBuf,
    /// The spread job's training speed, which sizes the fault jobs.
    pub steps_per_second: f64,
}

/// When each step of a recovery was seen, in seconds after the fault.
#[derive(Debug, Default, Clone)]
struct Timeline {
    /// The operator noticed: the generation is being stopped (status.stopping) or was replaced.
    detected: Option<f64>,
    /// No pod of the old generation is left.
    old_pods_gone: Option<f64>,
    /// The new generation's pods all run.
    running: Option<f64>,
    /// The new generation's rank 0 resumed from a checkpoint: training runs again.
    resumed: Option<f64>,
}

impl Timeline {
    fn to_json(&self) -> Value {
        json!({
            "detected_seconds": self.detected,
            "old_pods_gone_seconds": self.old_pods_gone,
            "new_generation_running_seconds": self.running,
            "first_step_seconds": self.resumed,
        })
    }
}

impl Faults {
    /// A fault job: the spread job sized to train `TRAIN_SECONDS`, checkpointing often, allowed no counted
    /// restart, with the collective timeout `timeout` seconds.
    pub(crate) fn fault_job(&self, name: &str, timeout: u64) -> (Value, u64, u64) {
        let steps = (self.steps_per_second * TRAIN_SECONDS).ceil() as u64;
        let interval = ((steps as f64 / CHECKPOINTS).ceil() as u64).max(1);
        let mut job = spread_job(name, 1, interval);
        let spec = &mut job["spec"];
        spec["training"]
            .as_object_mut()
            .expect("training")
            .remove("epochs");
        spec["training"]["steps"] = json!(steps);
        spec["dataParallel"]["timeoutSeconds"] = json!(timeout);
        spec["runPolicy"]["backoffLimit"] = json!(0);
        (job, steps, interval)
    }

    /// Applies a fault job and waits until it runs with a checkpoint written; returns its planned steps.
    async fn start_fault_job(&self, name: &str, timeout: u64) -> u64 {
        let (job, steps, interval) = self.fault_job(name, timeout);
        self.bed.shared_volume(name);
        self.bed.apply(&job.to_string());
        self.bed.wait_phase(name, "Running", LONG).await;
        self.wait_checkpointed(name, interval).await;
        steps
    }

    /// [`Self::start_fault_job`] for a job whose only checkpoint before its end is the one rank 0 writes on SIGTERM
    /// (`intervalSteps` is its steps): whatever a new generation resumes from was written when the signal came.
    async fn start_job_checkpointing_on_sigterm_only(&self, name: &str, timeout: u64) -> u64 {
        let (mut job, steps, interval) = self.fault_job(name, timeout);
        job["spec"]["checkpoint"]["intervalSteps"] = json!(steps);
        self.bed.shared_volume(name);
        self.bed.apply(&job.to_string());
        self.bed.wait_phase(name, "Running", LONG).await;
        // Well into the run, as the other fault jobs are when their fault comes.
        self.wait_checkpointed(name, interval).await;
        steps
    }

    /// Waits until rank 0 of job `name`, checkpointing every `interval` steps, has passed its second
    /// checkpoint, so a fault from now on has one to resume from.
    pub(crate) async fn wait_checkpointed(&self, name: &str, interval: u64) {
        self.bed
            .wait("a checkpoint of the running job", LONG, async || {
                let step = self.progress_step(name).await?;
                if step >= 2 * interval {
                    Ok(())
                } else {
                    Err(format!("rank 0 at step {step}"))
                }
            })
            .await;
    }

    /// The step rank 0 last reported in status.progress.
    pub(crate) async fn progress_step(&self, name: &str) -> Result<u64, String> {
        let job = self.bed.job(name).await?;
        job["status"]["progress"]["step"]
            .as_u64()
            .ok_or_else(|| format!("no progress yet: {}", job["status"]))
    }

    /// The node rank `rank` of job `name` runs on.
    async fn node_of(&self, name: &str, rank: u32) -> String {
        let pod = self
            .bed
            .pod(&format!("{name}-worker-{rank}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_else(|| panic!("rank {rank} of {name} is not scheduled: {pod}"))
            .to_string()
    }

    /// Follows the job from a fault at `fault` (generation `generation` running) until its next generation has
    /// resumed training; panics if the job fails or takes longer than `timeout`.
    async fn recovery(
        &self,
        name: &str,
        generation: u64,
        fault: (Instant, SystemTime),
        timeout: Duration,
    ) -> Timeline {
        let mut timeline = Timeline::default();
        let seconds = |at: Instant| at.duration_since(fault.0).as_secs_f64();
        let started = Instant::now();
        loop {
            let now = Instant::now();
            let job = self.bed.job(name).await.unwrap_or_else(|e| panic!("{e}"));
            let status = &job["status"];
            if status["phase"] == "Failed" {
                panic!(
                    "{name} failed after the fault: {status}\n{}",
                    self.bed.diagnose()
                );
            }
            let restarts = status["restarts"].as_u64().unwrap_or_default();
            let stopping = status["stopping"]["generation"].as_u64() == Some(generation);
            if timeline.detected.is_none() && (stopping || restarts > generation) {
                timeline.detected = Some(seconds(now));
            }
            let old = self
                .bed
                .pods(
                    "default",
                    &format!("rdu.dev/job-name={name},rdu.dev/generation={generation}"),
                )
                .await
                .unwrap_or_default();
            if timeline.old_pods_gone.is_none() && old.is_empty() {
                timeline.old_pods_gone = Some(seconds(now));
            }
            if timeline.running.is_none() && restarts > generation && status["phase"] == "Running" {
                timeline.running = Some(seconds(now));
            }
            if timeline.running.is_some()
                && let Some(at) = self.resumed_at(name, restarts).await
            {
                let after = at.duration_since(fault.1).map_or(0.0, |d| d.as_secs_f64());
                timeline.resumed = Some(after);
                return timeline;
            }
            if started.elapsed() > timeout {
                panic!(
                    "{name} did not resume within {timeout:?} of the fault: {timeline:?}\n{}",
                    self.bed.diagnose()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// When generation `generation`'s rank 0 of job `name` logged that it resumed from a checkpoint.
    async fn resumed_at(&self, name: &str, generation: u64) -> Option<SystemTime> {
        let pod = self.bed.pod(&format!("{name}-worker-0")).await.ok()?;
        let labelled = pod["metadata"]["labels"]["rdu.dev/generation"].as_str()?;
        if labelled != generation.to_string() {
            return None;
        }
        let log = self
            .bed
            .logs_in("default", &format!("{name}-worker-0"))
            .await
            .ok()?;
        let line = log
            .lines()
            .find(|l| l.contains("resumed from checkpoint"))?;
        log_time(line)
    }

    /// The step rank 0 of job `name`'s current generation resumed from, as its log says; the log where it says
    /// none.
    fn resumed_step(&self, name: &str) -> Result<u64, String> {
        let rank0 = self
            .bed
            .kubectl(&["logs", &format!("{name}-worker-0"), "-n", "default"]);
        rank0
            .lines()
            .find(|l| l.contains("resumed from checkpoint"))
            .and_then(|l| field_of(l, "step"))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(rank0)
    }

    /// Waits for Succeeded and checks what every fault job must end with: the planned steps, resumed from a
    /// checkpoint (never from step 0), no restart counted against backoffLimit. Returns the final job and the step
    /// its last generation resumed from.
    pub(crate) async fn ends_as_planned(&self, name: &str, planned: u64) -> (Value, u64) {
        let job = self.bed.wait_phase(name, "Succeeded", LONG).await;
        let status = &job["status"];
        assert_eq!(
            status["result"]["globalSteps"], planned,
            "{name} ended at another step: {status}"
        );
        assert_eq!(
            status["failureRestarts"].as_u64().unwrap_or_default(),
            0,
            "{name}: a disruption was counted against backoffLimit: {status}"
        );
        let resumed = self.resumed_step(name).unwrap_or_else(|rank0| {
            panic!("{name}'s last generation did not resume from a checkpoint:\n{rank0}")
        });
        assert!(resumed > 0, "{name} resumed from step 0");
        (job, resumed)
    }

    /// A kubelet restart on a node with ranks restarts no gang; then a drain of rank 0's node: rank 0
    /// checkpoints on SIGTERM (the job writes no other checkpoint, so resuming at all proves it), the gang runs
    /// on the other nodes, the drain ends within the grace period + 10 s,
    /// the failure count does not change.
    pub(crate) async fn kubelet_restart_then_drain(&mut self) -> serde_json::Map<String, Value> {
        let name = "drained";
        let planned = self.start_job_checkpointing_on_sigterm_only(name, 30).await;
        let mut out = serde_json::Map::new();

        // Kubelet restart on rank 1's node.
        let node = self.node_of(name, 1).await;
        let index = self.bed.index_of(&node);
        let before = self.bed.job(name).await.expect("job")["status"]["restarts"].clone();
        let restarted = SystemTime::now();
        self.bed.restart_kubelet(index);
        self.bed
            .wait_ready_heartbeat_after(&node, restarted, LONG)
            .await;
        let bed = &self.bed;
        // Training goes on: rank 0 reports a step it reached after the restart.
        let step = self.progress_step(name).await.expect("progress");
        bed.wait("progress after the kubelet restart", LONG, async || {
            let now = self.progress_step(name).await?;
            if now > step {
                Ok(())
            } else {
                Err(format!("step {now}"))
            }
        })
        .await;
        let after = self.bed.job(name).await.expect("job")["status"]["restarts"].clone();
        let gang_restarts =
            after.as_u64().unwrap_or_default() - before.as_u64().unwrap_or_default();
        assert_eq!(
            gang_restarts, 0,
            "a kubelet restart restarted the gang of {name} (status.restarts {before} -> {after})"
        );
        out.insert("kubelet_restart_gang_restarts".into(), json!(gang_restarts));

        // Drain rank 0's node.
        let node = self.node_of(name, 0).await;
        let step_before = self.progress_step(name).await.expect("progress");
        let generation = self.bed.job(name).await.expect("job")["status"]["restarts"]
            .as_u64()
            .unwrap_or_default();
        let fault = (Instant::now(), SystemTime::now());
        let kubeconfig = self.bed.plane.admin_kubeconfig.clone();
        let drained_node = node.clone();
        let drain = std::thread::spawn(move || {
            let started = Instant::now();
            let out = std::process::Command::new("kubectl")
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args([
                    "drain",
                    &drained_node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--timeout=120s",
                ])
                .output()
                .expect("kubectl drain");
            (started.elapsed().as_secs_f64(), out)
        });
        let timeline = self.recovery(name, generation, fault, LONG).await;
        let (drain_seconds, drained) = drain.join().expect("drain thread");
        assert!(
            drained.status.success(),
            "kubectl drain {node}: {}",
            String::from_utf8_lossy(&drained.stderr)
        );
        let job = self.bed.job(name).await.expect("job");
        for rank in job["status"]["ranks"].as_array().into_iter().flatten() {
            assert_ne!(rank["node"], node, "a rank went back to the drained node");
        }
        // Its only checkpoint is the one written on SIGTERM: resumed from none, or from before the step it had
        // reported, it did not checkpoint when the drain stopped it.
        let resumed = self
            .resumed_step(name)
            .expect("resumed from no checkpoint: rank 0 did not checkpoint on SIGTERM");
        assert!(
            resumed >= step_before,
            "rank 0 did not checkpoint on SIGTERM: resumed from {resumed}, it had reached {step_before}"
        );
        self.bed.kubectl(&["uncordon", &node]);
        let (done, _) = self.ends_as_planned(name, planned).await;
        out.insert("drain_to_resumed_seconds".into(), json!(timeline.resumed));
        out.insert("drain_seconds".into(), json!(drain_seconds));
        out.insert("drain_timeline".into(), timeline.to_json());
        out.insert("drain_resumed_from_step".into(), json!(resumed));
        out.insert("drain_step_at_fault".into(), json!(step_before));
        out.insert(
            "drain_status_history".into(),
            done["status"]["history"].clone(),
        );
        self.bed
            .kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
        out
    }

    /// Rank 0's node crashes (link down, every process killed): training resumes on the other nodes within
    /// 95 s with default cluster settings, from a checkpoint on the shared storage, neither waiting for the dead
    /// node's pods nor scheduled onto it. Then another node crashes and is declared out of service at once: the
    /// job no longer fits and waits whole (no pod created) with a condition saying why, until the first node
    /// comes back.
    pub(crate) async fn crash_then_too_little_capacity(
        &mut self,
    ) -> serde_json::Map<String, Value> {
        let name = "crashed";
        let planned = self.start_fault_job(name, 30).await;
        let mut out = serde_json::Map::new();
        let first = self.node_of(name, 0).await;
        let first_index = self.bed.index_of(&first);
        self.bed.keep_operator_off(&first, LONG).await;
        let generation = self.bed.job(name).await.expect("job")["status"]["restarts"]
            .as_u64()
            .unwrap_or_default();
        let fault = (Instant::now(), SystemTime::now());
        self.bed.crash(first_index);
        let timeline = self.recovery(name, generation, fault, LONG).await;
        let job = self.bed.job(name).await.expect("job");
        for rank in job["status"]["ranks"].as_array().into_iter().flatten() {
            assert_ne!(
                rank["node"], first,
                "a rank was scheduled onto the dead node"
            );
        }
        out.insert(
            "node_crash_to_resumed_seconds".into(),
            json!(timeline.resumed),
        );
        out.insert("node_crash_timeline".into(), timeline.to_json());

        // A second node goes; an administrator marks it out of service at once. 8 ranks no longer fit.
        let second = job["status"]["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["node"].as_str())
            .find(|n| *n != first)
            .expect("a node with ranks")
            .to_string();
        let second_index = self.bed.index_of(&second);
        self.bed.keep_operator_off(&second, LONG).await;
        let generation = job["status"]["restarts"].as_u64().unwrap_or_default();
        let fault = Instant::now();
        self.bed.crash(second_index);
        self.bed.kubectl(&[
            "taint",
            "node",
            &second,
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ]);
        let bed = &self.bed;
        let waiting = bed
            .wait("the job to wait whole for capacity", LONG, async || {
                let job = bed.job(name).await?;
                let status = &job["status"];
                let blocked = status["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| {
                        c["type"] == "PodsBlocked"
                            && c["status"] == "True"
                            && c["reason"] == "InsufficientCapacity"
                    })
                    .cloned();
                let pods = bed
                    .pods("default", &format!("rdu.dev/job-name={name}"))
                    .await?;
                match blocked {
                    Some(c)
                        if pods.is_empty() && status["restarts"].as_u64() > Some(generation) =>
                    {
                        Ok(c)
                    }
                    _ => Err(format!("{} pod(s); status {status}", pods.len())),
                }
            })
            .await;
        out.insert(
            "out_of_service_to_waiting_seconds".into(),
            json!(fault.elapsed().as_secs_f64()),
        );
        out.insert(
            "insufficient_capacity_message".into(),
            waiting["message"].clone(),
        );

        // The first node comes back: the gang starts whole within seconds of its tiles.
        let rebooted = SystemTime::now();
        self.bed.reboot(first_index).await;
        self.bed.wait_device_plugin(&first, rebooted, 4, LONG).await;
        let back = Instant::now();
        self.bed.wait_phase(name, "Running", LONG).await;
        out.insert(
            "capacity_back_to_running_seconds".into(),
            json!(back.elapsed().as_secs_f64()),
        );
        let (done, _) = self.ends_as_planned(name, planned).await;
        out.insert(
            "crash_status_history".into(),
            done["status"]["history"].clone(),
        );
        self.bed
            .kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
        let rebooted = SystemTime::now();
        self.bed.reboot(second_index).await;
        self.bed.kubectl(&[
            "taint",
            "node",
            &second,
            "node.kubernetes.io/out-of-service-",
        ]);
        self.bed
            .wait_device_plugin(&second, rebooted, 4, LONG)
            .await;
        out
    }

    /// Rank 0's node loses its link for 60 s (and until the next generation trains elsewhere): the side with the
    /// API server restarts the gang; when the link returns, the old generation's ranks neither rejoin the new
    /// gang nor get a checkpoint accepted (the old rank 0 still runs then: the collective timeout is longer
    /// than the partition).
    pub(crate) async fn partition(&mut self) -> serde_json::Map<String, Value> {
        let name = "partitioned";
        let planned = self.start_fault_job(name, 180).await;
        let mut out = serde_json::Map::new();
        let node = self.node_of(name, 0).await;
        let index = self.bed.index_of(&node);
        self.bed.keep_operator_off(&node, LONG).await;
        let generation = self.bed.job(name).await.expect("job")["status"]["restarts"]
            .as_u64()
            .unwrap_or_default();
        let fault = (Instant::now(), SystemTime::now());
        self.bed.set_link(index, false);
        let timeline = self.recovery(name, generation, fault, LONG).await;
        let wait_more = PARTITION.saturating_sub(fault.0.elapsed());
        tokio::time::sleep(wait_more).await;
        self.bed.set_link(index, true);
        let healed = Instant::now();
        // The old rank 0 learns its peers are gone (or is stopped by its kubelet) and tries to checkpoint.
        // Only the old rank 0's own log: its pod's directory is `<namespace>_<pod>_<uid>`.
        let zombie_log = self.bed.node(index).pod_logs().to_path_buf();
        let zombie_pod = format!("default_{name}-worker-0_");
        let refused = self
            .bed
            .wait(
                "the old rank 0 to try a checkpoint and be refused",
                LONG,
                async || {
                    let refused = count_in_pod_logs(&zombie_log, &zombie_pod, "checkpoint refused");
                    if refused > 0 {
                        Ok(refused)
                    } else {
                        Err("no refusal logged yet".into())
                    }
                },
            )
            .await;
        out.insert("partition_stale_writes_refused".into(), json!(refused));
        out.insert(
            "partition_stale_writes_accepted".into(),
            json!(stale_checkpoints(&self.shared.join(name))),
        );
        let (done, _) = self.ends_as_planned(name, planned).await;
        assert_eq!(
            stale_checkpoints(&self.shared.join(name)),
            0,
            "a checkpoint of a stale generation was accepted"
        );
        out.insert(
            "partition_to_resumed_seconds".into(),
            json!(timeline.resumed),
        );
        out.insert("partition_timeline".into(), timeline.to_json());
        out.insert(
            "partition_healed_to_refusal_seconds".into(),
            json!(healed.elapsed().as_secs_f64()),
        );
        out.insert(
            "partition_status_history".into(),
            done["status"]["history"].clone(),
        );
        self.bed
            .kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
        out
    }
}

/// A log line's time (the worker logs RFC 3339 first).
fn log_time(line: &str) -> Option<SystemTime> {
    rfc3339(line.split_whitespace().next()?)
}

fn rfc3339(text: &str) -> Option<SystemTime> {
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(at))
}

/// How many lines of the logs of the pods whose directory below `dir` (a node's `/var/log/pods`) starts with
/// `pod_prefix` contain `needle`.
fn count_in_pod_logs(dir: &std::path::Path, pod_prefix: &str, needle: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(pod_prefix))
        .map(|e| count_in_logs(&e.path(), needle))
        .sum()
}

/// How many lines of the files below `dir` contain `needle`.
fn count_in_logs(dir: &std::path::Path, needle: &str) -> usize {
    let mut count = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            count += count_in_logs(&path, needle);
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            count += text.lines().filter(|l| l.contains(needle)).count();
        }
    }
    count
}
