//! PyTorch's `DistributedSampler`, exactly: a per-epoch permutation from seed + epoch that every rank
//! computes identically, padded by wrapping (or truncated with `drop_last`) to a multiple of the world
//! size, then rank r takes indices r, r+W, r+2W, ...

use crate::rng::Rng;

/// One rank's view of the training set's sharding.
#[derive(Debug, Clone)]
pub(crate) struct DistributedSampler {
    pub dataset_len: usize,
    pub world_size: usize,
    pub rank: usize,
    pub shuffle: bool,
    pub drop_last: bool,
    pub seed: u64,
}

impl DistributedSampler {
    /// Samples this rank gets per epoch (the same on every rank).
    pub(crate) fn num_samples(&self) -> usize {
        let (n, w) = (self.dataset_len, self.world_size);
        if self.drop_last && n % w != 0 {
            n.saturating_sub(w).div_ceil(w)
        } else {
            n.div_ceil(w)
        }
    }

    /// This rank's dataset indices for `epoch`, in visiting order.
    pub(crate) fn indices(&self, epoch: u64) -> Vec<usize> {
        let n = self.dataset_len;
        let mut indices = if self.shuffle {
            Rng::new(self.seed.wrapping_add(epoch)).permutation(n)
        } else {
            (0..n).collect()
        };
        let total = self.num_samples() * self.world_size;
        if total > indices.len() && !indices.is_empty() {
            let base = indices.clone();
            while indices.len() < total {
                let need = total - indices.len();
                indices.extend_from_slice(&base[..need.min(base.len())]);
            }
        }
        indices.truncate(total);
        indices
            .into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn sampler(n: usize, w: usize, r: usize, drop_last: bool) -> DistributedSampler {
        DistributedSampler {
            dataset_len: n,
            world_size: w,
            rank: r,
            shuffle: true,
            drop_last,
            seed: 42,
        }
    }

    fn shards(n: usize, w: usize, drop_last: bool, epoch: u64) -> Vec<Vec<usize>> {
        (0..w)
            .map(|r| sampler(n, w, r, drop_last).indices(epoch))
            .collect()
    }

    #[test]
    fn shards_are_disjoint_with_drop_last() {
        for (n, w) in [(10, 3), (100, 4), (7, 7), (9, 2)] {
            let s = shards(n, w, true, 0);
            let all: Vec<usize> = s.iter().flatten().copied().collect();
            let set: BTreeSet<usize> = all.iter().copied().collect();
            assert_eq!(set.len(), all.len(), "n={n} w={w}");
            assert_eq!(all.len(), (n / w) * w);
        }
    }

    #[test]
    fn shards_cover_everything_without_drop_last() {
        for (n, w) in [(10, 3), (100, 4), (5, 8), (1, 3)] {
            let s = shards(n, w, false, 1);
            let set: BTreeSet<usize> = s.iter().flatten().copied().collect();
            assert_eq!(set, (0..n).collect(), "n={n} w={w}");
        }
    }

    #[test]
    fn every_rank_gets_the_same_number_of_samples() {
        for drop_last in [false, true] {
            for (n, w) in [(10, 3), (101, 4), (5, 8), (8, 8)] {
                let s = shards(n, w, drop_last, 2);
                let expected = sampler(n, w, 0, drop_last).num_samples();
                assert!(s.iter().all(|x| x.len() == expected), "n={n} w={w} {s:?}");
            }
        }
    }

    #[test]
    fn padding_wraps_around_like_pytorch() {
        // 10 samples over 4 ranks: 12 indices, the permutation's first two repeated at the end.
        let s = sampler(10, 4, 0, false);
        let perm = Rng::new(42).permutation(10);
        assert_eq!(s.indices(0), vec![perm[0], perm[4], perm[8]]);
        let r1 = sampler(10, 4, 2, false).indices(0);
        assert_eq!(r1, vec![perm[2], perm[6], perm[0]]);
    }

    #[test]
    fn each_epoch_has_a_new_order_and_all_ranks_agree_on_it() {
        let a = shards(50, 2, false, 0);
        let b = shards(50, 2, false, 1);
        assert_ne!(a, b);
        assert_eq!(a, shards(50, 2, false, 0));
    }

    #[test]
    fn no_shuffle_keeps_dataset_order() {
        let mut s = sampler(6, 2, 1, false);
        s.shuffle = false;
        assert_eq!(s.indices(5), vec![1, 3, 5]);
    }
}
