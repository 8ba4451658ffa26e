//! The table alone: what each operation changes and reports changed, which the node turns into a device-list
//! update, gauges and a saved-allocations write. (The node's tests cover the same operations through it.)

use super::*;
use std::collections::BTreeMap;

fn table(r: u32, t: u32, mode: ResourceMode) -> TileTable {
    TileTable::new(Topology::new(r, t).unwrap(), mode)
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn health_changes_are_reported_only_when_the_unhealthy_set_changes() {
    let mut t = table(2, 2, ResourceMode::Tile);
    let hung = BTreeMap::from([(1, Some("hung".to_string()))]);
    assert!(t.set_health(&hung));
    assert_eq!((t.counts(), t.device_list()[1].healthy), ((3, 0), false));
    let failed = BTreeMap::from([(1, Some("failed".to_string()))]);
    assert!(!t.set_health(&failed), "a new reason alone is no change");
    assert_eq!(t.status(None).tiles[1].reason.as_deref(), Some("failed"));
    assert!(t.set_health(&BTreeMap::new()));
    assert_eq!(t.counts(), (4, 0));
}

#[test]
fn writes_report_whether_the_allocations_changed() {
    let mut t = table(8, 4, ResourceMode::Tile);
    let picked = t.pick_free(2).unwrap();
    assert_eq!(picked, ids(&["rdu0-tile0", "rdu0-tile1"]));
    assert_eq!(t.counts().1, 0, "picking allocates nothing");
    let allocated = t
        .allocate_containers(std::slice::from_ref(&picked))
        .unwrap();
    assert_eq!(allocated[0].env["SF_RNT_TILE_AFFINITY"], "0x3");
    assert_eq!(t.counts().1, 2);
    assert!(
        !t.release(&ids(&["rdu5-tile0", "nope"])),
        "nothing of these was allocated"
    );
    assert!(t.release(&picked));
    assert_eq!(t.counts().1, 0);
    let owner = Owner {
        pod: Some("ns/j-worker-1".into()),
        rank: Some(1),
    };
    assert!(
        !t.set_owner(&ids(&["nope"]), owner.clone()),
        "no known tile"
    );
    assert!(t.set_owner(&ids(&["rdu3-tile2"]), owner));
    assert_eq!(t.status(Some("n".into())).tiles[14].rank, Some(1));
}

#[test]
fn a_snapshot_restores_into_a_table_of_the_same_topology_only() {
    let mut t = table(8, 4, ResourceMode::Tile);
    t.allocate_containers(&[ids(&["rdu2-tile0", "rdu2-tile1"])])
        .unwrap();
    t.set_owner(
        &ids(&["rdu5-tile3"]),
        Owner {
            pod: Some("ns/j-worker-2".into()),
            rank: Some(2),
        },
    );
    let saved = t.snapshot_later()();
    assert_eq!(saved.allocations.len(), 2);
    let back = TileTable::restored(t.topology(), ResourceMode::Tile, &saved);
    assert_eq!(back.status(None), t.status(None));
    let other = TileTable::restored(Topology::new(4, 8).unwrap(), ResourceMode::Tile, &saved);
    assert_eq!(other.counts().1, 0, "another shape ignores the file");
}
