//! Two ranks in one process over loopback gRPC, trained once with one gradient bucket and once with
//! several (bucketSizeMiB 1 and a first layer over 1 MiB): the parameters end bitwise the same.

use crate::common;

use std::collections::HashMap;

use rdu_crds::consts::env;
use rdu_worker::Mlp;
use rdu_worker::WorkerEnv;
use rdu_worker::run_rank;

/// 300 inputs × 1000 hidden: layer 0 holds 301,000 f32 (1.15 MiB), more than a 1 MiB bucket.
const SPEC: &str = r#"{"workers":2,"tilesPerWorker":2,
 "model":{"name":"ffn-logreg","hiddenSizes":[1000],"inputSize":300,"classes":4},
 "data":{"source":"synthetic","samples":240,"seed":5},
 "training":{"steps":6,"batchSize":16,"learningRate":0.01,"optimizer":"adam"},
 "dataParallel":{"timeoutSeconds":20,"bucketSizeMiB":BUCKET}}"#;

/// Trains 2 ranks with `bucket_mib`; returns each rank's final parameter checksum.
fn train_two_ranks(bucket_mib: u32) -> Vec<u64> {
    let master_port = common::free_port();
    let spec = SPEC.replace("BUCKET", &bucket_mib.to_string());
    let handles: Vec<_> = (0..2u32)
        .map(|rank| {
            let vars: HashMap<String, String> = [
                (env::RANK, rank.to_string()),
                (env::WORLD_SIZE, "2".into()),
                (env::MASTER_ADDR, "127.0.0.1".into()),
                (env::MASTER_PORT, master_port.to_string()),
                (env::COLLECTIVE_PORT, common::free_port().to_string()),
                (env::JOB_NAME, "b".into()),
                (env::JOB_UID, "uid-b".into()),
                (env::JOB_TOKEN, "tok".into()),
                (env::GENERATION, "0".into()),
                (env::JOB_SPEC, spec.clone()),
                (env::RESULT_PATH, "/dev/null".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            std::thread::spawn(move || {
                let env = WorkerEnv::from_vars(|k| vars.get(k).cloned()).unwrap();
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                runtime
                    .block_on(run_rank(&env))
                    .unwrap()
                    .checksum
                    .expect("a trained model")
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn several_buckets_train_to_bitwise_the_same_parameters_as_one() {
    let layers = Mlp::new(300, &[1000], 4).layer_elems();
    assert_eq!(
        rdu_worker::partition_buckets(&layers, rdu_worker::bucket_cap_bytes(1)).len(),
        2
    );
    assert_eq!(
        rdu_worker::partition_buckets(&layers, rdu_worker::bucket_cap_bytes(25)).len(),
        1
    );
    let one = train_two_ranks(25);
    let two = train_two_ranks(1);
    assert_eq!(one[0], one[1], "ranks differ with one bucket");
    assert_eq!(two[0], two[1], "ranks differ with two buckets");
    assert_eq!(one, two, "bucketing changed the result");
}
