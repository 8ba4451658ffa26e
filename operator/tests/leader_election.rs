//! Leader election over the Lease API of the fake API server: acquire, exclusion, renewal and release.

mod support;

use rdu_operator::{LEADER_LABEL, LeaderElector, OwnPod};
use support::fake_api::FakeApi;

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/rdu-operator";

#[tokio::test]
async fn one_holder_at_a_time_until_released() {
    let fake = FakeApi::default();
    let a = LeaderElector::new(fake.client(), "ops", "rdu-operator", "replica-a");
    let b = LeaderElector::new(fake.client(), "ops", "rdu-operator", "replica-b");
    assert!(a.try_acquire().await.expect("a acquires"));
    assert_eq!(
        fake.get(LEASE).expect("lease")["spec"]["holderIdentity"],
        "replica-a"
    );
    assert!(
        !b.try_acquire().await.expect("b asks"),
        "a fresh lease held by a is not b's"
    );
    assert!(a.try_acquire().await.expect("a renews"));
    a.release().await.expect("release");
    assert!(fake.get(LEASE).expect("lease")["spec"]["holderIdentity"].is_null());
    assert!(b.try_acquire().await.expect("b takes over"));
    let lease = fake.get(LEASE).expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over() {
    let fake = FakeApi::default();
    fake.put(
        LEASE,
        serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "rdu-operator", "namespace": "ops"},
            "spec": {"holderIdentity": "crashed", "leaseDurationSeconds": 15,
                     "renewTime": "2020-01-01T00:00:00.000000Z", "leaseTransitions": 4}}),
    );
    let b = LeaderElector::new(fake.client(), "ops", "rdu-operator", "replica-b");
    assert!(b.try_acquire().await.expect("take over"));
    assert_eq!(
        fake.get(LEASE).expect("lease")["spec"]["leaseTransitions"],
        5
    );
}

#[tokio::test]
async fn the_leader_labels_its_own_pod_and_takes_the_label_off_when_it_stops() {
    const POD: &str = "/api/v1/namespaces/ops/pods/rdu-operator-abc";
    let fake = FakeApi::default();
    fake.put(
        POD,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "rdu-operator-abc", "namespace": "ops"}}),
    );
    let pod = OwnPod::new(fake.client(), "ops", "rdu-operator-abc");
    pod.mark_leading(true).await.expect("label");
    assert_eq!(
        fake.get(POD).expect("pod")["metadata"]["labels"][LEADER_LABEL],
        "true"
    );
    pod.mark_leading(false).await.expect("unlabel");
    assert!(fake.get(POD).expect("pod")["metadata"]["labels"][LEADER_LABEL].is_null());
}
