//! The env a container gets for its tiles: `SF_RNT_TILE_AFFINITY` (bit `R*tilesPerRdu + T`, 0x-hex) and `RDU_VISIBLE_TILES`.

use crate::topology::{TileIndex, Topology};
use std::collections::BTreeMap;

/// Env name of the tile-affinity mask, as in the SambaFlow runtime (defined with the job model's other names).
pub use rdu_crds::consts::env::TILE_AFFINITY as TILE_AFFINITY_ENV;
/// Env name of the comma-separated tile IDs a container may use.
pub use rdu_crds::consts::env::VISIBLE_TILES as VISIBLE_TILES_ENV;

/// The mask with bit `index` set for every tile, as `0x`-prefixed lower-case hex without leading zeros
/// (`0x0` for no tile). As wide as the topology needs: 32 bits for 8×4, more for bigger nodes.
pub fn affinity_mask(topology: &Topology, tiles: &[TileIndex]) -> String {
    let nibbles = (topology.total_tiles() as usize).div_ceil(4).max(1);
    let mut digits = vec![0u8; nibbles];
    for &tile in tiles {
        if tile < topology.total_tiles() {
            digits[(tile / 4) as usize] |= 1 << (tile % 4);
        }
    }
    let top = digits.iter().rposition(|&d| d != 0).unwrap_or(0);
    let mut text = String::with_capacity(top + 3);
    text.push_str("0x");
    for &digit in digits[..=top].iter().rev() {
        text.push(char::from_digit(u32::from(digit), 16).unwrap_or('0'));
    }
    text
}

/// `rdu0-tile0,rdu0-tile1,...` in tile order.
pub fn visible_tiles(topology: &Topology, tiles: &[TileIndex]) -> String {
    let mut sorted = tiles.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted
        .iter()
        .map(|&t| topology.tile_id(t))
        .collect::<Vec<_>>()
        .join(",")
}

/// Both env vars for a set of tiles.
pub fn container_env(topology: &Topology, tiles: &[TileIndex]) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            TILE_AFFINITY_ENV.to_string(),
            affinity_mask(topology, tiles),
        ),
        (
            VISIBLE_TILES_ENV.to_string(),
            visible_tiles(topology, tiles),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rdu_tiles(topo: &Topology, rdus: &[u32]) -> Vec<TileIndex> {
        rdus.iter().flat_map(|&r| topo.tiles_of_rdu(r)).collect()
    }

    #[test]
    fn masks_of_an_8x4_node_match_the_seeds() {
        let topo = Topology::new(8, 4).unwrap();
        assert_eq!(
            affinity_mask(&topo, &rdu_tiles(&topo, &[6, 7])),
            "0xff000000"
        );
        assert_eq!(affinity_mask(&topo, &rdu_tiles(&topo, &[0])), "0xf");
        assert_eq!(affinity_mask(&topo, &rdu_tiles(&topo, &[1])), "0xf0");
        assert_eq!(affinity_mask(&topo, &rdu_tiles(&topo, &[7])), "0xf0000000");
        assert_eq!(affinity_mask(&topo, &[topo.tile_index(3, 2)]), "0x4000");
        assert_eq!(affinity_mask(&topo, &[]), "0x0");
    }

    #[test]
    fn masks_of_a_4x8_node_use_a_byte_per_rdu() {
        let topo = Topology::new(4, 8).unwrap();
        assert_eq!(affinity_mask(&topo, &rdu_tiles(&topo, &[3])), "0xff000000");
        assert_eq!(affinity_mask(&topo, &rdu_tiles(&topo, &[0, 1])), "0xffff");
        assert_eq!(affinity_mask(&topo, &[topo.tile_index(2, 7)]), "0x800000");
    }

    #[test]
    fn masks_grow_past_32_bits() {
        let topo = Topology::new(32, 32).unwrap();
        let last = topo.total_tiles() - 1;
        let mask = affinity_mask(&topo, &[last, 0]);
        assert_eq!(mask.len(), 2 + 256);
        assert!(mask.starts_with("0x8"));
        assert!(mask.ends_with('1'));
    }

    #[test]
    fn visible_tiles_are_sorted_ids() {
        let topo = Topology::new(8, 4).unwrap();
        assert_eq!(visible_tiles(&topo, &[5, 4, 4]), "rdu1-tile0,rdu1-tile1");
        let env = container_env(&topo, &[0]);
        assert_eq!(env[TILE_AFFINITY_ENV], "0x1");
        assert_eq!(env[VISIBLE_TILES_ENV], "rdu0-tile0");
    }
}
