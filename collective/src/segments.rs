//! Where a buffer is cut: segment boundaries are a pure function of (length, parts), so every
//! rank cuts identically; each segment is further cut into pipelining chunks.

use std::ops::Range;
use tokio::sync::{Mutex, MutexGuard};

/// Range of segment `index` when `len` elements are split into `parts` nearly equal parts:
/// the first `len % parts` segments hold one element more. `parts` must be at least 1.
pub fn segment_range(len: usize, parts: usize, index: usize) -> Range<usize> {
    let parts = parts.max(1);
    let base = len / parts;
    let extra = len % parts;
    let start = index * base + index.min(extra);
    let size = base + usize::from(index < extra);
    start..start + size
}

/// All segment ranges, in order; they tile `0..len` exactly.
pub fn segment_ranges(len: usize, parts: usize) -> Vec<Range<usize>> {
    (0..parts.max(1))
        .map(|i| segment_range(len, parts, i))
        .collect()
}

/// Number of chunks of at most `chunk_elems` elements in `seg_len` elements.
pub fn chunk_count(seg_len: usize, chunk_elems: usize) -> usize {
    seg_len.div_ceil(chunk_elems.max(1))
}

/// A buffer cut into segments and chunks; each chunk can be locked independently so a
/// sender and a receiver running concurrently in one task can touch different chunks. The
/// locks are async: a sender holds one while the chunk is written to a socket.
pub(crate) struct ChunkGrid<'a> {
    cells: Vec<Mutex<&'a mut [f32]>>,
    first_cell: Vec<usize>,
}

impl<'a> ChunkGrid<'a> {
    pub(crate) fn new(buf: &'a mut [f32], parts: usize, chunk_elems: usize) -> Self {
        let ranges = segment_ranges(buf.len(), parts);
        let mut cells = Vec::new();
        let mut first_cell = Vec::with_capacity(ranges.len() + 1);
        let mut rest = buf;
        for range in ranges {
            first_cell.push(cells.len());
            let (segment, tail) = rest.split_at_mut(range.len());
            rest = tail;
            cells.extend(segment.chunks_mut(chunk_elems.max(1)).map(Mutex::new));
        }
        first_cell.push(cells.len());
        ChunkGrid { cells, first_cell }
    }

    #[cfg(test)]
    pub(crate) fn segments(&self) -> usize {
        self.first_cell.len() - 1
    }

    pub(crate) fn chunks_in(&self, segment: usize) -> usize {
        self.first_cell[segment + 1] - self.first_cell[segment]
    }

    /// Locks one chunk.
    pub(crate) async fn lock(&self, segment: usize, chunk: usize) -> MutexGuard<'_, &'a mut [f32]> {
        self.cells[self.first_cell[segment] + chunk].lock().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_tile_the_buffer_and_differ_by_at_most_one() {
        for len in [0usize, 1, 2, 3, 7, 10, 1000, 1_000_003] {
            for parts in 1..=9 {
                let ranges = segment_ranges(len, parts);
                assert_eq!(ranges.len(), parts);
                let mut next = 0;
                for r in &ranges {
                    assert_eq!(r.start, next, "len {len} parts {parts}");
                    next = r.end;
                }
                assert_eq!(next, len);
                let sizes: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
                let (min, max) = (sizes.iter().min(), sizes.iter().max());
                assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "{sizes:?}");
            }
        }
    }

    #[test]
    fn known_boundaries() {
        assert_eq!(segment_ranges(7, 3), vec![0..3, 3..5, 5..7]);
        assert_eq!(segment_ranges(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(segment_range(10, 1, 0), 0..10);
    }

    #[test]
    fn chunk_counts_round_up() {
        assert_eq!(chunk_count(0, 4), 0);
        assert_eq!(chunk_count(1, 4), 1);
        assert_eq!(chunk_count(8, 4), 2);
        assert_eq!(chunk_count(9, 4), 3);
    }

    #[tokio::test]
    async fn grid_cells_cover_segments_in_chunks() {
        let mut buf: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let grid = ChunkGrid::new(&mut buf, 3, 2);
        assert_eq!(grid.segments(), 3);
        // segments 0..4, 4..7, 7..10 -> chunks [0,1][2,3] | [4,5][6] | [7,8][9]
        assert_eq!(
            (0..3).map(|s| grid.chunks_in(s)).collect::<Vec<_>>(),
            vec![2, 2, 2]
        );
        assert_eq!(**grid.lock(1, 1).await, [6.0]);
        assert_eq!(**grid.lock(2, 0).await, [7.0, 8.0]);
        grid.lock(0, 1).await[0] = 42.0;
        drop(grid);
        assert_eq!(buf[2], 42.0);
    }
}
