//! The spec's data-parallel settings (`spec.dataParallel`) as the collective takes them: the all-reduce's
//! algorithm and compression, and how a step's gradient is split into buckets.

use rdu_collective::{Algorithm, Compression, ReduceOptions};
use rdu_crds::{DataParallelSpec, GradientCompression, ReduceAlgorithm};

use crate::buckets;
use crate::overlap::ReducePlan;

/// The all-reduce algorithm of the spec: `reduceOnRdu: false` goes through the host (star via rank 0).
pub(crate) fn algorithm(dp: &DataParallelSpec) -> Algorithm {
    if !dp.reduce_on_rdu {
        return Algorithm::Star;
    }
    match dp.algorithm {
        ReduceAlgorithm::Auto => Algorithm::Auto,
        ReduceAlgorithm::Ring => Algorithm::Ring,
        ReduceAlgorithm::Hierarchical => Algorithm::Hierarchical,
        ReduceAlgorithm::Star => Algorithm::Star,
    }
}

/// How values travel: `spec.dataParallel.compression`.
pub(crate) fn compression(dp: &DataParallelSpec) -> Compression {
    match dp.compression {
        GradientCompression::None => Compression::None,
        GradientCompression::Bf16 => Compression::Bf16,
        GradientCompression::Fp16 => Compression::Fp16,
    }
}

/// The all-reduce the spec asks for: its algorithm and compression.
pub(crate) fn reduce_options(dp: &DataParallelSpec) -> ReduceOptions {
    ReduceOptions {
        algorithm: algorithm(dp),
        compression: compression(dp),
    }
}

/// How a step's gradient is computed and reduced: `tiles` threads, buckets of `bucketSizeMiB`.
pub(crate) fn reduce_plan(dp: &DataParallelSpec, tiles: usize) -> ReducePlan {
    ReducePlan {
        tiles,
        cap_bytes: buckets::cap_bytes(dp.bucket_size_mib),
        reduce: reduce_options(dp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_off_the_rdu_goes_through_the_host() {
        let mut dp = DataParallelSpec {
            algorithm: ReduceAlgorithm::Ring,
            ..DataParallelSpec::default()
        };
        assert_eq!(algorithm(&dp), Algorithm::Ring);
        dp.reduce_on_rdu = false;
        assert_eq!(algorithm(&dp), Algorithm::Star);
    }

    #[test]
    fn the_compression_comes_from_the_spec() {
        let mut dp = DataParallelSpec::default();
        assert_eq!(reduce_plan(&dp, 1).reduce.compression, Compression::None);
        dp.compression = GradientCompression::Bf16;
        assert_eq!(reduce_plan(&dp, 1).reduce.compression, Compression::Bf16);
        dp.compression = GradientCompression::Fp16;
        assert_eq!(reduce_plan(&dp, 1).reduce.compression, Compression::Fp16);
    }

    #[test]
    fn the_bucket_size_comes_from_the_spec() {
        let mut dp = DataParallelSpec::default();
        assert_eq!(reduce_plan(&dp, 2).cap_bytes, 25 << 20);
        dp.bucket_size_mib = 3;
        let plan = reduce_plan(&dp, 4);
        assert_eq!((plan.cap_bytes, plan.tiles), (3 << 20, 4));
    }
}
