//! The all-reduce benchmark job the node and multi-node stages time in pods and in local mode with one spec
//! (`spec.mode: allReduceBenchmark`, as nccl-tests' all_reduce_perf): one-tile ranks, a ring, no compression.

use std::time::Duration;

use crate::testbed::Testbed;
use serde_json::{Value, json};

/// Job `name` in `default` timing the all-reduce of each of `sizes` with `workers` ranks.
pub fn job(name: &str, workers: u32, sizes: &[&str]) -> Value {
    json!({
        "apiVersion": "rdu.dev/v1alpha1",
        "kind": "RduJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "mode": "allReduceBenchmark",
            "workers": workers,
            "tilesPerWorker": 1,
            "image": "rdu-worker:0.1.0",
            "imagePullPolicy": "IfNotPresent",
            "allReduceBenchmark": {"sizes": sizes, "warmupIterations": 3, "iterations": 10},
            "dataParallel": {"algorithm": "ring", "compression": "none", "timeoutSeconds": 60},
            "model": {"name": "ffn-logreg"},
            "data": {"source": "synthetic"},
            "training": {"steps": 1, "batchSize": 1, "learningRate": 0.1},
            "runPolicy": {"restartPolicy": "ExitCode", "backoffLimit": 0},
        }
    })
}

/// How long a DRA job's ranks wait for each other: a rank's pod starts only once the kubelet prepared its claim,
/// and a refused prepare is tried again only when the kubelet syncs the pod again (10 to 15 s later, more after
/// several). 60 s was not enough in two CI runs.
pub const DRA_RENDEZVOUS_SECONDS: u32 = 180;

/// [`job`] with each rank's tile claimed through DRA, its ranks waiting [`DRA_RENDEZVOUS_SECONDS`] for each other.
/// Its gang may restart twice: in a CI run the kubelet's first fetch of a rank's new ResourceClaim was refused by
/// the node authorizer ("no relationship found between node ... and this object", its graph behind the claim),
/// and it did not try again before the other ranks' 60 s rendezvous ran out; in another a rank's pod stayed before
/// its container through two 60 s rendezvous (the kubelet's lines about a restarted job's pods are printed since).
pub fn dra_job(name: &str, workers: u32, sizes: &[&str]) -> Value {
    let mut job = job(name, workers, sizes);
    job["spec"]["tileAllocation"] = json!({"api": "dra"});
    job["spec"]["runPolicy"]["backoffLimit"] = json!(2);
    job["spec"]["dataParallel"]["timeoutSeconds"] = json!(DRA_RENDEZVOUS_SECONDS);
    job
}

/// Rank 0's `allReduce` result of the Succeeded job `done`; prints the job's history when its gang restarted.
pub fn result_of(done: &Value) -> Value {
    if done["status"]["failureRestarts"]
        .as_u64()
        .unwrap_or_default()
        > 0
    {
        println!(
            "{}: restarted: {}",
            done["metadata"]["name"], done["status"]["history"]
        );
    }
    done["status"]["result"]["allReduce"].clone()
}

/// Runs benchmark `job` in pods in `default` until it Succeeded (within `wait`) and deletes it: its final object,
/// after checking that rank 0's result spans `nodes` nodes with every rank of the job.
pub async fn run_in_pods(bed: &Testbed, job: &Value, nodes: u64, wait: Duration) -> Value {
    let name = job["metadata"]["name"].as_str().expect("the job's name");
    bed.apply(&job.to_string());
    let done = bed.wait_phase(name, "Succeeded", wait).await;
    let result = result_of(&done);
    if done["status"]["failureRestarts"]
        .as_u64()
        .unwrap_or_default()
        > 0
    {
        println!(
            "{name}: the kubelets' lines about its pods:\n{}",
            bed.kubelet_lines_about(name)
        );
    }
    assert_eq!(result["nodes"], nodes, "{name}: {result}");
    assert_eq!(result["ranks"], job["spec"]["workers"], "{name}: {result}");
    bed.kubectl(&["delete", "rdujob", name, "-n", "default", "--wait=true"]);
    done
}

/// busbw (GB/s) by size label of `all_reduce` (a result of the job timing `sizes`), asserting every size is
/// present, every value right and every rate positive; `who` names the run in a failure.
pub fn busbw_by_size(
    all_reduce: &Value,
    sizes: &[&str],
    who: &str,
) -> serde_json::Map<String, Value> {
    let measured = all_reduce["sizes"].as_array().cloned().unwrap_or_default();
    assert_eq!(measured.len(), sizes.len(), "{who}: {all_reduce}");
    sizes
        .iter()
        .zip(&measured)
        .map(|(label, size)| {
            assert_eq!(size["wrongValues"], 0, "{who}: {size}");
            let gbps = size["busbwGbps"].as_f64().unwrap_or_default();
            assert!(gbps > 0.0 && gbps.is_finite(), "{who}: {size}");
            (label.to_string(), json!(gbps))
        })
        .collect()
}
