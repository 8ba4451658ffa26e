//! The pod of one rank, whole: its contract (`env::rank_contract`), the pod built from it (`children`), and the
//! volumes the contract's paths need (rank 0's TensorBoard directory and its progress token), and where a queue's
//! admission puts it (`ValidJob::placement`).

use k8s_openapi::api::core::v1::Pod;

use super::children::contract_pod;
use super::env::rank_contract;
use super::progress::add_progress_token;
use super::tensorboard::add_tensorboard;
use crate::validate::ValidJob;

/// The pod of `rank` at `generation`; rank 0's reports progress when the operator takes reports at `progress_url`,
/// and writes TensorBoard events when the job asks.
pub(crate) fn rank_pod(
    job: &ValidJob,
    rank: u32,
    generation: u32,
    progress_url: Option<&str>,
) -> Pod {
    let contract = rank_contract(job, rank, generation, progress_url);
    let mut pod = contract_pod(job, &contract);
    if let (Some(_), Some(log)) = (&contract.tensorboard_dir, &job.tensorboard) {
        add_tensorboard(&mut pod, log);
    }
    if contract.progress.is_some() {
        add_progress_token(&mut pod);
    }
    if let Some(placement) = &job.placement
        && let Err(conflict) = placement.apply(&mut pod)
    {
        // The Kueue step tried the placement on rank 0's pod before letting the job run; ranks differ only in
        // labels the admission does not set.
        tracing::warn!(job = job.name, namespace = job.namespace, rank, %conflict, "placement not applied whole");
    }
    pod
}

/// The pod of `rank` at `generation` when the operator takes no progress reports.
pub fn worker_pod(job: &ValidJob, rank: u32, generation: u32) -> Pod {
    rank_pod(job, rank, generation, None)
}

#[cfg(test)]
mod tests;
