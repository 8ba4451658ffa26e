//! Rank pods meet the restricted Pod Security level by default (issue 22, item 3), against a real API server, which
//! enforces Pod Security admission itself (no kubelet needed): the operator, running as the chart's ServiceAccount
//! with `--progress-url`, creates every pod of a plain job and of one with a checkpoint claim and TensorBoard in a
//! namespace labelled `pod-security.kubernetes.io/enforce: restricted`; a job whose template states
//! `runAsNonRoot: false` keeps it, and the API server refuses its pods (so the level is enforced in this test).
//! The admin's pod policy (tests/admin_safety.rs) would refuse that template first: here it allows privilege.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use rdu_e2e::kit::{
    self, JobFixture, TIMEOUT, operator_log, pods_of, progress_url_flag, wait_pods,
};
use rdu_e2e::{kubectl, poll_until};
use serde_json::json;

const RESTRICTED: &str = "restricted";

/// A 3-rank job in the restricted namespace.
fn job(name: &str) -> JobFixture {
    JobFixture::new(RESTRICTED, name).workers(3)
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn default_jobs_are_admitted_under_the_restricted_pod_security_level() {
    let (plane, _) = kit::plane("pod security")
        .namespaces(&[RESTRICTED])
        .chart_values(&["--set", "podPolicy.allow.privileged=true"])
        .operator_flags(&[&progress_url_flag(), "--pod-policy-allow=privileged"])
        .start_operator()
        .await;
    // Labelled before any job is applied: every pod the operator makes here meets the enforced level.
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
    let client = plane.admin_client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, RESTRICTED);

    // The level is enforced here: a pod that states runAsNonRoot false is refused, and the template's word is kept.
    let loose = job("loose")
        .template(json!({"spec": {"securityContext": {"runAsNonRoot": false}, "containers": []}}))
        .manifest();
    kit::apply(&plane, &loose).expect("apply loose");
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
    .unwrap_or_else(|e| {
        panic!(
            "{}\noperator log:\n{}",
            rdu_error_chain::Chain(&e),
            operator_log(&plane)
        )
    });
    assert!(pods_of(&pods, "loose").await.is_empty());

    // Default jobs: every pod admitted, rank 0 with its progress token, a checkpoint claim and TensorBoard.
    let kept = job("kept")
        .checkpoint(json!({"intervalSteps": 10,
                           "volumeClaimTemplate": {"resources": {"requests": {"storage": "64Mi"}}}}))
        .set("tensorboard", json!({}));
    for fixture in [job("plain"), kept] {
        kit::apply(&plane, &fixture.manifest()).expect("apply");
    }
    for name in ["plain", "kept"] {
        let created = wait_pods(&plane, &pods, name, 3, 0).await;
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
