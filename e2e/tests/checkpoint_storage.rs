//! Checkpoints that outlive the gang: with `spec.checkpoint.volumeClaimTemplate` the operator, running as the
//! chart's ServiceAccount under RBAC, creates one claim owned by the job, mounts it in rank 0 only, and keeps the
//! same claim across a gang restart; the API server refuses `volume` and `volumeClaimTemplate` together.
//! There is no kubelet: the test reports pod phases through the pods/status subresource.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use rdu_crds::RduJob;
use rdu_crds::consts::{checkpoint_claim_name, env};
use rdu_e2e::{
    Components, ControlPlane, assets_or_skip, create_namespace, install_crd, kubectl, poll_until,
    start_operator_as_chart,
};
use rdu_operator::builders::{CHECKPOINT_CLAIM_VOLUME, CHECKPOINT_MOUNT, WORKER_FS_GROUP};
use serde_json::{Value, json};
use std::time::Duration;

const OPERATOR_NAMESPACE: &str = "rdu-system";
const JOBS: &str = "jobs";
const TIMEOUT: Duration = Duration::from_secs(90);

fn job(name: &str, checkpoint: Value) -> String {
    json!({
        "apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob",
        "metadata": {"name": name, "namespace": JOBS},
        "spec": {"workers": 3, "tilesPerWorker": 1, "image": "rdu-worker:0.1.0",
                 "model": {"name": "ffn-logreg", "hiddenSizes": [16]},
                 "data": {"source": "synthetic", "samples": 512},
                 "training": {"epochs": 1, "batchSize": 8, "learningRate": 0.1},
                 "checkpoint": checkpoint,
                 "runPolicy": {"backoffLimit": 3}}
    })
    .to_string()
}

/// The control plane (with the garbage collector), the CRD, the chart's RBAC, and the operator running as the
/// chart's ServiceAccount.
async fn operator_plane() -> Option<ControlPlane> {
    let assets = assets_or_skip("checkpoint storage")?;
    let components = Components {
        scheduler: false,
        controller_manager: true,
        node: None,
    };
    let mut plane = ControlPlane::start(&assets, components)
        .await
        .expect("control plane");
    install_crd(&plane).await.expect("CRD");
    for ns in [OPERATOR_NAMESPACE, JOBS] {
        create_namespace(&plane, ns).await.expect("namespace");
    }
    start_operator_as_chart(&mut plane, OPERATOR_NAMESPACE).expect("operator starts");
    Some(plane)
}

fn operator_log(plane: &ControlPlane) -> String {
    plane.log_tail("rdu-operator", 40)
}

/// The live pods of `job` at `generation`, by rank, once all `workers` exist.
async fn wait_pods(
    plane: &ControlPlane,
    pods: &Api<Pod>,
    job: &str,
    workers: usize,
    generation: u32,
) -> Vec<Pod> {
    let selector = format!("rdu.dev/job-name={job},rdu.dev/generation={generation}");
    poll_until(
        &format!("{workers} pods of {job}/{generation}"),
        TIMEOUT,
        || {
            let (pods, selector) = (pods.clone(), selector.clone());
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let mut live: Vec<Pod> = list
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .collect();
                live.sort_by_key(|p| p.metadata.name.clone());
                if live.len() == workers {
                    Ok(live)
                } else {
                    Err(format!("{} pods", live.len()))
                }
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", operator_log(plane)))
}

async fn wait_phase(plane: &ControlPlane, jobs: &Api<RduJob>, name: &str, phase: &str) {
    poll_until(&format!("{name} phase {phase}"), TIMEOUT, || async {
        let job = jobs.get(name).await.map_err(|e| e.to_string())?;
        let status = serde_json::to_value(&job.status).unwrap_or(Value::Null);
        if status["phase"] == phase {
            Ok(())
        } else {
            Err(status.to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", operator_log(plane)));
}

/// Reports the worker container of `name` running, or terminated with `exit_code`, as a kubelet would.
async fn report(pods: &Api<Pod>, name: &str, exit_code: Option<i32>) {
    let now = "2026-01-01T00:00:00Z";
    let (phase, state) = match exit_code {
        None => ("Running", json!({"running": {"startedAt": now}})),
        Some(code) => (
            "Failed",
            json!({"terminated": {"exitCode": code, "reason": "Error", "startedAt": now, "finishedAt": now}}),
        ),
    };
    let patch = json!({"status": {"phase": phase, "podIP": "10.1.0.1", "startTime": now,
        "containerStatuses": [{"name": "worker", "ready": exit_code.is_none(), "restartCount": 0,
                               "image": "rdu-worker:0.1.0", "imageID": "", "state": state}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
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
async fn the_checkpoint_claim_is_owned_by_the_job_mounted_by_rank_0_and_outlives_a_gang_restart() {
    let Some(plane) = operator_plane().await else {
        return;
    };
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), JOBS);

    let checkpoint = json!({"intervalSteps": 20, "keep": 2,
        "volumeClaimTemplate": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}});
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("ckpt", checkpoint)),
    )
    .expect("apply");
    let generation0 = wait_pods(&plane, &pods, "ckpt", 3, 0).await;

    let name = checkpoint_claim_name("ckpt");
    assert_eq!(name, "ckpt-checkpoints");
    let claim = claims
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("no claim {name}: {e}\n{}", operator_log(&plane)));
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
    for pod in &generation0 {
        report(
            &pods,
            pod.metadata.name.as_deref().unwrap_or_default(),
            None,
        )
        .await;
    }
    wait_phase(&plane, &jobs, "ckpt", "Running").await;
    report(&pods, "ckpt-worker-2", Some(75)).await;
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
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn the_api_server_refuses_a_template_volume_and_a_claim_template_together() {
    let Some(assets) = assets_or_skip("checkpoint storage refusal") else {
        return;
    };
    let plane = ControlPlane::start(&assets, Components::default())
        .await
        .expect("control plane");
    install_crd(&plane).await.expect("CRD");
    create_namespace(&plane, JOBS).await.expect("namespace");
    let both = json!({"intervalSteps": 20, "volume": "ckpt",
        "volumeClaimTemplate": {"resources": {"requests": {"storage": "64Mi"}}}});
    let refused = kubectl(&plane, &["apply", "-f", "-"], Some(&job("both", both)))
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
    kubectl(&plane, &["apply", "-f", "-"], Some(&job("one", claim_only)))
        .expect("a claim template alone is accepted");
}
