//! The table alone: every allocation decision (which devices, refused why, what env), and what each operation
//! changes and reports changed, which the node turns into a device-list update, gauges and a saved-allocations
//! write (the node's tests check those).

use super::*;
use crate::packing::PackingError;
use std::collections::BTreeMap;

fn table(r: u32, t: u32, mode: ResourceMode) -> TileTable {
    TileTable::new(Topology::new(r, t).unwrap(), mode)
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `tiles` unhealthy, with no reason.
fn faults(tiles: &[TileIndex]) -> BTreeMap<TileIndex, Option<String>> {
    tiles.iter().map(|&t| (t, None)).collect()
}

fn allocate(t: &mut TileTable, device_ids: &[String]) -> Result<ContainerAllocation, NodeError> {
    let mut allocations = t.allocate_containers(&[device_ids.to_vec()])?;
    Ok(allocations.remove(0))
}

#[test]
fn allocate_returns_the_mask_and_marks_tiles() {
    let mut t = table(8, 4, ResourceMode::Tile);
    let all: Vec<String> = (24..32).map(|i| t.topology().tile_id(i)).collect();
    let a = allocate(&mut t, &all).unwrap();
    assert_eq!(a.env["SF_RNT_TILE_AFFINITY"], "0xff000000");
    assert_eq!(a.tiles, (24..32).collect::<Vec<_>>());
    assert_eq!(t.status(None).tiles_allocated, 8);
}

#[test]
fn allocate_refuses_unknown_and_unhealthy_devices_by_name() {
    let mut t = table(8, 4, ResourceMode::Tile);
    let err = allocate(&mut t, &ids(&["rdu0-tile0", "rdu9-tile0"])).unwrap_err();
    assert!(matches!(err, NodeError::UnknownDevice(_)));
    assert!(err.to_string().contains("rdu9-tile0"));
    t.set_health(&faults(&[1]));
    let err = allocate(&mut t, &ids(&["rdu0-tile0", "rdu0-tile1"])).unwrap_err();
    assert!(matches!(err, NodeError::Unhealthy { ref id } if id == "rdu0-tile1"));
    assert_eq!(t.counts().1, 0, "a refused request allocates nothing");
    assert!(matches!(
        t.allocate_containers(&[vec![]]),
        Err(NodeError::EmptyRequest)
    ));
    // One bad container refuses the whole request.
    let err = t
        .allocate_containers(&[ids(&["rdu2-tile0"]), ids(&["rdu0-tile1"])])
        .unwrap_err();
    assert!(matches!(err, NodeError::Unhealthy { .. }));
    assert_eq!(t.counts().1, 0);
    let both = t
        .allocate_containers(&[ids(&["rdu2-tile0"]), ids(&["rdu3-tile0", "rdu3-tile1"])])
        .unwrap();
    assert_eq!(both[0].env["SF_RNT_TILE_AFFINITY"], "0x100");
    assert_eq!(both[1].env["SF_RNT_TILE_AFFINITY"], "0x3000");
}

#[test]
fn rdu_mode_advertises_rdus_and_an_unhealthy_tile_fails_its_rdu() {
    let mut t = table(4, 8, ResourceMode::Rdu);
    assert_eq!(t.device_list().len(), 4);
    assert!(t.set_health(&faults(&[9])));
    assert!(!t.device_list()[1].healthy);
    assert!(t.device_list()[0].healthy);
    let a = allocate(&mut t, &ids(&["rdu3"])).unwrap();
    assert_eq!(a.env["SF_RNT_TILE_AFFINITY"], "0xff000000");
    assert!(allocate(&mut t, &ids(&["rdu0-tile0"])).is_err());
    assert_eq!(
        t.preferred(&ids(&["rdu0", "rdu2", "rdu3"]), &ids(&["rdu3"]), 2)
            .unwrap(),
        ids(&["rdu0", "rdu3"])
    );
}

#[test]
fn allocate_free_packs_and_release_frees() {
    let mut t = table(8, 4, ResourceMode::Tile);
    let (first, a) = t.allocate_free(2).unwrap();
    assert_eq!(first, ids(&["rdu0-tile0", "rdu0-tile1"]));
    assert_eq!(a.env["SF_RNT_TILE_AFFINITY"], "0x3");
    let (second, _) = t.allocate_free(4).unwrap();
    assert_eq!(
        second,
        ids(&["rdu1-tile0", "rdu1-tile1", "rdu1-tile2", "rdu1-tile3"])
    );
    let (third, _) = t.allocate_free(2).unwrap();
    assert_eq!(third, ids(&["rdu0-tile2", "rdu0-tile3"]));
    assert!(t.release(&first));
    assert_eq!(t.counts().1, 6);
    assert!(matches!(
        t.allocate_free(100),
        Err(NodeError::Packing(PackingError::NotEnough { .. }))
    ));
    assert_eq!(t.counts().1, 6, "a refused pick allocates nothing");
}

#[test]
fn preferred_rejects_bad_sizes_and_ids() {
    let t = table(8, 4, ResourceMode::Tile);
    assert!(matches!(
        t.preferred(&ids(&["rdu0-tile0"]), &[], 0),
        Err(NodeError::BadSize(0))
    ));
    assert!(t.preferred(&ids(&["nope"]), &[], 1).is_err());
}

#[test]
fn reconciling_with_pods_sets_owners_and_frees_ended_pods() {
    let mut t = table(8, 4, ResourceMode::Tile);
    allocate(&mut t, &ids(&["rdu0-tile0", "rdu0-tile1"])).unwrap();
    allocate(&mut t, &ids(&["rdu1-tile0"])).unwrap();
    let pods = vec![PodDevices {
        pod: "ns/job-worker-4".into(),
        rank: Some(4),
        device_ids: ids(&["rdu0-tile0", "rdu0-tile1"]),
    }];
    // Within the grace period the tile no pod lists yet is kept.
    assert!(t.reconcile_with_pods(&pods, Duration::from_secs(3600)));
    let status = t.status(None);
    assert_eq!(status.tiles_allocated, 3);
    assert_eq!(status.tiles[0].pod.as_deref(), Some("ns/job-worker-4"));
    assert_eq!(status.tiles[1].rank, Some(4));
    assert!(
        !t.reconcile_with_pods(&pods, Duration::from_secs(3600)),
        "no change"
    );
    // Past the grace period it is freed: its pod is gone.
    assert!(t.reconcile_with_pods(&pods, Duration::ZERO));
    assert_eq!(t.counts().1, 2);
    // The pod ends: everything is free.
    assert!(t.reconcile_with_pods(&[], Duration::ZERO));
    assert_eq!(t.counts().1, 0);
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
