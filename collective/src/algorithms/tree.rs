//! The collectives every rank joins that need no reduction, in about log2(n) links per rank instead of the
//! star's n - 1 at one root (as MPICH and Gloo do): a broadcast down a binomial tree, and the dissemination
//! barrier. Links open at first use, so with these a rank of a large job holds the links its all-reduce
//! algorithm needs plus a few, not one to every peer.

use crate::error::CollectiveError;
use crate::kernels::Apply;
use crate::segments::ChunkGrid;
use crate::transport::Inbox;

use super::{Exchange, PHASE_BARRIER, PHASE_BCAST, Wire, position};

/// Where position `relative` (counted from the root, which is 0) sits in a binomial tree of `n`: its
/// parent (`None` for the root) and its children, the largest subtree first. Every position but the root has
/// one parent, and the edges are n - 1: each position sends to at most log2(n) children.
pub(crate) fn binomial(relative: usize, n: usize) -> (Option<usize>, Vec<usize>) {
    let mut mask = 1;
    let mut parent = None;
    while mask < n {
        if relative & mask != 0 {
            parent = Some(relative - mask);
            break;
        }
        mask <<= 1;
    }
    let mut children = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if relative + mask < n {
            children.push(relative + mask);
        }
        mask >>= 1;
    }
    (parent, children)
}

/// The children of rank `rank` in the binomial tree of ranks `0..n` rooted at `root`, each rank at
/// position `(rank - root) mod n`: the ranks `rank + 2^j` (mod n) below its own lowest set position bit.
/// Aborts travel down this tree (`communicator::abort`).
pub(crate) fn children_of(rank: u32, root: u32, n: u32) -> Vec<u32> {
    let relative = ((rank + n - root) % n) as usize;
    let (_, children) = binomial(relative, n as usize);
    children
        .into_iter()
        .map(|child| (child as u32 + root) % n)
        .collect()
}

/// Copies `root`'s `buf` to every rank of `group` down a binomial tree, chunk by chunk: a rank forwards
/// chunk `k` to its children as soon as it has it, so a large buffer pipelines through the tree's
/// log2(n) levels.
pub(crate) async fn broadcast(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    root: u32,
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let n = group.len();
    let me = position(group, wire.me)?;
    let root_at = position(group, root)?;
    let rank_at = |relative: usize| group[(relative + root_at) % n];
    let (parent, children) = binomial((me + n - root_at) % n, n);
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    for k in 0..grid.chunks_in(0) {
        let id = wire.id(PHASE_BCAST, 0, k);
        let mut cell = grid.lock(0, k).await;
        if let Some(parent) = parent {
            wire.recv(inboxes, rank_at(parent), id, &mut cell, Apply::Copy)
                .await?;
        }
        for &child in &children {
            wire.send(rank_at(child), id, &mut cell).await?;
        }
    }
    Ok(())
}

/// Returns once every rank of `group` has entered: in round `r` each rank tells the rank 2^r after it and
/// waits to hear from the rank 2^r before it; after ceil(log2 n) rounds every rank has heard, through
/// some chain, from every other (Hensgen, Finkel and Manber's dissemination barrier). `token` is one
/// value of no meaning.
pub(crate) async fn barrier(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    token: &mut [f32],
) -> Result<(), CollectiveError> {
    let n = group.len();
    let me = position(group, wire.me)?;
    let grid = ChunkGrid::new(token, 1, wire.chunk_elems);
    let mut distance = 1;
    let mut round = 0;
    while distance < n {
        let tell = Exchange {
            to: group[(me + distance) % n],
            send_phase: PHASE_BARRIER + round,
            from: group[(me + n - distance) % n],
            receive_phase: PHASE_BARRIER + round,
            apply: Apply::Copy,
        };
        tell.run(wire, inboxes, &grid).await?;
        distance <<= 1;
        round += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binomial_tree_reaches_every_position_once_in_log_n_sends() {
        for n in 1..=70usize {
            let mut parent_of = vec![None; n];
            let mut depth = vec![0u32; n];
            for relative in 0..n {
                let (parent, children) = binomial(relative, n);
                assert_eq!(
                    parent.is_none(),
                    relative == 0,
                    "n {n}, position {relative}"
                );
                assert!(
                    children.len() <= n.next_power_of_two().trailing_zeros() as usize,
                    "n {n}, position {relative}: {children:?}"
                );
                for child in children {
                    assert!(child < n && child > relative);
                    assert_eq!(
                        binomial(child, n).0,
                        Some(relative),
                        "n {n}: {child}'s parent"
                    );
                    assert!(parent_of[child].replace(relative).is_none(), "two parents");
                }
            }
            // Every position but the root has exactly one parent, and no path is longer than log2(n).
            for relative in 1..n {
                let parent = parent_of[relative].expect("reached");
                depth[relative] = depth[parent] + 1;
                assert!(depth[relative] <= n.next_power_of_two().trailing_zeros());
            }
        }
    }

    #[test]
    fn the_root_sends_to_its_largest_subtree_first() {
        assert_eq!(binomial(0, 8), (None, vec![4, 2, 1]));
        assert_eq!(binomial(0, 5), (None, vec![4, 2, 1]));
        assert_eq!(binomial(4, 8), (Some(0), vec![6, 5]));
        assert_eq!(binomial(4, 5), (Some(0), vec![]));
        assert_eq!(binomial(3, 8), (Some(2), vec![]));
        assert_eq!(binomial(0, 1), (None, vec![]));
    }

    #[test]
    fn children_of_a_rank_are_counted_from_the_root() {
        assert_eq!(children_of(5, 5, 16), vec![13, 9, 7, 6]);
        assert_eq!(children_of(13, 5, 16), vec![1, 15, 14]);
        assert_eq!(children_of(6, 5, 16), Vec::<u32>::new());
        assert_eq!(children_of(0, 0, 8), vec![4, 2, 1]);
        assert_eq!(children_of(4, 3, 5), Vec::<u32>::new());
        assert_eq!(children_of(3, 3, 5), vec![2, 0, 4]);
    }
}
