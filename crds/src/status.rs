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
    /// The gang generation: how many times the whole gang was restarted.
    #[serde(default)]
    pub restarts: u32,
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
}
