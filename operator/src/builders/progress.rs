//! Rank 0's means to report progress (DESIGN 4.8): the operator's URL in its env and a projected ServiceAccount
//! token, bound to the pod and good only for the progress audience, that the kubelet mounts and refreshes.

use k8s_openapi::api::core::v1::{
    EnvVar, Pod, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use rdu_crds::consts::{self, WORKER_CONTAINER, env};

use super::children::worker_pod;
use crate::validate::ValidJob;

/// Name of the projected token volume in rank 0's pod.
pub const PROGRESS_TOKEN_VOLUME: &str = "rdu-progress-token";
/// The token's lifetime; the kubelet renews it at 80% of it.
pub const PROGRESS_TOKEN_SECONDS: i64 = 3600;

/// The pod of `rank` at `generation`; rank 0's reports progress when the operator takes reports at `progress_url`,
/// and writes TensorBoard events when the job asks.
pub fn rank_pod(job: &ValidJob, rank: u32, generation: u32, progress_url: Option<&str>) -> Pod {
    let mut pod = worker_pod(job, rank, generation);
    if rank == 0 {
        if let Some(url) = progress_url {
            add_progress_reporting(&mut pod, url);
        }
        if let Some(log) = &job.tensorboard {
            super::tensorboard::add_tensorboard(&mut pod, log);
        }
    }
    pod
}

/// Rank 0's pod reporting progress to the operator at `url`: the env of `rdu_crds::ProgressEndpoint`, the
/// projected token volume, and its read-only mount in the worker container.
pub fn add_progress_reporting(pod: &mut Pod, url: &str) {
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
                    path: "token".to_string(),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
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
            name: PROGRESS_TOKEN_VOLUME.to_string(),
            mount_path: consts::PROGRESS_TOKEN_DIR.to_string(),
            read_only: Some(true),
            ..Default::default()
        });
    let vars = worker.env.get_or_insert_with(Vec::new);
    vars.retain(|v| v.name != env::PROGRESS_URL && v.name != env::PROGRESS_TOKEN_FILE);
    for (name, value) in [
        (env::PROGRESS_URL, url.trim_end_matches('/').to_string()),
        (
            env::PROGRESS_TOKEN_FILE,
            format!("{}/token", consts::PROGRESS_TOKEN_DIR),
        ),
    ] {
        vars.push(EnvVar {
            name: name.to_string(),
            value: Some(value),
            value_from: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::job;
    use crate::validate::valid;

    #[test]
    fn only_rank_zero_reports_and_only_when_the_operator_takes_reports() {
        let job = job("mnist", Some("ml"), 2);
        let has_token = |pod: &Pod| {
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| v.name == PROGRESS_TOKEN_VOLUME)
        };
        assert!(has_token(&rank_pod(&valid(&job), 0, 0, Some("http://op"))));
        assert!(!has_token(&rank_pod(&valid(&job), 1, 0, Some("http://op"))));
        assert!(!has_token(&rank_pod(&valid(&job), 0, 0, None)));
    }

    #[test]
    fn rank_zero_gets_the_url_and_a_pod_bound_token_for_the_progress_audience() {
        let job = job("mnist", Some("ml"), 2);
        let mut pod = worker_pod(&valid(&job), 0, 0);
        add_progress_reporting(&mut pod, "http://op.sys.svc:8080/");
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
        assert_eq!(
            spec.automount_service_account_token,
            Some(false),
            "the projected volume is rank 0's only token: the API's default one stays unmounted"
        );
        let worker = &spec.containers[0];
        let mount = worker
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == PROGRESS_TOKEN_VOLUME)
            .expect("mount");
        assert_eq!(mount.read_only, Some(true));
        let value = |name: &str| {
            worker
                .env
                .iter()
                .flatten()
                .find(|v| v.name == name)
                .and_then(|v| v.value.clone())
        };
        assert_eq!(
            value(env::PROGRESS_URL).as_deref(),
            Some("http://op.sys.svc:8080")
        );
        assert_eq!(
            value(env::PROGRESS_TOKEN_FILE).as_deref(),
            Some("/var/run/secrets/rdu.dev/progress/token")
        );
    }
}
