//! A soak of random faults on a three-node cluster of its own (issue 35; the soak itself is
//! `rdu_e2e::soak`): for long soaks and replays, without the three-node test's stages before it. `bash
//! e2e/soak/run.sh` runs it (`RDU_SOAK_FAULTS`, default 20; `RDU_SOAK_SEED` replays a run) and prints the JSON
//! line it writes to `RDU_SOAK_BENCH_OUT`. CI's short soak runs at the end of the three-node test instead.

use rdu_e2e::soak::Soak;
use rdu_e2e::three_nodes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kind, podman or docker, the images of docker/Dockerfile and Kueue: bash e2e/soak/run.sh"]
async fn jobs_end_as_planned_through_random_faults() {
    let soak = Soak::from_env(20, 100_000);
    let mut cluster = three_nodes::start("rdu-soak").await;
    soak.run(&mut cluster.bed).await;
}
