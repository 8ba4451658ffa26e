//! Pure builders of an RduJob's children from the validated job: no client in scope, nothing left to check,
//! the same input gives the same objects.

pub(crate) mod checkpoint;
pub(crate) mod children;
pub(crate) mod env;
pub(crate) mod hardening;
pub(crate) mod meta;
pub(crate) mod network;
pub(crate) mod progress;
pub(crate) mod rank;
pub(crate) mod tensorboard;
pub(crate) mod tile_claim;
pub(crate) mod worker_container;

#[cfg(test)]
pub(crate) use checkpoint::CHECKPOINT_VOLUME;
pub(crate) use checkpoint::checkpoint_claim;
pub use checkpoint::{CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT, WORKER_FS_GROUP};
pub use children::{headless_service, token_secret};
pub(crate) use children::{pod_group, pod_group_resource};
pub(crate) use network::network_policy;
pub(crate) use rank::rank_pod;
pub use rank::worker_pod;
pub(crate) use rdu_crds::{job_name, job_namespace};
pub(crate) use tile_claim::claim_template;
