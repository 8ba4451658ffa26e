//! The cluster the three-node test and the soak run on: a kind testbed of three RDU nodes (2 RDUs × 2 tiles
//! each), Kueue's manager on the host against its API server, and the chart installed with `helm install`
//! (Kueue integration on for jobs that name a queue, two operator replicas), every node offering its tiles.

use std::time::{Duration, Instant};

use crate::kueue::{self, Kueue};
use crate::testbed::{Testbed, TestbedSpec};

pub const NODES: u8 = 3;
pub const RDUS: u32 = 2;
pub const TILES_PER_RDU: u32 = 2;
pub const TILES_PER_NODE: u32 = RDUS * TILES_PER_RDU;
/// How long the cluster's own steps may take (a node's tiles offered, a fault healed).
pub const LONG: Duration = Duration::from_secs(300);

/// The running cluster and how long its parts took to come up.
pub struct ThreeNodes {
    /// Kueue's manager; stopped when dropped (before the cluster: fields drop in this order).
    pub kueue: Kueue,
    pub bed: Testbed,
    /// From the testbed's start to every node Ready and Kueue answering.
    pub nodes_ready: Duration,
    /// From `helm install` to every node offering its tiles.
    pub helm_install_to_tiles: Duration,
}

/// Starts the cluster named `name` (one kind cluster per test); panics with diagnostics when a part fails.
pub async fn start(name: &'static str) -> ThreeNodes {
    let mut bed = Testbed::start(&TestbedSpec { name, nodes: NODES }).await;
    // After the cluster is up: when Kueue is not built yet (a fresh CI machine), its build overlaps the cluster's.
    let kueue_dir = kueue::kueue_dir().unwrap_or_else(|e| panic!("{e}"));
    // Kueue's manager before the chart: the operator runs with `kueue.enabled`, so jobs labelled with a queue
    // wait for admission; the others run as they would without Kueue (`kueue.manageJobsWithoutQueueName=false`).
    let kueue = kueue::start(&mut bed.plane, &kueue_dir, None)
        .await
        .unwrap_or_else(|e| panic!("Kueue starts: {}", rdu_error_chain::Chain(&e)));
    let nodes_ready = bed.started.elapsed();
    let installed = Instant::now();
    bed.helm_install(&[
        format!("devicePlugin.rdusPerNode={RDUS}"),
        format!("devicePlugin.tilesPerRdu={TILES_PER_RDU}"),
        "kueue.enabled=true".to_string(),
        "kueue.manageJobsWithoutQueueName=false".to_string(),
        // A standby replica, as in production: a killed leader's Lease lapses to it.
        "operator.replicas=2".to_string(),
    ]);
    for node in &bed.nodes {
        bed.wait_tiles(&node.name, TILES_PER_NODE, "after helm install", LONG)
            .await;
    }
    ThreeNodes {
        bed,
        kueue,
        nodes_ready,
        helm_install_to_tiles: installed.elapsed(),
    }
}
