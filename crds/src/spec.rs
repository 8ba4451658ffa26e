//! The RduJob spec (DESIGN 4.1) with its schema-level and CEL validation.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PodTemplateSpec};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::status::RduJobStatus;

/// A data-parallel training job: `workers` ranks, each on `tilesPerWorker` RDU tiles.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rdu.dev",
    version = "v1alpha1",
    kind = "RduJob",
    namespaced,
    shortname = "rj",
    status = "RduJobStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Restarts","type":"integer","jsonPath":".status.restarts"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".status.queue.state"}"#,
    printcolumn = r#"{"name":"Progress%","type":"integer","jsonPath":".status.progress.percent"}"#,
    printcolumn = r#"{"name":"ETA(s)","type":"integer","jsonPath":".status.progress.estimatedRemainingSeconds"}"#,
    printcolumn = r#"{"name":"Samples/s","type":"number","jsonPath":".status.result.samplesPerSecond"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.compile) || self.workers >= self.compile.minWorldSize").message("spec.workers must be at least spec.compile.minWorldSize: raise workers or compile for a smaller world size"))]
#[x_kube(validation = Rule::new("(has(self.runPolicy) && self.runPolicy.suspend) || (has(oldSelf.runPolicy) && oldSelf.runPolicy.suspend) || (self.workers == oldSelf.workers && self.model == oldSelf.model && self.data == oldSelf.data)").message("spec.workers, spec.model and spec.data are immutable while the job runs: set spec.runPolicy.suspend to true first"))]
#[x_kube(validation = Rule::new("!has(self.runPolicy) || !has(self.runPolicy.schedulingPolicy) || !has(self.runPolicy.schedulingPolicy.minAvailable) || self.runPolicy.schedulingPolicy.minAvailable <= self.workers").message("spec.runPolicy.schedulingPolicy.minAvailable must be between 1 and spec.workers"))]
#[x_kube(validation = Rule::new("!has(self.runPolicy) || !has(self.runPolicy.failurePolicy) || self.runPolicy.failurePolicy.rules.all(r, !has(r.onRanks) || r.onRanks.all(k, k < self.workers))").message(crate::failure_policy::RANK_BEYOND_WORKERS))]
#[x_kube(validation = Rule::new("!has(self.mode) || self.mode != 'inference' || has(self.checkpoint)").message("spec.mode inference loads the newest checkpoint: set spec.checkpoint to the storage a training run of this job wrote"))]
#[x_kube(validation = Rule::new("!has(self.mode) || self.mode != 'allReduceBenchmark' || !has(self.training.minThroughput)").message(crate::validation::BENCHMARK_HAS_NO_THROUGHPUT))]
#[serde(rename_all = "camelCase")]
pub struct RduJobSpec {
    /// World size: the number of ranks, one pod each (1 to 4096).
    #[x_kube(validation = Rule::new("self >= 1").message("spec.workers must be at least 1"))]
    #[x_kube(validation = Rule::new("self <= 4096").message(crate::consts::MAX_WORKERS_MESSAGE))]
    #[schemars(range(max = crate::consts::MAX_WORKERS))]
    pub workers: u32,
    /// RDU tiles per rank: 1, 2, 4 or 8.
    #[serde(default = "default_tiles_per_worker")]
    #[x_kube(validation = Rule::new("self in [1, 2, 4, 8]").message("spec.tilesPerWorker must be 1, 2, 4 or 8"))]
    pub tiles_per_worker: u32,
    /// How each rank's tiles are asked for: the device plugin's extended resource `rdu.dev/tile` (the default), or
    /// a ResourceClaim per rank through Dynamic Resource Allocation, which can also keep them on one RDU.
    #[serde(default)]
    pub tile_allocation: crate::TileAllocation,
    /// Container image of the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Pull policy of the worker image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Pod template merged into every rank's pod (nodeSelector, tolerations, volumes, resources...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::preserve_unknown_object")]
    pub template: Option<PodTemplateSpec>,
    /// The model to train.
    pub model: ModelSpec,
    /// Where the data comes from and how it is sharded.
    pub data: DataSpec,
    /// Epochs or steps, batch size, optimizer.
    pub training: TrainingSpec,
    /// What the ranks run, as SambaNova's tutorial commands: `train` (`run`, the default), `measurePerformance`
    /// (`measure-performance`: `training.warmupSteps` untimed steps, then `training.steps` (default 50) timed ones;
    /// throughput and step latency, no model result), `inference` (`run --inference`: forward only over the
    /// test split with the parameters of the newest checkpoint in `spec.checkpoint`'s storage), or
    /// `allReduceBenchmark` (nccl-tests' all_reduce_perf across the job's ranks: `spec.allReduceBenchmark`; the
    /// model, data and training are not read).
    #[serde(default)]
    pub mode: RunMode,
    /// The sizes and iterations of `mode: allReduceBenchmark` (its defaults when unset; other modes ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_reduce_benchmark: Option<AllReduceBenchmarkSpec>,
    /// How gradients are reduced between ranks.
    #[serde(default)]
    pub data_parallel: DataParallelSpec,
    /// A compiled PEF to run (path inside the worker's filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pef: Option<String>,
    /// Compile settings when no PEF is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileSpec>,
    /// Checkpointing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// Rank 0 writes TensorBoard event files (loss, accuracy, samples/s, learning rate) when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<TensorBoardSpec>,
    /// Restarts, deadlines, clean-up, suspension, scheduling.
    #[serde(default)]
    pub run_policy: RunPolicy,
}

fn default_tiles_per_worker() -> u32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

/// The model: a feed-forward network followed by a softmax-regression layer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Model architecture.
    pub name: ModelName,
    /// Widths of the hidden ReLU layers (empty: plain logistic regression); at most 16 layers of 1 to 16384.
    #[serde(default)]
    #[schemars(length(max = 16), inner(range(max = crate::consts::MAX_HIDDEN_SIZE)))]
    #[x_kube(validation = Rule::new("self.all(h, h >= 1)").message("spec.model.hiddenSizes entries must be at least 1"))]
    #[x_kube(validation = Rule::new("self.all(h, h <= 16384)").message(crate::consts::MAX_HIDDEN_SIZE_MESSAGE))]
    pub hidden_sizes: Vec<u32>,
    /// Input features; taken from the data when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.model.inputSize must be at least 1, or omitted to take it from the data"))]
    pub input_size: Option<u32>,
    /// Number of classes; taken from the data when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 2").message("spec.model.classes must be at least 2, or omitted to take it from the data"))]
    pub classes: Option<u32>,
    /// Which kernel computes each matrix product: fixed (one kernel everywhere, the same bits on every run) or
    /// measured (each rank times the kernels on its step's shapes at start and uses the fastest per shape, as
    /// cuDNN's benchmark mode: faster, but two runs may differ in the last bits).
    #[serde(default)]
    pub kernels: KernelChoice,
}

/// How the worker picks the kernel of each matrix product (`spec.model.kernels`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KernelChoice {
    /// One kernel (matrixmultiply) for every product: bitwise reproducible.
    #[default]
    Fixed,
    /// The fastest kernel per shape, timed by each rank at start.
    Measured,
}

impl KernelChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            KernelChoice::Fixed => "fixed",
            KernelChoice::Measured => "measured",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum ModelName {
    /// Hidden ReLU layers, then softmax regression (SambaNova's MNIST tutorial model).
    #[serde(rename = "ffn-logreg")]
    FfnLogreg,
}

/// Training data and its sharding (DistributedSampler semantics).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.source == 'synthetic' || has(self.path)").message("spec.data.path is required for csv and idx sources"))]
#[x_kube(validation = Rule::new("self.source != 'idx' || has(self.labelsPath)").message("spec.data.labelsPath is required for the idx source"))]
pub struct DataSpec {
    /// Where samples come from.
    pub source: DataSource,
    /// csv: the file (features then label per row, optionally gzipped); idx: the images file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// idx: the labels file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels_path: Option<String>,
    /// A separate test set (csv file or idx images); else `testFraction` of the data is held out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_path: Option<String>,
    /// idx: the test labels file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_labels_path: Option<String>,
    /// Fraction of the data held out for testing when no test files are given.
    #[serde(default = "default_test_fraction")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("spec.data.testFraction must be in [0, 1)"))]
    pub test_fraction: f64,
    /// synthetic: number of samples to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.data.samples must be at least 1"))]
    pub samples: Option<u32>,
    /// Shuffle the training set each epoch (the same permutation on every rank).
    #[serde(default = "default_true")]
    pub shuffle: bool,
    /// Drop the tail that does not divide evenly between ranks instead of padding it.
    #[serde(default)]
    pub drop_last: bool,
    /// Seed of the shuffles, the split and the initial weights.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The largest data file a rank reads, in MiB (1 to 65536, default 1024), checked as read and again after
    /// gunzip: a larger file (or one that inflates past it) fails the job naming the file and the limit.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "maxFileMiB"
    )]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65536").message(crate::consts::DATA_FILE_MIB_MESSAGE))]
    #[schemars(range(min = 1, max = crate::consts::MAX_DATA_FILE_MIB))]
    pub max_file_mib: Option<u32>,
}

impl DataSpec {
    /// The largest data file a rank reads, in bytes (`maxFileMiB`, else its default).
    pub fn max_file_bytes(&self) -> u64 {
        u64::from(
            self.max_file_mib
                .unwrap_or(crate::consts::DEFAULT_MAX_DATA_FILE_MIB),
        ) << 20
    }
}

fn default_test_fraction() -> f64 {
    0.2
}

fn default_true() -> bool {
    true
}

fn default_seed() -> u64 {
    42
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// Deterministic, learnable generated data.
    Synthetic,
    /// MNIST's own file format, gzipped or not.
    Idx,
    /// Rows of features then the label, gzipped or not.
    Csv,
}

/// Length of training, batch and optimizer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.epochs) || has(self.steps)").message("spec.training needs epochs or steps"))]
pub struct TrainingSpec {
    /// Passes over the training set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.training.epochs must be at least 1"))]
    pub epochs: Option<u32>,
    /// Global optimizer steps (overrides epochs when both are set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.training.steps must be at least 1"))]
    pub steps: Option<u64>,
    /// Samples per rank per step; the global batch is batchSize × workers.
    #[x_kube(validation = Rule::new("self >= 1").message("spec.training.batchSize must be at least 1"))]
    pub batch_size: u32,
    /// Step size of the optimizer.
    #[x_kube(validation = Rule::new("self > 0.0").message("spec.training.learningRate must be greater than 0"))]
    pub learning_rate: f64,
    /// Optimizer.
    #[serde(default)]
    pub optimizer: OptimizerName,
    /// Momentum of SGD.
    #[serde(default = "default_momentum")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("spec.training.momentum must be in [0, 1)"))]
    pub momentum: f64,
    /// Where the loss is computed.
    #[serde(default)]
    pub loss_on: LossOn,
    /// Untimed steps (or inference batches) before the timed ones of `measurePerformance` and `inference`
    /// (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<u32>,
    /// Samples per second (whole job) below which the run fails, as SambaNova's `--min-throughput`: the job ends
    /// Failed with a message naming the measured and the required throughput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0").message("spec.training.minThroughput must be greater than 0 (samples per second)"))]
    pub min_throughput: Option<f64>,
}

/// What the ranks of a job run (`spec.mode`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RunMode {
    /// Train and evaluate on the test split (SambaNova's `run`).
    #[default]
    Train,
    /// Timed training steps after a warm-up: throughput and step latency (SambaNova's `measure-performance`).
    MeasurePerformance,
    /// Forward passes over the test split from the newest checkpoint (SambaNova's `run --inference`).
    Inference,
    /// Timed all-reduces of each size of `spec.allReduceBenchmark` across the job's ranks (nccl-tests'
    /// all_reduce_perf): median time, algorithm and bus bandwidth per size.
    AllReduceBenchmark,
}

impl RunMode {
    /// The mode as the spec spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Train => "train",
            RunMode::MeasurePerformance => "measurePerformance",
            RunMode::Inference => "inference",
            RunMode::AllReduceBenchmark => "allReduceBenchmark",
        }
    }
}

/// `mode: allReduceBenchmark`: every rank joins the job as in training (the same rendezvous, `dataParallel`'s
/// algorithm and compression, the same data path), warms the machine up for `warmupMilliseconds`, then all-reduces
/// a buffer of each size `warmupIterations` times untimed and `iterations` times timed, as nccl-tests'
/// all_reduce_perf does.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllReduceBenchmarkSpec {
    /// Buffer sizes, each a number of bytes or of KiB or MiB with the suffix Ki or Mi (4096, 4Ki, 64Mi): a
    /// multiple of 4 bytes from 4 to 256Mi. Default 4Ki, 64Ki, 1Mi, 16Mi, 64Mi.
    #[serde(default = "default_benchmark_sizes")]
    #[schemars(length(min = 1, max = 32), inner(length(max = 16)))]
    #[x_kube(validation = Rule::new(crate::byte_size::SIZE_RULE).message(crate::byte_size::SIZE_MESSAGE))]
    pub sizes: Vec<String>,
    /// Milliseconds the ranks all-reduce the largest size (at most 16 MiB) before the first size, to bring an idle
    /// machine to the steady state a training job runs in (an idle VM ran every size 2-3x slower until something
    /// heavy ran); 0 to 60000, default 250, 0 skips it.
    #[serde(default = "default_warmup_milliseconds")]
    #[x_kube(validation = Rule::new("self <= 60000").message("spec.allReduceBenchmark.warmupMilliseconds must be at most 60000"))]
    pub warmup_milliseconds: u32,
    /// Untimed all-reduces of each size before the timed ones (default 5).
    #[serde(default = "default_warmup_iterations")]
    #[x_kube(validation = Rule::new("self <= 1000").message("spec.allReduceBenchmark.warmupIterations must be at most 1000"))]
    pub warmup_iterations: u32,
    /// Timed all-reduces of each size; the median is reported (default 20).
    #[serde(default = "default_iterations")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 10000").message("spec.allReduceBenchmark.iterations must be between 1 and 10000"))]
    pub iterations: u32,
}

impl Default for AllReduceBenchmarkSpec {
    fn default() -> Self {
        AllReduceBenchmarkSpec {
            sizes: default_benchmark_sizes(),
            warmup_milliseconds: default_warmup_milliseconds(),
            warmup_iterations: default_warmup_iterations(),
            iterations: default_iterations(),
        }
    }
}

fn default_benchmark_sizes() -> Vec<String> {
    ["4Ki", "64Ki", "1Mi", "16Mi", "64Mi"]
        .map(String::from)
        .to_vec()
}

fn default_warmup_milliseconds() -> u32 {
    250
}

fn default_warmup_iterations() -> u32 {
    5
}

fn default_iterations() -> u32 {
    20
}

fn default_momentum() -> f64 {
    0.9
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    /// Stochastic gradient descent with momentum.
    #[default]
    Sgd,
    /// Adam.
    Adam,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LossOn {
    #[default]
    Device,
    Host,
}

/// Gradient reduction between ranks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataParallelSpec {
    /// true: peer-to-peer collectives between the ranks; false: through the host (a star through rank 0).
    #[serde(default = "default_true")]
    pub reduce_on_rdu: bool,
    /// All-reduce algorithm.
    #[serde(default)]
    pub algorithm: ReduceAlgorithm,
    /// How gradients travel between ranks: none (f32), bf16 or fp16 (half the bytes, reduced in
    /// f32 on arrival; every rank still ends each step with identical parameters).
    #[serde(default)]
    pub compression: GradientCompression,
    /// Gradient bucket size.
    #[serde(default = "default_bucket_size_mib", rename = "bucketSizeMiB")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.dataParallel.bucketSizeMiB must be at least 1"))]
    pub bucket_size_mib: u32,
    /// Bound on the rendezvous and on every collective; a peer silent for longer fails the gang (retryable).
    #[serde(default = "default_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.dataParallel.timeoutSeconds must be at least 1"))]
    pub timeout_seconds: u32,
}

impl Default for DataParallelSpec {
    fn default() -> Self {
        DataParallelSpec {
            reduce_on_rdu: true,
            algorithm: ReduceAlgorithm::Auto,
            compression: GradientCompression::None,
            bucket_size_mib: default_bucket_size_mib(),
            timeout_seconds: default_timeout_seconds(),
        }
    }
}

fn default_bucket_size_mib() -> u32 {
    25
}

fn default_timeout_seconds() -> u32 {
    60
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ReduceAlgorithm {
    #[default]
    Auto,
    Ring,
    Hierarchical,
    Star,
}

impl ReduceAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            ReduceAlgorithm::Auto => "auto",
            ReduceAlgorithm::Ring => "ring",
            ReduceAlgorithm::Hierarchical => "hierarchical",
            ReduceAlgorithm::Star => "star",
        }
    }
}

/// Gradient compression on the wire (as DDP's bf16/fp16 compress hooks, Horovod's fp16).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum GradientCompression {
    /// f32, exact.
    #[default]
    None,
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half: 11 bits of mantissa; gradient values beyond 65504 become infinite.
    Fp16,
}

impl GradientCompression {
    pub fn as_str(self) -> &'static str {
        match self {
            GradientCompression::None => "none",
            GradientCompression::Bf16 => "bf16",
            GradientCompression::Fp16 => "fp16",
        }
    }
}

/// Compile settings (as `model.py compile --data-parallel -ws N`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompileSpec {
    /// The smallest world size the compiled artefact runs with.
    #[serde(default = "default_min_world_size")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.compile.minWorldSize must be at least 1"))]
    pub min_world_size: u32,
}

fn default_min_world_size() -> u32 {
    2
}

/// Checkpointing of the model and optimizer. Only rank 0 reads and writes checkpoints.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.volume) || !has(self.volumeClaimTemplate)").message("spec.checkpoint.volume and spec.checkpoint.volumeClaimTemplate cannot both be set: keep volume to write into a volume of spec.template, or volumeClaimTemplate for a claim the operator creates, and remove the other"))]
pub struct CheckpointSpec {
    /// Write a checkpoint every this many global steps.
    #[x_kube(validation = Rule::new("self >= 1").message("spec.checkpoint.intervalSteps must be at least 1"))]
    pub interval_steps: u64,
    /// A volume of `template` to write into; an emptyDir when neither this nor `volumeClaimTemplate` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// A PersistentVolumeClaim spec: the operator creates one claim `<job>-checkpoints`, owned by the job, that
    /// only rank 0 mounts and that outlives gang restarts, so a restarted gang resumes from its checkpoints.
    /// Local mode ignores it (its scratch directory already survives restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::claim_template")]
    #[x_kube(validation = Rule::new("has(self.resources) && has(self.resources.requests) && 'storage' in self.resources.requests").message("spec.checkpoint.volumeClaimTemplate.resources.requests.storage is required: set the size of the checkpoint volume, e.g. 1Gi"))]
    pub volume_claim_template: Option<PersistentVolumeClaimSpec>,
    /// How many checkpoints to keep.
    #[serde(default = "default_keep")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.checkpoint.keep must be at least 1"))]
    pub keep: u32,
}

/// Where rank 0's TensorBoard event files go (`tensorboard --logdir` on that directory reads them).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TensorBoardSpec {
    /// A volume of `template` (a PersistentVolumeClaim, for instance) that rank 0 mounts at
    /// `/var/log/rdu/tensorboard`; an emptyDir when unset. Local mode writes to its scratch directory instead and
    /// prints where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

fn default_keep() -> u32 {
    2
}

/// Restarts, deadlines, clean-up, suspension and scheduling (as Kubeflow's RunPolicy).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.failurePolicy) || self.backoffLimit > 0 || self.failurePolicy.rules.all(r, r.action != 'RestartJob')").message(crate::failure_policy::RESTART_WITHOUT_BACKOFF))]
#[x_kube(validation = Rule::new("!has(self.failurePolicy) || !has(self.maxInfrastructureRestarts) || self.maxInfrastructureRestarts > 0 || self.failurePolicy.rules.all(r, r.action != 'RestartJobNotCounted')").message(crate::failure_policy::NOT_COUNTED_WITHOUT_BUDGET))]
pub struct RunPolicy {
    /// Which failures restart the gang when no rule of `failurePolicy` matches: `ExitCode` (75 and signals
    /// restart, other codes fail), `OnFailure` (every failure restarts), `Never`; disruptions restart uncounted
    /// except under `Never`.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Gang restarts counted against it (action `RestartJob`) allowed before the job fails.
    #[serde(default = "default_backoff_limit")]
    pub backoff_limit: u32,
    /// Gang restarts not counted against `backoffLimit` (action `RestartJobNotCounted`: by default disruptions
    /// from outside the job) allowed before the job fails with `MaxInfrastructureRestartsExceeded`; 10 when
    /// omitted, so that a job no node can run does not restart forever (null: no limit).
    #[serde(
        default = "default_max_infrastructure_restarts",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_infrastructure_restarts: Option<u32>,
    /// Ordered rules deciding what follows a failed generation, first match wins; the defaults of
    /// `restartPolicy` apply to what no rule matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<crate::failure_policy::FailurePolicy>,
    /// Hang detection: when rank 0's reported step has not increased for this long while every rank of the
    /// generation runs, the gang is stopped and restarted as a `Hung` failure (at least 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 20").message(crate::failure_policy::PROGRESS_DEADLINE_MINIMUM))]
    pub progress_deadline_seconds: Option<u64>,
    /// Wall-clock bound on the job from its start; then it fails with DeadlineExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.runPolicy.activeDeadlineSeconds must be at least 1"))]
    pub active_deadline_seconds: Option<u64>,
    /// Delete the job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// Which pods remain after the job finished.
    #[serde(default)]
    pub clean_pod_policy: CleanPodPolicy,
    /// Delete the pods and keep the job; false recreates them.
    #[serde(default)]
    pub suspend: bool,
    /// Scheduler, priority and gang scheduling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_policy: Option<SchedulingPolicy>,
}

fn default_backoff_limit() -> u32 {
    3
}

/// `maxInfrastructureRestarts` when omitted.
pub const DEFAULT_MAX_INFRASTRUCTURE_RESTARTS: u32 = 10;

fn default_max_infrastructure_restarts() -> Option<u32> {
    Some(DEFAULT_MAX_INFRASTRUCTURE_RESTARTS)
}

/// The same defaults as an omitted `runPolicy` field by field (a derived Default would make backoffLimit 0).
impl Default for RunPolicy {
    fn default() -> Self {
        RunPolicy {
            restart_policy: RestartPolicy::default(),
            backoff_limit: default_backoff_limit(),
            max_infrastructure_restarts: default_max_infrastructure_restarts(),
            failure_policy: None,
            progress_deadline_seconds: None,
            active_deadline_seconds: None,
            ttl_seconds_after_finished: None,
            clean_pod_policy: CleanPodPolicy::default(),
            suspend: false,
            scheduling_policy: None,
        }
    }
}

#[cfg(test)]
mod run_policy_tests {
    use super::*;

    #[test]
    fn omitted_run_policy_has_the_field_defaults() {
        let parsed: RunPolicy = serde_json::from_str("{}").expect("empty run policy");
        assert_eq!(parsed, RunPolicy::default());
        assert_eq!(RunPolicy::default().backoff_limit, 3);
    }
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum RestartPolicy {
    /// Never restart: any failure fails the job.
    Never,
    /// Restart the gang on any failure, up to backoffLimit.
    OnFailure,
    /// Restart the gang on retryable exit codes (75, signals); fail on permanent ones (64, 65, other).
    #[default]
    ExitCode,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum CleanPodPolicy {
    /// Delete every pod when the job finishes.
    All,
    /// Delete the pods still running when the job finishes.
    #[default]
    Running,
    /// Keep every pod.
    None,
}

/// Scheduler and gang scheduling settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Queue of the gang scheduler (Volcano).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Gang scheduling: pods that must be schedulable together (a PodGroup is created when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("spec.runPolicy.schedulingPolicy.minAvailable must be at least 1"))]
    pub min_available: Option<u32>,
}
