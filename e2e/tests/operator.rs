//! The operator binary, running as the chart's ServiceAccount under RBAC with the chart's RBAC applied,
//! against a real API server and kube-controller-manager (garbage collector). There is no kubelet: the
//! test drives pod phases through the pods/status subresource, as a kubelet would report them. The operator's
//! /metrics is read as Prometheus would scrape it.

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use rdu_crds::RduJob;
use rdu_device_plugin::annotate::{KubeAnnotator, PodAnnotator};
use rdu_e2e::kit::{
    self, JobFixture, TIMEOUT, job_status, operator_log, or_operator_log, report_running,
    report_terminated, wait_phase, wait_pods, wait_status,
};
use rdu_e2e::{ControlPlane, kubectl, poll_until};
use serde_json::{Value, json};
use std::net::SocketAddr;

const JOBS: &str = "jobs";
const RESULT: &str = r#"{"finalLoss":0.125,"testAccuracy":0.96,"samplesPerSecond":1234.5,"trainSeconds":3.5,"globalSteps":40}"#;

fn job(name: &str, workers: u32, run_policy: Value) -> String {
    JobFixture::new(JOBS, name)
        .workers(workers)
        .run_policy(run_policy)
        .manifest()
}

/// The names of all `workers` pods of `generation`, once they exist.
async fn wait_pod_names(
    plane: &ControlPlane,
    pods: &Api<Pod>,
    job: &str,
    workers: usize,
    generation: u32,
) -> Vec<String> {
    kit::names(&wait_pods(plane, pods, job, workers, generation).await)
}

/// Every pod of `names` Running, as the kubelet would report it.
async fn report_all_running(pods: &Api<Pod>, names: &[String]) {
    join_all(names.iter().map(|n| report_running(pods, n))).await;
}

async fn wait_gone<K>(api: &Api<K>, what: &str, selector: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    poll_until(what, TIMEOUT, || async {
        let left = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{}", rdu_error_chain::Chain(&e)));
}

/// The control plane with the garbage collector and the PodGroup CRD (installed before the operator starts, so
/// gang jobs get a PodGroup), the chart applied, and the operator running as the chart's ServiceAccount; the
/// operator's /metrics address.
async fn operator_plane(test: &str) -> (ControlPlane, SocketAddr) {
    let (plane, addrs) = kit::plane(test)
        .controller_manager()
        .namespaces(&[JOBS])
        .pod_group_crd()
        .start_operator()
        .await;
    (plane, addrs.metrics)
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_operator_runs_the_job_lifecycle_under_the_charts_rbac() {
    let (mut plane, _) = operator_plane("operator lifecycle").await;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let services: Api<Service> = Api::namespaced(client.clone(), JOBS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), JOBS);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), JOBS);

    // Every child of a 16-rank job.
    kit::apply(&plane, &job("life", 16, json!({"backoffLimit": 3}))).expect("apply");
    let names = wait_pod_names(&plane, &pods, "life", 16, 0).await;
    services.get("life").await.expect("headless Service life");
    let uid = jobs
        .get("life")
        .await
        .expect("job")
        .metadata
        .uid
        .expect("uid");
    let token = |generation: u32| rdu_crds::consts::token_secret_name("life", &uid, generation);
    secrets
        .get(&token(0))
        .await
        .expect("generation 0's token Secret");
    let policy = policies
        .get("life-workers")
        .await
        .expect("NetworkPolicy life-workers");
    let same_job = policy.spec.and_then(|s| s.ingress).expect("ingress rules")[0]
        .from
        .clone()
        .expect("from")[0]
        .pod_selector
        .clone()
        .and_then(|s| s.match_labels)
        .expect("peer labels");
    assert_eq!(
        same_job.get("rdu.dev/job-name").map(String::as_str),
        Some("life"),
        "only pods of the same job may reach the worker ports"
    );
    assert!(plane.dead_process().is_none(), "{:?}", plane.dead_process());

    // Running -> rank 3 exits 75 -> the gang restarts with generation 1.
    report_all_running(&pods, &names).await;
    wait_phase(&plane, &jobs, "life", "Running").await;
    report_terminated(&pods, "life-worker-3", "Failed", 75, None).await;
    let names = wait_pod_names(&plane, &pods, "life", 16, 1).await;
    // The reconcile that creates generation 1 writes its status after the pods: their watch events can come
    // first.
    let restarted = wait_status(&plane, &jobs, "life", "restarts 1", |s| s["restarts"] == 1).await;
    assert_eq!(restarted["failureRestarts"], 1, "{restarted}");
    let env = pods
        .get("life-worker-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let generation = env
        .iter()
        .find(|e| e.name == "RDU_GENERATION")
        .and_then(|e| e.value.clone());
    assert_eq!(generation.as_deref(), Some("1"));
    // A token per generation: generation 1's made, generation 0's deleted.
    secrets
        .get(&token(1))
        .await
        .expect("generation 1's token Secret");
    assert!(
        secrets.get_opt(&token(0)).await.expect("get").is_none(),
        "generation 0's token Secret is deleted"
    );

    // All exit 0, rank 0 with its result -> Succeeded, result copied.
    report_all_running(&pods, &names).await;
    wait_phase(&plane, &jobs, "life", "Running").await;

    // The device plugin publishes a rank's tiles on its pod; the operator reports them per rank.
    KubeAnnotator::new(client.clone())
        .annotate(JOBS, "life-worker-2", "rdu1-tile0,rdu1-tile1")
        .await
        .expect("annotate as the device plugin does");
    let waited = poll_until("rank 2's tiles in status", TIMEOUT, || async {
        let s = job_status(&jobs, "life").await?;
        if s["ranks"][2]["tiles"] == json!(["rdu1-tile0", "rdu1-tile1"]) {
            Ok(())
        } else {
            Err(s["ranks"][2].to_string())
        }
    })
    .await;
    or_operator_log(&plane, waited);

    for name in &names {
        let message = (name == "life-worker-0").then_some(RESULT);
        report_terminated(&pods, name, "Succeeded", 0, message).await;
    }
    let done = wait_phase(&plane, &jobs, "life", "Succeeded").await;
    assert_eq!(done["result"]["testAccuracy"], 0.96, "{done}");
    assert_eq!(done["result"]["globalSteps"], 40, "{done}");

    // Deleting the job garbage-collects its children (owner references, kube-controller-manager).
    jobs.delete("life", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(&pods, "life's pods collected", "rdu.dev/job-name=life").await;
    wait_gone(
        &services,
        "life's Service collected",
        "rdu.dev/job-name=life",
    )
    .await;
    wait_gone(&secrets, "life's Secret collected", "rdu.dev/job-name=life").await;
    wait_gone(
        &policies,
        "life's NetworkPolicy collected",
        "rdu.dev/job-name=life",
    )
    .await;

    // Suspend deletes the pods, resume recreates them.
    kit::apply(&plane, &job("pause", 2, json!({}))).expect("apply");
    wait_pods(&plane, &pods, "pause", 2, 0).await;
    let suspend = json!({"spec": {"runPolicy": {"suspend": true}}});
    jobs.patch("pause", &PatchParams::default(), &Patch::Merge(&suspend))
        .await
        .expect("suspend");
    wait_phase(&plane, &jobs, "pause", "Suspended").await;
    wait_gone(&pods, "pause's pods deleted", "rdu.dev/job-name=pause").await;
    let resume = json!({"spec": {"runPolicy": {"suspend": false}}});
    jobs.patch("pause", &PatchParams::default(), &Patch::Merge(&resume))
        .await
        .expect("resume");
    poll_until("pause's pods back", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("rdu.dev/job-name=pause"))
            .await
            .map_err(|e| e.to_string())?;
        let live = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        if live == 2 {
            Ok(())
        } else {
            Err(format!("{live} pods"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{}", rdu_error_chain::Chain(&e)));

    // activeDeadlineSeconds -> Failed.
    kit::apply(&plane, &job("late", 2, json!({"activeDeadlineSeconds": 2}))).expect("apply");
    let failed = wait_phase(&plane, &jobs, "late", "Failed").await;
    assert!(failed.to_string().contains("DeadlineExceeded"), "{failed}");

    // ttlSecondsAfterFinished deletes a finished job.
    kit::apply(
        &plane,
        &job("brief", 1, json!({"ttlSecondsAfterFinished": 1})),
    )
    .expect("apply");
    let names = wait_pod_names(&plane, &pods, "brief", 1, 0).await;
    report_terminated(&pods, &names[0], "Succeeded", 0, Some(RESULT)).await;
    poll_until("brief deleted by its TTL", TIMEOUT, || async {
        match jobs.get_opt("brief").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(j) => Err(serde_json::to_string(&j.status).unwrap_or_default()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{}", rdu_error_chain::Chain(&e)));
    assert!(plane.dead_process().is_none(), "{:?}", plane.dead_process());
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn a_gang_job_gets_a_pod_group_and_its_pods_join_it() {
    let (plane, _) = operator_plane("operator gang").await;
    let client = plane.admin_client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    kit::apply(
        &plane,
        &job("gang", 4, json!({"schedulingPolicy": {"minAvailable": 3}})),
    )
    .expect("apply");
    let names = wait_pod_names(&plane, &pods, "gang", 4, 0).await;
    let group = kubectl(
        &plane,
        &[
            "get",
            "podgroups.scheduling.x-k8s.io",
            "gang",
            "-n",
            JOBS,
            "-o",
            "json",
        ],
        None,
    )
    .unwrap_or_else(|e| {
        panic!(
            "no PodGroup gang: {e}\noperator log:\n{}",
            operator_log(&plane)
        )
    });
    let group: Value = serde_json::from_str(&group).expect("PodGroup JSON");
    assert_eq!(group["spec"]["minMember"], json!(3));
    assert_eq!(
        group["metadata"]["ownerReferences"][0]["kind"],
        json!("RduJob")
    );
    for name in names {
        let pod = pods.get(&name).await.expect("pod");
        assert_eq!(
            pod.metadata
                .labels
                .unwrap_or_default()
                .get("scheduling.x-k8s.io/pod-group")
                .map(String::as_str),
            Some("gang"),
            "{name} must name its PodGroup"
        );
    }
}

/// `rdu_operator_jobs` by phase on the operator's /metrics.
async fn jobs_by_phase(metrics: SocketAddr) -> Result<Vec<(String, f64)>, String> {
    let text = rdu_e2e::metrics::scrape(metrics)
        .await
        .map_err(|e| e.to_string())?;
    Ok(rdu_e2e::metrics::parse(&text)
        .into_iter()
        .filter(|s| s.name == "rdu_operator_jobs")
        .map(|s| (s.labels.get("phase").cloned().unwrap_or_default(), s.value))
        .collect())
}

/// Polls /metrics until every phase has the count `want` gives it (0 when it gives none).
async fn wait_jobs_by_phase(plane: &ControlPlane, metrics: SocketAddr, want: &[(&str, f64)]) {
    let what = format!("rdu_operator_jobs {want:?}");
    let waited = poll_until(&what, TIMEOUT, || async {
        let seen = jobs_by_phase(metrics).await?;
        let expected = |phase: &str| {
            want.iter()
                .find(|(p, _)| *p == phase)
                .map_or(0.0, |(_, n)| *n)
        };
        let all_phases = seen.len() == 6;
        if all_phases && seen.iter().all(|(p, n)| *n == expected(p)) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    or_operator_log(plane, waited);
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn jobs_by_phase_follow_the_jobs_and_a_deleted_job_leaves_the_count() {
    let (plane, metrics) = operator_plane("operator metrics").await;
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let waited = poll_until("the operator's /readyz", TIMEOUT, || async {
        match rdu_e2e::metrics::http_get(metrics, "/readyz").await {
            Ok((200, _)) => Ok(()),
            Ok((code, body)) => Err(format!("{code} {body}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    or_operator_log(&plane, waited);
    wait_jobs_by_phase(&plane, metrics, &[]).await;

    kit::apply(&plane, &job("counted", 2, json!({}))).expect("apply");
    let names = wait_pod_names(&plane, &pods, "counted", 2, 0).await;
    wait_jobs_by_phase(&plane, metrics, &[("Pending", 1.0)]).await;
    report_all_running(&pods, &names).await;
    wait_phase(&plane, &jobs, "counted", "Running").await;
    wait_jobs_by_phase(&plane, metrics, &[("Running", 1.0)]).await;

    // No finalizer: the operator never reconciles the deleted job, yet it leaves the count.
    jobs.delete("counted", &DeleteParams::default())
        .await
        .expect("delete");
    wait_jobs_by_phase(&plane, metrics, &[]).await;

    let text = rdu_e2e::metrics::scrape(metrics).await.expect("scrape");
    let samples = rdu_e2e::metrics::parse(&text);
    for step in ["fetch", "build", "apply", "status"] {
        assert!(
            samples
                .iter()
                .any(|s| s.name == "rdu_operator_reconcile_errors_total"
                    && s.labels.get("step").map(String::as_str) == Some(step)),
            "errors by step {step}: {text}"
        );
    }
}
