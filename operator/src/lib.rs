//! The RduJob controller: builders, state machine, reconcile pipeline (reading pods from the controller's cache),
//! metrics and leader election.

mod apply;
mod builders;
mod context;
mod expectations;
mod health;
mod kueue;
mod leader;
mod lifecycle;
mod metrics;
mod node_cache;
mod nodes;
mod ownership;
mod placement;
mod progress;
mod reconcile;
mod serve;
mod slim;
mod slow_start;
mod status_writes;
mod step;
#[cfg(test)]
pub(crate) mod test_fixtures;
mod validate;
mod watches;

pub use builders::{
    CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT, WORKER_FS_GROUP, headless_service, token_secret,
    worker_pod,
};
pub use context::{Context, FIELD_MANAGER, Settings};
pub use health::{Health, router as health_router};
pub use kueue::{JOB_UID_LABEL as KUEUE_JOB_UID_LABEL, workload_resource};
pub use leader::{LEADER_LABEL, LeaderElector, OwnPod};
pub use lifecycle::{Change, Decision, JobEvent, decide};
pub use metrics::Metrics;
pub use node_cache::NodeCache;
pub use nodes::ClusterView;
pub use progress::token_review::ApiTokenReviewer;
pub use progress::writer::write_progress;
pub use progress::{ProgressService, router as progress_router};
pub use reconcile::{AFTER_CONFLICT, CONFLICT_RETRIED, error_policy, reconcile};
pub use serve::{HEALTH_LIMITS, PROGRESS_LIMITS, serve};
pub use slim::slim_job;
pub use step::{ReconcileError, Step};
pub use validate::{
    DEFAULT_MAX_WORKERS_PER_JOB, Exception, Guard, Limits, POD_POLICY_RULES, PodPolicy, Rule,
    ValidJob, ValidationErrors, validate,
};
pub use watches::{Synced, jobs_woken_by, node_watch, on_first_sync, pod_watch};
