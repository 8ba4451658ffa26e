//! The worker container of a pod being built: the one container the contract's mounts go into.

use k8s_openapi::api::core::v1::{PodSpec, VolumeMount};
use rdu_crds::consts::WORKER_CONTAINER;

/// Mounts `mount` in `spec`'s worker container; a spec without one (refused by validation before any pod is
/// built) is left as it is.
pub(crate) fn mount_in_worker(spec: &mut PodSpec, mount: VolumeMount) {
    if let Some(worker) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == WORKER_CONTAINER)
    {
        worker
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    #[test]
    fn only_the_worker_container_gets_the_mount() {
        let container = |name: &str| Container {
            name: name.to_string(),
            ..Default::default()
        };
        let mut spec = PodSpec {
            containers: vec![container("sidecar"), container(WORKER_CONTAINER)],
            ..Default::default()
        };
        let mount = VolumeMount {
            name: "v".into(),
            mount_path: "/m".into(),
            ..Default::default()
        };
        mount_in_worker(&mut spec, mount.clone());
        assert_eq!(spec.containers[0].volume_mounts, None);
        assert_eq!(spec.containers[1].volume_mounts, Some(vec![mount]));

        let mut no_worker = PodSpec {
            containers: vec![container("sidecar")],
            ..Default::default()
        };
        mount_in_worker(&mut no_worker, VolumeMount::default());
        assert_eq!(no_worker.containers[0].volume_mounts, None);
    }
}
