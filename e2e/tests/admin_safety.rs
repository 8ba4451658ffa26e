//! An operator a cluster admin can install (issue 34, item 1): a user who may create RduJobs and nothing else
//! gets no pod beyond the admin's pod policy through the operator, against a real API server with the chart's RBAC
//! and the operator binary as the chart's ServiceAccount.
//! - With the chart's ValidatingAdmissionPolicy off, every rule's example template is accepted by the API and the
//!   operator fails the job (InvalidSpec) with the rule's message, creating no pod.
//! - With it on, `kubectl apply` as that user is refused with the same message, rule by rule.
//! - A template within the policy is admitted and its pods are made; a chart value lifts its rule at the API.
//!
//! Prints `{"bench":"admin_safety","refused":{…},"rules":…}`: refusals at the API per kind of privilege.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use rdu_crds::RduJob;
use rdu_e2e::kit::{self, JobFixture, TIMEOUT, pods_of, wait_pods, wait_status};
use rdu_e2e::{CHART_RELEASE, ControlPlane, SYSTEM_NAMESPACE, helm_template, kubectl, poll_until};
use rdu_operator::validate::{Exception, Guard, POD_POLICY_RULES, Rule};
use serde_json::{Value, json};

const TENANT: &str = "ml";
const USER: &str = "mallory";
const POLICY_TEMPLATE: &str = "templates/rdujob-pod-policy.yaml";

/// The summary's key for what a rule guards.
fn summary_key(rule: &Rule) -> &'static str {
    match rule.guard {
        Guard::Allow(Exception::Privileged) => "privileged",
        Guard::Allow(Exception::HostNamespaces) => "hostNetwork",
        Guard::Allow(Exception::HostPath) => "hostPath",
        Guard::Allow(Exception::NodeName) => "nodeName",
        Guard::Allow(Exception::Secrets) => "secretVolume",
        Guard::ServiceAccount => "serviceAccount",
        Guard::RuntimeClass => "runtimeClass",
    }
}

fn job(name: &str, template: &str) -> String {
    let template: Value = serde_json::from_str(template).expect("example JSON");
    JobFixture::new(TENANT, name)
        .workers(2)
        .template(template)
        .manifest()
}

/// `kubectl apply` as the tenant, who may create RduJobs and nothing else.
fn apply_as_tenant(plane: &ControlPlane, manifest: &str) -> Result<String, String> {
    kubectl(
        plane,
        &["apply", "--as", USER, "-n", TENANT, "-f", "-"],
        Some(manifest),
    )
    .map_err(|e| e.to_string())
}

/// The tenant's rights: RduJobs in its namespace, nothing else.
fn grant_rdujobs_only(plane: &ControlPlane) {
    kubectl(
        plane,
        &[
            "create",
            "role",
            "rdujobs-only",
            "-n",
            TENANT,
            "--verb=get,list,watch,create,update,patch,delete",
            "--resource=rdujobs.rdu.dev",
        ],
        None,
    )
    .expect("role");
    kubectl(
        plane,
        &[
            "create",
            "rolebinding",
            "mallory-rdujobs",
            "-n",
            TENANT,
            "--role=rdujobs-only",
            &format!("--user={USER}"),
        ],
        None,
    )
    .expect("rolebinding");
    let can_i = |verb: &str, resource: &str| {
        let args = ["auth", "can-i", verb, resource, "-n", TENANT, "--as", USER];
        let out = rdu_e2e::kubectl_in(&plane.admin_kubeconfig, &args, None).expect("kubectl");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    assert!(can_i("create", "rdujobs.rdu.dev"));
    assert!(
        !can_i("create", "pods") && !can_i("get", "secrets"),
        "the tenant may not make pods or read Secrets itself"
    );
}

/// Applies the chart's admission policy rendered with `values`.
fn install_admission_policy(plane: &ControlPlane, values: &[&str]) {
    let mut args = vec!["--show-only", POLICY_TEMPLATE];
    args.extend_from_slice(values);
    let rendered = helm_template(CHART_RELEASE, SYSTEM_NAMESPACE, &args).expect("helm template");
    kubectl(
        plane,
        &["apply", "--server-side", "-f", "-"],
        Some(&rendered),
    )
    .expect("the policy applies");
}

/// Applies `name` with `template` as the tenant until the API answers as `refusal` says (the API server loads a
/// new or changed policy asynchronously): refused with that message, or admitted when `None`. An admitted probe
/// that should have been refused is deleted before the next try.
async fn until_answered(plane: &ControlPlane, name: &str, template: &str, refusal: Option<String>) {
    let manifest = job(name, template);
    poll_until(&format!("{name}: the API's answer"), TIMEOUT, || async {
        match (apply_as_tenant(plane, &manifest), &refusal) {
            (Err(e), Some(message)) if e.contains(message.as_str()) => Ok(()),
            (Ok(_), None) => Ok(()),
            (Ok(_), Some(_)) => {
                kubectl(plane, &["delete", "rdujob", name, "-n", TENANT], None).ok();
                Err("admitted: the policy is not loaded yet".to_string())
            }
            (Err(e), _) => Err(e),
        }
    })
    .await
    .expect("the policy answers");
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_tenant_gets_no_pod_beyond_the_admins_pod_policy() {
    let (plane, _) = kit::plane("admin safety: pod policy")
        .namespaces(&[TENANT])
        .chart_values(&["--set", "podPolicy.admission=false"])
        .start_operator()
        .await;
    grant_rdujobs_only(&plane);
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), TENANT);
    let pods: Api<Pod> = Api::namespaced(client, TENANT);

    // The operator alone: the API admits each template, the operator fails the job with the rule's message.
    for (i, rule) in POD_POLICY_RULES.iter().enumerate() {
        apply_as_tenant(&plane, &job(&format!("rule-{i}"), rule.example)).unwrap_or_else(|e| {
            panic!("{}: the API admits it without the policy: {e}", rule.field)
        });
    }
    for (i, rule) in POD_POLICY_RULES.iter().enumerate() {
        let name = format!("rule-{i}");
        let status = wait_status(&plane, &jobs, &name, "Failed", |s| s["phase"] == "Failed").await;
        let failed = status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Failed"))
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(failed["reason"], "InvalidSpec", "{name}: {status}");
        let message = failed["message"].as_str().unwrap_or_default();
        assert_eq!(
            message,
            format!("invalid RduJob: {}", rule.message()),
            "{name}"
        );
        assert!(pods_of(&pods, &name).await.is_empty(), "{name}: no pod");
    }

    // The chart's admission policy: the same templates are refused at `kubectl apply`, with the same message.
    install_admission_policy(&plane, &[]);
    let first = &POD_POLICY_RULES[0];
    until_answered(&plane, "probe", first.example, Some(first.message())).await;
    let mut refused: BTreeMap<&str, u32> = BTreeMap::new();
    for (i, rule) in POD_POLICY_RULES.iter().enumerate() {
        let refusal =
            apply_as_tenant(&plane, &job(&format!("api-{i}"), rule.example)).expect_err(rule.field);
        assert!(
            refusal.contains(&rule.message()),
            "{}: the API's refusal differs from the operator's message\n{refusal}",
            rule.field
        );
        *refused.entry(summary_key(rule)).or_default() += 1;
    }
    // Positive controls: a template within the policy is admitted and run; a chart value lifts its rule.
    let within = r#"{"metadata": {"labels": {"team": "ml"}}, "spec": {"containers": [{"name": "worker",
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "scratch", "emptyDir": {}}]}}"#;
    apply_as_tenant(&plane, &job("within", within)).expect("within the policy");
    wait_pods(&plane, &pods, "within", 2, 0).await;
    let host_path = POD_POLICY_RULES
        .iter()
        .find(|r| r.guard == Guard::Allow(Exception::HostPath))
        .expect("hostPath rule");
    install_admission_policy(&plane, &["--set", "podPolicy.allow.hostPath=true"]);
    until_answered(&plane, "lifted", host_path.example, None).await;

    println!(
        "{}",
        json!({"bench": "admin_safety", "refused": refused, "rules": POD_POLICY_RULES.len()})
    );
}
