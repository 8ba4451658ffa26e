//! Pure builders of an RduJob's children from the validated job: no client in scope, nothing left to check,
//! the same input gives the same objects.

pub mod checkpoint;
pub mod children;
pub mod env;
pub mod hardening;
pub mod meta;
pub mod network;
pub mod progress;
pub mod rank;
pub mod tensorboard;
pub mod worker_container;

pub use checkpoint::{
    CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT, CHECKPOINT_VOLUME, CheckpointStorage,
    WORKER_FS_GROUP, checkpoint_claim,
};
pub use children::{
    POD_GROUP_LABEL, contract_pod, headless_service, pod_group, pod_group_resource, token_secret,
};
pub use env::{container_env, rank_contract};
pub use meta::{child_meta, job_labels, job_selector};
pub use network::{network_policy, network_policy_name};
pub use progress::{add_progress_token, progress_endpoint};
pub use rank::{rank_pod, worker_pod};
pub use rdu_crds::consts::WORKER_CONTAINER;
pub use rdu_crds::{job_name, job_namespace};
