//! The RduJob status: phase, conditions, worker counts, ranks and the training result.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::progress::TrainingProgress;

/// Observed state of an RduJob, derived by the operator from what it saw.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RduJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Ready ranks over world size, e.g. "4/4".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The gang generation: how many times the whole gang was restarted, for any cause.
    #[serde(default)]
    pub restarts: u32,
    /// Gang restarts caused by the job's own failures; `runPolicy.backoffLimit` caps them.
    #[serde(default)]
    pub failure_restarts: u32,
    /// Gang restarts not counted against `backoffLimit` (action `RestartJobNotCounted`: by default disruptions
    /// from outside the job, its node lost, a drain or another eviction, a preemption);
    /// `runPolicy.maxInfrastructureRestarts` caps them.
    #[serde(default)]
    pub disruption_restarts: u32,
    /// Times a queue (Kueue) evicted the running job, a preemption among them: its pods were stopped (rank 0
    /// checkpointing on SIGTERM) and it waited to be admitted again. Never counted against `backoffLimit`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub evictions: u32,
    /// Where the job stands in its Kueue queue, for a job labelled `kueue.x-k8s.io/queue-name` when the
    /// operator runs with the Kueue integration (`kubectl get rj` shows it as `Queue`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// Hang detection (`runPolicy.progressDeadlineSeconds`), while every rank of the generation runs: the step
    /// rank 0 last reported and since when the operator has seen it stand still.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress: Option<ProgressMark>,
    /// While a failed generation is being stopped: which, and what its end is blamed on so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<GenerationEnd>,
    /// How the last generations ended, oldest first (at most [`GenerationEnd::KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<GenerationEnd>,
    #[serde(default)]
    pub workers: WorkerCounts,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<JobResult>,
    /// How far the current generation's training is, as rank 0 last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<TrainingProgress>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum JobPhase {
    Pending,
    Running,
    Restarting,
    Succeeded,
    Failed,
    Suspended,
}

impl JobPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Pending => "Pending",
            JobPhase::Running => "Running",
            JobPhase::Restarting => "Restarting",
            JobPhase::Succeeded => "Succeeded",
            JobPhase::Failed => "Failed",
            JobPhase::Suspended => "Suspended",
        }
    }

    /// Succeeded and Failed are final.
    pub fn is_finished(self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Failed)
    }
}

/// Pods of the current generation by state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCounts {
    pub active: u32,
    pub ready: u32,
    pub succeeded: u32,
    pub failed: u32,
}

/// How a generation of the gang ended: the rank it is blamed on (`rdu_gang::culprit`), why, and what followed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GenerationEnd {
    pub generation: u32,
    /// The rank the end is blamed on.
    pub rank: u32,
    /// Its exit code (128 + N for signal N); none when the rank was lost without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The worker's, kubelet's or control plane's reason: `Error`, `OOMKilled`, `NodeLost`,
    /// `EvictionByEvictionAPI`, `PreemptionByScheduler`, `PodDeleted`...
    pub reason: String,
    /// One line saying what happened.
    pub message: String,
    /// The node the rank ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The worker container's own reason for its end (`OOMKilled`, `Error`…), when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_reason: Option<String>,
    /// The conditions True on the rank's pod, with their reasons, as the failure rules saw them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_conditions: Vec<crate::PodConditionMatcher>,
    /// A failure of the job's own (counted against backoffLimit) or a disruption from outside it (not counted).
    pub cause: EndCause,
    /// What followed; none while the generation is still being stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<EndAction>,
    /// The failure rule that chose the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<MatchedRule>,
    /// `failureRestarts` and `disruptionRestarts` after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_restarts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_restarts: Option<u32>,
    /// When the generation began to be stopped.
    pub time: Time,
}

impl GenerationEnd {
    /// How many ended generations `status.history` keeps.
    pub const KEPT: usize = 10;
}

/// The failure rule that decided what followed a generation's end.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchedRule {
    /// Where the rule is: `FailurePolicy` (`spec.runPolicy.failurePolicy.rules`) or `RestartPolicy` (the
    /// defaults of `spec.runPolicy.restartPolicy`, for what no rule of the failure policy matched).
    pub source: RuleSource,
    /// Its index in that list.
    pub index: u32,
    /// Its name, if it has one (the defaults all do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Which list a matched rule comes from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RuleSource {
    FailurePolicy,
    RestartPolicy,
}

impl std::fmt::Display for MatchedRule {
    /// `failurePolicy.rules[1] (oom-is-fatal)`, `restartPolicy default 0 (disruption)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.source {
            RuleSource::FailurePolicy => write!(f, "failurePolicy.rules[{}]", self.index)?,
            RuleSource::RestartPolicy => write!(f, "restartPolicy default {}", self.index)?,
        }
        match &self.name {
            Some(name) => write!(f, " ({name})"),
            None => Ok(()),
        }
    }
}

/// The step rank 0 last reported for `generation`, and since when the operator has seen that step: the start of
/// the window `progressDeadlineSeconds` measures.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgressMark {
    pub generation: u32,
    /// `status.progress.step` then; none before rank 0 ever reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// When the step last changed, or every rank of the generation was first seen running.
    pub since: Time,
}

/// Whose doing a generation's end was.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EndCause {
    /// The job's own: a rank exited with an error, was OOM-killed, its pod was deleted.
    Failure,
    /// From outside the job: its node was lost, drained or otherwise evicted it, or the scheduler preempted it.
    Disruption,
}

/// What followed a generation's end.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EndAction {
    /// The gang restarted; the restart counts against backoffLimit.
    RestartJob,
    /// The gang restarted; the restart does not count.
    RestartJobNotCounted,
    /// The job failed.
    FailJob,
}

/// Where a rank runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankStatus {
    pub rank: u32,
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Tiles the rank holds (`rdu0-tile0`...), as the device plugin published them on its pod
    /// (annotation `rdu.dev/tiles`); empty until it has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiles: Vec<String>,
}

/// The result rank 0 writes to its termination message (DESIGN 4.6), copied into the status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobResult {
    /// Training: the last epoch's mean loss; inference: the test split's.
    pub final_loss: f64,
    pub test_accuracy: f64,
    /// Samples per second of the whole job (timed steps only in `measurePerformance` and `inference`).
    pub samples_per_second: f64,
    /// Seconds of the training loop (of the timed steps, or of the timed inference batches).
    pub train_seconds: f64,
    /// Optimizer steps (timed steps; inference: timed batches of rank 0).
    pub global_steps: u64,
    /// The mode that produced this result; absent means `train`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::RunMode>,
    /// Median and 99th percentile of rank 0's timed step (inference: batch) latency, in seconds
    /// (`measurePerformance` and `inference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_latency_p50_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_latency_p99_seconds: Option<f64>,
    /// `allReduceBenchmark`: rank 0's timings of each size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_reduce: Option<AllReduceResult>,
    /// `train` and `measurePerformance`: where rank 0's steps went, mean seconds per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_phases: Option<StepPhasesResult>,
}

/// Rank 0's mean seconds per training step in each phase of it (`measurePerformance`: the timed steps). What the
/// step's wall time holds beyond their sum is the loop's own work (progress, checkpoints, the stop check).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepPhasesResult {
    /// Steps averaged over.
    pub steps: u64,
    /// Copying the batch's rows out of the dataset.
    pub gather_seconds: f64,
    /// Forward and backward on the rank's tiles.
    pub compute_seconds: f64,
    /// The gradient's all-reduce left after backward ended: what overlapping it with backward did not hide.
    pub exposed_reduce_seconds: f64,
    /// The optimizer's update of the parameters.
    pub optimizer_seconds: f64,
}

/// What `mode: allReduceBenchmark` measured (nccl-tests' definitions: algbw = bytes / time, busbw = algbw ×
/// 2(n−1)/n, in GB/s of 1e9 bytes).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllReduceResult {
    /// Ranks (n).
    pub ranks: u32,
    /// Distinct nodes the ranks ran on.
    pub nodes: u32,
    /// The algorithm asked for (`auto`, `ring`, `hierarchical`, `star`; `star` when `reduceOnRdu` is false).
    pub algorithm: String,
    /// How values travelled: `none`, `bf16` or `fp16`.
    pub compression: String,
    /// The data path (`auto`, `tcp`, `grpc`; `RDU_DATA_PATH`).
    pub data_path: String,
    /// Peers rank 0's all-reduces reached through shared memory (same host, data path `auto`).
    pub shared_memory_peers: u32,
    /// Rounds of the largest size the ranks all-reduced to warm the machine up before the first size
    /// (`spec.allReduceBenchmark.warmupMilliseconds`; 0 when it was 0).
    #[serde(default)]
    pub warmup_rounds: u32,
    pub warmup_iterations: u32,
    pub iterations: u32,
    /// One entry per size, in the spec's order.
    pub sizes: Vec<AllReduceTiming>,
}

/// The timing of one size.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllReduceTiming {
    pub bytes: u64,
    /// Median of rank 0's timed all-reduces.
    pub median_seconds: f64,
    /// Algorithm bandwidth: bytes / median time, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth: algbw × 2(n−1)/n, GB/s (0 for one rank).
    pub busbw_gbps: f64,
    /// Values of rank 0's first all-reduce of this size that were not the sum of every rank's (nccl-tests'
    /// `#wrong`): 0 unless the collective is broken.
    pub wrong_values: u64,
}

/// A queued job's place in Kueue: its LocalQueue and whether its Workload is admitted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// The LocalQueue (the `kueue.x-k8s.io/queue-name` label).
    pub name: String,
    pub state: QueueState,
}

/// Where a queued job's Workload stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum QueueState {
    /// Waiting for Kueue to admit it: no pod exists.
    Queued,
    /// Admitted: its quota is reserved and its pods may run.
    Admitted,
    /// Evicted (preempted, a PodsReady timeout, deactivated): its pods stop and it waits to be admitted again.
    Evicted,
    /// The job ended and its Workload is finished: the quota is released.
    Finished,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
