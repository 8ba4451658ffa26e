//! What the control-plane tests (`e2e/tests/*.rs` other than `node` and `multi_node`) share: a control plane with
//! the CRD, namespaces and the operator running as the chart's ServiceAccount (`plane`), waits for a job's pods,
//! status and phase that put the operator's log in the panic (`wait`), RduJob manifests (`fixture`), and pod
//! states and tokens as a kubelet would report and mint them (`kubelet`), cells of `kubectl get` tables (`table`),
//! and rank 0's progress reports (`progress`).
//!
//! These tests are `#[ignore]`d, so that `cargo test` lists them as ignored, never as passed, on a machine without
//! the Go-built binaries; `bash e2e/control-plane/run.sh` runs them with `--ignored`, and then a missing binary
//! fails the test (`require_assets`).

pub mod fixture;
pub mod kubelet;
pub mod plane;
pub mod progress;
pub mod table;
pub mod wait;

pub use fixture::{JobFixture, WORKER_IMAGE};
pub use kubelet::{REPORTED_AT, pod_token, report_running, report_terminated};
pub use plane::{PlaneBuilder, apply, plane, progress_url_flag, require_assets};
pub use progress::{post_progress, progress_report};
pub use wait::{
    TIMEOUT, job_status, names, operator_log, or_operator_log, pods_of, wait_phase, wait_pods,
    wait_status,
};
