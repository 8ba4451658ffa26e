//! Reconcile scenarios against an in-process fake API server: children, status, gang restart, suspend/resume,
//! deadline and TTL deletion; pods read from the controller's cache (kept here in step with the fake, as the pod
//! watch would), a cache behind the operator's own writes, and errors counted by pipeline step.

mod support;

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use rdu_crds::RduJob;
use rdu_operator::metrics::Metrics;
use rdu_operator::{Context, ReconcileError, Step, reconcile};
use serde_json::{Value, json};
use support::fake_api::FakeApi;

const JOB: &str = "/apis/rdu.dev/v1alpha1/namespaces/ml/rdujobs/mnist";
const PODS: &str = "/api/v1/namespaces/ml/pods/";

fn pod(rank: u32) -> String {
    format!("{PODS}mnist-worker-{rank}")
}

/// The reconcile's context and the writer of its pod cache.
struct Harness {
    ctx: Arc<Context>,
    pods: Mutex<Writer<Pod>>,
}

fn setup(workers: u32, run_policy: Value) -> (FakeApi, Harness) {
    let fake = FakeApi::default();
    fake.put(
        JOB,
        json!({
            "apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob",
            "metadata": {"name": "mnist", "namespace": "ml", "uid": "u-1", "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"workers": workers, "tilesPerWorker": 1, "image": "img:1",
                     "model": {"name": "ffn-logreg"}, "data": {"source": "synthetic"},
                     "training": {"epochs": 1, "batchSize": 8, "learningRate": 0.1},
                     "runPolicy": run_policy}
        }),
    );
    let client = fake.client();
    let (job_cache, _) = reflector::store::<RduJob>();
    let (pod_cache, pod_writer) = reflector::store::<Pod>();
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "rdu-operator".into(),
                instance: None,
            },
        ),
        metrics: Arc::new(Metrics::new(job_cache)),
        pods: pod_cache,
        expectations: Default::default(),
        pod_groups: false,
        network_policies: true,
        progress_url: None,
    });
    let harness = Harness {
        ctx,
        pods: Mutex::new(pod_writer),
    };
    (fake, harness)
}

fn job(fake: &FakeApi) -> Arc<RduJob> {
    Arc::new(serde_json::from_value(fake.get(JOB).expect("job stored")).expect("job parses"))
}

/// Brings the pod cache up to date with the fake's pods, as the controller's pod watch does (here: a relist).
fn sync_cache(fake: &FakeApi, h: &Harness) {
    let mut writer = h.pods.lock().expect("lock");
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in fake.objects_under::<Pod>(PODS) {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// One reconcile after the pod watch caught up.
async fn reconcile_once(fake: &FakeApi, h: &Harness) {
    sync_cache(fake, h);
    reconcile(job(fake), h.ctx.clone())
        .await
        .expect("reconcile");
}

fn set_phase(fake: &FakeApi, rank: u32, phase: &str, exit: Option<i32>) {
    fake.update(&pod(rank), |p| {
        let state = exit.map_or(json!({"running": {}}), |code| json!({"terminated": {"exitCode": code}}));
        p["status"] = json!({"phase": phase, "containerStatuses": [{
            "name": "worker", "ready": phase == "Running", "restartCount": 0, "image": "img:1", "imageID": "",
            "state": state}]});
    });
}

fn phase(fake: &FakeApi) -> Value {
    fake.get(JOB).expect("job")["status"]["phase"].clone()
}

fn env(fake: &FakeApi, rank: u32, name: &str) -> Value {
    let pod = fake.get(&pod(rank)).expect("pod");
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .map(|v| v["value"].clone())
        .unwrap_or(Value::Null)
}

fn event_reasons(fake: &FakeApi) -> Vec<String> {
    fake.paths_under("/apis/events.k8s.io/v1/namespaces/ml/events/")
        .iter()
        .filter_map(|p| fake.get(p))
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn creates_service_secret_and_every_rank_then_reports_pending() {
    let (fake, h) = setup(3, json!({}));
    reconcile_once(&fake, &h).await;
    assert!(fake.get("/api/v1/namespaces/ml/services/mnist").is_some());
    assert!(
        fake.get("/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/mnist-workers")
            .is_some(),
        "the job's NetworkPolicy"
    );
    let secret = fake
        .get("/api/v1/namespaces/ml/secrets/mnist-token")
        .expect("secret");
    assert_eq!(
        secret["stringData"]["token"].as_str().map(str::len),
        Some(64)
    );
    for rank in 0..3 {
        assert_eq!(env(&fake, rank, "RANK"), json!(rank.to_string()));
        assert_eq!(env(&fake, rank, "RDU_GENERATION"), json!("0"));
    }
    assert_eq!(phase(&fake), json!("Pending"));
    let applies = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH"))
        .count();
    assert!(
        fake.requests()
            .iter()
            .all(|r| !r.starts_with("PATCH") || r.contains("fieldManager=rdu-operator"))
    );
    assert_eq!(
        applies,
        3 + 3 + 1,
        "3 pods, service, secret, network policy, status"
    );
}

#[tokio::test]
async fn existing_token_is_kept() {
    let (fake, h) = setup(1, json!({}));
    fake.put(
        "/api/v1/namespaces/ml/secrets/mnist-token",
        json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "mnist-token", "namespace": "ml"}, "data": {"token": "a2VlcA=="}}),
    );
    reconcile_once(&fake, &h).await;
    let secret = fake
        .get("/api/v1/namespaces/ml/secrets/mnist-token")
        .expect("secret");
    assert_eq!(secret["data"]["token"], "a2VlcA==");
    assert!(secret.get("stringData").is_none());
}

#[tokio::test]
async fn running_pods_are_patched_into_the_status_with_an_event() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    reconcile_once(&fake, &h).await;
    let status = fake.get(JOB).expect("job")["status"].clone();
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["ready"], "2/2");
    assert_eq!(status["workers"]["active"], 2);
    assert!(
        event_reasons(&fake).contains(&"Running".to_string()),
        "{:?}",
        event_reasons(&fake)
    );
}

#[tokio::test]
async fn gang_restart_deletes_and_recreates_with_the_next_generation() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 1, "Failed", Some(75));
    reconcile_once(&fake, &h).await;
    assert!(
        fake.paths_under(PODS).is_empty(),
        "the whole gang is deleted"
    );
    assert_eq!(phase(&fake), json!("Restarting"));
    assert_eq!(fake.get(JOB).expect("job")["status"]["restarts"], 1);
    reconcile_once(&fake, &h).await;
    for rank in 0..2 {
        assert_eq!(env(&fake, rank, "RDU_GENERATION"), json!("1"));
        assert_eq!(
            fake.get(&pod(rank)).expect("pod")["metadata"]["labels"]["rdu.dev/generation"],
            "1"
        );
    }
    assert!(event_reasons(&fake).contains(&"Restarting".to_string()));
}

#[tokio::test]
async fn the_checkpoint_claim_is_applied_once_and_kept_across_a_gang_restart() {
    const CLAIM: &str = "/api/v1/namespaces/ml/persistentvolumeclaims/mnist-checkpoints";
    let (fake, h) = setup(2, json!({}));
    fake.update(JOB, |j| {
        j["spec"]["checkpoint"] = json!({"intervalSteps": 10,
            "volumeClaimTemplate": {"resources": {"requests": {"storage": "1Gi"}}}});
    });
    reconcile_once(&fake, &h).await;
    let claim = fake.get(CLAIM).expect("the claim is created with the pods");
    assert_eq!(claim["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 1, "Failed", Some(75));
    reconcile_once(&fake, &h).await;
    reconcile_once(&fake, &h).await;
    assert_eq!(env(&fake, 0, "RDU_GENERATION"), json!("1"));
    assert!(fake.get(CLAIM).is_some(), "a gang restart keeps the claim");
    let applies = fake
        .requests()
        .iter()
        .filter(|r| r.starts_with(&format!("PATCH {CLAIM}")))
        .count();
    assert_eq!(
        applies, 1,
        "an existing claim is never re-applied (its spec is immutable once bound)"
    );
    assert!(
        fake.requests()
            .iter()
            .all(|r| !r.starts_with("DELETE") || !r.contains("persistentvolumeclaims"))
    );
}

#[tokio::test]
async fn suspend_deletes_pods_and_resume_recreates_them() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    fake.update(JOB, |j| j["spec"]["runPolicy"]["suspend"] = json!(true));
    reconcile_once(&fake, &h).await;
    assert!(fake.paths_under(PODS).is_empty());
    assert_eq!(phase(&fake), json!("Suspended"));
    fake.update(JOB, |j| j["spec"]["runPolicy"]["suspend"] = json!(false));
    reconcile_once(&fake, &h).await;
    assert_eq!(fake.paths_under(PODS).len(), 2);
    assert_eq!(phase(&fake), json!("Pending"));
    let reasons = event_reasons(&fake);
    assert!(
        reasons.contains(&"Suspended".to_string()) && reasons.contains(&"Resumed".to_string()),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn deadline_fails_the_job_and_deletes_running_pods() {
    let (fake, h) = setup(1, json!({"activeDeadlineSeconds": 5}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    fake.update(JOB, |j| {
        j["status"]["startTime"] = json!("2020-01-01T00:00:00Z")
    });
    reconcile_once(&fake, &h).await;
    let job = fake.get(JOB).expect("job");
    assert_eq!(job["status"]["phase"], "Failed");
    let failed = job["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Failed")
        .cloned()
        .expect("failed condition");
    assert_eq!(failed["reason"], "DeadlineExceeded");
    assert!(fake.paths_under(PODS).is_empty());
}

#[tokio::test]
async fn ttl_deletes_the_finished_job() {
    let (fake, h) = setup(1, json!({"ttlSecondsAfterFinished": 1}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Succeeded", Some(0));
    reconcile_once(&fake, &h).await;
    assert_eq!(phase(&fake), json!("Succeeded"));
    fake.update(JOB, |j| {
        j["status"]["completionTime"] = json!("2020-01-01T00:00:00Z")
    });
    reconcile_once(&fake, &h).await;
    assert!(fake.get(JOB).is_none(), "the job is deleted after its TTL");
}

#[tokio::test]
async fn invalid_spec_fails_without_children() {
    let (fake, h) = setup(1, json!({}));
    fake.update(JOB, |j| j["spec"]["tilesPerWorker"] = json!(3));
    reconcile_once(&fake, &h).await;
    assert!(fake.paths_under(PODS).is_empty());
    let job = fake.get(JOB).expect("job");
    assert_eq!(job["status"]["phase"], "Failed");
    assert!(
        job["status"]["conditions"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.tilesPerWorker")
    );
}

fn pod_requests(fake: &FakeApi, method: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.starts_with(&format!("{method} {PODS}")))
        .count()
}

#[tokio::test]
async fn pods_are_read_from_the_cache_never_listed() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    // The API server has both pods running, but the cache has not seen it yet: the reconcile goes by the cache.
    reconcile(job(&fake), h.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        phase(&fake),
        json!("Pending"),
        "the cache still shows Pending pods"
    );
    reconcile_once(&fake, &h).await;
    assert_eq!(phase(&fake), json!("Running"));
    let lists: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /api/v1/namespaces/ml/pods"))
        .collect();
    assert!(lists.is_empty(), "no pod is read from the API: {lists:?}");
}

#[tokio::test]
async fn a_cache_behind_the_operators_own_writes_is_waited_for() {
    let (fake, h) = setup(3, json!({}));
    reconcile_once(&fake, &h).await;
    assert_eq!(pod_requests(&fake, "PATCH"), 3);
    let requests = fake.requests().len();

    // Woken again before the watch brought the 3 new pods: no second create, no status, no API call at all.
    reconcile(job(&fake), h.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        fake.requests().len(),
        requests,
        "{:?}",
        &fake.requests()[requests..]
    );

    // The watch caught up: the reconcile goes on, and finds all pods created.
    reconcile_once(&fake, &h).await;
    assert_eq!(pod_requests(&fake, "PATCH"), 3, "no pod is applied twice");
    assert!(event_reasons(&fake).contains(&"Created".to_string()));
    assert!(h.ctx.expectations.is_empty());

    // A gang restart: the deleted pods are awaited too, and the next generation comes once they are gone.
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    set_phase(&fake, 2, "Failed", Some(75));
    reconcile_once(&fake, &h).await;
    assert_eq!(pod_requests(&fake, "DELETE"), 3);
    let requests = fake.requests().len();
    reconcile(job(&fake), h.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        fake.requests().len(),
        requests,
        "the cache still holds the deleted pods"
    );
    reconcile_once(&fake, &h).await;
    assert_eq!(env(&fake, 0, "RDU_GENERATION"), json!("1"));
    assert_eq!(pod_requests(&fake, "DELETE"), 3, "no pod is deleted twice");
}

#[tokio::test]
async fn a_failed_pod_create_and_a_failed_status_write_are_told_apart() {
    let (fake, h) = setup(2, json!({}));
    fake.fail("PATCH", PODS);
    sync_cache(&fake, &h);
    let error = reconcile(job(&fake), h.ctx.clone())
        .await
        .expect_err("pod creation fails");
    assert!(
        matches!(&error, ReconcileError::CreatePods { pod, .. } if pod.starts_with("ml/mnist-worker-")),
        "{error:?}"
    );
    assert_eq!(error.step(), Step::Apply);

    let (fake, h2) = setup(2, json!({}));
    fake.fail("PATCH", &format!("{JOB}/status"));
    sync_cache(&fake, &h2);
    let error = reconcile(job(&fake), h2.ctx.clone())
        .await
        .expect_err("status write fails");
    assert!(matches!(error, ReconcileError::Status { .. }), "{error:?}");
    assert_eq!(error.step(), Step::Status);

    for (harness, step) in [(&h, "apply"), (&h2, "status")] {
        let text = harness.ctx.metrics.render();
        assert!(
            text.contains(&format!(
                "rdu_operator_reconcile_errors_total{{step=\"{step}\"}} 1"
            )),
            "{text}"
        );
    }
    let text = h.ctx.metrics.render();
    assert!(
        text.contains("rdu_operator_reconcile_errors_total{step=\"status\"} 0"),
        "{text}"
    );
}
