//! The tile table of one node, as plain data: which tiles are healthy (and why not), which are allocated, to whom
//! and since when, and every operation behind a device plugin call on it. No lock, watch, metric or file: the
//! node module's `TileNode` wraps the table with those and publishes what each operation changed.

use crate::affinity::container_env;
use crate::packing::{PackingError, pack};
use crate::saved_allocations::{FILE_VERSION, SavedAllocations, SavedAllocationsError, SavedGroup};
use crate::tilestat::{NodeStatus, TileState, TileStatus};
use crate::topology::{ResourceMode, TileIndex, Topology, TopologyError};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

/// The tiles of one node: health, reasons, allocations.
#[derive(Debug, Clone)]
pub struct TileTable {
    topology: Topology,
    mode: ResourceMode,
    unhealthy: Vec<bool>,
    /// Why a tile is unhealthy (e.g. `hung`, `failed`), when the health file says.
    reasons: Vec<Option<String>>,
    allocated: Vec<Option<Allocation>>,
    next_group: u64,
}

impl TileTable {
    /// Every tile healthy and free.
    pub fn new(topology: Topology, mode: ResourceMode) -> TileTable {
        let total = topology.total_tiles() as usize;
        TileTable {
            topology,
            mode,
            unhealthy: vec![false; total],
            reasons: vec![None; total],
            allocated: vec![None; total],
            next_group: 0,
        }
    }

    /// Every tile healthy, allocated as `saved` says; a saved file of another topology is ignored (with a
    /// warning): the node was reconfigured.
    pub fn restored(topology: Topology, mode: ResourceMode, saved: &SavedAllocations) -> TileTable {
        let mut table = TileTable::new(topology, mode);
        if saved.rdus_per_node != topology.rdus() || saved.tiles_per_rdu != topology.tiles_per_rdu()
        {
            tracing::warn!(
                saved_rdus = saved.rdus_per_node,
                saved_tiles = saved.tiles_per_rdu,
                rdus = topology.rdus(),
                tiles = topology.tiles_per_rdu(),
                "checkpoint is for another topology; starting with no allocations"
            );
            return table;
        }
        for entry in &saved.allocations {
            let group = table.next_group;
            table.next_group += 1;
            for id in &entry.tiles {
                match topology.parse_device(ResourceMode::Tile, id) {
                    Ok(tiles) => {
                        for t in tiles {
                            table.allocated[t as usize] = Some(Allocation {
                                group,
                                owner: Owner {
                                    pod: entry.pod.clone(),
                                    rank: entry.rank,
                                },
                                since: Instant::now(),
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %rdu_error_chain::Chain(&e), "checkpoint entry skipped")
                    }
                }
            }
        }
        table
    }

    pub fn topology(&self) -> Topology {
        self.topology
    }

    pub fn mode(&self) -> ResourceMode {
        self.mode
    }

    /// Healthy and allocated tiles.
    pub fn counts(&self) -> (usize, usize) {
        let healthy = self.unhealthy.iter().filter(|u| !**u).count();
        let allocated = self.allocated.iter().filter(|a| a.is_some()).count();
        (healthy, allocated)
    }

    /// The device list ListAndWatch sends: tiles, or RDUs (unhealthy when any of their tiles is).
    pub fn device_list(&self) -> Vec<DeviceHealth> {
        let topology = &self.topology;
        match self.mode {
            ResourceMode::Tile => (0..topology.total_tiles())
                .map(|t| DeviceHealth {
                    id: topology.tile_id(t),
                    healthy: !self.unhealthy[t as usize],
                })
                .collect(),
            ResourceMode::Rdu => (0..topology.rdus())
                .map(|r| DeviceHealth {
                    id: Topology::rdu_id(r),
                    healthy: topology
                        .tiles_of_rdu(r)
                        .all(|t| !self.unhealthy[t as usize]),
                })
                .collect(),
        }
    }

    /// Replaces the unhealthy tiles and why each is unhealthy. True when the set of unhealthy tiles changed (a
    /// new reason alone only shows in the status).
    pub fn set_health(&mut self, faults: &BTreeMap<TileIndex, Option<String>>) -> bool {
        let total = self.topology.total_tiles();
        self.reasons = (0..total)
            .map(|t| faults.get(&t).cloned().flatten())
            .collect();
        let wanted: Vec<bool> = (0..total).map(|t| faults.contains_key(&t)).collect();
        if wanted == self.unhealthy {
            return false;
        }
        self.unhealthy = wanted;
        true
    }

    /// GetPreferredAllocation for one container, on device IDs of the table's mode.
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

    /// Allocate for every container of one request: every ID known and healthy, checked before any is
    /// allocated, so a refused request leaves nothing half-allocated. Tiles already recorded as allocated are
    /// re-assigned (the kubelet only re-allocates devices it has freed; it never tells the plugin about frees).
    pub fn allocate_containers(
        &mut self,
        containers: &[Vec<String>],
    ) -> Result<Vec<ContainerAllocation>, NodeError> {
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
        for id in containers.iter().flatten() {
            let unit = self.unit_index(id)?;
            if !self.unit_healthy(unit) {
                return Err(NodeError::Unhealthy { id: id.clone() });
            }
        }
        for tiles in &per_container {
            self.mark_allocated(tiles, Owner::default());
        }
        Ok(per_container
            .into_iter()
            .map(|tiles| ContainerAllocation {
                env: container_env(&self.topology, &tiles),
                tiles,
            })
            .collect())
    }

    /// `count` free healthy devices, picked with the packing of GetPreferredAllocation (not yet allocated).
    pub fn pick_free(&self, count: u32) -> Result<Vec<String>, NodeError> {
        let units = self.unit_topology();
        let free: Vec<TileIndex> = (0..units.total_tiles())
            .filter(|&u| self.unit_healthy(u) && self.unit_free(u))
            .collect();
        let picked = pack(&units, &free, &[], count as usize)?;
        Ok(picked.into_iter().map(|u| self.unit_id(u)).collect())
    }

    /// Local mode: picks `count` free healthy devices with the packing of GetPreferredAllocation and allocates them
    /// as one container. Returns the device IDs and the allocation.
    pub fn allocate_free(
        &mut self,
        count: u32,
    ) -> Result<(Vec<String>, ContainerAllocation), NodeError> {
        let ids = self.pick_free(count)?;
        let mut allocations = self.allocate_containers(std::slice::from_ref(&ids))?;
        let allocation = allocations.pop().ok_or(NodeError::EmptyRequest)?;
        Ok((ids, allocation))
    }

    /// Frees the tiles of these device IDs (unknown IDs are ignored); true when any was allocated.
    pub fn release(&mut self, device_ids: &[String]) -> bool {
        let mut changed = false;
        for id in device_ids {
            if let Ok(tiles) = self.topology.parse_device(self.mode, id) {
                for t in tiles {
                    changed |= self.allocated[t as usize].take().is_some();
                }
            }
        }
        changed
    }

    /// Records who uses a set of devices (unknown IDs are ignored); true when any tile was recorded.
    pub fn set_owner(&mut self, device_ids: &[String], owner: Owner) -> bool {
        let mut tiles = Vec::new();
        for id in device_ids {
            if let Ok(t) = self.topology.parse_device(self.mode, id) {
                tiles.extend(t);
            }
        }
        self.mark_allocated(&tiles, owner)
    }

    /// Makes the allocations match the kubelet's pod resources: tiles a pod holds are allocated to it; tiles no
    /// pod holds are freed, unless allocated less than `grace` ago (the kubelet records an allocation only after
    /// Allocate returns). Returns whether anything changed.
    pub fn reconcile_with_pods(&mut self, pods: &[PodDevices], grace: Duration) -> bool {
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
        let base = self.next_group;
        let mut changed = false;
        for (t, holder) in held.iter().enumerate() {
            match (holder, &self.allocated[t]) {
                (Some((index, pod)), current) => {
                    let owner = Owner {
                        pod: Some(pod.pod.clone()),
                        rank: pod.rank,
                    };
                    if current.as_ref().map(|a| &a.owner) != Some(&owner) {
                        self.allocated[t] = Some(Allocation {
                            group: base + *index as u64,
                            owner,
                            since: Instant::now(),
                        });
                        changed = true;
                    }
                }
                (None, Some(a)) if a.since.elapsed() >= grace => {
                    self.allocated[t] = None;
                    changed = true;
                }
                (None, _) => {}
            }
        }
        self.next_group = base + pods.len() as u64;
        changed
    }

    /// The sntilestat view of the table, for the node named `node`.
    pub fn status(&self, node: Option<String>) -> NodeStatus {
        let tiles: Vec<TileStatus> = (0..self.topology.total_tiles())
            .map(|t| {
                let allocation = self.allocated[t as usize].as_ref();
                TileStatus {
                    id: self.topology.tile_id(t),
                    rdu: self.topology.rdu_of(t),
                    tile: self.topology.tile_of(t),
                    state: if self.unhealthy[t as usize] {
                        TileState::Unhealthy
                    } else {
                        TileState::Healthy
                    },
                    reason: self.reasons[t as usize].clone(),
                    allocated: allocation.is_some(),
                    pod: allocation.and_then(|a| a.owner.pod.clone()),
                    rank: allocation.and_then(|a| a.owner.rank),
                }
            })
            .collect();
        let (healthy, allocated) = self.counts();
        NodeStatus {
            node,
            resource_name: self.mode.resource_name().to_string(),
            rdus_per_node: self.topology.rdus(),
            tiles_per_rdu: self.topology.tiles_per_rdu(),
            tiles_total: self.topology.total_tiles(),
            tiles_healthy: healthy as u32,
            tiles_allocated: allocated as u32,
            tiles,
        }
    }

    /// A cheap copy of the allocations that becomes the saved-allocations file when called (off the caller's
    /// thread).
    pub fn snapshot_later(&self) -> impl FnOnce() -> SavedAllocations + Send + 'static {
        let topology = self.topology;
        let allocated = self.allocated.clone();
        move || snapshot(&topology, &allocated)
    }

    /// Marks `tiles` allocated to `owner` as one group; true unless `tiles` is empty.
    fn mark_allocated(&mut self, tiles: &[TileIndex], owner: Owner) -> bool {
        if tiles.is_empty() {
            return false;
        }
        let group = self.next_group;
        self.next_group += 1;
        for &t in tiles {
            self.allocated[t as usize] = Some(Allocation {
                group,
                owner: owner.clone(),
                since: Instant::now(),
            });
        }
        true
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

    fn unit_healthy(&self, unit: TileIndex) -> bool {
        self.unit_tiles(unit).all(|t| !self.unhealthy[t as usize])
    }

    fn unit_free(&self, unit: TileIndex) -> bool {
        self.unit_tiles(unit)
            .all(|t| self.allocated[t as usize].is_none())
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

#[cfg(test)]
mod tests;
