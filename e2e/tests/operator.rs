//! The operator binary, running as the chart's ServiceAccount under RBAC with the chart's RBAC applied,
//! against a real API server and kube-controller-manager (garbage collector). There is no kubelet: the
//! test drives pod phases through the pods/status subresource, as a kubelet would report them. The operator's
//! /metrics is read as Prometheus would scrape it.

use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use rdu_crds::RduJob;
use rdu_device_plugin::annotate::{KubeAnnotator, PodAnnotator};
use rdu_e2e::{
    Components, ControlPlane, assets_or_skip, create_namespace, install_crd, kubectl, poll_until,
    start_operator_as_chart,
};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const OPERATOR_NAMESPACE: &str = "rdu-system";
const JOBS: &str = "jobs";
const TIMEOUT: Duration = Duration::from_secs(90);
const RESULT: &str = r#"{"finalLoss":0.125,"testAccuracy":0.96,"samplesPerSecond":1234.5,"trainSeconds":3.5,"globalSteps":40}"#;

fn job(name: &str, workers: u32, run_policy: Value) -> String {
    json!({
        "apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob",
        "metadata": {"name": name, "namespace": JOBS},
        "spec": {"workers": workers, "tilesPerWorker": 1, "image": "rdu-worker:0.1.0",
                 "model": {"name": "ffn-logreg", "hiddenSizes": [16]},
                 "data": {"source": "synthetic", "samples": 512},
                 "training": {"epochs": 1, "batchSize": 8, "learningRate": 0.1},
                 "runPolicy": run_policy}
    })
    .to_string()
}

/// The job's status as JSON (null when absent).
async fn status(jobs: &Api<RduJob>, name: &str) -> Result<Value, String> {
    let job = jobs.get(name).await.map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(&job.status).unwrap_or(Value::Null))
}

async fn wait_phase(plane: &ControlPlane, jobs: &Api<RduJob>, name: &str, phase: &str) -> Value {
    poll_until(&format!("{name} phase {phase}"), TIMEOUT, || async {
        let s = status(jobs, name).await?;
        if s["phase"] == phase {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 40)))
}

/// Waits for all `workers` pods of `generation` and returns their names.
async fn wait_pods(
    plane: &ControlPlane,
    pods: &Api<Pod>,
    job: &str,
    workers: usize,
    generation: u32,
) -> Vec<String> {
    let selector = format!("rdu.dev/job-name={job},rdu.dev/generation={generation}");
    poll_until(
        &format!("{workers} pods of {job} generation {generation}"),
        TIMEOUT,
        || {
            let pods = pods.clone();
            let selector = selector.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let live: Vec<String> = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                if live.len() == workers {
                    Ok(live)
                } else {
                    Err(format!("{} pods: {live:?}", live.len()))
                }
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 40)))
}

fn container_status(state: Value) -> Value {
    json!([{"name": "worker", "ready": state.get("running").is_some(), "restartCount": 0,
            "image": "rdu-worker:0.1.0", "imageID": "", "state": state}])
}

/// Reports `phase` for a pod as the kubelet would.
async fn report(
    pods: &Api<Pod>,
    name: &str,
    phase: &str,
    exit_code: Option<i32>,
    message: Option<&str>,
) {
    let now = "2026-01-01T00:00:00Z";
    let state = match exit_code {
        None => json!({"running": {"startedAt": now}}),
        Some(code) => {
            let mut t = json!({"exitCode": code, "reason": if code == 0 {"Completed"} else {"Error"},
                               "startedAt": now, "finishedAt": now});
            if let Some(m) = message {
                t["message"] = json!(m);
            }
            json!({"terminated": t})
        }
    };
    let ready = if phase == "Running" { "True" } else { "False" };
    let patch = json!({"status": {"phase": phase, "podIP": "10.1.0.1", "startTime": now,
        "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": now}],
        "containerStatuses": container_status(state)}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

async fn report_all(pods: &Api<Pod>, names: &[String], phase: &str, exit_code: Option<i32>) {
    join_all(
        names
            .iter()
            .map(|n| report(pods, n, phase, exit_code, None)),
    )
    .await;
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
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Starts the control plane, applies the chart, and runs the operator as the chart's ServiceAccount; returns the
/// plane and the operator's /metrics address.
async fn operator_plane() -> Option<(ControlPlane, SocketAddr)> {
    let assets = assets_or_skip("operator")?;
    let components = Components {
        scheduler: false,
        controller_manager: true,
        node: None,
    };
    let mut plane = ControlPlane::start(&assets, components)
        .await
        .expect("control plane");
    install_crd(&plane).await.expect("CRD");
    create_namespace(&plane, OPERATOR_NAMESPACE)
        .await
        .expect("namespace");
    create_namespace(&plane, JOBS).await.expect("namespace");
    // The PodGroup CRD exists before the operator starts, so gang jobs get a PodGroup.
    let pod_group_crd = rdu_e2e::workspace_root().join("e2e/fixtures/podgroup-crd.yaml");
    let pod_group_crd = pod_group_crd.display().to_string();
    kubectl(&plane, &["apply", "-f", &pod_group_crd], None).expect("PodGroup CRD");
    kubectl(
        &plane,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/podgroups.scheduling.x-k8s.io",
        ],
        None,
    )
    .expect("PodGroup CRD established");
    let metrics = start_operator_as_chart(&mut plane, OPERATOR_NAMESPACE).expect("operator starts");
    Some((plane, metrics))
}

#[tokio::test]
async fn the_operator_runs_the_job_lifecycle_under_the_charts_rbac() {
    let Some((mut plane, _)) = operator_plane().await else {
        return;
    };
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    let services: Api<Service> = Api::namespaced(client.clone(), JOBS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), JOBS);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), JOBS);

    // Every child of a 16-rank job.
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("life", 16, json!({"backoffLimit": 3}))),
    )
    .expect("apply");
    let names = wait_pods(&plane, &pods, "life", 16, 0).await;
    services.get("life").await.expect("headless Service life");
    secrets.get("life-token").await.expect("Secret life-token");
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
    report_all(&pods, &names, "Running", None).await;
    wait_phase(&plane, &jobs, "life", "Running").await;
    report(&pods, "life-worker-3", "Failed", Some(75), None).await;
    let names = wait_pods(&plane, &pods, "life", 16, 1).await;
    let restarted = status(&jobs, "life").await.unwrap();
    assert_eq!(restarted["restarts"], 1, "{restarted}");
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

    // All exit 0, rank 0 with its result -> Succeeded, result copied.
    report_all(&pods, &names, "Running", None).await;
    wait_phase(&plane, &jobs, "life", "Running").await;

    // The device plugin publishes a rank's tiles on its pod; the operator reports them per rank.
    KubeAnnotator::new(client.clone())
        .annotate(JOBS, "life-worker-2", "rdu1-tile0,rdu1-tile1")
        .await
        .expect("annotate as the device plugin does");
    poll_until("rank 2's tiles in status", TIMEOUT, || async {
        let s = status(&jobs, "life").await?;
        if s["ranks"][2]["tiles"] == json!(["rdu1-tile0", "rdu1-tile1"]) {
            Ok(())
        } else {
            Err(s["ranks"][2].to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 40)));

    for name in &names {
        let message = (name == "life-worker-0").then_some(RESULT);
        report(&pods, name, "Succeeded", Some(0), message).await;
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
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("pause", 2, json!({}))),
    )
    .expect("apply");
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
    .unwrap_or_else(|e| panic!("{e}"));

    // activeDeadlineSeconds -> Failed.
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("late", 2, json!({"activeDeadlineSeconds": 2}))),
    )
    .expect("apply");
    let failed = wait_phase(&plane, &jobs, "late", "Failed").await;
    assert!(failed.to_string().contains("DeadlineExceeded"), "{failed}");

    // ttlSecondsAfterFinished deletes a finished job.
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("brief", 1, json!({"ttlSecondsAfterFinished": 1}))),
    )
    .expect("apply");
    let names = wait_pods(&plane, &pods, "brief", 1, 0).await;
    report(&pods, &names[0], "Succeeded", Some(0), Some(RESULT)).await;
    poll_until("brief deleted by its TTL", TIMEOUT, || async {
        match jobs.get_opt("brief").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(j) => Err(serde_json::to_string(&j.status).unwrap_or_default()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(plane.dead_process().is_none(), "{:?}", plane.dead_process());
}

#[tokio::test]
async fn a_gang_job_gets_a_pod_group_and_its_pods_join_it() {
    let Some((plane, _)) = operator_plane().await else {
        return;
    };
    let client = plane.admin_client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job(
            "gang",
            4,
            json!({"schedulingPolicy": {"minAvailable": 3}}),
        )),
    )
    .expect("apply");
    let names = wait_pods(&plane, &pods, "gang", 4, 0).await;
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
            plane.log_tail("rdu-operator", 40)
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

#[tokio::test]
async fn bench_apply_to_pods_256() {
    let Some((plane, _)) = operator_plane().await else {
        return;
    };
    let client = plane.admin_client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, JOBS);
    let start = Instant::now();
    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("wide", 256, json!({}))),
    )
    .expect("apply");
    poll_until("256 pods", Duration::from_secs(300), || async {
        let list = pods
            .list_metadata(&ListParams::default().labels("rdu.dev/job-name=wide"))
            .await
            .map_err(|e| e.to_string())?;
        if list.items.len() == 256 {
            Ok(())
        } else {
            Err(format!("{} pods", list.items.len()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 30)));
    let seconds = start.elapsed().as_secs_f64();

    // Baseline in the same run: the same 256 pods (the operator's builder) created straight through the
    // API by the admin, 16 requests in flight, with no watch, reconcile or status in between.
    create_namespace(&plane, "baseline")
        .await
        .expect("namespace");
    let admin = plane.admin_client().await.expect("client");
    let template: RduJob = Api::namespaced(admin.clone(), JOBS)
        .get("wide")
        .await
        .expect("job");
    let direct: Api<Pod> = Api::namespaced(admin, "baseline");
    let template =
        rdu_operator::validate(&template, &rdu_operator::Limits::default()).expect("valid job");
    let built: Vec<Pod> = (0..256)
        .map(|rank| {
            let mut pod = rdu_operator::builders::worker_pod(&template, rank, 0);
            pod.metadata.namespace = Some("baseline".into());
            pod.metadata.owner_references = None;
            pod
        })
        .collect();
    let post = kube::api::PostParams::default();
    let start = Instant::now();
    futures::stream::iter(built.iter().map(|pod| direct.create(&post, pod)))
        .buffer_unordered(16)
        .for_each(|r| async move {
            r.expect("direct create");
        })
        .await;
    let baseline = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "apply_to_pods_256", "seconds": seconds, "pods": 256,
               "baseline_direct_create_seconds": baseline, "ratio": seconds / baseline})
    );
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
    poll_until(&what, TIMEOUT, || async {
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
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 40)));
}

#[tokio::test]
async fn jobs_by_phase_follow_the_jobs_and_a_deleted_job_leaves_the_count() {
    let Some((plane, metrics)) = operator_plane().await else {
        return;
    };
    let client = plane.admin_client().await.expect("client");
    let jobs: Api<RduJob> = Api::namespaced(client.clone(), JOBS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS);
    poll_until("the operator's /readyz", TIMEOUT, || async {
        match rdu_e2e::metrics::http_get(metrics, "/readyz").await {
            Ok((200, _)) => Ok(()),
            Ok((code, body)) => Err(format!("{code} {body}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", plane.log_tail("rdu-operator", 40)));
    wait_jobs_by_phase(&plane, metrics, &[]).await;

    kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&job("counted", 2, json!({}))),
    )
    .expect("apply");
    let names = wait_pods(&plane, &pods, "counted", 2, 0).await;
    wait_jobs_by_phase(&plane, metrics, &[("Pending", 1.0)]).await;
    report_all(&pods, &names, "Running", None).await;
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
