//! A node of simulated RDU tiles as the device plugin serves it: the tile table (`crate::table`) behind a lock,
//! and what each change of it publishes: the device list that ListAndWatch streams (a watch), the tile gauges,
//! and the saved-allocations file (written off the caller's thread). The plain-Rust operations behind every
//! gRPC call.

use crate::metrics::PluginMetrics;
use crate::saved_allocations::{self, SavedAllocationsWriter};
use crate::table::TileTable;
pub use crate::table::{ContainerAllocation, DeviceHealth, NodeError, Owner, PodDevices};
use crate::tilestat::NodeStatus;
use crate::topology::{ResourceMode, TileIndex, Topology};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A simulated node of RDU tiles, shared by the gRPC service, the health watcher and the status endpoint.
pub struct TileNode {
    topology: Topology,
    mode: ResourceMode,
    node_name: Option<String>,
    saved: Option<SavedAllocationsWriter>,
    table: Mutex<TileTable>,
    devices: watch::Sender<Arc<Vec<DeviceHealth>>>,
    metrics: Arc<PluginMetrics>,
    /// Woken by every kubelet Allocate, so the pod-resources poller can look soon after.
    allocated: tokio::sync::Notify,
}

impl TileNode {
    /// A node with every tile healthy and free, or with the allocations of `checkpoint_path` when it exists.
    /// A checkpoint of another topology is ignored (with a warning): the node was reconfigured.
    pub fn new(
        topology: Topology,
        mode: ResourceMode,
        node_name: Option<String>,
        checkpoint_path: Option<PathBuf>,
    ) -> Result<TileNode, NodeError> {
        let table = match &checkpoint_path {
            Some(path) => match saved_allocations::load(path)? {
                Some(saved) => TileTable::restored(topology, mode, &saved),
                None => TileTable::new(topology, mode),
            },
            None => TileTable::new(topology, mode),
        };
        Ok(TileNode::build(
            table,
            node_name,
            checkpoint_path.map(SavedAllocationsWriter::new),
        ))
    }

    /// A node with every tile healthy and free and no checkpoint (local mode, tests).
    pub fn in_memory(
        topology: Topology,
        mode: ResourceMode,
        node_name: Option<String>,
    ) -> TileNode {
        TileNode::build(TileTable::new(topology, mode), node_name, None)
    }

    fn build(
        table: TileTable,
        node_name: Option<String>,
        saved: Option<SavedAllocationsWriter>,
    ) -> TileNode {
        let (devices, _) = watch::channel(Arc::new(table.device_list()));
        let metrics = Arc::new(PluginMetrics::new());
        metrics
            .tiles_total
            .set(i64::from(table.topology().total_tiles()));
        let node = TileNode {
            topology: table.topology(),
            mode: table.mode(),
            node_name,
            saved,
            table: Mutex::new(table),
            devices,
            metrics,
            allocated: tokio::sync::Notify::new(),
        };
        node.update_gauges(&node.lock());
        node
    }

    pub fn topology(&self) -> Topology {
        self.topology
    }

    pub fn mode(&self) -> ResourceMode {
        self.mode
    }

    pub fn metrics(&self) -> &Arc<PluginMetrics> {
        &self.metrics
    }

    /// The device list now and every later change of it.
    pub fn watch_devices(&self) -> watch::Receiver<Arc<Vec<DeviceHealth>>> {
        self.devices.subscribe()
    }

    pub fn devices(&self) -> Arc<Vec<DeviceHealth>> {
        self.devices.borrow().clone()
    }

    /// Replaces the set of unhealthy tiles; notifies ListAndWatch when the device list changed.
    pub fn set_unhealthy(&self, tiles: &BTreeSet<TileIndex>) -> bool {
        self.set_health(&tiles.iter().map(|&t| (t, None)).collect())
    }

    /// Replaces the unhealthy tiles and why each is unhealthy; notifies ListAndWatch and returns true
    /// when the device list changed (a new reason alone only shows in the status).
    pub fn set_health(&self, faults: &BTreeMap<TileIndex, Option<String>>) -> bool {
        let mut table = self.lock();
        if !table.set_health(faults) {
            return false;
        }
        self.update_gauges(&table);
        let list = table.device_list();
        drop(table);
        self.devices.send_if_modified(|current| {
            if **current == list {
                false
            } else {
                *current = Arc::new(list);
                true
            }
        })
    }

    /// GetPreferredAllocation for one container, on device IDs of the plugin's mode.
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: i64,
    ) -> Result<Vec<String>, NodeError> {
        self.lock().preferred(available, must_include, size)
    }

    /// Allocate for one container: checks every ID is known and healthy, marks the tiles allocated,
    /// checkpoints, and returns the env. Tiles already recorded as allocated are re-assigned (the kubelet
    /// only re-allocates devices it has freed; it never tells the plugin about frees).
    pub fn allocate(&self, device_ids: &[String]) -> Result<ContainerAllocation, NodeError> {
        let mut allocations =
            self.allocate_containers(std::slice::from_ref(&device_ids.to_vec()))?;
        allocations.pop().ok_or(NodeError::EmptyRequest)
    }

    /// Returns after the next kubelet Allocate (at once if one came since the last call).
    pub async fn allocation_made(&self) {
        self.allocated.notified().await;
    }

    /// Allocate for every container of one request: all are checked before any is allocated, so a
    /// refused request leaves nothing half-allocated.
    pub fn allocate_containers(
        &self,
        containers: &[Vec<String>],
    ) -> Result<Vec<ContainerAllocation>, NodeError> {
        let started = Instant::now();
        let mut table = self.lock();
        let allocations = table.allocate_containers(containers)?;
        self.allocations_changed(&table);
        drop(table);
        self.allocated.notify_one();
        self.metrics.observe_allocate(started.elapsed());
        Ok(allocations)
    }

    /// Local mode: picks `count` free healthy devices with the same packing as GetPreferredAllocation and
    /// allocates them, under one lock. Returns the device IDs and the allocation.
    pub fn allocate_free(
        &self,
        count: u32,
    ) -> Result<(Vec<String>, ContainerAllocation), NodeError> {
        let started = Instant::now();
        let mut table = self.lock();
        let picked = table.allocate_free(count)?;
        self.allocations_changed(&table);
        drop(table);
        self.allocated.notify_one();
        self.metrics.observe_allocate(started.elapsed());
        Ok(picked)
    }

    /// Frees the tiles of these device IDs (unknown IDs are ignored).
    pub fn release(&self, device_ids: &[String]) {
        let mut table = self.lock();
        if table.release(device_ids) {
            self.allocations_changed(&table);
        }
    }

    /// Records who uses a set of devices (e.g. from the kubelet's pod-resources API).
    pub fn set_owner(&self, device_ids: &[String], owner: Owner) {
        let mut table = self.lock();
        if table.set_owner(device_ids, owner) {
            self.allocations_changed(&table);
        }
    }

    /// Makes the allocations match the kubelet's pod resources: tiles a pod holds are allocated to it;
    /// tiles no pod holds are freed, unless allocated less than `grace` ago (the kubelet records an
    /// allocation only after Allocate returns). Returns whether anything changed.
    pub fn reconcile_with_pods(&self, pods: &[PodDevices], grace: Duration) -> bool {
        let mut table = self.lock();
        let changed = table.reconcile_with_pods(pods, grace);
        if changed {
            self.allocations_changed(&table);
        }
        changed
    }

    /// The sntilestat view of the node.
    pub fn status(&self) -> NodeStatus {
        self.lock().status(self.node_name.clone())
    }

    /// Waits until the allocation checkpoint reflects every allocation made so far.
    pub fn flush_checkpoint(&self) {
        if let Some(writer) = &self.saved {
            writer.flush();
        }
    }

    fn lock(&self) -> MutexGuard<'_, TileTable> {
        // A panic while holding the lock cannot leave the table half-updated in a way that matters here.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes changed allocations: the gauges, and the saved file (written on the writer's thread).
    fn allocations_changed(&self, table: &TileTable) {
        self.update_gauges(table);
        if let Some(writer) = &self.saved {
            writer.submit(Box::new(table.snapshot_later()));
        }
    }

    fn update_gauges(&self, table: &TileTable) {
        let (healthy, allocated) = table.counts();
        self.metrics.tiles_healthy.set(healthy as i64);
        self.metrics.tiles_allocated.set(allocated as i64);
    }
}

#[cfg(test)]
mod tests {
    //! What the node adds to the table (whose decisions `table`'s tests check): the device-list watch, the gauges
    //! and the saved-allocations file.

    use super::*;

    fn node(r: u32, t: u32, mode: ResourceMode) -> TileNode {
        TileNode::in_memory(Topology::new(r, t).unwrap(), mode, None)
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn health_changes_update_the_device_list_once() {
        let n = node(2, 2, ResourceMode::Tile);
        let mut rx = n.watch_devices();
        rx.mark_unchanged();
        assert!(n.set_unhealthy(&BTreeSet::from([3])));
        assert!(rx.has_changed().unwrap());
        assert!(!n.devices()[3].healthy);
        assert!(
            !n.set_unhealthy(&BTreeSet::from([3])),
            "same set: no update"
        );
        assert!(n.set_unhealthy(&BTreeSet::new()));
        assert!(n.devices().iter().all(|d| d.healthy));
    }

    #[test]
    fn reasons_show_in_the_status_without_a_device_list_update() {
        let n = node(2, 2, ResourceMode::Tile);
        let mut rx = n.watch_devices();
        assert!(n.set_health(&BTreeMap::from([(1, Some("hung".to_string()))])));
        assert_eq!(n.status().tiles[1].reason.as_deref(), Some("hung"));
        rx.mark_unchanged();
        assert!(!n.set_health(&BTreeMap::from([(1, Some("failed".to_string()))])));
        assert!(
            !rx.has_changed().unwrap(),
            "a new reason alone sends nothing"
        );
        assert_eq!(n.status().tiles[1].reason.as_deref(), Some("failed"));
        assert!(n.set_health(&BTreeMap::new()));
        assert_eq!(n.status().tiles[1].reason, None);
    }

    #[test]
    fn the_gauges_follow_health_and_allocations() {
        let n = node(8, 4, ResourceMode::Tile);
        let gauges = |n: &TileNode| {
            let m = n.metrics();
            (
                m.tiles_total.get(),
                m.tiles_healthy.get(),
                m.tiles_allocated.get(),
            )
        };
        assert_eq!(gauges(&n), (32, 32, 0));
        n.set_unhealthy(&BTreeSet::from([31]));
        let (first, _) = n.allocate_free(2).unwrap();
        n.allocate(&ids(&["rdu4-tile0"])).unwrap();
        assert_eq!(gauges(&n), (32, 31, 3));
        n.release(&first);
        assert_eq!(gauges(&n), (32, 31, 1));
        assert!(
            n.metrics()
                .encode()
                .contains("rdu_allocate_seconds_count 2"),
            "both allocations timed"
        );
        // A refused request changes nothing.
        assert!(n.allocate(&ids(&["rdu7-tile3"])).is_err());
        assert_eq!(gauges(&n), (32, 31, 1));
    }

    #[test]
    fn checkpoint_restores_allocations_and_owners() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alloc.json");
        let topo = Topology::new(8, 4).unwrap();
        {
            let n = TileNode::new(topo, ResourceMode::Tile, None, Some(path.clone())).unwrap();
            n.allocate(&ids(&["rdu2-tile0", "rdu2-tile1"])).unwrap();
            n.set_owner(
                &ids(&["rdu5-tile3"]),
                Owner {
                    pod: Some("ns/j-worker-2".into()),
                    rank: Some(2),
                },
            );
        }
        let n = TileNode::new(topo, ResourceMode::Tile, None, Some(path.clone())).unwrap();
        let status = n.status();
        assert_eq!(status.tiles_allocated, 3);
        let t = &status.tiles[topo.tile_index(5, 3) as usize];
        assert_eq!((t.pod.as_deref(), t.rank), (Some("ns/j-worker-2"), Some(2)));
        // A node of another shape ignores the checkpoint.
        let other = TileNode::new(
            Topology::new(4, 8).unwrap(),
            ResourceMode::Tile,
            None,
            Some(path),
        )
        .unwrap();
        assert_eq!(other.status().tiles_allocated, 0);
    }
}
