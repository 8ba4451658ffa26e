//! Topology-aware choice of tiles: as few RDUs as possible, the tightest fitting RDU (lowest index on ties),
//! contiguous tiles within an RDU, always keeping the must-include tiles. Pure code, used by
//! `GetPreferredAllocation` and by local mode.

use crate::topology::{TileIndex, Topology};

/// Why a set of tiles cannot be chosen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PackingError {
    #[error("allocation size must be at least 1 (got {0})")]
    ZeroSize(i64),
    #[error("{must} must-include devices do not fit in an allocation of {size}")]
    TooManyMustInclude { must: usize, size: usize },
    #[error("{size} tiles requested but only {available} are available")]
    NotEnough { size: usize, available: usize },
}

/// Chooses `size` tiles from `available` (plus `must_include`, which are always part of the answer).
/// Returns the tiles in index order.
///
/// The rule, in order: tiles next to the must-include tiles on their RDUs; then, while one RDU cannot hold
/// the rest, the RDU with the most free tiles (so the fewest RDUs are used); then the RDU that holds the rest
/// most tightly (this keeps whole RDUs free for larger requests), on ties one with a contiguous run, then the
/// lowest index; within it the lowest contiguous run of tiles, else the lowest free tiles.
pub fn pack(
    topology: &Topology,
    available: &[TileIndex],
    must_include: &[TileIndex],
    size: usize,
) -> Result<Vec<TileIndex>, PackingError> {
    if size == 0 {
        return Err(PackingError::ZeroSize(0));
    }
    let total = topology.total_tiles() as usize;
    let mut chosen = vec![false; total];
    let mut chosen_count = 0usize;
    for &tile in must_include {
        if (tile as usize) < total && !chosen[tile as usize] {
            chosen[tile as usize] = true;
            chosen_count += 1;
        }
    }
    if chosen_count > size {
        return Err(PackingError::TooManyMustInclude {
            must: chosen_count,
            size,
        });
    }
    let mut free = vec![false; total];
    let mut free_count = 0usize;
    for &tile in available {
        let i = tile as usize;
        if i < total && !chosen[i] && !free[i] {
            free[i] = true;
            free_count += 1;
        }
    }
    if chosen_count + free_count < size {
        return Err(PackingError::NotEnough {
            size,
            available: chosen_count + free_count,
        });
    }
    let mut remaining = size - chosen_count;
    let per_rdu = topology.tiles_per_rdu() as usize;
    let rdus = topology.rdus() as usize;
    let mut rdu_free: Vec<Vec<TileIndex>> = (0..rdus)
        .map(|r| {
            topology
                .tiles_of_rdu(r as u32)
                .filter(|&t| free[t as usize])
                .collect()
        })
        .collect();
    let mut rdu_used = vec![false; rdus];

    // 1. Fill the RDUs the must-include tiles are on, nearest tiles first.
    for rdu in 0..rdus {
        if remaining == 0 {
            break;
        }
        let anchors: Vec<usize> = (rdu * per_rdu..(rdu + 1) * per_rdu)
            .filter(|&t| chosen[t])
            .collect();
        if anchors.is_empty() {
            continue;
        }
        rdu_used[rdu] = true;
        let mut candidates = std::mem::take(&mut rdu_free[rdu]);
        candidates.sort_by_key(|&t| {
            let distance = anchors
                .iter()
                .map(|&a| (a as i64 - t as i64).unsigned_abs())
                .min()
                .unwrap_or(u64::MAX);
            (distance, t)
        });
        for t in candidates.into_iter().take(remaining) {
            chosen[t as usize] = true;
            remaining -= 1;
        }
    }

    // 2. Whole RDUs with the most free tiles while no single RDU can hold the rest; then the tightest fit.
    while remaining > 0 {
        let fit = (0..rdus)
            .filter(|&r| !rdu_used[r] && rdu_free[r].len() >= remaining)
            .min_by_key(|&r| {
                let no_run = lowest_run(&rdu_free[r], remaining).is_none();
                (rdu_free[r].len(), no_run, r)
            });
        if let Some(rdu) = fit {
            let tiles = &rdu_free[rdu];
            let picked: Vec<TileIndex> = match lowest_run(tiles, remaining) {
                Some(start) => tiles[start..start + remaining].to_vec(),
                None => tiles[..remaining].to_vec(),
            };
            for t in picked {
                chosen[t as usize] = true;
            }
            remaining = 0;
        } else {
            let largest = (0..rdus)
                .filter(|&r| !rdu_used[r] && !rdu_free[r].is_empty())
                .max_by_key(|&r| (rdu_free[r].len(), std::cmp::Reverse(r)));
            let Some(rdu) = largest else {
                // Unreachable given the count check above; reported rather than panicking.
                return Err(PackingError::NotEnough {
                    size,
                    available: size - remaining,
                });
            };
            rdu_used[rdu] = true;
            for &t in &rdu_free[rdu] {
                chosen[t as usize] = true;
                remaining -= 1;
            }
        }
    }
    Ok((0..total as u32).filter(|&t| chosen[t as usize]).collect())
}

/// Start (in `tiles`) of the lowest run of `len` consecutive tile indexes, if any.
fn lowest_run(tiles: &[TileIndex], len: usize) -> Option<usize> {
    if len == 0 || tiles.len() < len {
        return None;
    }
    (0..=tiles.len() - len).find(|&start| tiles[start + len - 1] - tiles[start] == (len - 1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(r: u32, t: u32) -> Topology {
        Topology::new(r, t).unwrap()
    }

    fn all(topology: &Topology) -> Vec<TileIndex> {
        (0..topology.total_tiles()).collect()
    }

    fn without(all: Vec<TileIndex>, taken: &[TileIndex]) -> Vec<TileIndex> {
        all.into_iter().filter(|t| !taken.contains(t)).collect()
    }

    #[test]
    fn empty_node_packs_from_the_lowest_rdu() {
        let t = topo(8, 4);
        assert_eq!(pack(&t, &all(&t), &[], 2), Ok(vec![0, 1]));
        assert_eq!(pack(&t, &all(&t), &[], 4), Ok(vec![0, 1, 2, 3]));
        assert_eq!(pack(&t, &all(&t), &[], 8), Ok((0..8).collect()));
    }

    #[test]
    fn a_small_request_fills_a_partly_used_rdu_before_breaking_a_whole_one() {
        let t = topo(8, 4);
        // RDU 0 has tiles 0,1 taken: a 2-tile request goes to tiles 2,3, not to RDU 1.
        let avail = without(all(&t), &[0, 1]);
        assert_eq!(pack(&t, &avail, &[], 2), Ok(vec![2, 3]));
        // A 4-tile request cannot fit RDU 0 any more, and takes the whole of RDU 1.
        assert_eq!(pack(&t, &avail, &[], 4), Ok(vec![4, 5, 6, 7]));
    }

    #[test]
    fn fragmented_nodes_use_the_fewest_rdus() {
        let t = topo(4, 4);
        // Free: RDU0 {1,3}, RDU1 {4,5,6}, RDU2 {8}, RDU3 {12,13,14,15}.
        let avail = vec![1, 3, 4, 5, 6, 8, 12, 13, 14, 15];
        // 3 tiles fit in RDU1 (exactly, contiguous) rather than breaking the whole RDU3.
        assert_eq!(pack(&t, &avail, &[], 3), Ok(vec![4, 5, 6]));
        // 2 tiles: RDU0 has exactly 2 (not contiguous): the tightest fit wins over contiguity.
        assert_eq!(pack(&t, &avail, &[], 2), Ok(vec![1, 3]));
        // 1 tile: the tightest fit is RDU2.
        assert_eq!(pack(&t, &avail, &[], 1), Ok(vec![8]));
        // Among equally tight RDUs, one with a contiguous run wins.
        assert_eq!(pack(&t, &[0, 2, 5, 6], &[], 2), Ok(vec![5, 6]));
        // 6 tiles need two RDUs: all of RDU3, then the tightest fit for 2 more.
        assert_eq!(pack(&t, &avail, &[], 6), Ok(vec![1, 3, 12, 13, 14, 15]));
        // Everything.
        assert_eq!(pack(&t, &avail, &[], 10), Ok(avail.clone()));
    }

    #[test]
    fn must_include_is_kept_and_filled_around() {
        let t = topo(8, 4);
        let got = pack(&t, &all(&t), &[10], 3).unwrap();
        assert!(got.contains(&10));
        assert_eq!(got, vec![9, 10, 11]);
        // Must-include tiles that are not in the available list are still kept.
        assert_eq!(pack(&t, &[0, 1], &[20], 2), Ok(vec![0, 20]));
    }

    #[test]
    fn refuses_impossible_requests() {
        let t = topo(2, 2);
        assert_eq!(
            pack(&t, &[0, 1], &[], 3),
            Err(PackingError::NotEnough {
                size: 3,
                available: 2
            })
        );
        assert_eq!(
            pack(&t, &[0, 1, 2], &[0, 1, 2], 2),
            Err(PackingError::TooManyMustInclude { must: 3, size: 2 })
        );
        assert_eq!(pack(&t, &[0], &[], 0), Err(PackingError::ZeroSize(0)));
    }

    #[test]
    fn rdu_mode_packs_like_a_node_of_single_tile_rdus() {
        let t = topo(8, 1);
        assert_eq!(pack(&t, &[2, 3, 5, 6, 7], &[], 2), Ok(vec![2, 3]));
    }
}
