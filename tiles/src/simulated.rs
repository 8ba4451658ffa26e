//! Local mode's simulated node: the device plugin's own allocator handing out tiles without a kubelet.

use crate::node::{NodeError, TileNode};
pub use crate::tilestat::NodeStatus;
pub use crate::topology::TopologyError;
use crate::topology::{ResourceMode, Topology};
use std::collections::BTreeMap;

/// Why local mode could not get tiles.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error("a rank needs at least 1 tile (tilesPerWorker is 0)")]
    ZeroTiles,
    #[error(
        "{requested} tiles requested but only {free} of the simulated node's {total} tiles are free and healthy; \
         lower tilesPerWorker or workers"
    )]
    NotEnough {
        requested: u32,
        free: u32,
        total: u32,
    },
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// What Allocate would give the container: its device IDs and env
/// (`SF_RNT_TILE_AFFINITY`, `RDU_VISIBLE_TILES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAllocation {
    pub device_ids: Vec<String>,
    pub env: BTreeMap<String, String>,
}

/// A simulated node of `rdus_per_node` RDUs × `tiles_per_rdu` tiles, all healthy, in tile mode.
pub struct SimulatedNode {
    node: TileNode,
}

impl SimulatedNode {
    pub fn new(rdus_per_node: u32, tiles_per_rdu: u32) -> Result<SimulatedNode, TopologyError> {
        let topology = Topology::new(rdus_per_node, tiles_per_rdu)?;
        Ok(SimulatedNode {
            node: TileNode::in_memory(topology, ResourceMode::Tile, None),
        })
    }

    /// Picks `tiles` free healthy tiles (the same packing as GetPreferredAllocation) and marks them allocated,
    /// returning what Allocate would give the container.
    pub fn allocate(&mut self, tiles: u32) -> Result<LocalAllocation, AllocationError> {
        if tiles == 0 {
            return Err(AllocationError::ZeroTiles);
        }
        let status = self.node.status();
        let free = status
            .tiles
            .iter()
            .filter(|t| !t.allocated && t.state == crate::tilestat::TileState::Healthy)
            .count() as u32;
        if free < tiles {
            return Err(AllocationError::NotEnough {
                requested: tiles,
                free,
                total: status.tiles_total,
            });
        }
        let (device_ids, allocation) = self.node.allocate_free(tiles)?;
        Ok(LocalAllocation {
            device_ids,
            env: allocation.env,
        })
    }

    /// Frees the tiles of an earlier allocation (unknown IDs are ignored).
    pub fn release(&mut self, device_ids: &[String]) {
        self.node.release(device_ids);
    }

    /// The sntilestat view of the simulated node.
    pub fn status(&self) -> NodeStatus {
        self.node.status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_packed_tiles_and_masks() {
        let mut node = SimulatedNode::new(8, 4).unwrap();
        let a = node.allocate(4).unwrap();
        assert_eq!(
            a.device_ids,
            vec!["rdu0-tile0", "rdu0-tile1", "rdu0-tile2", "rdu0-tile3"]
        );
        assert_eq!(a.env["SF_RNT_TILE_AFFINITY"], "0xf");
        assert_eq!(
            a.env["RDU_VISIBLE_TILES"],
            "rdu0-tile0,rdu0-tile1,rdu0-tile2,rdu0-tile3"
        );
        let b = node.allocate(8).unwrap();
        assert_eq!(b.env["SF_RNT_TILE_AFFINITY"], "0xff0");
        node.release(&a.device_ids);
        let c = node.allocate(2).unwrap();
        assert_eq!(c.env["SF_RNT_TILE_AFFINITY"], "0x3");
    }

    #[test]
    fn refuses_zero_and_too_many_tiles() {
        assert!(SimulatedNode::new(0, 4).is_err());
        let mut node = SimulatedNode::new(1, 4).unwrap();
        assert!(matches!(node.allocate(0), Err(AllocationError::ZeroTiles)));
        node.allocate(3).unwrap();
        let err = node.allocate(2).unwrap_err();
        assert!(matches!(
            err,
            AllocationError::NotEnough {
                requested: 2,
                free: 1,
                total: 4
            }
        ));
    }
}
