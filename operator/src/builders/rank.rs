//! The pod of one rank, whole: its contract (`env::rank_contract`), the pod built from it (`children`), and the
//! volumes the contract's paths need: rank 0's TensorBoard directory and its progress token.

use k8s_openapi::api::core::v1::Pod;

use super::children::contract_pod;
use super::env::rank_contract;
use super::progress::add_progress_token;
use super::tensorboard::add_tensorboard;
use crate::validate::ValidJob;

/// The pod of `rank` at `generation`; rank 0's reports progress when the operator takes reports at `progress_url`,
/// and writes TensorBoard events when the job asks.
pub fn rank_pod(job: &ValidJob, rank: u32, generation: u32, progress_url: Option<&str>) -> Pod {
    let contract = rank_contract(job, rank, generation, progress_url);
    let mut pod = contract_pod(job, &contract);
    if let (Some(_), Some(log)) = (&contract.tensorboard_dir, &job.tensorboard) {
        add_tensorboard(&mut pod, log);
    }
    if contract.progress.is_some() {
        add_progress_token(&mut pod);
    }
    pod
}

/// The pod of `rank` at `generation` when the operator takes no progress reports.
pub fn worker_pod(job: &ValidJob, rank: u32, generation: u32) -> Pod {
    rank_pod(job, rank, generation, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::progress::PROGRESS_TOKEN_VOLUME;
    use crate::builders::tensorboard::TENSORBOARD_VOLUME;
    use crate::test_fixtures::job;
    use crate::validate::valid;
    use rdu_crds::consts::{TENSORBOARD_MOUNT, env};

    /// The worker container's value of `name`, and whether it is set once.
    fn env_value(pod: &Pod, name: &str) -> Option<String> {
        let worker = &pod.spec.as_ref().expect("spec").containers[0];
        let vars: Vec<_> = worker
            .env
            .iter()
            .flatten()
            .filter(|v| v.name == name)
            .collect();
        assert!(vars.len() <= 1, "{name} set {} times", vars.len());
        vars.first().and_then(|v| v.value.clone())
    }

    fn mount_named(pod: &Pod, path: &str) -> Option<String> {
        pod.spec.as_ref().expect("spec").containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == path)
            .map(|m| m.name.clone())
    }

    fn has_volume(pod: &Pod, name: &str) -> bool {
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.name == name)
    }

    #[test]
    fn only_rank_zero_reports_and_only_when_the_operator_takes_reports() {
        let job = job("mnist", Some("ml"), 2);
        let rank0 = rank_pod(&valid(&job), 0, 0, Some("http://op.sys.svc:8080/"));
        assert!(has_volume(&rank0, PROGRESS_TOKEN_VOLUME));
        assert_eq!(
            env_value(&rank0, env::PROGRESS_URL).as_deref(),
            Some("http://op.sys.svc:8080")
        );
        assert_eq!(
            env_value(&rank0, env::PROGRESS_TOKEN_FILE).as_deref(),
            Some("/var/run/secrets/rdu.dev/progress/token")
        );
        for pod in [
            rank_pod(&valid(&job), 1, 0, Some("http://op")),
            rank_pod(&valid(&job), 0, 0, None),
        ] {
            assert!(!has_volume(&pod, PROGRESS_TOKEN_VOLUME));
            assert_eq!(env_value(&pod, env::PROGRESS_URL), None);
        }
    }

    #[test]
    fn only_rank_zero_of_a_job_with_tensorboard_gets_the_log_directory() {
        let mut with = job("mnist", Some("ml"), 2);
        with.spec.tensorboard = Some(Default::default());
        let rank0 = rank_pod(&valid(&with), 0, 0, None);
        assert_eq!(
            (
                mount_named(&rank0, TENSORBOARD_MOUNT),
                env_value(&rank0, env::TENSORBOARD_DIR)
            ),
            (
                Some(TENSORBOARD_VOLUME.to_string()),
                Some(TENSORBOARD_MOUNT.to_string())
            )
        );
        let rank1 = rank_pod(&valid(&with), 1, 0, None);
        assert_eq!(
            (
                mount_named(&rank1, TENSORBOARD_MOUNT),
                env_value(&rank1, env::TENSORBOARD_DIR)
            ),
            (None, None)
        );
        let without = rank_pod(&valid(&job("mnist", Some("ml"), 2)), 0, 0, None);
        assert_eq!(env_value(&without, env::TENSORBOARD_DIR), None);
        assert!(!has_volume(&without, TENSORBOARD_VOLUME));
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
        assert_eq!(
            mount_named(&pod, TENSORBOARD_MOUNT).as_deref(),
            Some("runs")
        );
        assert!(!has_volume(&pod, TENSORBOARD_VOLUME));
    }

    #[test]
    fn a_template_variable_of_a_contract_name_is_replaced_not_repeated() {
        let mut with = job("mnist", Some("ml"), 2);
        with.spec.tensorboard = Some(Default::default());
        with.spec.template = Some(
            serde_json::from_value(serde_json::json!({
                "spec": {"containers": [{"name": "worker", "env": [
                    {"name": "RDU_TENSORBOARD_DIR", "value": "/elsewhere"},
                    {"name": "RDU_PROGRESS_URL", "value": "http://elsewhere"}
                ]}]}
            }))
            .expect("template"),
        );
        let pod = rank_pod(&valid(&with), 0, 0, Some("http://op"));
        assert_eq!(
            env_value(&pod, env::TENSORBOARD_DIR).as_deref(),
            Some(TENSORBOARD_MOUNT)
        );
        assert_eq!(
            env_value(&pod, env::PROGRESS_URL).as_deref(),
            Some("http://op")
        );
    }
}
