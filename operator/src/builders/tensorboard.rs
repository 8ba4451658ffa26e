//! Rank 0's TensorBoard log directory (`spec.tensorboard`): the template's named volume, or an emptyDir, mounted at
//! `/var/log/rdu/tensorboard` (the contract's `RDU_TENSORBOARD_DIR` names it: `env::rank_contract`).

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, Volume, VolumeMount};
use rdu_crds::consts::TENSORBOARD_MOUNT;

use super::worker_container::mount_in_worker;

use crate::validate::TensorBoardLog;

/// Name of the emptyDir used when `spec.tensorboard.volume` is unset.
pub(crate) const TENSORBOARD_VOLUME: &str = "rdu-tensorboard";

/// Rank 0's pod with the volume of `log` mounted where it writes TensorBoard events.
pub(crate) fn add_tensorboard(pod: &mut Pod, log: &TensorBoardLog) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let volume = match log {
        TensorBoardLog::TemplateVolume(name) => name.clone(),
        TensorBoardLog::EmptyDir => {
            spec.volumes.get_or_insert_with(Vec::new).push(Volume {
                name: TENSORBOARD_VOLUME.to_string(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            });
            TENSORBOARD_VOLUME.to_string()
        }
    };
    mount_in_worker(
        spec,
        VolumeMount {
            name: volume,
            mount_path: TENSORBOARD_MOUNT.to_string(),
            ..Default::default()
        },
    );
}
