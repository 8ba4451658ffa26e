//! The checkpoint claim and which rank mounts it.

use super::*;
use crate::builders::{WORKER_CONTAINER, worker_pod};
use crate::test_fixtures::job_from;
use crate::validate::valid;
use k8s_openapi::api::core::v1::Pod;
use rdu_crds::RduJob;

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

fn worker(pod: &Pod) -> &k8s_openapi::api::core::v1::Container {
    let spec = pod.spec.as_ref().expect("spec");
    spec.containers
        .iter()
        .find(|c| c.name == WORKER_CONTAINER)
        .expect("worker container")
}

fn checkpoint_dir(pod: &Pod) -> Option<String> {
    worker(pod)
        .env
        .as_ref()
        .and_then(|env| env.iter().find(|e| e.name == consts::env::CHECKPOINT_DIR))
        .and_then(|e| e.value.clone())
}

fn fs_group(pod: &Pod) -> (Option<i64>, Option<String>) {
    let context = pod.spec.as_ref().and_then(|s| s.security_context.clone());
    (
        context.as_ref().and_then(|c| c.fs_group),
        context.and_then(|c| c.fs_group_change_policy),
    )
}

#[test]
fn the_claim_is_named_labelled_owned_and_defaults_to_one_writer() {
    let claim = checkpoint_claim(&valid(&claimed(SIZED, ""))).expect("a claim");
    assert_eq!(claim.metadata.name.as_deref(), Some("mnist-checkpoints"));
    assert_eq!(claim.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(
        claim.metadata.labels.as_ref().expect("labels")[consts::LABEL_JOB_NAME],
        "mnist"
    );
    let owners = claim.metadata.owner_references.as_ref().expect("owner");
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str(),
            owners[0].controller
        ),
        ("RduJob", "mnist", "uid-mnist", Some(true))
    );
    let spec = claim.spec.expect("spec");
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert_eq!(
        spec.resources.and_then(|r| r.requests).expect("requests")["storage"].0,
        "64Mi"
    );
}

#[test]
fn the_template_of_the_claim_is_kept() {
    let template = "{accessModes: [ReadWriteMany], storageClassName: fast, resources: {requests: {storage: 1Gi}}}";
    let spec = checkpoint_claim(&valid(&claimed(template, "")))
        .expect("a claim")
        .spec
        .expect("spec");
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_string()]));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
}

#[test]
fn no_claim_without_a_claim_template() {
    let mut job = claimed(SIZED, "");
    job.spec
        .checkpoint
        .as_mut()
        .expect("checkpoint")
        .volume_claim_template = None;
    assert_eq!(checkpoint_claim(&valid(&job)), None);
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

#[test]
fn storage_follows_the_resolved_setting_and_only_rank_0_mounts_the_claim() {
    let claim = Checkpointing::Claim(Default::default());
    let cases = [
        (Checkpointing::Off, 0, CheckpointStorage::None),
        (Checkpointing::EmptyDir, 1, CheckpointStorage::EmptyDir),
        (
            Checkpointing::TemplateVolume("ckpt".into()),
            1,
            CheckpointStorage::Template("ckpt".into()),
        ),
        (claim.clone(), 0, CheckpointStorage::Claim),
        (claim, 1, CheckpointStorage::None),
    ];
    for (setting, rank, want) in cases {
        assert_eq!(
            CheckpointStorage::of(&setting, rank),
            want,
            "{setting:?} rank {rank}"
        );
    }
}
