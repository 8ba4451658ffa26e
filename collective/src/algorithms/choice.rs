//! How ranks group into nodes (the node groups and leaders of the hierarchical algorithm), and
//! which algorithm `Auto` runs.

use crate::config::{Algorithm, PeerInfo};

/// `Auto` uses a latency-bound algorithm up to this many bytes (recursive doubling on 2^k ranks,
/// the star otherwise); above, a bandwidth-optimal one (halving or the ring). Measured with
/// `allreduce-bench --ranks 4 --no-baseline` on 2 cores, shared-memory rings, medians of 3 runs on
/// a busy machine: star 29 us, doubling 34 us, ring 102 us at 4 KiB; 40, 67 and 96 us at 64 KiB;
/// star 97 us and ring 137 us at 256 KiB, ring ahead from 1 MiB (409-427 us against 318-684 us for
/// the star). The star led at 256 KiB in that run, so this bound is on the safe side of the
/// crossover, not at it.
pub const AUTO_SMALL_MAX_BYTES: usize = 64 << 10;

/// Above `AUTO_SMALL_MAX_BYTES` on 2^k ranks without shared nodes `Auto` runs recursive halving
/// and doubling, the ring otherwise. Halving moves the ring's bytes in 2 log2(n) steps instead of
/// 2 (n - 1); measured with `allreduce-bench --no-baseline`, one host, 2 cores, medians of 3
/// interleaved runs, halving against ring: 4 ranks 141 / 211 us at 128 KiB, 865 / 1,216 at 1 MiB
/// (Open MPI's shared memory 815), 3.27 / 4.27 ms at 4 MiB, 14.6 / 15.8 at 16 MiB; 2 ranks
/// 231 / 284 us at 1 MiB, 1.01 / 1.27 ms at 4 MiB.
///
/// The algorithm an all-reduce actually runs: the caller's [`Algorithm`] with `Auto` resolved
/// by buffer size, world size and node groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChosenAlgorithm {
    Ring,
    Hierarchical,
    Star,
    Doubling,
    Halving,
}

impl ChosenAlgorithm {
    pub(crate) fn choose(
        algorithm: Algorithm,
        bytes: usize,
        world: usize,
        groups: &NodeGroups,
    ) -> ChosenAlgorithm {
        match algorithm {
            Algorithm::Ring => ChosenAlgorithm::Ring,
            Algorithm::Star => ChosenAlgorithm::Star,
            Algorithm::Hierarchical => ChosenAlgorithm::Hierarchical,
            Algorithm::Auto if bytes <= AUTO_SMALL_MAX_BYTES && world.is_power_of_two() => {
                ChosenAlgorithm::Doubling
            }
            Algorithm::Auto if bytes <= AUTO_SMALL_MAX_BYTES => ChosenAlgorithm::Star,
            Algorithm::Auto if groups.multi_rank_nodes(world) => ChosenAlgorithm::Hierarchical,
            Algorithm::Auto if world.is_power_of_two() => ChosenAlgorithm::Halving,
            Algorithm::Auto => ChosenAlgorithm::Ring,
        }
    }
}

/// How ranks group into nodes, for the hierarchical algorithm (the nodes named in the peer
/// table; not the device plugin's topology of RDUs and tiles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeGroups {
    /// Ranks on this rank's node, ascending; the first is the node leader.
    pub(crate) node_group: Vec<u32>,
    /// The leader (lowest rank) of every node, ascending.
    pub(crate) leaders: Vec<u32>,
}

impl NodeGroups {
    pub(crate) fn new(peers: &[PeerInfo], me: u32) -> Self {
        let my_node = peers
            .iter()
            .find(|p| p.rank == me)
            .map(|p| p.node.as_str())
            .unwrap_or_default();
        let node_group = peers
            .iter()
            .filter(|p| p.node == my_node)
            .map(|p| p.rank)
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        let leaders = peers
            .iter()
            .filter(|p| seen.insert(p.node.as_str()))
            .map(|p| p.rank)
            .collect();
        NodeGroups {
            node_group,
            leaders,
        }
    }

    pub(crate) fn multi_rank_nodes(&self, world: usize) -> bool {
        self.leaders.len() > 1 && self.leaders.len() < world
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32, node: &str) -> PeerInfo {
        PeerInfo {
            rank,
            address: format!("h:{rank}"),
            node: node.into(),
        }
    }

    #[test]
    fn node_groups_gather_ranks_by_node_with_lowest_rank_leading() {
        let peers = [
            peer(0, "a"),
            peer(1, "b"),
            peer(2, "a"),
            peer(3, "b"),
            peer(4, "c"),
        ];
        let t = NodeGroups::new(&peers, 3);
        assert_eq!(t.node_group, vec![1, 3]);
        assert_eq!(t.leaders, vec![0, 1, 4]);
        assert!(t.multi_rank_nodes(5));
        let flat = NodeGroups::new(&[peer(0, "a"), peer(1, "b")], 0);
        assert!(!flat.multi_rank_nodes(2));
        let one = NodeGroups::new(&[peer(0, "a"), peer(1, "a")], 1);
        assert_eq!(one.leaders, vec![0]);
        assert!(!one.multi_rank_nodes(2));
    }

    #[test]
    fn auto_picks_doubling_or_star_for_small_hierarchical_for_shared_nodes_halving_on_2k_ranks_else_ring()
     {
        let shared = NodeGroups::new(&[peer(0, "a"), peer(1, "a"), peer(2, "b")], 0);
        let flat = NodeGroups::new(&[peer(0, "a"), peer(1, "b")], 0);
        let big = AUTO_SMALL_MAX_BYTES + 4;
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, 4096, 3, &shared),
            ChosenAlgorithm::Star
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, AUTO_SMALL_MAX_BYTES, 2, &flat),
            ChosenAlgorithm::Doubling
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, 4096, 8, &flat),
            ChosenAlgorithm::Doubling
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, 4096, 6, &flat),
            ChosenAlgorithm::Star
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, big, 3, &shared),
            ChosenAlgorithm::Hierarchical
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, big, 2, &flat),
            ChosenAlgorithm::Halving
        );
        // Every rank on one node.
        let one_node = NodeGroups::new(&[peer(0, "a")], 0);
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, big, 8, &one_node),
            ChosenAlgorithm::Halving
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Auto, big, 6, &one_node),
            ChosenAlgorithm::Ring
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Ring, 4, 3, &shared),
            ChosenAlgorithm::Ring
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Star, big, 2, &flat),
            ChosenAlgorithm::Star
        );
        assert_eq!(
            ChosenAlgorithm::choose(Algorithm::Hierarchical, 4, 2, &flat),
            ChosenAlgorithm::Hierarchical
        );
    }
}
