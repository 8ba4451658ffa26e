//! All-reduce between pods on two nodes over the pod network, beside the same two ranks in local mode over TCP
//! on loopback: `spec.mode: allReduceBenchmark` (nccl-tests' all_reduce_perf) run both ways with one spec.

use std::collections::BTreeSet;

use rdu_e2e::all_reduce_bench;
use rdu_e2e::local_mode::run_local;
use rdu_e2e::testbed::Testbed;
use serde_json::{Value, json};

use super::LONG;

/// Sizes timed both ways; the largest is the summary's `cross_node_allreduce_busbw_gbps`.
const SIZES: [&str; 3] = ["64Ki", "1Mi", "16Mi"];

/// The benchmark job: two one-tile ranks that may not share a node.
fn benchmark_job(name: &str) -> Value {
    let mut job = all_reduce_bench::job(name, 2, &SIZES);
    job["spec"]["template"] = json!({"spec": {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"rdu.dev/job-name": name}},
        }]
    }}}});
    job
}

/// Each size's timing from a result's `allReduce`, checked: every value right, every size present.
fn timings(all_reduce: &Value, who: &str) -> Vec<Value> {
    let sizes = all_reduce["sizes"].as_array().cloned().unwrap_or_default();
    assert_eq!(sizes.len(), SIZES.len(), "{who}: {all_reduce}");
    for size in &sizes {
        assert_eq!(size["wrongValues"], 0, "{who}: {size}");
        let busbw = size["busbwGbps"].as_f64().unwrap_or_default();
        assert!(busbw > 0.0 && busbw.is_finite(), "{who}: {size}");
    }
    sizes
}

/// Runs the benchmark across two nodes, then locally over TCP; the summary's keys.
pub(crate) async fn between_two_nodes(bed: &Testbed) -> serde_json::Map<String, Value> {
    let name = "crossbench";
    let job = benchmark_job(name);
    let done = all_reduce_bench::run_in_pods(bed, &job, 2, LONG).await;
    let nodes: BTreeSet<&str> = done["status"]["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["node"].as_str())
        .collect();
    assert_eq!(nodes.len(), 2, "the ranks ran on {nodes:?}");
    let cluster = &done["status"]["result"]["allReduce"];
    assert_eq!(
        cluster["sharedMemoryPeers"], 0,
        "two nodes share no memory: {cluster}"
    );
    let on_nodes = timings(cluster, "two nodes");

    let local = run_local(&job, &[(rdu_crds::consts::env::DATA_PATH, "tcp")]);
    let on_loopback = timings(&local["allReduce"], "local mode over TCP");

    let rows: Vec<Value> = on_nodes
        .iter()
        .zip(&on_loopback)
        .map(|(node, local)| {
            json!({
                "bytes": node["bytes"],
                "pods_median_seconds": node["medianSeconds"],
                "pods_busbw_gbps": node["busbwGbps"],
                "local_tcp_median_seconds": local["medianSeconds"],
                "local_tcp_busbw_gbps": local["busbwGbps"],
            })
        })
        .collect();
    let mut out = serde_json::Map::new();
    out.insert(
        "cross_node_allreduce_busbw_gbps".into(),
        on_nodes
            .last()
            .map_or(Value::Null, |s| s["busbwGbps"].clone()),
    );
    out.insert(
        "local_tcp_allreduce_busbw_gbps".into(),
        on_loopback
            .last()
            .map_or(Value::Null, |s| s["busbwGbps"].clone()),
    );
    out.insert("cross_node_allreduce".into(), json!(rows));
    out
}
