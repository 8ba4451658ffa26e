//! Gradient buckets (DDP's `bucket_cap_mb`, our `spec.dataParallel.bucketSizeMiB`): contiguous
//! ranges of the flat gradient, formed from the last layer backwards, because backward finishes the
//! last layer first and each bucket can be all-reduced while backward still runs on earlier layers.

use std::ops::Range;

/// Bytes of one gradient element (f32).
const ELEM_BYTES: usize = 4;

/// One bucket: whole layers, back to back in the flat gradient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Its elements in the flat parameter/gradient buffer.
    pub range: Range<usize>,
    /// Its layers (indices into the model's layers, lowest first).
    pub layers: Range<usize>,
}

/// `spec.dataParallel.bucketSizeMiB` in bytes.
pub fn cap_bytes(bucket_size_mib: u32) -> usize {
    bucket_size_mib as usize * 1024 * 1024
}

/// Splits layers laid out back to back (`layer_elems[l]` elements each, layer 0 first) into buckets
/// in reverse layer order: each bucket holds at most `cap_bytes`, except a layer larger than the cap,
/// which is a bucket of its own. Every layer is in exactly one bucket.
pub fn partition(layer_elems: &[usize], cap_bytes: usize) -> Vec<Bucket> {
    let mut starts = Vec::with_capacity(layer_elems.len());
    let mut offset = 0;
    for &n in layer_elems {
        starts.push(offset);
        offset += n;
    }
    let mut buckets = Vec::new();
    // The open bucket: layers `lowest..highest_end`, `bytes` in total.
    let mut highest_end = layer_elems.len();
    let mut bytes = 0usize;
    for l in (0..layer_elems.len()).rev() {
        let layer_bytes = layer_elems[l] * ELEM_BYTES;
        if l + 1 < highest_end && bytes + layer_bytes > cap_bytes {
            buckets.push(bucket(&starts, layer_elems, l + 1..highest_end));
            highest_end = l + 1;
            bytes = 0;
        }
        bytes += layer_bytes;
    }
    if highest_end > 0 {
        buckets.push(bucket(&starts, layer_elems, 0..highest_end));
    }
    buckets
}

fn bucket(starts: &[usize], layer_elems: &[usize], layers: Range<usize>) -> Bucket {
    let last = layers.end - 1;
    Bucket {
        range: starts[layers.start]..starts[last] + layer_elems[last],
        layers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    fn ranges(buckets: &[Bucket]) -> Vec<(Range<usize>, Range<usize>)> {
        buckets
            .iter()
            .map(|b| (b.layers.clone(), b.range.clone()))
            .collect()
    }

    #[test]
    fn a_gradient_smaller_than_the_cap_is_one_bucket() {
        // digits: 64-32-10, 2410 parameters.
        let b = partition(&[64 * 32 + 32, 32 * 10 + 10], cap_bytes(25));
        assert_eq!(ranges(&b), vec![(0..2, 0..2410)]);
    }

    #[test]
    fn buckets_go_from_the_last_layer_back_and_fill_up_to_the_cap() {
        // 4 layers of 100 elements (400 bytes) each, cap 800 bytes: two layers per bucket.
        let b = partition(&[100, 100, 100, 100], 800);
        assert_eq!(ranges(&b), vec![(2..4, 200..400), (0..2, 0..200)]);
        // Cap 1200: the last three layers fit, the first is left over.
        let b = partition(&[100, 100, 100, 100], 1200);
        assert_eq!(ranges(&b), vec![(1..4, 100..400), (0..1, 0..100)]);
    }

    #[test]
    fn a_layer_larger_than_the_cap_is_its_own_bucket() {
        // 256-1024-1024-10 with a 1 MiB cap: every layer is alone (the 10-class one is small but
        // the next one down does not fit beside it).
        let layers = [256 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 10 + 10];
        let b = partition(&layers, MIB);
        assert_eq!(
            ranges(&b),
            vec![
                (2..3, 1_312_768..1_323_018),
                (1..2, 263_168..1_312_768),
                (0..1, 0..263_168)
            ]
        );
        // A big layer between small ones does not pull them into its bucket.
        let b = partition(&[10, 1000, 10, 10], 100);
        assert_eq!(
            ranges(&b),
            vec![(2..4, 1010..1030), (1..2, 10..1010), (0..1, 0..10)]
        );
    }

    #[test]
    fn buckets_tile_the_buffer_contiguously_and_respect_the_cap() {
        let layers = [7, 300, 5, 5, 90, 1, 64, 64, 2];
        let total: usize = layers.iter().sum();
        for cap in [4, 40, 400, 1000, 4000, 1 << 20] {
            let b = partition(&layers, cap);
            // Reverse order, back to back, from the end of the buffer to its start.
            let mut end = total;
            let mut layer_end = layers.len();
            for bucket in &b {
                assert_eq!(bucket.range.end, end, "cap {cap}: {b:?}");
                assert_eq!(bucket.layers.end, layer_end, "cap {cap}: {b:?}");
                assert!(!bucket.layers.is_empty());
                let bytes = bucket.range.len() * ELEM_BYTES;
                assert!(
                    bytes <= cap || bucket.layers.len() == 1,
                    "cap {cap}: {bucket:?} holds {bytes} bytes"
                );
                let elems: usize = layers[bucket.layers.clone()].iter().sum();
                assert_eq!(elems, bucket.range.len());
                end = bucket.range.start;
                layer_end = bucket.layers.start;
            }
            assert_eq!((end, layer_end), (0, 0), "cap {cap}: {b:?}");
        }
    }

    #[test]
    fn no_layers_no_buckets() {
        assert!(partition(&[], MIB).is_empty());
    }
}
