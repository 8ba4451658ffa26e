//! An operator a cluster admin can install (issue 34, item 1): a user who may create RduJobs and nothing else
//! gets no pod beyond the admin's pod policy through the operator, against a real API server with the chart's RBAC
//! and the operator binary as the chart's ServiceAccount.
//! - With the chart's ValidatingAdmissionPolicy off, every rule's example template is accepted by the API and the
//!   operator fails the job (InvalidSpec) with the rule's message, creating no pod.
//! - With it on, `kubectl apply` as that user is refused with the same message, rule by rule.
//! - A template within the policy is admitted and its pods are made; a chart value lifts its rule at the API.
//!
//! And no tenant can fill the operator's memory (item 2): 100 pods of 1 MiB each, labelled like another tenant's
//! job, leave the operator's peak RSS under a bound while that job runs to Succeeded.
//!
//! And no job loops through restarts as fast as the API server answers (item 5): a template whose `nodeName`
//! names no node (allowed by the admin) restarts with backoff, and keeps its budget.
//!
//! Prints `{"bench":"admin_safety","refused":{…},"rules":…}` (refusals at the API per kind of privilege),
//! `{"bench":"admin_safety_cache",…}` and `{"bench":"admin_safety_restart_loop",…}`; the port flood's line is
//! progress_flood's `{"bench":"admin_safety_flood",…}`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use rdu_crds::RduJob;
use rdu_e2e::kit::{
    self, JobFixture, TIMEOUT, pods_of, report_running, report_terminated, wait_phase, wait_pods,
    wait_status,
};
use rdu_e2e::{CHART_RELEASE, ControlPlane, SYSTEM_NAMESPACE, helm_template, kubectl, poll_until};
use rdu_operator::{Exception, Guard, POD_POLICY_RULES, Rule};
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

/// Look-alike pods the attacker makes, and the env each carries: 100 MiB in all.
const ATTACK_PODS: usize = 100;
const ATTACK_ENV_BYTES: usize = 1 << 20;
/// The operator's memory limit in the chart (`operator.resources.limits.memory`).
const OPERATOR_LIMIT_MIB: u64 = 256;
/// The operator's peak resident memory (VmHWM, debug build) through the attack and a 2-rank job's whole life. It
/// idles near 20 MiB (tests/tenancy.rs); a cache that kept the attacker's pods would hold their 100 MiB of env.
const CACHE_ATTACK_BOUND_MIB: u64 = 64;
const VICTIM: &str = "victims";

/// `VmHWM` (the peak resident memory) of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kib / 1024
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_tenants_large_look_alike_pods_cost_the_operator_no_memory_and_other_jobs_finish() {
    let (plane, addrs) = kit::plane("admin safety: cache attack")
        .namespaces(&[TENANT, VICTIM])
        .start_operator()
        .await;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), VICTIM);
    let victim_pods: Api<Pod> = Api::namespaced(client.clone(), VICTIM);
    let attack_pods: Api<Pod> = Api::namespaced(client, TENANT);

    // Another tenant's job starts.
    kit::apply(
        &plane,
        &JobFixture::new(VICTIM, "victim").workers(2).manifest(),
    )
    .expect("victim");
    let ranks = wait_pods(&plane, &victim_pods, "victim", 2, 0).await;
    let names: Vec<String> = ranks
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    for name in &names {
        report_running(&victim_pods, name).await;
    }
    wait_phase(&plane, &jobs, "victim", "Running").await;

    // The attack, as anyone who may create pods in their own namespace: pods labelled like the victim's, each
    // with 1 MiB of env, which a label-selected cache of whole pods would keep.
    let big = "x".repeat(ATTACK_ENV_BYTES);
    for i in 0..ATTACK_PODS {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("look-alike-{i}"),
                         "labels": {"rdu.dev/job-name": "victim", "rdu.dev/rank": "0", "rdu.dev/generation": "0"}},
            "spec": {"containers": [{"name": "worker", "image": "w", "env": [{"name": "BIG", "value": big}]}]}
        }))
        .expect("pod");
        attack_pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("look-alike {i}: {}", rdu_error_chain::Chain(&e)));
    }

    // The victim's ranks end after the attack's pods in the one pod watch, so by its Succeeded the operator has
    // read every one of them.
    for name in &names {
        let result = (name == "victim-worker-0").then_some(
            r#"{"finalLoss":0.125,"testAccuracy":0.96,"samplesPerSecond":1234.5,"trainSeconds":3.5,"globalSteps":40}"#,
        );
        report_terminated(&victim_pods, name, "Succeeded", 0, result).await;
    }
    let done = wait_phase(&plane, &jobs, "victim", "Succeeded").await;
    assert_eq!(done["workers"]["succeeded"], 2, "{done}");
    assert_eq!(
        attack_pods
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .len(),
        ATTACK_PODS,
        "the look-alikes are neither counted nor deleted"
    );
    let peak = peak_rss_mib(addrs.pid);
    println!(
        "{}",
        json!({"bench": "admin_safety_cache", "attack_pods": ATTACK_PODS,
               "attack_mib": (ATTACK_PODS * ATTACK_ENV_BYTES) >> 20,
               "cache_attack_operator_peak_rss_mib": peak, "operator_memory_limit_mib": OPERATOR_LIMIT_MIB,
               "foreign_job_succeeded_under_attacks": true})
    );
    assert!(
        peak <= CACHE_ATTACK_BOUND_MIB,
        "the operator's peak RSS {peak} MiB passed {CACHE_ATTACK_BOUND_MIB} MiB under the attack"
    );
}

/// How long the restart loop is watched, and the most generations a job may start in it: the first restart at once,
/// then 10 s, then 20 s between them (`rdu_gang::restart_delay`). Without the backoff a job whose pods
/// name no node went through its whole infrastructure budget (10 restarts) in about as many seconds.
const LOOP_WINDOW: Duration = Duration::from_secs(45);
const MOST_RESTARTS_IN_WINDOW: u64 = 4;

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_job_whose_pods_name_no_node_restarts_with_backoff_not_as_fast_as_the_api_answers() {
    // The admin allowed nodeName, so the template's `nodeName: nope` is admitted and its pods are bound to a node
    // that does not exist: every rank is lost at once, every generation.
    let (plane, _) = kit::plane("admin safety: restart loop")
        .namespaces(&[TENANT])
        .chart_values(&["--set", "podPolicy.allow.nodeName=true"])
        .operator_flags(&["--pod-policy-allow=nodeName"])
        .start_operator()
        .await;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client, TENANT);
    kit::apply(
        &plane,
        &JobFixture::new(TENANT, "nope")
            .workers(2)
            .template(json!({"spec": {"nodeName": "nope", "containers": [{"name": "worker"}]}}))
            .manifest(),
    )
    .expect("apply");
    let started = Instant::now();
    let mut backed_off = false;
    let mut restarts = 0;
    while started.elapsed() < LOOP_WINDOW {
        let status = kit::job_status(&jobs, "nope").await.unwrap_or_default();
        restarts = status["restarts"].as_u64().unwrap_or(0);
        backed_off |= status["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["reason"] == "BackOff"));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = kit::job_status(&jobs, "nope").await.expect("status");
    let per_minute = restarts as f64 * 60.0 / LOOP_WINDOW.as_secs_f64();
    println!(
        "{}",
        json!({"bench": "admin_safety_restart_loop", "window_seconds": LOOP_WINDOW.as_secs(),
               "generations": restarts + 1, "generations_per_minute_nodename_nope": per_minute})
    );
    assert!(
        restarts >= 2,
        "the job restarts (its ranks are lost): {status}"
    );
    assert!(backed_off, "a BackOff was seen: {status}");
    assert!(
        restarts <= MOST_RESTARTS_IN_WINDOW,
        "{restarts} restarts in {LOOP_WINDOW:?}: {status}"
    );
    assert_ne!(
        status["phase"], "Failed",
        "its budget is not spent: {status}"
    );
}
