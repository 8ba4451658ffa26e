//! kube-scheduler places ranks by the extended resource `rdu.dev/tile`: with two Nodes advertising 32
//! tiles each, 16 ranks of 4 tiles (the operator's own pods) fill both nodes and a 17th stays Pending.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rdu_crds::RduJob;
use rdu_e2e::kit::{self, JobFixture};
use rdu_e2e::poll_until;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const NAMESPACE: &str = "sched";
const NODES: [&str; 2] = ["rdu-node-a", "rdu-node-b"];

async fn fake_node(nodes: &Api<Node>, name: &str) {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}
    }))
    .unwrap();
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
    // What the kubelet reports once the device plugin registered 8 RDUs x 4 tiles.
    let resources = json!({"cpu": "64", "memory": "256Gi", "pods": "110", "rdu.dev/tile": "32"});
    let status = json!({"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node",
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    // The API server's TaintNodesByCondition admission adds node.kubernetes.io/not-ready to a new Node;
    // the node lifecycle controller would lift it once Ready. Do its part.
    let untaint = json!({"spec": {"taints": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&untaint))
        .await
        .expect("untaint node");
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: bash e2e/control-plane/run.sh"]
async fn the_scheduler_packs_16_ranks_of_4_tiles_onto_two_32_tile_nodes_and_leaves_the_17th_pending()
 {
    let plane = kit::plane("scheduling")
        .scheduler()
        .namespaces(&[NAMESPACE])
        .start()
        .await;
    let client = plane.admin_client().await.expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    for name in NODES {
        fake_node(&nodes, name).await;
    }

    let job = JobFixture::new(NAMESPACE, "packed")
        .workers(17)
        .tiles_per_worker(4)
        .model(json!({"name": "ffn-logreg"}))
        .data(json!({"source": "synthetic"}));
    kit::apply(&plane, &job.manifest()).expect("job");
    let job: RduJob = Api::namespaced(client.clone(), NAMESPACE)
        .get("packed")
        .await
        .expect("stored job");

    // The pods exactly as the operator builds them (requests rdu.dev/tile: 4 each).
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let job = rdu_operator::validate(&job, &rdu_operator::Limits::default()).expect("valid job");
    for rank in 0..17 {
        let pod = rdu_operator::worker_pod(&job, rank, 0);
        let tiles = pod.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("rdu.dev/tile"))
            .cloned();
        assert_eq!(
            tiles.map(|q| q.0),
            Some("4".to_string()),
            "rank {rank} requests 4 tiles"
        );
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }

    let placement = poll_until(
        "16 pods bound and 1 unschedulable",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let mut per_node: BTreeMap<String, u32> = BTreeMap::new();
                let mut unschedulable = Vec::new();
                for pod in &list.items {
                    let spec = pod.spec.as_ref().unwrap();
                    if let Some(node) = &spec.node_name {
                        *per_node.entry(node.clone()).or_default() += 1;
                    }
                    let refused = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .find(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        });
                    if let Some(c) = refused {
                        unschedulable.push((
                            pod.metadata.name.clone().unwrap(),
                            c.message.clone().unwrap_or_default(),
                        ));
                    }
                }
                let bound: u32 = per_node.values().sum();
                if bound == 16 && unschedulable.len() == 1 {
                    Ok((per_node, unschedulable))
                } else {
                    Err(format!(
                        "bound {per_node:?}, unschedulable {unschedulable:?}"
                    ))
                }
            }
        },
    )
    .await
    .expect("scheduling");
    let (per_node, unschedulable) = placement;
    assert_eq!(
        per_node,
        NODES.iter().map(|n| (n.to_string(), 8)).collect(),
        "8 ranks x 4 tiles per node"
    );
    assert!(
        unschedulable[0].1.contains("Insufficient rdu.dev/tile"),
        "{unschedulable:?}"
    );
}
