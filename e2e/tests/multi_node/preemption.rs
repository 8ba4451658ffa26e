//! Kueue on real nodes (issue 25): a low-priority job queued in Kueue trains across the nodes until a
//! high-priority one preempts it. Every rank gets SIGTERM, rank 0 checkpoints the last step it completed, the
//! pods go and the quota is released; the preemptor runs, and the preempted job, admitted again, resumes from that
//! checkpoint and ends at the step count it planned, the preemption counted in `status.evictions` and never
//! against `backoffLimit` (the job runs with `backoffLimit: 0`). The operator's leader is killed in the middle of
//! that eviction (the preempted pods held Terminating by a finalizer the test holds, as a slow kubelet would): the
//! replica that takes over finishes it, the eviction counted once. Then a gang restart inside an admitted job keeps
//! its quota: the Workload stays admitted with the same admission, never evicted. The summary's `kueue` object has
//! the numbers.

use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, EvictParams, LogParams, Patch, PatchParams};
use rdu_e2e::kueue;
use rdu_e2e::logs::field_of;
use serde_json::{Value, json};

use super::LONG;
use super::faults::Faults;

/// A flavor for every node, a ClusterQueue of 8 tiles (of the nodes' 12) that preempts lower priorities, and
/// LocalQueue `team` in `default` (with `kueue::PRIORITY_CLASSES`).
const QUEUE: kueue::TileQueue<'static> = kueue::TileQueue {
    flavor: "nodes",
    flavor_spec: None,
    cluster_queue: "rdu",
    nominal_tiles: 8,
    preempt_lower_priority: true,
    local_queue: "team",
    namespace: "default",
};

/// A finalizer the test puts on the preempted job's pods to keep them Terminating while the operator's leader is
/// killed.
const HOLD: &str = "e2e.rdu.dev/hold";

/// The preemptor's ranks: with the preempted job's 8 they pass the queue's 8 tiles.
const PREEMPTOR_RANKS: u32 = 4;

/// `job` queued in LocalQueue `team` at PriorityClass `priority`, without the fault jobs' CPU limit: the
/// ClusterQueue covers tiles only, and Kueue does not admit a Workload that asks for a resource it does not cover
/// (a limit is the pod's request when none is given).
fn queued(mut job: Value, priority: &str) -> Value {
    if let Some(pod) = job["spec"]["template"]["spec"].as_object_mut() {
        pod.remove("containers");
    }
    job["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    job["spec"]["runPolicy"]["schedulingPolicy"] = json!({"priorityClassName": priority});
    job
}

/// The step in rank 0's last words when it stopped on SIGTERM: the step it checkpointed on the way out, or the
/// one already checkpointed.
fn stopped_at(log: &[String]) -> Option<u64> {
    log.iter()
        .rev()
        .find(|l| {
            l.contains("checkpoint of the last completed step saved on the way out")
                || l.contains("the last completed step is checkpointed already")
        })
        .and_then(|l| field_of(l, "step"))
        .and_then(|s| s.parse().ok())
}

impl Faults {
    /// Puts the test's finalizer on every pod of job `name` (or takes it off); how many pods.
    async fn hold_pods(&self, name: &str, hold: bool) -> usize {
        let pods = self
            .bed
            .pods("default", &format!("rdu.dev/job-name={name}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let api: Api<Pod> = Api::namespaced(self.bed.client.clone(), "default");
        let finalizers = if hold { json!([HOLD]) } else { Value::Null };
        for pod in &pods {
            api.patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "finalizer of {}: {}",
                    pod.name_any(),
                    rdu_error_chain::Chain(&e)
                )
            });
        }
        pods.len()
    }

    /// Job `name`'s Workload once it is Finished (the operator finishes it once the job's status records the
    /// end, the reconcile after the one that saw it).
    async fn finished_workload(&self, name: &str) -> Value {
        self.bed
            .wait(
                &format!("{name}'s Workload Finished"),
                Duration::from_secs(60),
                async || {
                    let workload = self.workload_of(name).await?;
                    if kueue::condition_is(&workload, "Finished", "True") {
                        Ok(workload)
                    } else {
                        Err(workload["status"].to_string())
                    }
                },
            )
            .await
    }

    /// Job `name`'s Workload in `default`.
    async fn workload_of(&self, name: &str) -> Result<Value, String> {
        kueue::workload_of(&self.bed.client, "default", name).await
    }

    /// Follows pod `pod`'s log until its container ends; the lines.
    fn follow_log(&self, pod: &str) -> tokio::task::JoinHandle<Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.bed.client.clone(), "default");
        let pod = pod.to_string();
        tokio::spawn(async move {
            let params = LogParams {
                follow: true,
                ..LogParams::default()
            };
            let mut lines = Vec::new();
            if let Ok(stream) = pods.log_stream(&pod, &params).await {
                let mut stream = stream.lines();
                while let Ok(Some(line)) = stream.try_next().await {
                    lines.push(line);
                }
            }
            lines
        })
    }

    /// A queued low-priority job runs across the nodes, is preempted, checkpoints, and resumes when admitted again.
    pub(crate) async fn kueue_preemption(&self) -> serde_json::Map<String, Value> {
        self.bed
            .apply(&format!("{}---\n{}", kueue::PRIORITY_CLASSES, QUEUE.yaml()));
        let name = "preempted";
        let (job, planned, interval) = self.fault_job(name, 30);
        self.bed.shared_volume(name);
        let applied = Instant::now();
        self.bed.apply(&queued(job, "low").to_string());
        let admitted = self
            .bed
            .wait("the queued job admitted", LONG, async || {
                let w = self.workload_of(name).await?;
                if kueue::condition_is(&w, "Admitted", "True") {
                    Ok(Instant::now())
                } else {
                    Err(w["status"].to_string())
                }
            })
            .await;
        self.bed.wait_phase(name, "Running", LONG).await;
        let admission_to_running = admitted.elapsed().as_secs_f64();
        let apply_to_running = applied.elapsed().as_secs_f64();
        self.wait_checkpointed(name, interval).await;
        let rank0_log = self.follow_log(&format!("{name}-worker-0"));

        // The preemptor: fewer ranks, a few steps, high priority.
        let preemptor = "preemptor";
        let (mut job, _, _) = self.fault_job(preemptor, 30);
        job["spec"]["workers"] = json!(PREEMPTOR_RANKS);
        job["spec"]["training"]["steps"] = json!(interval);
        self.bed.shared_volume(preemptor);
        let held = self.hold_pods(name, true).await;
        let preempted = Instant::now();
        self.bed.apply(&queued(job, "high").to_string());
        // The eviction under way: Kueue evicted the Workload and the operator is stopping the pods, which the
        // finalizer holds Terminating. The leader is killed now; the replica that takes over finishes the eviction.
        self.bed
            .wait(
                "the low job evicted and its pods stopping",
                LONG,
                async || {
                    let w = self.workload_of(name).await?;
                    let pods = self
                        .bed
                        .pods("default", &format!("rdu.dev/job-name={name}"))
                        .await?;
                    let stopping = pods
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_some())
                        .count();
                    if kueue::condition_is(&w, "Evicted", "True") && stopping == held {
                        Ok(())
                    } else {
                        Err(format!(
                            "{stopping} of {held} pods stopping; workload {}",
                            w["status"]
                        ))
                    }
                },
            )
            .await;
        let new_leader = self.bed.kill_operator_leader(LONG).await;
        self.hold_pods(name, false).await;
        self.bed
            .wait(
                "the low job evicted and its quota released",
                LONG,
                async || {
                    let w = self.workload_of(name).await?;
                    if kueue::condition_is(&w, "Evicted", "True")
                        && kueue::condition_is(&w, "QuotaReserved", "False")
                    {
                        Ok(())
                    } else {
                        Err(w["status"].to_string())
                    }
                },
            )
            .await;
        let quota_released = preempted.elapsed().as_secs_f64();
        let last_words = rank0_log.await.expect("rank 0's log");
        let reached = stopped_at(&last_words).unwrap_or_else(|| {
            panic!(
                "rank 0 did not checkpoint on SIGTERM:\n{}",
                last_words.join("\n")
            )
        });
        self.bed.wait_phase(preemptor, "Succeeded", LONG).await;
        let preemptor_done = self.bed.job(preemptor).await.expect("preemptor");
        assert!(
            self.bed.job(name).await.expect("job")["status"]["evictions"] == 1,
            "the preemption is counted as an eviction"
        );

        // Admitted again: the job resumes from the checkpoint rank 0 wrote on SIGTERM.
        let (done, resumed) = self.ends_as_planned(name, planned).await;
        let status = &done["status"];
        assert_eq!(
            resumed, reached,
            "the job resumed from another step than rank 0 reached before the preemption"
        );
        assert_eq!(
            (
                status["evictions"].as_u64(),
                status["restarts"].as_u64(),
                status["failureRestarts"].as_u64()
            ),
            (Some(1), Some(0), Some(0)),
            "{status}"
        );
        self.finished_workload(name).await;
        for job in [name, preemptor] {
            self.bed
                .kubectl(&["delete", "rdujob", job, "-n", "default", "--wait=true"]);
        }
        let mut out = serde_json::Map::new();
        out.insert(
            "kueue".into(),
            json!({
                "bench": "kueue",
                "admission_to_running_seconds": admission_to_running,
                "apply_to_running_seconds": apply_to_running,
                "preemption_to_quota_released_seconds": quota_released,
                "steps_at_preemption": reached,
                "steps_lost_to_preemption": reached.saturating_sub(resumed),
                "resumed_from_step": resumed,
                "planned_steps": planned,
                "restarts_counted_for_preemption": status["failureRestarts"],
                "evictions": status["evictions"],
                "preemptor_phase": preemptor_done["status"]["phase"],
                "leader_killed_mid_eviction_to_new_leader_seconds": new_leader,
            }),
        );
        out
    }

    /// A gang restart inside an admitted job keeps its quota: a queued job running across the nodes loses a pod
    /// (evicted, a disruption restarted without counting against `backoffLimit`); its next generation starts while
    /// its Workload stays admitted with the same admission and is never evicted, and the job ends as planned.
    pub(crate) async fn kueue_gang_restart_keeps_quota(&self) -> serde_json::Map<String, Value> {
        let name = "requeued";
        let (mut job, _, interval) = self.fault_job(name, 30);
        // A third of a fault job's training: long enough for a restart and a checkpoint to resume from.
        let planned = 10 * interval;
        job["spec"]["training"]["steps"] = json!(planned);
        self.bed.shared_volume(name);
        self.bed.apply(&queued(job, "low").to_string());
        self.bed.wait_phase(name, "Running", LONG).await;
        self.wait_checkpointed(name, interval).await;
        let before = self.workload_of(name).await.expect("workload");
        assert!(
            kueue::condition_is(&before, "Admitted", "True"),
            "{}",
            before["status"]
        );
        let admission = before["status"]["admission"].clone();
        let restarted = Instant::now();
        // An eviction through the Eviction API, as a drain makes: a disruption, restarted without counting.
        let pods: Api<Pod> = Api::namespaced(self.bed.client.clone(), "default");
        pods.evict(&format!("{name}-worker-1"), &EvictParams::default())
            .await
            .expect("evict rank 1");
        self.bed
            .wait(
                "the next generation running while the Workload stays admitted",
                LONG,
                async || {
                    let w = self.workload_of(name).await?;
                    kueue::assert_keeps_admission(&w, &admission);
                    let job = self.bed.job(name).await?;
                    let status = &job["status"];
                    if status["restarts"] == 1 && status["phase"] == "Running" {
                        Ok(())
                    } else {
                        Err(format!("status {status}"))
                    }
                },
            )
            .await;
        let restart_seconds = restarted.elapsed().as_secs_f64();
        let (done, _) = self.ends_as_planned(name, planned).await;
        let status = &done["status"];
        assert_eq!(
            (
                status["restarts"].as_u64(),
                status["evictions"].as_u64().unwrap_or_default()
            ),
            (Some(1), 0),
            "{status}"
        );
        let finished = self.finished_workload(name).await;
        assert_eq!(
            finished["status"]["admission"], admission,
            "the admission changed"
        );
        self.bed
            .kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
        let mut out = serde_json::Map::new();
        out.insert(
            "kueue_gang_restart".into(),
            json!({"pod_evicted_to_running_seconds": restart_seconds, "restarts": 1, "evictions": 0}),
        );
        out
    }
}
