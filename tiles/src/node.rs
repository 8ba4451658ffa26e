//! The node state: tile health, allocations and their checkpoint, the device list that
//! ListAndWatch streams, and the plain-Rust operations behind every gRPC call.

use crate::affinity::container_env;
use crate::metrics::PluginMetrics;
use crate::packing::{PackingError, pack};
use crate::saved_allocations::{
    self, FILE_VERSION, SavedAllocations, SavedAllocationsError, SavedAllocationsWriter, SavedGroup,
};

use crate::tilestat::{NodeStatus, TileState, TileStatus};
use crate::topology::{ResourceMode, TileIndex, Topology, TopologyError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Errors of node operations; each names the device or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    UnknownDevice(#[from] TopologyError),
    #[error(
        "device `{id}` is unhealthy (listed in the health file); it cannot be allocated until it recovers"
    )]
    Unhealthy { id: String },
    #[error("allocation request names no devices")]
    EmptyRequest,
    #[error("allocation_size must be at least 1 (got {0})")]
    BadSize(i64),
    #[error(transparent)]
    Packing(#[from] PackingError),
    #[error(transparent)]
    SavedAllocations(#[from] SavedAllocationsError),
}

/// One advertised device and its health, as ListAndWatch sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    pub id: String,
    pub healthy: bool,
}

/// The devices of one resource held by one pod (all its containers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDevices {
    /// `namespace/name`.
    pub pod: String,
    /// The RduJob rank, from the pod name `<job>-worker-<rank>`.
    pub rank: Option<u32>,
    pub device_ids: Vec<String>,
}

/// Who uses a tile, when known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub pod: Option<String>,
    pub rank: Option<u32>,
}

/// What Allocate gives one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerAllocation {
    pub tiles: Vec<TileIndex>,
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
struct Allocation {
    group: u64,
    owner: Owner,
    since: Instant,
}

struct Inner {
    unhealthy: Vec<bool>,
    /// Why a tile is unhealthy (e.g. `hung`, `failed`), when the health file says.
    reasons: Vec<Option<String>>,
    allocated: Vec<Option<Allocation>>,
    next_group: u64,
}

/// A simulated node of RDU tiles, shared by the gRPC service, the health watcher and the status endpoint.
pub struct TileNode {
    topology: Topology,
    mode: ResourceMode,
    node_name: Option<String>,
    checkpoint: Option<SavedAllocationsWriter>,
    inner: Mutex<Inner>,
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
        let saved = match &checkpoint_path {
            Some(path) => saved_allocations::load(path)?,
            None => None,
        };
        let node = TileNode::build(
            topology,
            mode,
            node_name,
            checkpoint_path.map(SavedAllocationsWriter::new),
            saved.as_ref(),
        );
        Ok(node)
    }

    /// A node with every tile healthy and free and no checkpoint (local mode, tests).
    pub fn in_memory(
        topology: Topology,
        mode: ResourceMode,
        node_name: Option<String>,
    ) -> TileNode {
        TileNode::build(topology, mode, node_name, None, None)
    }

    fn build(
        topology: Topology,
        mode: ResourceMode,
        node_name: Option<String>,
        checkpoint: Option<SavedAllocationsWriter>,
        saved: Option<&SavedAllocations>,
    ) -> TileNode {
        let total = topology.total_tiles() as usize;
        let mut inner = Inner {
            unhealthy: vec![false; total],
            reasons: vec![None; total],
            allocated: vec![None; total],
            next_group: 0,
        };
        if let Some(saved) = saved {
            restore(&topology, &mut inner, saved);
        }
        let (devices, _) = watch::channel(Arc::new(device_list(&topology, mode, &inner)));
        let node = TileNode {
            topology,
            mode,
            node_name,
            checkpoint,
            inner: Mutex::new(inner),
            devices,
            metrics: Arc::new(PluginMetrics::new()),
            allocated: tokio::sync::Notify::new(),
        };
        node.metrics
            .tiles_total
            .set(i64::from(topology.total_tiles()));
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
        let mut inner = self.lock();
        let total = self.topology.total_tiles();
        let wanted: Vec<bool> = (0..total).map(|t| faults.contains_key(&t)).collect();
        let reasons: Vec<Option<String>> = (0..total)
            .map(|t| faults.get(&t).cloned().flatten())
            .collect();
        inner.reasons = reasons;
        if wanted == inner.unhealthy {
            return false;
        }
        inner.unhealthy = wanted;
        self.update_gauges(&inner);
        let list = device_list(&self.topology, self.mode, &inner);
        drop(inner);
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
        if size < 1 {
            return Err(NodeError::BadSize(size));
        }
        let units = self.unit_topology();
        let to_units = |ids: &[String]| -> Result<Vec<TileIndex>, NodeError> {
            ids.iter().map(|id| self.unit_index(id)).collect()
        };
        let picked = pack(
            &units,
            &to_units(available)?,
            &to_units(must_include)?,
            size as usize,
        )?;
        Ok(picked.into_iter().map(|u| self.unit_id(u)).collect())
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
        let mut per_container = Vec::with_capacity(containers.len());
        for device_ids in containers {
            if device_ids.is_empty() {
                return Err(NodeError::EmptyRequest);
            }
            let mut tiles = Vec::with_capacity(device_ids.len());
            for id in device_ids {
                tiles.extend(self.topology.parse_device(self.mode, id)?);
            }
            tiles.sort_unstable();
            tiles.dedup();
            per_container.push(tiles);
        }
        let mut inner = self.lock();
        for device_ids in containers {
            for id in device_ids {
                let unit = self.unit_index(id)?;
                if !self.unit_healthy(&inner, unit) {
                    return Err(NodeError::Unhealthy { id: id.clone() });
                }
            }
        }
        for tiles in &per_container {
            self.mark_allocated(&mut inner, tiles, Owner::default());
        }
        drop(inner);
        self.allocated.notify_one();
        let allocations = per_container
            .into_iter()
            .map(|tiles| ContainerAllocation {
                env: container_env(&self.topology, &tiles),
                tiles,
            })
            .collect();
        self.metrics.observe_allocate(started.elapsed());
        Ok(allocations)
    }

    /// Local mode: picks `count` free healthy devices with the same packing as GetPreferredAllocation and
    /// allocates them. Returns the device IDs and the allocation.
    pub fn allocate_free(
        &self,
        count: u32,
    ) -> Result<(Vec<String>, ContainerAllocation), NodeError> {
        let inner = self.lock();
        let units = self.unit_topology();
        let free: Vec<TileIndex> = (0..units.total_tiles())
            .filter(|&u| self.unit_healthy(&inner, u) && self.unit_free(&inner, u))
            .collect();
        drop(inner);
        let picked = pack(&units, &free, &[], count as usize)?;
        let ids: Vec<String> = picked.into_iter().map(|u| self.unit_id(u)).collect();
        let allocation = self.allocate(&ids)?;
        Ok((ids, allocation))
    }

    /// Frees the tiles of these device IDs (unknown IDs are ignored).
    pub fn release(&self, device_ids: &[String]) {
        let mut inner = self.lock();
        let mut changed = false;
        for id in device_ids {
            if let Ok(tiles) = self.topology.parse_device(self.mode, id) {
                for t in tiles {
                    changed |= inner.allocated[t as usize].take().is_some();
                }
            }
        }
        if changed {
            self.update_gauges(&inner);
            self.save_checkpoint(&inner);
        }
    }

    /// Records who uses a set of devices (e.g. from the kubelet's pod-resources API).
    pub fn set_owner(&self, device_ids: &[String], owner: Owner) {
        let mut inner = self.lock();
        let mut tiles = Vec::new();
        for id in device_ids {
            if let Ok(t) = self.topology.parse_device(self.mode, id) {
                tiles.extend(t);
            }
        }
        self.mark_allocated(&mut inner, &tiles, owner);
    }

    /// Makes the allocations match the kubelet's pod resources: tiles a pod holds are allocated to it;
    /// tiles no pod holds are freed, unless allocated less than `grace` ago (the kubelet records an
    /// allocation only after Allocate returns). Returns whether anything changed.
    pub fn reconcile_with_pods(&self, pods: &[PodDevices], grace: Duration) -> bool {
        let total = self.topology.total_tiles() as usize;
        let mut held: Vec<Option<(usize, &PodDevices)>> = vec![None; total];
        for (index, pod) in pods.iter().enumerate() {
            for id in &pod.device_ids {
                if let Ok(tiles) = self.topology.parse_device(self.mode, id) {
                    for t in tiles {
                        held[t as usize] = Some((index, pod));
                    }
                }
            }
        }
        let mut inner = self.lock();
        let base = inner.next_group;
        let mut changed = false;
        for (t, holder) in held.iter().enumerate() {
            match (holder, &inner.allocated[t]) {
                (Some((index, pod)), current) => {
                    let owner = Owner {
                        pod: Some(pod.pod.clone()),
                        rank: pod.rank,
                    };
                    if current.as_ref().map(|a| &a.owner) != Some(&owner) {
                        inner.allocated[t] = Some(Allocation {
                            group: base + *index as u64,
                            owner,
                            since: Instant::now(),
                        });
                        changed = true;
                    }
                }
                (None, Some(a)) if a.since.elapsed() >= grace => {
                    inner.allocated[t] = None;
                    changed = true;
                }
                (None, _) => {}
            }
        }
        inner.next_group = base + pods.len() as u64;
        if changed {
            self.update_gauges(&inner);
            self.save_checkpoint(&inner);
        }
        changed
    }

    /// The sntilestat view of the node.
    pub fn status(&self) -> NodeStatus {
        let inner = self.lock();
        let tiles: Vec<TileStatus> = (0..self.topology.total_tiles())
            .map(|t| {
                let allocation = inner.allocated[t as usize].as_ref();
                TileStatus {
                    id: self.topology.tile_id(t),
                    rdu: self.topology.rdu_of(t),
                    tile: self.topology.tile_of(t),
                    state: if inner.unhealthy[t as usize] {
                        TileState::Unhealthy
                    } else {
                        TileState::Healthy
                    },
                    reason: inner.reasons[t as usize].clone(),
                    allocated: allocation.is_some(),
                    pod: allocation.and_then(|a| a.owner.pod.clone()),
                    rank: allocation.and_then(|a| a.owner.rank),
                }
            })
            .collect();
        NodeStatus {
            node: self.node_name.clone(),
            resource_name: self.mode.resource_name().to_string(),
            rdus_per_node: self.topology.rdus(),
            tiles_per_rdu: self.topology.tiles_per_rdu(),
            tiles_total: self.topology.total_tiles(),
            tiles_healthy: tiles
                .iter()
                .filter(|t| t.state == TileState::Healthy)
                .count() as u32,
            tiles_allocated: tiles.iter().filter(|t| t.allocated).count() as u32,
            tiles,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave Inner half-updated in a way that matters here.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn mark_allocated(&self, inner: &mut Inner, tiles: &[TileIndex], owner: Owner) {
        if tiles.is_empty() {
            return;
        }
        let group = inner.next_group;
        inner.next_group += 1;
        for &t in tiles {
            inner.allocated[t as usize] = Some(Allocation {
                group,
                owner: owner.clone(),
                since: Instant::now(),
            });
        }
        self.update_gauges(inner);
        self.save_checkpoint(inner);
    }

    fn save_checkpoint(&self, inner: &Inner) {
        let Some(writer) = &self.checkpoint else {
            return;
        };
        let topology = self.topology;
        let allocated = inner.allocated.clone();
        writer.submit(Box::new(move || snapshot(&topology, &allocated)));
    }

    /// Waits until the allocation checkpoint reflects every allocation made so far.
    pub fn flush_checkpoint(&self) {
        if let Some(writer) = &self.checkpoint {
            writer.flush();
        }
    }

    fn update_gauges(&self, inner: &Inner) {
        let healthy = inner.unhealthy.iter().filter(|u| !**u).count();
        let allocated = inner.allocated.iter().filter(|a| a.is_some()).count();
        self.metrics.tiles_healthy.set(healthy as i64);
        self.metrics.tiles_allocated.set(allocated as i64);
    }

    /// The topology of schedulable units: tiles, or RDUs as single-tile units in RDU mode.
    fn unit_topology(&self) -> Topology {
        match self.mode {
            ResourceMode::Tile => self.topology,
            // An RDU count already validated as a topology is a valid 1-tile topology.
            ResourceMode::Rdu => Topology::new(self.topology.rdus(), 1).unwrap_or(self.topology),
        }
    }

    fn unit_index(&self, id: &str) -> Result<TileIndex, NodeError> {
        let tiles = self.topology.parse_device(self.mode, id)?;
        Ok(match self.mode {
            ResourceMode::Tile => tiles[0],
            ResourceMode::Rdu => self.topology.rdu_of(tiles[0]),
        })
    }

    fn unit_id(&self, unit: TileIndex) -> String {
        match self.mode {
            ResourceMode::Tile => self.topology.tile_id(unit),
            ResourceMode::Rdu => Topology::rdu_id(unit),
        }
    }

    fn unit_tiles(&self, unit: TileIndex) -> std::ops::Range<TileIndex> {
        match self.mode {
            ResourceMode::Tile => unit..unit + 1,
            ResourceMode::Rdu => self.topology.tiles_of_rdu(unit),
        }
    }

    fn unit_healthy(&self, inner: &Inner, unit: TileIndex) -> bool {
        self.unit_tiles(unit).all(|t| !inner.unhealthy[t as usize])
    }

    fn unit_free(&self, inner: &Inner, unit: TileIndex) -> bool {
        self.unit_tiles(unit)
            .all(|t| inner.allocated[t as usize].is_none())
    }
}

fn device_list(topology: &Topology, mode: ResourceMode, inner: &Inner) -> Vec<DeviceHealth> {
    match mode {
        ResourceMode::Tile => (0..topology.total_tiles())
            .map(|t| DeviceHealth {
                id: topology.tile_id(t),
                healthy: !inner.unhealthy[t as usize],
            })
            .collect(),
        ResourceMode::Rdu => (0..topology.rdus())
            .map(|r| DeviceHealth {
                id: Topology::rdu_id(r),
                healthy: topology
                    .tiles_of_rdu(r)
                    .all(|t| !inner.unhealthy[t as usize]),
            })
            .collect(),
    }
}

fn snapshot(topology: &Topology, allocated: &[Option<Allocation>]) -> SavedAllocations {
    let mut groups: BTreeMap<u64, SavedGroup> = BTreeMap::new();
    for (t, allocation) in allocated.iter().enumerate() {
        if let Some(a) = allocation {
            let entry = groups.entry(a.group).or_insert_with(|| SavedGroup {
                tiles: Vec::new(),
                pod: a.owner.pod.clone(),
                rank: a.owner.rank,
            });
            entry.tiles.push(topology.tile_id(t as TileIndex));
        }
    }
    SavedAllocations {
        version: FILE_VERSION,
        rdus_per_node: topology.rdus(),
        tiles_per_rdu: topology.tiles_per_rdu(),
        allocations: groups.into_values().collect(),
    }
}

fn restore(topology: &Topology, inner: &mut Inner, saved: &SavedAllocations) {
    if saved.rdus_per_node != topology.rdus() || saved.tiles_per_rdu != topology.tiles_per_rdu() {
        tracing::warn!(
            saved_rdus = saved.rdus_per_node,
            saved_tiles = saved.tiles_per_rdu,
            rdus = topology.rdus(),
            tiles = topology.tiles_per_rdu(),
            "checkpoint is for another topology; starting with no allocations"
        );
        return;
    }
    for entry in &saved.allocations {
        let group = inner.next_group;
        inner.next_group += 1;
        for id in &entry.tiles {
            match topology.parse_device(ResourceMode::Tile, id) {
                Ok(tiles) => {
                    for t in tiles {
                        inner.allocated[t as usize] = Some(Allocation {
                            group,
                            owner: Owner {
                                pod: entry.pod.clone(),
                                rank: entry.rank,
                            },
                            since: Instant::now(),
                        });
                    }
                }
                Err(e) => tracing::warn!(error = %e, "checkpoint entry skipped"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(r: u32, t: u32, mode: ResourceMode) -> TileNode {
        TileNode::in_memory(Topology::new(r, t).unwrap(), mode, None)
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn allocate_returns_the_mask_and_marks_tiles() {
        let n = node(8, 4, ResourceMode::Tile);
        let all: Vec<String> = (24..32).map(|t| n.topology().tile_id(t)).collect();
        let a = n.allocate(&all).unwrap();
        assert_eq!(a.env["SF_RNT_TILE_AFFINITY"], "0xff000000");
        assert_eq!(n.status().tiles_allocated, 8);
    }

    #[test]
    fn allocate_refuses_unknown_and_unhealthy_devices_by_name() {
        let n = node(8, 4, ResourceMode::Tile);
        let err = n.allocate(&ids(&["rdu0-tile0", "rdu9-tile0"])).unwrap_err();
        assert!(matches!(err, NodeError::UnknownDevice(_)));
        assert!(err.to_string().contains("rdu9-tile0"));
        n.set_unhealthy(&BTreeSet::from([1]));
        let err = n.allocate(&ids(&["rdu0-tile0", "rdu0-tile1"])).unwrap_err();
        assert!(matches!(err, NodeError::Unhealthy { ref id } if id == "rdu0-tile1"));
        assert_eq!(
            n.status().tiles_allocated,
            0,
            "a refused request allocates nothing"
        );
        assert!(matches!(n.allocate(&[]), Err(NodeError::EmptyRequest)));
        // One bad container refuses the whole request.
        let err = n
            .allocate_containers(&[ids(&["rdu2-tile0"]), ids(&["rdu0-tile1"])])
            .unwrap_err();
        assert!(matches!(err, NodeError::Unhealthy { .. }));
        assert_eq!(n.status().tiles_allocated, 0);
        let both = n
            .allocate_containers(&[ids(&["rdu2-tile0"]), ids(&["rdu3-tile0", "rdu3-tile1"])])
            .unwrap();
        assert_eq!(both[0].env["SF_RNT_TILE_AFFINITY"], "0x100");
        assert_eq!(both[1].env["SF_RNT_TILE_AFFINITY"], "0x3000");
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
        assert!(n.set_health(&BTreeMap::from([(1, Some("hung".to_string()))])));
        assert_eq!(n.status().tiles[1].reason.as_deref(), Some("hung"));
        assert!(!n.set_health(&BTreeMap::from([(1, Some("failed".to_string()))])));
        assert_eq!(n.status().tiles[1].reason.as_deref(), Some("failed"));
        assert!(n.set_health(&BTreeMap::new()));
        assert_eq!(n.status().tiles[1].reason, None);
    }

    #[test]
    fn rdu_mode_advertises_rdus_and_an_unhealthy_tile_fails_its_rdu() {
        let n = node(4, 8, ResourceMode::Rdu);
        assert_eq!(n.devices().len(), 4);
        n.set_unhealthy(&BTreeSet::from([9]));
        assert!(!n.devices()[1].healthy);
        assert!(n.devices()[0].healthy);
        let a = n.allocate(&ids(&["rdu3"])).unwrap();
        assert_eq!(a.env["SF_RNT_TILE_AFFINITY"], "0xff000000");
        assert!(n.allocate(&ids(&["rdu0-tile0"])).is_err());
        assert_eq!(
            n.preferred(&ids(&["rdu0", "rdu2", "rdu3"]), &ids(&["rdu3"]), 2)
                .unwrap(),
            ids(&["rdu0", "rdu3"])
        );
    }

    #[test]
    fn allocate_free_packs_and_release_frees() {
        let n = node(8, 4, ResourceMode::Tile);
        let (first, _) = n.allocate_free(2).unwrap();
        assert_eq!(first, ids(&["rdu0-tile0", "rdu0-tile1"]));
        let (second, _) = n.allocate_free(4).unwrap();
        assert_eq!(
            second,
            ids(&["rdu1-tile0", "rdu1-tile1", "rdu1-tile2", "rdu1-tile3"])
        );
        let (third, _) = n.allocate_free(2).unwrap();
        assert_eq!(third, ids(&["rdu0-tile2", "rdu0-tile3"]));
        n.release(&first);
        assert_eq!(n.status().tiles_allocated, 6);
        assert!(matches!(
            n.allocate_free(100),
            Err(NodeError::Packing(PackingError::NotEnough { .. }))
        ));
    }

    #[test]
    fn preferred_rejects_bad_sizes_and_ids() {
        let n = node(8, 4, ResourceMode::Tile);
        assert!(matches!(
            n.preferred(&ids(&["rdu0-tile0"]), &[], 0),
            Err(NodeError::BadSize(0))
        ));
        assert!(n.preferred(&ids(&["nope"]), &[], 1).is_err());
    }

    #[test]
    fn reconciling_with_pods_sets_owners_and_frees_ended_pods() {
        let n = node(8, 4, ResourceMode::Tile);
        n.allocate(&ids(&["rdu0-tile0", "rdu0-tile1"])).unwrap();
        n.allocate(&ids(&["rdu1-tile0"])).unwrap();
        let pods = vec![PodDevices {
            pod: "ns/job-worker-4".into(),
            rank: Some(4),
            device_ids: ids(&["rdu0-tile0", "rdu0-tile1"]),
        }];
        // Within the grace period the tile no pod lists yet is kept.
        assert!(n.reconcile_with_pods(&pods, Duration::from_secs(3600)));
        let status = n.status();
        assert_eq!(status.tiles_allocated, 3);
        assert_eq!(status.tiles[0].pod.as_deref(), Some("ns/job-worker-4"));
        assert_eq!(status.tiles[1].rank, Some(4));
        assert!(
            !n.reconcile_with_pods(&pods, Duration::from_secs(3600)),
            "no change"
        );
        // Past the grace period it is freed: its pod is gone.
        assert!(n.reconcile_with_pods(&pods, Duration::ZERO));
        assert_eq!(n.status().tiles_allocated, 2);
        // The pod ends: everything is free.
        assert!(n.reconcile_with_pods(&[], Duration::ZERO));
        assert_eq!(n.status().tiles_allocated, 0);
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
