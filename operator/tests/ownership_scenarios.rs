//! What the operator does with objects it does not own, against the in-process fake API server: an object named
//! like a job's child that is someone else's fails the job and is left exactly as it was; an earlier job's
//! leftovers are waited for; a pod labelled like the job's but not its own is neither counted nor deleted. And how
//! it writes: pods with a slow start that stops at the first failure, and jobs above its limit refused.

mod support;

use std::sync::Arc;

use rdu_operator::{Limits, reconcile};
use serde_json::{Value, json};
use support::fake_api::FakeApi;
use support::harness::*;

const SERVICE: &str = "/api/v1/namespaces/ml/services/mnist";
const POLICY: &str = "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/mnist-workers";

fn foreign(api_version: &str, kind: &str, name: &str, owners: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind,
           "metadata": {"name": name, "namespace": "ml", "resourceVersion": "7", "ownerReferences": owners,
                        "labels": {"rdu.dev/job-name": "mnist"}},
           "spec": {"someone": "else"}})
}

fn writes_to(fake: &FakeApi, path: &str) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|r| {
            let target = r.split_once(' ').map(|(_, t)| t).unwrap_or_default();
            !r.starts_with("GET") && target.split('?').next() == Some(path)
        })
        .collect()
}

#[tokio::test]
async fn a_foreign_service_or_policy_fails_the_job_and_is_left_untouched() {
    let deployment = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u-web",
                             "controller": true}]);
    let cases = [
        (
            SERVICE,
            foreign("v1", "Service", "mnist", deployment.clone()),
            "Service ml/mnist",
            "Deployment web",
        ),
        (
            POLICY,
            foreign(
                "networking.k8s.io/v1",
                "NetworkPolicy",
                "mnist-workers",
                Value::Null,
            ),
            "NetworkPolicy ml/mnist-workers",
            "it has no controller",
        ),
    ];
    for (path, object, named, controller) in cases {
        let (fake, h) = setup(2, json!({}));
        fake.put(path, object.clone());
        reconcile_once(&fake, &h).await;
        assert_eq!(fake.get(path), Some(object), "{named} is exactly as it was");
        assert!(
            writes_to(&fake, path).is_empty(),
            "{:?}",
            writes_to(&fake, path)
        );
        assert_eq!(phase(&fake), json!("Failed"), "{named}");
        let failed = failed_condition(&fake).expect("Failed condition");
        assert_eq!(failed["reason"], "ChildConflict", "{failed}");
        let message = failed["message"].as_str().unwrap_or_default();
        for part in [
            named,
            controller,
            "delete or rename the existing object, or rename the job",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        assert_eq!(
            pod_requests(&fake, "POST"),
            0,
            "no pod of a job that cannot run"
        );
        assert!(event_reasons(&fake).contains(&"ChildConflict".to_string()));

        // The job stays Failed and never touches the object.
        reconcile_once(&fake, &h).await;
        assert!(writes_to(&fake, path).is_empty());
        assert_eq!(pod_requests(&fake, "POST"), 0);
    }
}

#[tokio::test]
async fn the_jobs_own_children_are_kept_and_the_service_follows_the_job() {
    let (fake, h) = setup(2, json!({}));
    reconcile_once(&fake, &h).await;
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Failed", Some(75));
    reconcile_once(&fake, &h).await;
    reconcile_once(&fake, &h).await;
    assert_eq!(
        env(&fake, 0, "RDU_GENERATION"),
        json!("1"),
        "the gang restarted"
    );
    assert_eq!(phase(&fake), json!("Restarting"));
    // Found the job's own: the Service and NetworkPolicy re-applied. (Token Secrets are one per generation,
    // named with the job's UID, and never read: reconcile_scenarios.)
    for (path, applies) in [(SERVICE, 1), (POLICY, 1)] {
        let patches = writes_to(&fake, path)
            .into_iter()
            .filter(|r| r.starts_with("PATCH"))
            .collect::<Vec<_>>();
        assert_eq!(patches.len(), applies, "{path}: {patches:?}");
        assert!(patches.iter().all(|r| r.contains("force=true")));
    }
}

#[tokio::test]
async fn a_pod_labelled_like_the_jobs_but_not_its_own_is_neither_counted_nor_deleted() {
    let (fake, h) = setup(2, json!({}));
    let impostor = |rank: u32, owners: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": format!("mnist-worker-{rank}"), "namespace": "ml", "ownerReferences": owners,
                            "labels": {"rdu.dev/job-name": "mnist", "rdu.dev/rank": rank.to_string(),
                                       "rdu.dev/generation": "0"}},
               "spec": {"containers": [{"name": "worker", "image": "x"}]},
               "status": {"phase": "Running", "containerStatuses": [{"name": "worker", "ready": true,
                          "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}}]}})
    };
    // Rank 7 of a 2-rank job (the job would delete its own), unowned.
    fake.put(&pod(7), impostor(7, Value::Null));
    reconcile_once(&fake, &h).await;
    assert!(fake.get(&pod(7)).is_some(), "not the job's: not deleted");
    assert_eq!(pod_requests(&fake, "DELETE"), 0);
    set_phase(&fake, 0, "Running", None);
    set_phase(&fake, 1, "Running", None);
    reconcile_once(&fake, &h).await;
    let status = fake.get(JOB).expect("job")["status"].clone();
    assert_eq!(status["workers"]["active"], 2, "{status}");
    assert_eq!(status["ready"], "2/2", "{status}");
    let ranks: Vec<&Value> = status["ranks"].as_array().expect("ranks").iter().collect();
    assert_eq!(ranks.len(), 2, "{status}");

    // A pod holding a rank's name that is not the job's: the job fails naming it, the pod stays.
    let (fake, h) = setup(2, json!({}));
    let other_job = json!([{"apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob", "name": "x", "uid": "u-x",
                            "controller": true}]);
    fake.put(&pod(1), impostor(1, other_job));
    let before = fake.get(&pod(1));
    reconcile_once(&fake, &h).await;
    assert_eq!(fake.get(&pod(1)), before);
    let failed = failed_condition(&fake).expect("Failed condition");
    assert_eq!(failed["reason"], "ChildConflict");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Pod ml/mnist-worker-1 already exists"),
        "{failed}"
    );
}

#[tokio::test]
async fn an_earlier_jobs_leftovers_are_waited_for_then_replaced() {
    let (fake, h) = setup(1, json!({}));
    let earlier = json!([{"apiVersion": "rdu.dev/v1alpha1", "kind": "RduJob", "name": "mnist", "uid": "u-0",
                          "controller": true}]);
    fake.put(SERVICE, foreign("v1", "Service", "mnist", earlier.clone()));
    reconcile_once(&fake, &h).await;
    assert_eq!(
        phase(&fake),
        json!("Pending"),
        "not failed: the garbage collector removes it"
    );
    assert!(failed_condition(&fake).is_none());
    assert_eq!(
        pod_requests(&fake, "POST"),
        0,
        "nothing is created before the Service is the job's"
    );
    assert!(
        writes_to(&fake, SERVICE)
            .iter()
            .all(|r| r.starts_with("POST"))
    );

    // The garbage collector removed it: the job goes on.
    fake.delete(SERVICE);
    reconcile_once(&fake, &h).await;
    let service = fake.get(SERVICE).expect("the job's Service");
    assert_eq!(service["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(pod_requests(&fake, "POST"), 1);
}

#[tokio::test]
async fn pods_are_created_with_a_slow_start_that_stops_at_the_first_failure() {
    let (fake, h) = setup(40, json!({}));
    fake.fail("POST", POD_COLLECTION);
    sync_cache(&fake, &h);
    reconcile(job(&fake), h.ctx.clone())
        .await
        .expect_err("pod creation fails");
    assert_eq!(
        pod_requests(&fake, "POST"),
        1,
        "one failed create stops the gang's"
    );

    let (fake, h) = setup(40, json!({}));
    reconcile_once(&fake, &h).await;
    assert_eq!(pod_requests(&fake, "POST"), 40);
    assert_eq!(fake.paths_under(PODS).len(), 40);
}

#[tokio::test]
async fn a_job_above_the_operators_limit_fails_naming_the_field_the_value_and_the_limit() {
    let (fake, h) = setup(5, json!({}));
    let settings = rdu_operator::Settings {
        limits: Limits {
            max_workers_per_job: 4,
            ..Limits::default()
        },
        ..Default::default()
    };
    let ctx = Arc::new(rdu_operator::Context::new(
        h.ctx.client.clone(),
        None,
        h.ctx.metrics.clone(),
        h.ctx.pods.clone(),
        Default::default(),
        h.ctx.caches.clone(),
        settings,
    ));
    sync_cache(&fake, &h);
    reconcile(job(&fake), ctx).await.expect("reconcile");
    assert_eq!(phase(&fake), json!("Failed"));
    let failed = failed_condition(&fake).expect("Failed condition");
    assert_eq!(failed["reason"], "InvalidSpec");
    let message = failed["message"].as_str().unwrap_or_default();
    for part in [
        "spec.workers is 5",
        "limit of 4 ranks",
        "--max-workers-per-job",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(fake.paths_under(PODS).is_empty());
    assert!(fake.get(SERVICE).is_none(), "no child of a refused job");
}
