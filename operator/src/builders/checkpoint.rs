//! Where a rank keeps its checkpoints: an emptyDir, a volume of `spec.template`, or the job's own claim.
//!
//! Only rank 0 reads and writes checkpoints (it loads the newest and broadcasts it at resume), so with
//! `spec.checkpoint.volumeClaimTemplate` only rank 0 mounts the claim `<job>-checkpoints`. The claim is owned by
//! the job, not by a pod, so it outlives gang restarts and a restarted gang resumes where it stopped.

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSpec, Volume,
};
use rdu_crds::consts;

use super::meta::child_meta;
use crate::validate::{Checkpointing, ValidJob};

/// Where checkpoints are written inside the worker container.
pub const CHECKPOINT_MOUNT: &str = "/var/lib/rdu/checkpoints";
/// Name of the emptyDir volume used for checkpoints when the spec names none.
pub(crate) const CHECKPOINT_VOLUME: &str = "rdu-checkpoints";
/// Name of rank 0's pod volume for the claim of `spec.checkpoint.volumeClaimTemplate`.
pub const CHECKPOINT_CLAIM_VOLUME: &str = "rdu-checkpoint-claim";
/// The group the worker image runs as (`USER 65532:65532` in docker/Dockerfile, target worker).
pub const WORKER_FS_GROUP: i64 = 65532;

/// The checkpoint storage of one rank's pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CheckpointStorage {
    /// No checkpointing, or a rank that never touches checkpoints (not rank 0, with a claim).
    None,
    /// An emptyDir `rdu-checkpoints`: dies with the pod.
    EmptyDir,
    /// A volume of `spec.template` named by `spec.checkpoint.volume`.
    Template(String),
    /// The job's claim `<job>-checkpoints` (rank 0 only).
    Claim,
}

impl CheckpointStorage {
    /// The storage of `rank`'s pod.
    pub(crate) fn of(checkpointing: &Checkpointing, rank: u32) -> Self {
        match checkpointing {
            Checkpointing::Off => CheckpointStorage::None,
            Checkpointing::EmptyDir => CheckpointStorage::EmptyDir,
            Checkpointing::TemplateVolume(volume) => CheckpointStorage::Template(volume.clone()),
            Checkpointing::Claim(_) if rank == 0 => CheckpointStorage::Claim,
            Checkpointing::Claim(_) => CheckpointStorage::None,
        }
    }

    /// The name of the pod volume the worker mounts at [`CHECKPOINT_MOUNT`], if any.
    pub(crate) fn volume_name(&self) -> Option<&str> {
        match self {
            CheckpointStorage::None => None,
            CheckpointStorage::EmptyDir => Some(CHECKPOINT_VOLUME),
            CheckpointStorage::Template(name) => Some(name),
            CheckpointStorage::Claim => Some(CHECKPOINT_CLAIM_VOLUME),
        }
    }

    /// Adds the volume the operator provides (a template volume is the user's) and, for the claim of job `job`,
    /// the fsGroup that makes it writable.
    pub(crate) fn add_to_pod(&self, job: &str, spec: &mut PodSpec) {
        let volume = match self {
            CheckpointStorage::None | CheckpointStorage::Template(_) => return,
            CheckpointStorage::EmptyDir => Volume {
                name: CHECKPOINT_VOLUME.to_string(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            CheckpointStorage::Claim => {
                writable_by_the_worker(spec);
                Volume {
                    name: CHECKPOINT_CLAIM_VOLUME.to_string(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: consts::checkpoint_claim_name(job),
                        read_only: None,
                    }),
                    ..Default::default()
                }
            }
        };
        spec.volumes.get_or_insert_with(Vec::new).push(volume);
    }
}

/// A fresh PersistentVolume is owned by root, and the worker runs as 65532:65532. With a pod fsGroup the kubelet
/// makes volumes that support ownership management (most block and local volumes) group-owned and group-writable
/// by that group. The template's own fsGroup wins: whoever sets one also chose the image's user.
/// `OnRootMismatch` keeps a gang restart from re-chowning every checkpoint already on the volume.
fn writable_by_the_worker(spec: &mut PodSpec) {
    let context = spec.security_context.get_or_insert_with(Default::default);
    if context.fs_group.is_none() {
        context.fs_group = Some(WORKER_FS_GROUP);
        context
            .fs_group_change_policy
            .get_or_insert_with(|| "OnRootMismatch".to_string());
    }
}

/// The claim `<job>-checkpoints` of `spec.checkpoint.volumeClaimTemplate`, owned by the job (never by a pod, so
/// gang restarts keep it; garbage collection removes it with the job). `None` without a claim template.
pub(crate) fn checkpoint_claim(job: &ValidJob) -> Option<PersistentVolumeClaim> {
    let Checkpointing::Claim(spec) = &job.checkpoint else {
        return None;
    };
    Some(PersistentVolumeClaim {
        metadata: child_meta(job, consts::checkpoint_claim_name(job.name)),
        spec: Some(PersistentVolumeClaimSpec::clone(spec)),
        status: None,
    })
}

#[cfg(test)]
mod tests;
