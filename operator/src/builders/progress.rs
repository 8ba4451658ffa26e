//! Rank 0's means to report progress (DESIGN 4.8): where it reports (the contract's `ProgressEndpoint`) and a
//! projected ServiceAccount token, bound to the pod and good only for the progress audience, that the kubelet
//! mounts and refreshes.

use k8s_openapi::api::core::v1::{
    Pod, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use rdu_crds::ProgressEndpoint;
use rdu_crds::consts;

use super::worker_container::mount_in_worker;

/// Name of the projected token volume in rank 0's pod.
pub(crate) const PROGRESS_TOKEN_VOLUME: &str = "rdu-progress-token";
/// The token's file inside [`consts::PROGRESS_TOKEN_DIR`].
pub(crate) const PROGRESS_TOKEN_FILE: &str = "token";
/// The token's lifetime; the kubelet renews it at 80% of it.
pub(crate) const PROGRESS_TOKEN_SECONDS: i64 = 3600;

/// Where rank 0 reports to the operator at `url`, and the token it shows.
pub(crate) fn progress_endpoint(url: &str) -> ProgressEndpoint {
    ProgressEndpoint {
        url: url.trim_end_matches('/').to_string(),
        token_file: format!("{}/{PROGRESS_TOKEN_FILE}", consts::PROGRESS_TOKEN_DIR),
    }
}

/// Rank 0's pod holding its progress token: the projected token volume, and its read-only mount in the worker
/// container.
pub(crate) fn add_progress_token(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: PROGRESS_TOKEN_VOLUME.to_string(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(consts::PROGRESS_TOKEN_AUDIENCE.to_string()),
                    expiration_seconds: Some(PROGRESS_TOKEN_SECONDS),
                    path: PROGRESS_TOKEN_FILE.to_string(),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    mount_in_worker(
        spec,
        VolumeMount {
            name: PROGRESS_TOKEN_VOLUME.to_string(),
            mount_path: consts::PROGRESS_TOKEN_DIR.to_string(),
            read_only: Some(true),
            ..Default::default()
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use rdu_crds::consts::WORKER_CONTAINER;

    #[test]
    fn the_endpoint_is_the_url_without_its_slash_and_the_mounted_token() {
        assert_eq!(
            progress_endpoint("http://op.sys.svc:8080/"),
            ProgressEndpoint {
                url: "http://op.sys.svc:8080".into(),
                token_file: "/var/run/secrets/rdu.dev/progress/token".into(),
            }
        );
    }

    #[test]
    fn the_token_is_pod_bound_for_the_progress_audience_and_mounted_read_only() {
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: WORKER_CONTAINER.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        add_progress_token(&mut pod);
        let spec = pod.spec.as_ref().expect("spec");
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == PROGRESS_TOKEN_VOLUME)
            .expect("token volume");
        let projection = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        let token = projection
            .and_then(|s| s[0].service_account_token.as_ref())
            .expect("service account token");
        assert_eq!(token.audience.as_deref(), Some("rdu.dev/progress"));
        let mount = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == PROGRESS_TOKEN_VOLUME)
            .expect("mount");
        assert_eq!(mount.read_only, Some(true));
        assert_eq!(
            format!("{}/{}", mount.mount_path, token.path),
            progress_endpoint("http://op").token_file,
            "the contract names the file the kubelet writes"
        );
    }
}
