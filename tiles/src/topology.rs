//! The simulated node's shape (RDUs × tiles), the resource mode, and device IDs (`rdu<R>-tile<T>`, `rdu<R>`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Most tiles a simulated node may have (keeps masks and device lists bounded).
pub const MAX_TILES: u32 = 65_536;

/// Errors in a topology or a device ID.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    #[error("rdusPerNode must be at least 1 (got {0}); set --rdus-per-node to the number of RDUs")]
    NoRdus(u32),
    #[error(
        "tilesPerRdu must be at least 1 (got {0}); set --tiles-per-rdu (4 as on an SN10-8, 8 as on an SN30)"
    )]
    NoTiles(u32),
    #[error(
        "rdusPerNode × tilesPerRdu = {rdus} × {tiles} exceeds {MAX_TILES} tiles; use a smaller topology"
    )]
    TooManyTiles { rdus: u32, tiles: u32 },
    #[error("unknown device `{id}`: expected {expected} on a node of {rdus} RDUs × {tiles} tiles")]
    UnknownDevice {
        id: String,
        expected: &'static str,
        rdus: u32,
        tiles: u32,
    },
    #[error("unknown resource mode `{0}`: expected `tile` or `rdu`")]
    UnknownMode(String),
}

/// What the plugin advertises: one device per tile, or one per whole RDU. Never both for the same hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ResourceMode {
    #[default]
    Tile,
    Rdu,
}

impl ResourceMode {
    /// The extended resource name the kubelet schedules.
    pub fn resource_name(self) -> &'static str {
        match self {
            ResourceMode::Tile => "rdu.dev/tile",
            ResourceMode::Rdu => "rdu.dev/rdu",
        }
    }

    /// The plugin's socket file name in the device plugin directory.
    pub fn socket_name(self) -> &'static str {
        match self {
            ResourceMode::Tile => "rdu-tile.sock",
            ResourceMode::Rdu => "rdu-rdu.sock",
        }
    }
}

impl FromStr for ResourceMode {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tile" => Ok(ResourceMode::Tile),
            "rdu" => Ok(ResourceMode::Rdu),
            other => Err(TopologyError::UnknownMode(other.to_string())),
        }
    }
}

impl fmt::Display for ResourceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceMode::Tile => "tile",
            ResourceMode::Rdu => "rdu",
        })
    }
}

/// A tile by its global index `R * tilesPerRdu + T` (also its bit in `SF_RNT_TILE_AFFINITY`).
pub type TileIndex = u32;

/// A node of `rdus` RDUs with `tiles_per_rdu` tiles each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    rdus: u32,
    tiles_per_rdu: u32,
}

impl Topology {
    pub fn new(rdus: u32, tiles_per_rdu: u32) -> Result<Topology, TopologyError> {
        if rdus == 0 {
            return Err(TopologyError::NoRdus(rdus));
        }
        if tiles_per_rdu == 0 {
            return Err(TopologyError::NoTiles(tiles_per_rdu));
        }
        if u64::from(rdus) * u64::from(tiles_per_rdu) > u64::from(MAX_TILES) {
            return Err(TopologyError::TooManyTiles {
                rdus,
                tiles: tiles_per_rdu,
            });
        }
        Ok(Topology {
            rdus,
            tiles_per_rdu,
        })
    }

    pub fn rdus(&self) -> u32 {
        self.rdus
    }

    pub fn tiles_per_rdu(&self) -> u32 {
        self.tiles_per_rdu
    }

    pub fn total_tiles(&self) -> u32 {
        self.rdus * self.tiles_per_rdu
    }

    pub fn tile_index(&self, rdu: u32, tile: u32) -> TileIndex {
        rdu * self.tiles_per_rdu + tile
    }

    pub fn rdu_of(&self, index: TileIndex) -> u32 {
        index / self.tiles_per_rdu
    }

    pub fn tile_of(&self, index: TileIndex) -> u32 {
        index % self.tiles_per_rdu
    }

    /// The global indexes of every tile of one RDU.
    pub fn tiles_of_rdu(&self, rdu: u32) -> std::ops::Range<TileIndex> {
        rdu * self.tiles_per_rdu..(rdu + 1) * self.tiles_per_rdu
    }

    /// `rdu<R>-tile<T>`.
    pub fn tile_id(&self, index: TileIndex) -> String {
        format!("rdu{}-tile{}", self.rdu_of(index), self.tile_of(index))
    }

    /// `rdu<R>`.
    pub fn rdu_id(rdu: u32) -> String {
        format!("rdu{rdu}")
    }

    /// The device IDs advertised in `mode`, in order.
    pub fn device_ids(&self, mode: ResourceMode) -> Vec<String> {
        match mode {
            ResourceMode::Tile => (0..self.total_tiles()).map(|i| self.tile_id(i)).collect(),
            ResourceMode::Rdu => (0..self.rdus).map(Topology::rdu_id).collect(),
        }
    }

    /// Parses `rdu<R>-tile<T>` or `rdu<R>` into the tiles it names (one tile, or every tile of the RDU).
    pub fn parse_any(&self, id: &str) -> Result<Vec<TileIndex>, TopologyError> {
        let unknown = || TopologyError::UnknownDevice {
            id: id.to_string(),
            expected: "`rdu<R>-tile<T>` or `rdu<R>`",
            rdus: self.rdus,
            tiles: self.tiles_per_rdu,
        };
        let rest = id.strip_prefix("rdu").ok_or_else(unknown)?;
        let (rdu_text, tile_text) = match rest.split_once("-tile") {
            Some((r, t)) => (r, Some(t)),
            None => (rest, None),
        };
        let rdu = parse_number(rdu_text).ok_or_else(unknown)?;
        if rdu >= self.rdus {
            return Err(unknown());
        }
        match tile_text {
            None => Ok(self.tiles_of_rdu(rdu).collect()),
            Some(t) => {
                let tile = parse_number(t).ok_or_else(unknown)?;
                if tile >= self.tiles_per_rdu {
                    return Err(unknown());
                }
                Ok(vec![self.tile_index(rdu, tile)])
            }
        }
    }

    /// Parses a device ID of `mode` into the tiles it stands for.
    pub fn parse_device(
        &self,
        mode: ResourceMode,
        id: &str,
    ) -> Result<Vec<TileIndex>, TopologyError> {
        let is_tile = id.contains("-tile");
        let matches_mode = match mode {
            ResourceMode::Tile => is_tile,
            ResourceMode::Rdu => !is_tile,
        };
        if !matches_mode {
            return Err(TopologyError::UnknownDevice {
                id: id.to_string(),
                expected: match mode {
                    ResourceMode::Tile => "`rdu<R>-tile<T>` (resource mode tile)",
                    ResourceMode::Rdu => "`rdu<R>` (resource mode rdu)",
                },
                rdus: self.rdus,
                tiles: self.tiles_per_rdu,
            });
        }
        self.parse_any(id)
    }
}

/// A decimal number without sign or leading zeros (so each device has exactly one ID).
fn parse_number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_empty_and_huge_topologies() {
        assert_eq!(Topology::new(0, 4), Err(TopologyError::NoRdus(0)));
        assert_eq!(Topology::new(8, 0), Err(TopologyError::NoTiles(0)));
        assert!(matches!(
            Topology::new(100_000, 100_000),
            Err(TopologyError::TooManyTiles { .. })
        ));
        assert_eq!(Topology::new(32, 32).map(|t| t.total_tiles()), Ok(1024));
    }

    #[test]
    fn device_ids_round_trip() {
        let topo = Topology::new(8, 4).unwrap();
        let ids = topo.device_ids(ResourceMode::Tile);
        assert_eq!(ids.len(), 32);
        assert_eq!(ids[0], "rdu0-tile0");
        assert_eq!(ids[31], "rdu7-tile3");
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                topo.parse_device(ResourceMode::Tile, id),
                Ok(vec![i as u32])
            );
        }
        assert_eq!(
            topo.parse_device(ResourceMode::Rdu, "rdu2"),
            Ok(vec![8, 9, 10, 11])
        );
    }

    #[test]
    fn rejects_bad_ids_naming_them() {
        let topo = Topology::new(8, 4).unwrap();
        for bad in [
            "rdu8-tile0",
            "rdu0-tile4",
            "gpu0",
            "rdu-1",
            "rdu01-tile0",
            "rdu0-tile",
            "",
        ] {
            let err = topo.parse_any(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
        assert!(topo.parse_device(ResourceMode::Tile, "rdu1").is_err());
        assert!(topo.parse_device(ResourceMode::Rdu, "rdu1-tile0").is_err());
    }

    #[test]
    fn resource_modes_parse() {
        assert_eq!("tile".parse(), Ok(ResourceMode::Tile));
        assert_eq!("rdu".parse(), Ok(ResourceMode::Rdu));
        assert!("gpu".parse::<ResourceMode>().is_err());
        assert_eq!(ResourceMode::Rdu.resource_name(), "rdu.dev/rdu");
    }
}
