//! Rank 0's TensorBoard log directory (`spec.tensorboard`): the template's named volume, or an emptyDir, mounted at
//! `/var/log/rdu/tensorboard`, and `RDU_TENSORBOARD_DIR` naming it.

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, EnvVar, Pod, Volume, VolumeMount};
use rdu_crds::consts::{TENSORBOARD_MOUNT, WORKER_CONTAINER, env};

use crate::validate::TensorBoardLog;

/// Name of the emptyDir used when `spec.tensorboard.volume` is unset.
pub const TENSORBOARD_VOLUME: &str = "rdu-tensorboard";

/// Rank 0's pod writing TensorBoard events to `log`.
pub fn add_tensorboard(pod: &mut Pod, log: &TensorBoardLog) {
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
    let Some(worker) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == WORKER_CONTAINER)
    else {
        return;
    };
    worker
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: volume,
            mount_path: TENSORBOARD_MOUNT.to_string(),
            ..Default::default()
        });
    let vars = worker.env.get_or_insert_with(Vec::new);
    vars.retain(|v| v.name != env::TENSORBOARD_DIR);
    vars.push(EnvVar {
        name: env::TENSORBOARD_DIR.to_string(),
        value: Some(TENSORBOARD_MOUNT.to_string()),
        value_from: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::rank_pod;
    use crate::test_fixtures::job;
    use crate::validate::valid;

    fn mount_and_env(pod: &Pod) -> (Option<String>, Option<String>) {
        let worker = &pod.spec.as_ref().expect("spec").containers[0];
        let mount = worker
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == TENSORBOARD_MOUNT)
            .map(|m| m.name.clone());
        let dir = worker
            .env
            .iter()
            .flatten()
            .find(|v| v.name == env::TENSORBOARD_DIR)
            .and_then(|v| v.value.clone());
        (mount, dir)
    }

    #[test]
    fn only_rank_zero_of_a_job_with_tensorboard_gets_the_log_directory() {
        let mut with = job("mnist", Some("ml"), 2);
        with.spec.tensorboard = Some(Default::default());
        let rank0 = rank_pod(&valid(&with), 0, 0, None);
        assert_eq!(
            mount_and_env(&rank0),
            (
                Some(TENSORBOARD_VOLUME.to_string()),
                Some(TENSORBOARD_MOUNT.to_string())
            )
        );
        assert_eq!(
            mount_and_env(&rank_pod(&valid(&with), 1, 0, None)),
            (None, None)
        );
        let without = job("mnist", Some("ml"), 2);
        assert_eq!(
            mount_and_env(&rank_pod(&valid(&without), 0, 0, None)),
            (None, None)
        );
    }

    #[test]
    fn a_named_volume_of_the_template_is_mounted_and_no_emptydir_added() {
        let mut with = job("mnist", Some("ml"), 2);
        with.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"containers": [], "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": "tb"}}]}
            }))
            .expect("template"),
        );
        with.spec.tensorboard = Some(rdu_crds::TensorBoardSpec {
            volume: Some("runs".into()),
        });
        let pod = rank_pod(&valid(&with), 0, 0, None);
        assert_eq!(mount_and_env(&pod).0.as_deref(), Some("runs"));
        let volumes = pod.spec.and_then(|s| s.volumes).unwrap_or_default();
        assert!(
            volumes.iter().all(|v| v.name != TENSORBOARD_VOLUME),
            "{volumes:?}"
        );
    }
}
