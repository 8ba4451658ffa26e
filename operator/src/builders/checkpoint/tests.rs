//! The checkpoint claim and which rank's storage is what (the whole pod with it: `builders/rank/tests.rs`).

use super::*;
use crate::test_fixtures::job_from;
use crate::validate::valid;
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
