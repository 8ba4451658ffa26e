//! The reconcile harness: a fake API server holding one job `ml/mnist` (uid `u-1`), the reconcile's context, and
//! the pod cache kept in step with the fake as the controller's pod watch would.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use rdu_crds::RduJob;
use rdu_operator::Metrics;
use rdu_operator::{Context, Settings, reconcile};
use serde_json::{Value, json};

use super::fake_api::FakeApi;

pub(crate) const JOB: &str = "/apis/rdu.dev/v1alpha1/namespaces/ml/rdujobs/mnist";
pub(crate) const PODS: &str = "/api/v1/namespaces/ml/pods/";

pub(crate) fn pod(rank: u32) -> String {
    format!("{PODS}mnist-worker-{rank}")
}

/// The reconcile's context and the writer of its pod cache.
pub(crate) struct Harness {
    pub ctx: Arc<Context>,
    pub pods: Mutex<Writer<Pod>>,
}

impl Harness {
    /// The test is about to change the job's status itself (standing in for time passing): the operator's last
    /// status write is no longer what the next reconcile must wait to see.
    pub(crate) fn forget_status_write(&self) {
        self.ctx.status_writes.forget("u-1");
    }
}

pub(crate) fn setup(workers: u32, run_policy: Value) -> (FakeApi, Harness) {
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
    // A node cache that never syncs: the lifecycle knows nothing of nodes.
    let ctx = Arc::new(Context::new(
        client,
        None,
        Arc::new(Metrics::new(job_cache)),
        pod_cache,
        Default::default(),
        ready_caches(),
        Settings::default(),
    ));
    let harness = Harness {
        ctx,
        pods: Mutex::new(pod_writer),
    };
    (fake, harness)
}

pub(crate) fn job(fake: &FakeApi) -> Arc<RduJob> {
    Arc::new(serde_json::from_value(fake.get(JOB).expect("job stored")).expect("job parses"))
}

/// Brings the pod cache up to date with the fake's pods, as the controller's pod watch does (here: a relist).
pub(crate) fn sync_cache(fake: &FakeApi, h: &Harness) {
    let mut writer = h.pods.lock().expect("lock");
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in fake.objects_under::<Pod>(PODS) {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// One reconcile after the pod watch caught up.
pub(crate) async fn reconcile_once(fake: &FakeApi, h: &Harness) {
    sync_cache(fake, h);
    reconcile(job(fake), h.ctx.clone())
        .await
        .expect("reconcile");
}

pub(crate) fn set_phase(fake: &FakeApi, rank: u32, phase: &str, exit: Option<i32>) {
    fake.update(&pod(rank), |p| {
        let state = exit.map_or(json!({"running": {}}), |code| json!({"terminated": {"exitCode": code}}));
        p["status"] = json!({"phase": phase, "containerStatuses": [{
            "name": "worker", "ready": phase == "Running", "restartCount": 0, "image": "img:1", "imageID": "",
            "state": state}]});
    });
}

pub(crate) fn phase(fake: &FakeApi) -> Value {
    fake.get(JOB).expect("job")["status"]["phase"].clone()
}

pub(crate) fn env(fake: &FakeApi, rank: u32, name: &str) -> Value {
    let pod = fake.get(&pod(rank)).expect("pod");
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .map(|v| v["value"].clone())
        .unwrap_or(Value::Null)
}

pub(crate) fn event_reasons(fake: &FakeApi) -> Vec<String> {
    fake.paths_under("/apis/events.k8s.io/v1/namespaces/ml/events/")
        .iter()
        .filter_map(|p| fake.get(p))
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The collection path pods are created at.
pub(crate) const POD_COLLECTION: &str = "/api/v1/namespaces/ml/pods";

/// How many requests of `method` went to the job's pods (created at the collection, deleted by name).
pub(crate) fn pod_requests(fake: &FakeApi, method: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.starts_with(&format!("{method} {POD_COLLECTION}")))
        .count()
}

/// The Failed condition of the job, if any.
pub(crate) fn failed_condition(fake: &FakeApi) -> Option<Value> {
    fake.get(JOB).expect("job")["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Failed")
        .cloned()
}

/// The job's controller reference, as its children carry it.
pub(crate) fn owned_by_the_job() -> Value {
    json!([{"apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob", "name": "mnist", "uid": "u-1",
            "controller": true, "blockOwnerDeletion": true}])
}

/// Caches that hold their first full list, as after the operator's start-up.
pub(crate) fn ready_caches() -> Arc<rdu_operator::Health> {
    let (store, _) = reflector::store::<RduJob>();
    let health = Arc::new(rdu_operator::Health::new(Arc::new(Metrics::new(store))));
    health.set_synced(true);
    health
}
