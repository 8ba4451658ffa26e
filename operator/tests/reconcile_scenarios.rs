//! Reconcile scenarios against an in-process fake API server: children, status, gang restart, suspend/resume,
//! deadline and TTL deletion; pods read from the controller's cache (kept here in step with the fake, as the pod
//! watch would), a cache behind the operator's own writes, and errors counted by pipeline step.

mod support;

use kube::runtime::controller::Action;
use rdu_operator::{AFTER_CONFLICT, ReconcileError, Step, reconcile};
use serde_json::json;
use support::harness::*;

/// The token Secrets of generations 0 and 1 of `ml/mnist` (uid `u-1`).
const TOKEN_0: &str = "/api/v1/namespaces/ml/secrets/mnist-token-0-u-1";
const TOKEN_1: &str = "/api/v1/namespaces/ml/secrets/mnist-token-1-u-1";

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
    let secret = fake.get(TOKEN_0).expect("secret");
    assert_eq!(
        secret["stringData"]["token"].as_str().map(str::len),
        Some(64)
    );
    for rank in 0..3 {
        assert_eq!(env(&fake, rank, "RANK"), json!(rank.to_string()));
        assert_eq!(env(&fake, rank, "RDU_GENERATION"), json!("0"));
    }
    assert_eq!(phase(&fake), json!("Pending"));
    let writes: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("POST") || r.starts_with("PATCH"))
        .filter(|r| !r.contains("/events"))
        .collect();
    assert!(
        writes
            .iter()
            .all(|r| r.contains("fieldManager=rdu-operator")),
        "{writes:?}"
    );
    let creates = writes.iter().filter(|r| r.starts_with("POST")).count();
    assert_eq!(
        creates,
        3 + 3,
        "3 pods, service, secret, network policy: {writes:?}"
    );
    assert_eq!(
        writes.iter().filter(|r| r.starts_with("PATCH")).count(),
        1,
        "the status alone is applied: {writes:?}"
    );
}

/// The operator never reads a create's answer (the watch brings the object): parsing a pod's answer cost it
/// about as much CPU as the pod's watch event, a quarter of its CPU per pod at 4,096 ranks (issue 26).
#[tokio::test]
async fn a_creates_answer_is_not_parsed() {
    let (fake, h) = setup(3, json!({}));
    fake.answer_creates_unparsably();
    reconcile_once(&fake, &h).await;
    for rank in 0..3 {
        assert_eq!(env(&fake, rank, "RANK"), json!(rank.to_string()));
    }
    assert!(fake.get(TOKEN_0).is_some());
    assert_eq!(phase(&fake), json!("Pending"));
}

/// An existing token Secret of the generation was made by an earlier reconcile (its name holds the job's UID and
/// the generation): it is kept, and never read (the operator may read no Secret).
#[tokio::test]
async fn the_generations_existing_token_is_kept_unread() {
    let (fake, h) = setup(1, json!({}));
    fake.put(
        TOKEN_0,
        json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "mnist-token-0-u-1", "namespace": "ml", "ownerReferences": owned_by_the_job()},
        "data": {"token": "a2VlcA=="}}),
    );
    reconcile_once(&fake, &h).await;
    assert_eq!(phase(&fake), json!("Pending"));
    let secret = fake.get(TOKEN_0).expect("secret");
    assert_eq!(secret["data"]["token"], "a2VlcA==");
    assert!(secret.get("stringData").is_none());
    assert!(
        !fake
            .requests()
            .iter()
            .any(|r| r.starts_with("GET") && r.contains("/secrets")),
        "{:?}",
        fake.requests()
    );
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
    // Stopping: the generation ends when no pod of it is left, and only then is the restart counted.
    let status = fake.get(JOB).expect("job")["status"].clone();
    assert_eq!(status["restarts"], 0);
    assert_eq!(status["stopping"]["rank"], 1);
    reconcile_once(&fake, &h).await;
    let status = fake.get(JOB).expect("job")["status"].clone();
    assert_eq!(status["restarts"], 1);
    assert_eq!(status["failureRestarts"], 1);
    assert_eq!(status["history"][0]["action"], "RestartJob");
    for rank in 0..2 {
        assert_eq!(env(&fake, rank, "RDU_GENERATION"), json!("1"));
        assert_eq!(
            fake.get(&pod(rank)).expect("pod")["metadata"]["labels"]["rdu.dev/generation"],
            "1"
        );
    }
    assert!(event_reasons(&fake).contains(&"Restarting".to_string()));
    // A token per generation: generation 0's is gone, so a rank of it still running behind a partition holds a
    // token generation 1 refuses.
    assert!(fake.get(TOKEN_0).is_none(), "generation 0's token deleted");
    let token = fake.get(TOKEN_1).expect("generation 1's token");
    assert_eq!(
        token["stringData"]["token"].as_str().map(str::len),
        Some(64)
    );
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
    let writes = fake
        .requests()
        .iter()
        .filter(|r| {
            r.starts_with(&format!("PATCH {CLAIM}")) || r.starts_with(&format!("PUT {CLAIM}"))
        })
        .count();
    assert_eq!(
        writes, 0,
        "an existing claim is never re-applied (its spec is immutable once bound)"
    );
    assert_eq!(
        fake.get(CLAIM),
        Some(claim),
        "the claim is as it was created"
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
    h.forget_status_write();
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
    h.forget_status_write();
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
    assert_eq!(pod_requests(&fake, "POST"), 3);
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
    assert_eq!(pod_requests(&fake, "POST"), 3, "no pod is created twice");
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
    fake.fail("POST", POD_COLLECTION);
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

/// A write refused because its object changed since it was read (409 `Conflict`) is optimistic concurrency, not a
/// failure: the reconcile asks to run again soon, counts a conflict and no error, and the next one lands.
#[tokio::test]
async fn a_write_refused_as_conflicting_is_retried_soon_and_not_counted_as_an_error() {
    let (fake, h) = setup(2, json!({}));
    fake.conflict("PATCH", &format!("{JOB}/status"));
    sync_cache(&fake, &h);
    let action = reconcile(job(&fake), h.ctx.clone())
        .await
        .expect("a conflict is no failure");
    assert_eq!(
        action,
        Action::requeue(AFTER_CONFLICT),
        "run again soon, from a fresh read"
    );
    let text = h.ctx.metrics.render();
    assert!(
        text.contains("rdu_operator_reconcile_conflicts_total 1"),
        "{text}"
    );
    for step in Step::ALL {
        assert!(
            text.contains(&format!(
                "rdu_operator_reconcile_errors_total{{step=\"{}\"}} 0",
                step.as_str()
            )),
            "{text}"
        );
    }
    assert_eq!(
        phase(&fake),
        json!(null),
        "the refused status write left nothing"
    );

    fake.heal();
    h.forget_status_write();
    sync_cache(&fake, &h);
    reconcile_once(&fake, &h).await;
    assert_eq!(phase(&fake), json!("Pending"));
}

#[tokio::test]
async fn a_reconcile_from_a_job_cache_behind_its_own_status_write_changes_nothing() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 1, "Failed", Some(75));
    // The job as the cache still holds it while the generation is stopped and the next one started.
    let before_restart = job(&fake);
    reconcile_once(&fake, &h).await;
    reconcile_once(&fake, &h).await;
    assert_eq!(env(&fake, 0, "RDU_GENERATION"), json!("1"));
    let requests = fake.requests().len();
    // A pod event wakes a reconcile before the status's watch event: it must not take generation 1's pods for
    // leftovers of generation 0 and delete them.
    sync_cache(&fake, &h);
    reconcile(before_restart, h.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        fake.requests().len(),
        requests,
        "no request from a stale job: {:?}",
        &fake.requests()[requests..]
    );
    assert_eq!(env(&fake, 0, "RDU_GENERATION"), json!("1"));
}

/// An operator that just took over the Lease: its pod watch is still listing (the listed pods reach the store
/// only at the list's end) when the first reconcile runs. It must wait, not take the running gang's pods for
/// vanished: before the gate, that reconcile ended generation 0 as `PodVanished`, and a job with
/// `backoffLimit: 0` failed.
#[tokio::test]
async fn a_new_leader_waits_for_its_caches_before_judging_a_running_gang() {
    let (fake, h) = setup(2, json!({"backoffLimit": 0}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    reconcile_once(&fake, &h).await;
    assert_eq!(phase(&fake), json!("Running"));
    let deletes_before = pod_requests(&fake, "DELETE");

    // The new leader: an empty pod store whose list has not ended, caches not ready.
    let (pods, mut writer) = kube::runtime::reflector::store::<k8s_openapi::api::core::v1::Pod>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    for pod in fake.objects_under::<k8s_openapi::api::core::v1::Pod>(PODS) {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(pod));
    }
    let caches = ready_caches();
    caches.set_synced(false);
    let ctx = std::sync::Arc::new(rdu_operator::Context::new(
        h.ctx.client.clone(),
        None,
        h.ctx.metrics.clone(),
        pods,
        Default::default(),
        caches.clone(),
        rdu_operator::Settings::default(),
    ));
    reconcile(job(&fake), ctx.clone()).await.expect("reconcile");
    assert_eq!(phase(&fake), json!("Running"), "nothing decided yet");
    assert_eq!(pod_requests(&fake, "DELETE"), deletes_before);

    // The list ends: the same gang, running.
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    caches.set_synced(true);
    reconcile(job(&fake), ctx).await.expect("reconcile");
    assert_eq!(phase(&fake), json!("Running"));
    assert_eq!(pod_requests(&fake, "DELETE"), deletes_before);
    let status = fake.get(JOB).expect("job")["status"].clone();
    assert_eq!(status["failureRestarts"], 0, "{status}");
}

/// Deletes name the object the operator decided on by its UID: a pod replaced by another of the same name
/// between the cache's view and the delete (someone else's now) is left alone, and the job goes on.
#[tokio::test]
async fn a_delete_names_the_cached_pod_by_uid_and_spares_a_replacement() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    sync_cache(&fake, &h);
    // Rank 1 is replaced behind the cache's back by a pod of the same name and another UID.
    fake.update(&pod(1), |p| {
        p["metadata"]["uid"] = json!("someone-elses");
        p["metadata"]["ownerReferences"] = json!([]);
    });
    fake.update(JOB, |j| j["spec"]["runPolicy"]["suspend"] = json!(true));
    reconcile(job(&fake), h.ctx.clone())
        .await
        .expect("reconcile");
    assert!(fake.get(&pod(0)).is_none(), "the job's own pod is deleted");
    let spared = fake.get(&pod(1)).expect("the replacement is spared");
    assert_eq!(spared["metadata"]["uid"], "someone-elses");
    assert_eq!(pod_requests(&fake, "DELETE"), 2, "both deletes were sent");
}
