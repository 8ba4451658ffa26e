//! Checkpoints that outlive the gang: with `spec.checkpoint.volumeClaimTemplate` the operator, running as the
//! chart's ServiceAccount under RBAC, creates one claim owned by the job, mounts it in rank 0 only, and keeps the
//! same claim across a gang restart; the API server refuses `volume` and `volumeClaimTemplate` together.
//! There is no kubelet: the test reports pod phases through the pods/status subresource.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use rdu_crds::RduJob;
use rdu_crds::consts::{checkpoint_claim_name, env};
use rdu_e2e::kit::{
    self, JobFixture, TIMEOUT, operator_log, report_running, report_terminated, wait_phase,
    wait_pods,
};
use rdu_e2e::poll_until;
use rdu_operator::{CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT, WORKER_FS_GROUP};
use serde_json::{Value, json};

const JOBS: &str = "jobs";

fn job(name: &str, checkpoint: Value) -> String {
    JobFixture::new(JOBS, name)
        .workers(3)
        .checkpoint(checkpoint)
        .run_policy(json!({"backoffLimit": 3}))
        .manifest()
}

/// What rank pod `pod` has of the checkpoint claim: (claim volume, mount at CHECKPOINT_MOUNT, checkpoint env,
/// pod fsGroup).
fn claim_use(pod: &Pod, claim: &str) -> (bool, bool, Option<String>, Option<i64>) {
    let spec = pod.spec.as_ref().expect("spec");
    let volume = spec.volumes.iter().flatten().any(|v| {
        v.name == CHECKPOINT_CLAIM_VOLUME
            && v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
    });
    let worker = spec
        .containers
        .iter()
        .find(|c| c.name == "worker")
        .expect("worker container");
    let mounted = worker
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == CHECKPOINT_MOUNT);
    let dir = worker
        .env
        .iter()
        .flatten()
        .find(|e| e.name == env::CHECKPOINT_DIR)
        .and_then(|e| e.value.clone());
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
    (volume, mounted, dir, fs_group)
}

fn assert_only_rank_0_uses(pods: &[Pod], claim: &str) {
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let expected = if name.ends_with("-worker-0") {
            (
                true,
                true,
                Some(CHECKPOINT_MOUNT.to_string()),
                Some(WORKER_FS_GROUP),
            )
        } else {
            (false, false, None, None)
        };
        assert_eq!(claim_use(pod, claim), expected, "{name}");
    }
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_checkpoint_claim_is_owned_by_the_job_mounted_by_rank_0_and_outlives_a_gang_restart() {
    let (plane, _) = kit::plane("checkpoint storage")
        .controller_manager()
        .namespaces(&[JOBS])
        .start_operator()
        .await;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), JOBS);

    let checkpoint = json!({"intervalSteps": 20, "keep": 2,
        "volumeClaimTemplate": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}});
    kit::apply(&plane, &job("ckpt", checkpoint)).expect("apply");
    let generation0 = wait_pods(&plane, &pods, "ckpt", 3, 0).await;

    let name = checkpoint_claim_name("ckpt");
    assert_eq!(name, "ckpt-checkpoints");
    let claim = claims.get(&name).await.unwrap_or_else(|e| {
        panic!(
            "no claim {name}: {}\n{}",
            rdu_error_chain::Chain(&e),
            operator_log(&plane)
        )
    });
    let job_uid = jobs.get("ckpt").await.expect("job").metadata.uid;
    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            Some(owners[0].uid.clone()),
            owners[0].controller
        ),
        ("RduJob", "ckpt", job_uid, Some(true))
    );
    assert_eq!(
        claim
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .get("rdu.dev/job-name")
            .map(String::as_str),
        Some("ckpt")
    );
    let size = claim
        .spec
        .clone()
        .and_then(|s| s.resources)
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned());
    assert_eq!(size.map(|q| q.0).as_deref(), Some("64Mi"));
    let uid = claim.metadata.uid.clone().expect("uid");
    assert_only_rank_0_uses(&generation0, &name);

    // Running, then rank 2 exits 75: the gang restarts with generation 1 on the same claim.
    for name in kit::names(&generation0) {
        report_running(&pods, &name).await;
    }
    wait_phase(&plane, &jobs, "ckpt", "Running").await;
    report_terminated(&pods, "ckpt-worker-2", "Failed", 75, None).await;
    let generation1 = wait_pods(&plane, &pods, "ckpt", 3, 1).await;
    let after = claims.get(&name).await.expect("the claim survives");
    assert_eq!(after.metadata.uid.as_deref(), Some(uid.as_str()));
    assert!(after.metadata.deletion_timestamp.is_none());
    assert_only_rank_0_uses(&generation1, &name);
    let all = claims
        .list(&ListParams::default().labels("rdu.dev/job-name=ckpt"))
        .await
        .expect("claims");
    assert_eq!(all.items.len(), 1, "one claim per job");

    // Deleting the job hands the claim to the garbage collector (pvc-protection may hold it while
    // terminating; no kube-controller-manager here removes that finalizer).
    jobs.delete("ckpt", &DeleteParams::background())
        .await
        .expect("delete");
    poll_until("the claim collected with its job", TIMEOUT, || async {
        match claims.get_opt(&name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(c) if c.metadata.deletion_timestamp.is_some() => Ok(()),
            Some(c) => Err(format!("still there: {:?}", c.metadata)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{}", rdu_error_chain::Chain(&e)));
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_api_server_refuses_a_template_volume_and_a_claim_template_together() {
    let plane = kit::plane("checkpoint storage refusal")
        .namespaces(&[JOBS])
        .start()
        .await;
    let both = json!({"intervalSteps": 20, "volume": "ckpt",
        "volumeClaimTemplate": {"resources": {"requests": {"storage": "64Mi"}}}});
    let refused = kit::apply(&plane, &job("both", both))
        .expect_err("both refused")
        .to_string();
    assert!(
        refused.contains(
            "spec.checkpoint.volume and spec.checkpoint.volumeClaimTemplate cannot both be set: keep volume to \
             write into a volume of spec.template, or volumeClaimTemplate for a claim the operator creates, and \
             remove the other"
        ),
        "{refused}"
    );
    let claim_only = json!({"intervalSteps": 20,
        "volumeClaimTemplate": {"resources": {"requests": {"storage": "64Mi"}}}});
    kit::apply(&plane, &job("one", claim_only)).expect("a claim template alone is accepted");
}
