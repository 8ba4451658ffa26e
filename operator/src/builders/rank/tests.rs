//! A rank's whole pod: the contract's variables, the volumes its paths need, and rank 0's checkpoint claim.

use super::*;
use crate::builders::checkpoint::{CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT, WORKER_FS_GROUP};
use crate::builders::progress::PROGRESS_TOKEN_VOLUME;
use crate::builders::tensorboard::TENSORBOARD_VOLUME;
use crate::test_fixtures::{job, job_from};
use crate::validate::valid;
use k8s_openapi::api::core::v1::Container;
use rdu_crds::RduJob;
use rdu_crds::consts::{TENSORBOARD_MOUNT, WORKER_CONTAINER, env};

fn claimed(template: &str, pod_template: &str) -> RduJob {
    job_from(&format!(
        "apiVersion: rdu.dev/v1alpha1
kind: RduJob
metadata: {{name: mnist, namespace: ml, uid: uid-mnist}}
spec:
  workers: 3
  image: ghcr.io/rdu/worker:1
  checkpoint: {{intervalSteps: 20, keep: 2, volumeClaimTemplate: {template}}}
{pod_template}  model: {{name: ffn-logreg}}
  data: {{source: synthetic}}
  training: {{steps: 5, batchSize: 8, learningRate: 0.5}}
"
    ))
}

const SIZED: &str = "{resources: {requests: {storage: 64Mi}}}";

fn worker(pod: &Pod) -> &Container {
    let spec = pod.spec.as_ref().expect("spec");
    spec.containers
        .iter()
        .find(|c| c.name == WORKER_CONTAINER)
        .expect("worker container")
}

fn checkpoint_dir(pod: &Pod) -> Option<String> {
    env_value(pod, env::CHECKPOINT_DIR)
}

fn fs_group(pod: &Pod) -> (Option<i64>, Option<String>) {
    let context = pod.spec.as_ref().and_then(|s| s.security_context.clone());
    (
        context.as_ref().and_then(|c| c.fs_group),
        context.and_then(|c| c.fs_group_change_policy),
    )
}

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
        rank0
            .spec
            .as_ref()
            .and_then(|s| s.automount_service_account_token),
        Some(false),
        "the projected volume is rank 0's only token: the API's default one stays unmounted"
    );
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

#[test]
fn only_rank_0_mounts_the_claim_and_gets_the_checkpoint_dir() {
    let job = claimed(SIZED, "");
    let rank0 = worker_pod(&valid(&job), 0, 2);
    let volumes = rank0
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .expect("volumes");
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0].name, CHECKPOINT_CLAIM_VOLUME);
    assert_eq!(
        volumes[0]
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("mnist-checkpoints")
    );
    let mounts = worker(&rank0).volume_mounts.clone().expect("mounts");
    assert_eq!(
        (mounts[0].name.as_str(), mounts[0].mount_path.as_str()),
        (CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT)
    );
    assert_eq!(checkpoint_dir(&rank0).as_deref(), Some(CHECKPOINT_MOUNT));

    for rank in [1, 2] {
        let pod = worker_pod(&valid(&job), rank, 2);
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.volumes, None, "rank {rank}");
        assert_eq!(worker(&pod).volume_mounts, None, "rank {rank}");
        assert_eq!(checkpoint_dir(&pod), None, "rank {rank}");
        assert_eq!(fs_group(&pod), (None, None), "rank {rank}");
    }
}

#[test]
fn rank_0_gets_the_workers_fs_group_unless_the_template_sets_one() {
    let job = claimed(SIZED, "");
    assert_eq!(
        fs_group(&worker_pod(&valid(&job), 0, 0)),
        (Some(WORKER_FS_GROUP), Some("OnRootMismatch".to_string()))
    );

    let other_settings =
        "  template: {spec: {containers: [], securityContext: {runAsUser: 1000}}}\n";
    let pod = worker_pod(&valid(&claimed(SIZED, other_settings)), 0, 0);
    assert_eq!(
        fs_group(&pod),
        (Some(WORKER_FS_GROUP), Some("OnRootMismatch".to_string()))
    );
    assert_eq!(
        pod.spec
            .and_then(|s| s.security_context)
            .and_then(|c| c.run_as_user),
        Some(1000),
        "the template's other settings stay"
    );

    let own = "  template: {spec: {containers: [], securityContext: {fsGroup: 2000}}}\n";
    assert_eq!(
        fs_group(&worker_pod(&valid(&claimed(SIZED, own)), 0, 0)),
        (Some(2000), None),
        "the template's fsGroup wins"
    );
}
