//! The all-reduce benchmark job the node and multi-node stages time in pods and in local mode with one spec
//! (`spec.mode: allReduceBenchmark`, as nccl-tests' all_reduce_perf): one-tile ranks, a ring, no compression.

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
