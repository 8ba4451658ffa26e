//! Rank pods meet the restricted Pod Security level by default (issue 22, item 3), against a real API server, which
//! enforces Pod Security admission itself (no kubelet needed): the operator, running as the chart's ServiceAccount
//! with `--progress-url`, creates every pod of a plain job and of one with a checkpoint claim and TensorBoard in a
//! namespace labelled `pod-security.kubernetes.io/enforce: restricted`; a job whose template states
//! `runAsNonRoot: false` keeps it, and the API server refuses its pods (so the level is enforced in this test).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use rdu_e2e::{
    Components, ControlPlane, assets_or_skip, create_namespace, install_crd, kubectl, poll_until,
    start_operator_as_chart_with,
};
use serde_json::{Value, json};
use std::time::Duration;

const OPERATOR_NAMESPACE: &str = "rdu-system";
const RESTRICTED: &str = "restricted";
const TIMEOUT: Duration = Duration::from_secs(90);

fn job(name: &str, extra: Value) -> String {
    let mut spec = json!({
        "workers": 3, "tilesPerWorker": 1, "image": "rdu-worker:0.1.0",
        "model": {"name": "ffn-logreg", "hiddenSizes": [16]},
        "data": {"source": "synthetic", "samples": 512},
        "training": {"epochs": 1, "batchSize": 8, "learningRate": 0.1}
    });
    for (key, value) in extra.as_object().into_iter().flatten() {
        spec[key] = value.clone();
    }
    json!({
        "apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob",
        "metadata": {"name": name, "namespace": RESTRICTED},
        "spec": spec,
    })
    .to_string()
}

async fn pods_of(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("rdu.dev/job-name={job}")))
        .await
        .expect("list pods")
        .items
}

async fn wait_for_pods(plane: &ControlPlane, pods: &Api<Pod>, job: &str, count: usize) -> Vec<Pod> {
    poll_until(&format!("{job}: {count} pods"), TIMEOUT, || async {
        let list = pods_of(pods, job).await;
        if list.len() == count {
            Ok(list)
        } else {
            Err(format!("{} pods", list.len()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 40)))
}

#[tokio::test]
async fn default_jobs_are_admitted_under_the_restricted_pod_security_level() {
    let Some(assets) = assets_or_skip("pod security") else {
        return;
    };
    let mut plane = ControlPlane::start(&assets, Components::default())
        .await
        .expect("control plane");
    install_crd(&plane).await.expect("CRD");
    for namespace in [OPERATOR_NAMESPACE, RESTRICTED] {
        create_namespace(&plane, namespace)
            .await
            .expect("namespace");
    }
    kubectl(
        &plane,
        &[
            "label",
            "namespace",
            RESTRICTED,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
        None,
    )
    .expect("label the namespace");
    start_operator_as_chart_with(
        &mut plane,
        OPERATOR_NAMESPACE,
        &["--progress-url=http://rdu-rdu-operator-progress.rdu-system.svc:8081"],
    )
    .expect("operator starts");
    let client = plane.admin_client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, RESTRICTED);

    // The level is enforced here: a pod that states runAsNonRoot false is refused, and the template's word is kept.
    let loose = job(
        "loose",
        json!({"template": {"spec": {"securityContext": {"runAsNonRoot": false}, "containers": []}}}),
    );
    kubectl(&plane, &["apply", "-f", "-"], Some(&loose)).expect("apply loose");
    poll_until("the loose job's pods refused", TIMEOUT, || async {
        let log = plane.log_tail("rdu-operator", 200);
        if log.contains("loose-worker-0")
            && log.contains("violates PodSecurity \"restricted:latest\"")
        {
            Ok(())
        } else {
            Err("no refusal in the operator's log yet".to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", plane.log_tail("rdu-operator", 40)));
    assert!(pods_of(&pods, "loose").await.is_empty());

    // Default jobs: every pod admitted, rank 0 with its progress token, a checkpoint claim and TensorBoard.
    for (name, extra) in [
        ("plain", json!({})),
        (
            "kept",
            json!({
                "checkpoint": {"intervalSteps": 10,
                               "volumeClaimTemplate": {"resources": {"requests": {"storage": "64Mi"}}}},
                "tensorboard": {}
            }),
        ),
    ] {
        kubectl(&plane, &["apply", "-f", "-"], Some(&job(name, extra))).expect("apply");
    }
    for name in ["plain", "kept"] {
        let created = wait_for_pods(&plane, &pods, name, 3).await;
        for pod in &created {
            let spec = pod.spec.as_ref().expect("spec");
            assert_eq!(spec.automount_service_account_token, Some(false));
            let worker = &spec.containers[0];
            let context = worker.security_context.as_ref().expect("context");
            assert_eq!(context.read_only_root_filesystem, Some(true));
            assert_eq!(context.allow_privilege_escalation, Some(false));
        }
        let rank0 = created
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(&format!("{name}-worker-0")))
            .expect("rank 0");
        let volumes = rank0
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>();
        assert!(volumes.contains(&"rdu-progress-token"), "{volumes:?}");
        if name == "kept" {
            assert!(volumes.contains(&"rdu-checkpoint-claim"), "{volumes:?}");
            assert!(volumes.contains(&"rdu-tensorboard"), "{volumes:?}");
        }
    }
    assert!(
        pods_of(&pods, "loose").await.is_empty(),
        "still refused while the others run"
    );
}
