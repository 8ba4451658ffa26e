//! What the operator's caches keep (DESIGN 9): of pods, only those an RduJob controls, and of those only what the
//! operator reads (its own labels and annotations, the node, the tiles each container asks for, the status); of
//! jobs, everything but managedFields and kubectl's copy of the last applied manifest. A tenant who makes many
//! large pods, or labels its own pods like a job's, then costs the operator no memory.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use rdu_crds::RduJob;
use rdu_crds::consts;

/// The prefix of the labels and annotations the operator reads on its pods.
const OWN_PREFIX: &str = "rdu.dev/";
/// kubectl's client-side apply copy of the whole manifest, as large as the job again.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Whether an RduJob is `meta`'s controller (any RduJob: a deleted job's pods are still waited for).
pub(crate) fn controlled_by_an_rdujob(meta: &ObjectMeta) -> bool {
    meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind == "RduJob" && o.api_version.starts_with("rdu.dev/")
    })
}

/// The pod watch's event as the cache should see it: a pod no RduJob controls is never stored (an update that
/// makes a cached pod someone else's removes it), and every other pod is slimmed by [`slim_pod`].
pub(crate) fn own_pods_only(event: Event<Pod>) -> Option<Event<Pod>> {
    match event {
        Event::Apply(pod) | Event::Delete(pod) if !controlled_by_an_rdujob(&pod.metadata) => {
            Some(Event::Delete(identity_only(pod)))
        }
        Event::InitApply(pod) if !controlled_by_an_rdujob(&pod.metadata) => None,
        // A deleted pod of a job keeps its owner reference: it wakes the job.
        event => Some(event.modify(slim_pod)),
    }
}

/// Keeps of `pod` what the operator reads.
pub(crate) fn slim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    keep_own(&mut meta.labels);
    keep_own(&mut meta.annotations);
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            containers: spec
                .containers
                .into_iter()
                .map(|c| Container {
                    name: c.name,
                    resources: c.resources.map(tiles_only),
                    ..Container::default()
                })
                .collect(),
            ..PodSpec::default()
        });
    }
}

/// Keeps of `job` all but managedFields and kubectl's last-applied copy.
pub fn slim_job(job: &mut RduJob) {
    job.metadata.managed_fields = None;
    if let Some(annotations) = job.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// A pod reduced to what removes it from a store: its namespace, name and UID.
fn identity_only(pod: Pod) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: pod.metadata.namespace,
            name: pod.metadata.name,
            uid: pod.metadata.uid,
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn keep_own(map: &mut Option<BTreeMap<String, String>>) {
    if let Some(map) = map.as_mut() {
        map.retain(|key, _| key.starts_with(OWN_PREFIX));
    }
}

/// A container's requests and limits of RDU tiles alone (what the room checks count).
fn tiles_only(resources: ResourceRequirements) -> ResourceRequirements {
    let tiles = |quantities: Option<BTreeMap<String, Quantity>>| {
        quantities.map(|mut q| {
            q.retain(|name, _| name == consts::TILE_RESOURCE);
            q
        })
    };
    ResourceRequirements {
        requests: tiles(resources.requests),
        limits: tiles(resources.limits),
        claims: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(owner_kind: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "ml", "name": "a-worker-0", "uid": "p1",
                "labels": {"rdu.dev/job-name": "a", "rdu.dev/rank": "0", "team": "x"},
                "annotations": {"rdu.dev/tiles": "rdu0-t0", "note": "n".repeat(100_000)},
                "managedFields": [{"manager": "rdu-operator"}],
                "ownerReferences": [{"apiVersion": "rdu.dev/v1alpha1", "kind": owner_kind, "name": "a",
                                     "uid": "j1", "controller": true}]
            },
            "spec": {
                "nodeName": "n1",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [{"name": "worker", "image": "w",
                                "env": [{"name": "BIG", "value": "x".repeat(100_000)}],
                                "resources": {"requests": {"rdu.dev/tile": "2", "cpu": "1"},
                                              "limits": {"rdu.dev/tile": "2", "memory": "1Gi"}}}]
            },
            "status": {"phase": "Running"}
        }))
        .expect("pod")
    }

    fn size(pod: &Pod) -> usize {
        serde_json::to_vec(pod).expect("json").len()
    }

    #[test]
    fn a_cached_pod_keeps_what_the_operator_reads_and_nothing_a_tenant_can_inflate() {
        let mut slim = pod("RduJob");
        slim_pod(&mut slim);
        assert!(size(&slim) < 1_000, "{} bytes", size(&slim));
        let meta = &slim.metadata;
        assert_eq!(meta.managed_fields, None);
        assert_eq!(
            meta.labels
                .as_ref()
                .map(|l| l.keys().cloned().collect::<Vec<_>>()),
            Some(vec![
                "rdu.dev/job-name".to_string(),
                "rdu.dev/rank".to_string()
            ])
        );
        assert_eq!(
            meta.annotations.as_ref().map(|a| a.len()),
            Some(1),
            "only rdu.dev/tiles"
        );
        assert!(controlled_by_an_rdujob(meta), "owner references kept");
        let spec = slim.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.volumes, None);
        let resources = spec.containers[0].resources.as_ref().expect("resources");
        let names = |q: &Option<BTreeMap<String, Quantity>>| {
            q.as_ref().map(|q| q.keys().cloned().collect::<Vec<_>>())
        };
        assert_eq!(
            names(&resources.requests),
            Some(vec![consts::TILE_RESOURCE.to_string()])
        );
        assert_eq!(
            names(&resources.limits),
            Some(vec![consts::TILE_RESOURCE.to_string()])
        );
        assert_eq!(spec.containers[0].env, None);
        assert_eq!(slim.status, pod("RduJob").status, "status kept whole");
    }

    #[test]
    fn pods_no_rdujob_controls_never_reach_the_cache() {
        let foreign = pod("ReplicaSet");
        assert!(own_pods_only(Event::InitApply(foreign.clone())).is_none());
        match own_pods_only(Event::Apply(foreign)) {
            Some(Event::Delete(gone)) => {
                assert_eq!(gone.metadata.name.as_deref(), Some("a-worker-0"));
                assert!(size(&gone) < 200, "removes, stores nothing");
            }
            other => panic!("{other:?}"),
        }
        match own_pods_only(Event::InitApply(pod("RduJob"))) {
            Some(Event::InitApply(kept)) => assert!(size(&kept) < 1_000),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            own_pods_only(Event::InitDone),
            Some(Event::InitDone)
        ));
        match own_pods_only(Event::Delete(pod("RduJob"))) {
            Some(Event::Delete(gone)) => {
                assert!(controlled_by_an_rdujob(&gone.metadata), "wakes its job")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cached_job_drops_managed_fields_and_kubectls_copy_only() {
        let mut job: RduJob = crate::test_fixtures::job("a", Some("ml"), 2);
        job.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_string(), "{...}".to_string()),
                ("team".to_string(), "x".to_string()),
            ]
            .into(),
        );
        job.metadata.managed_fields = Some(vec![Default::default()]);
        let spec_before = serde_json::to_value(&job.spec).expect("spec");
        slim_job(&mut job);
        assert_eq!(job.metadata.managed_fields, None);
        assert_eq!(job.metadata.annotations.as_ref().map(|a| a.len()), Some(1));
        assert_eq!(serde_json::to_value(&job.spec).expect("spec"), spec_before);
    }
}
