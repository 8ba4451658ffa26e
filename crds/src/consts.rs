//! Names shared by the operator, the worker, the device plugin and local mode: the contracts of DESIGN 4.

/// API group of the RduJob resource.
pub const GROUP: &str = "rdu.dev";
/// API version of the RduJob resource.
pub const VERSION: &str = "v1alpha1";

/// Extended resource a rank requests: one device per RDU tile.
pub const TILE_RESOURCE: &str = "rdu.dev/tile";
/// Extended resource of the whole-RDU mode of the device plugin.
pub const RDU_RESOURCE: &str = "rdu.dev/rdu";

/// Label on every child naming its RduJob.
pub const LABEL_JOB_NAME: &str = "rdu.dev/job-name";
/// Label on every rank's pod with its rank.
pub const LABEL_RANK: &str = "rdu.dev/rank";
/// Label on every rank's pod with the gang generation (restart count) it belongs to.
pub const LABEL_GENERATION: &str = "rdu.dev/generation";
/// Pod annotation the device plugin sets to the tiles the pod holds (`rdu0-tile0,rdu0-tile1`); the operator
/// copies it into `status.ranks[].tiles`.
pub const TILES_ANNOTATION: &str = "rdu.dev/tiles";

/// The largest world size the RduJob API accepts (`spec.workers`, the CRD's schema maximum and a CEL rule). An
/// operator may refuse smaller jobs (its `--max-workers-per-job`); none may go past this.
pub const MAX_WORKERS: u32 = 4096;
/// What the CRD and `validate_spec` say about a job above [`MAX_WORKERS`] (Rust adds the value it got).
pub const MAX_WORKERS_MESSAGE: &str =
    "spec.workers must be at most 4096, the largest world size an RduJob may have: lower it";

/// The widest hidden layer an RduJob may have (each `spec.model.hiddenSizes` entry: a schema maximum, a CEL rule and
/// `validate_spec`). Two layers this wide are a 1 GiB weight matrix; without a ceiling `[4294967295]` made every
/// rank try to allocate it.
pub const MAX_HIDDEN_SIZE: u32 = 16384;
/// What the CRD and `validate_spec` say about a hidden layer above [`MAX_HIDDEN_SIZE`] (Rust adds the value).
pub const MAX_HIDDEN_SIZE_MESSAGE: &str = "spec.model.hiddenSizes entries must be at most 16384, the widest layer an RduJob may have: lower them";

/// The largest data file a rank reads by default, in MiB (`spec.data.maxFileMiB`), counted as read and again after
/// gunzip, so that a decompression bomb fails with an error naming the file instead of taking the rank's memory.
pub const DEFAULT_MAX_DATA_FILE_MIB: u32 = 1024;
/// The largest `spec.data.maxFileMiB` (64 GiB).
pub const MAX_DATA_FILE_MIB: u32 = 65536;
/// What the CRD and `validate_spec` say about a `spec.data.maxFileMiB` out of range.
pub const DATA_FILE_MIB_MESSAGE: &str = "spec.data.maxFileMiB must be between 1 and 65536 (MiB)";

/// Name of the worker container in every rank's pod (a template container of that name is merged into it).
pub const WORKER_CONTAINER: &str = "worker";

/// Port of the rendezvous served by rank 0.
pub const MASTER_PORT: u16 = 29500;
/// Port of each rank's collective (all-reduce) server.
pub const COLLECTIVE_PORT: u16 = 29501;

/// Key of the job token inside the per-job Secret `<job>-token`.
pub const TOKEN_SECRET_KEY: &str = "token";
/// Where rank 0 writes the result JSON in a pod.
pub const TERMINATION_LOG_PATH: &str = "/dev/termination-log";

/// Audience of the ServiceAccount token rank 0 shows the operator with its progress reports (a projected token
/// the kubelet mounts and refreshes; the API server's TokenReview accepts it for this audience only).
pub const PROGRESS_TOKEN_AUDIENCE: &str = "rdu.dev/progress";
/// Directory of that token in rank 0's worker container (file `token`).
pub const PROGRESS_TOKEN_DIR: &str = "/var/run/secrets/rdu.dev/progress";
/// Largest progress report body the operator reads, in bytes.
pub const PROGRESS_REPORT_MAX_BYTES: usize = 4096;

/// Path of a job's progress endpoint on the operator (POST a `ProgressReport`).
pub fn progress_path(namespace: &str, job: &str) -> String {
    format!("/progress/v1/namespaces/{namespace}/rdujobs/{job}")
}

/// Where rank 0's pod mounts the TensorBoard log directory.
pub const TENSORBOARD_MOUNT: &str = "/var/log/rdu/tensorboard";

/// Environment variables set on every rank (DESIGN 4.2) and by the device plugin (DESIGN 4.3).
pub mod env {
    pub const RANK: &str = "RANK";
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    pub const MASTER_PORT: &str = "MASTER_PORT";
    pub const COLLECTIVE_PORT: &str = "RDU_COLLECTIVE_PORT";
    pub const JOB_NAME: &str = "RDU_JOB_NAME";
    pub const JOB_NAMESPACE: &str = "RDU_JOB_NAMESPACE";
    pub const JOB_UID: &str = "RDU_JOB_UID";
    pub const GENERATION: &str = "RDU_GENERATION";
    pub const JOB_TOKEN: &str = "RDU_JOB_TOKEN";
    /// The job's spec as JSON.
    pub const JOB_SPEC: &str = "RDU_JOB_SPEC";
    pub const NODE_NAME: &str = "NODE_NAME";
    pub const POD_IP: &str = "POD_IP";
    /// Where the worker writes its result JSON (rank 0); defaults to the termination log.
    pub const RESULT_PATH: &str = "RDU_RESULT_PATH";
    /// Directory for checkpoints.
    pub const CHECKPOINT_DIR: &str = "RDU_CHECKPOINT_DIR";
    /// Rank 0 only, when the operator takes progress reports: the operator's base URL.
    pub const PROGRESS_URL: &str = "RDU_PROGRESS_URL";
    /// Rank 0 only: the file holding its progress token (re-read before each report: the kubelet refreshes it).
    pub const PROGRESS_TOKEN_FILE: &str = "RDU_PROGRESS_TOKEN_FILE";
    /// Rank 0 of a job with `spec.tensorboard`: the directory its event files go to.
    pub const TENSORBOARD_DIR: &str = "RDU_TENSORBOARD_DIR";
    /// Local mode, rank 0: `1` writes progress as JSON lines on stdout for `rdujob`'s progress line.
    pub const PROGRESS_LINES: &str = "RDU_PROGRESS_LINES";
    /// Optional: how chunks travel between ranks, `auto` (default: shared memory between ranks
    /// of one host, TCP between hosts), `tcp` or `grpc`; as NCCL_SHM_DISABLE, for comparing and
    /// debugging.
    pub const DATA_PATH: &str = "RDU_DATA_PATH";
    /// Tile-affinity mask handed out by the device plugin, as in the seeds.
    pub const TILE_AFFINITY: &str = "SF_RNT_TILE_AFFINITY";
    /// Comma-separated tile device IDs handed out by the device plugin.
    pub const VISIBLE_TILES: &str = "RDU_VISIBLE_TILES";
    /// Test fault injection, never for production (DESIGN 5.3): in generation 0, every rank that has it stops
    /// making progress after this train step, without exiting, until it is asked to stop.
    pub const TEST_HANG_AT_STEP: &str = "RDU_TEST_HANG_AT_STEP";
    /// Test fault injection, never for production: the rank allocates and touches this many MiB (at most 4096)
    /// before it loads its data, so a container memory limit below it gets the rank OOM-killed.
    pub const TEST_ALLOCATE_MIB: &str = "RDU_TEST_ALLOCATE_MIB";
}

/// Exit codes of the worker (DESIGN 4.6).
pub mod exit_code {
    pub const SUCCESS: i32 = 0;
    /// Bad configuration or spec: permanent.
    pub const BAD_CONFIG: i32 = 64;
    /// Bad data: permanent.
    pub const BAD_DATA: i32 = 65;
    /// The run's throughput was below `spec.training.minThroughput`: permanent.
    pub const BELOW_MIN_THROUGHPUT: i32 = 66;
    /// Reading or writing a file failed (checkpoint, result, data): permanent.
    pub const IO_ERROR: i32 = 74;
    /// Transient (peer lost, timeout, rendezvous failed): the gang is restarted.
    pub const RETRYABLE: i32 = 75;
    /// `rdujob run` when spec.runPolicy.activeDeadlineSeconds passed (as timeout(1)).
    pub const DEADLINE_EXCEEDED: i32 = 124;
    /// A process killed by signal N ends with 128 + N (the shell's and the kubelet's convention).
    pub const SIGNAL_BASE: i32 = 128;
}

/// Name of the headless Service of a job.
pub fn service_name(job: &str) -> String {
    job.to_string()
}

/// Name of the Secret holding the token of one generation of a job. The job's UID makes it this job's alone (not
/// an earlier job's of the same name that the garbage collector has yet to remove), the generation this gang's
/// alone: a rank of an older generation, still running behind a partition, holds a token the new gang refuses.
pub fn token_secret_name(job: &str, job_uid: &str, generation: u32) -> String {
    format!("{job}-token-{generation}-{job_uid}")
}

/// Name of the PersistentVolumeClaim holding a job's checkpoints (`spec.checkpoint.volumeClaimTemplate`).
pub fn checkpoint_claim_name(job: &str) -> String {
    format!("{job}-checkpoints")
}

/// Name of the pod of one rank.
pub fn pod_name(job: &str, rank: u32) -> String {
    format!("{job}-worker-{rank}")
}

/// Stable DNS name of rank 0, resolvable before readiness through the headless Service.
pub fn master_addr(job: &str, namespace: &str) -> String {
    format!("{}.{}.{namespace}.svc", pod_name(job, 0), service_name(job))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_names_follow_the_design() {
        assert_eq!(pod_name("mnist", 3), "mnist-worker-3");
        assert_eq!(token_secret_name("mnist", "u-1", 2), "mnist-token-2-u-1");
        assert_eq!(checkpoint_claim_name("mnist"), "mnist-checkpoints");
        assert_eq!(master_addr("mnist", "ml"), "mnist-worker-0.mnist.ml.svc");
    }

    #[test]
    fn the_ceiling_message_names_the_ceiling() {
        assert!(MAX_WORKERS_MESSAGE.contains(&format!("at most {MAX_WORKERS},")));
        assert!(MAX_HIDDEN_SIZE_MESSAGE.contains(&format!("at most {MAX_HIDDEN_SIZE},")));
        assert!(DATA_FILE_MIB_MESSAGE.contains(&format!("between 1 and {MAX_DATA_FILE_MIB} ")));
    }
}
