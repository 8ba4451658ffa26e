//! Recursive halving then doubling (Rabenseifner's all-reduce) on 2^k ranks: a reduce-scatter
//! that halves the range each rank reduces at every step, then an all-gather that doubles it
//! back. It moves what the ring moves, 2 (n - 1) / n of the buffer per rank, in 2 log2(n) steps
//! instead of 2 (n - 1): fewer hand-overs between ranks, which is what a step costs when ranks
//! outnumber cores or the buffer is medium-sized.

use crate::error::CollectiveError;
use crate::kernels::Apply;
use crate::segments::ChunkGrid;
use crate::transport::Inbox;

use super::{PHASE_HALVING, Wire, position, power_of_two};

/// The segments (of `n`, one per rank) this rank keeps and gives away at each halving step, in
/// step order: at step `s` it pairs with the rank `n >> (s + 1)` away and keeps the half of its
/// current range on its own side. It ends holding segment `p` alone.
fn halving_steps(n: usize, p: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    let (mut lo, mut hi) = (0, n);
    let mut distance = n / 2;
    while distance > 0 {
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if p & distance == 0 {
            (lo..mid, mid..hi)
        } else {
            (mid..hi, lo..mid)
        };
        steps.push(Step {
            partner: p ^ distance,
            keep: keep.clone(),
            give,
        });
        (lo, hi) = (keep.start, keep.end);
        distance /= 2;
    }
    steps
}

/// One step: the partner's position, the segments reduced here and those sent to be reduced
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    partner: usize,
    keep: std::ops::Range<usize>,
    give: std::ops::Range<usize>,
}

/// All-reduce (sum) of `buf` over the 2^k ranks of `group`. Each segment is reduced by one rank
/// alone, in an order fixed by the positions, then copied to the others: bitwise identical.
pub(crate) async fn halving(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    power_of_two(group, "recursive halving")?;
    let n = group.len();
    if n == 1 || buf.is_empty() {
        return Ok(());
    }
    let p = position(group, wire.me)?;
    let grid = ChunkGrid::new(buf, n, wire.chunk_elems);
    let steps = halving_steps(n, p);
    let last = steps.len() as u32;
    // Reduce-scatter: give one half, add the partner's copy of the other.
    for (s, step) in steps.iter().enumerate() {
        let phase = PHASE_HALVING + s as u32;
        swap(
            wire,
            inboxes,
            &grid,
            group[step.partner],
            phase,
            step,
            Apply::Add,
        )
        .await?;
    }
    // All-gather, the same pairs in reverse: give what this rank holds, copy what it lacks.
    for (s, step) in steps.iter().enumerate().rev() {
        let back = Step {
            partner: step.partner,
            keep: step.give.clone(),
            give: step.keep.clone(),
        };
        let phase = PHASE_HALVING + last + s as u32;
        swap(
            wire,
            inboxes,
            &grid,
            group[step.partner],
            phase,
            &back,
            Apply::Copy,
        )
        .await?;
    }
    Ok(())
}

/// Sends every chunk of `step.give` to `partner` while receiving every chunk of `step.keep` from
/// it into this rank's (`apply`): disjoint segments, so both run at once.
async fn swap(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    grid: &ChunkGrid<'_>,
    partner: u32,
    phase: u32,
    step: &Step,
    apply: Apply,
) -> Result<(), CollectiveError> {
    let sender = async {
        for seg in step.give.clone() {
            for k in 0..grid.chunks_in(seg) {
                let id = wire.id(phase, seg, k);
                wire.send(partner, id, &mut grid.lock(seg, k).await).await?;
            }
        }
        Ok::<(), CollectiveError>(())
    };
    let receiver = async {
        for seg in step.keep.clone() {
            for k in 0..grid.chunks_in(seg) {
                let id = wire.id(phase, seg, k);
                wire.recv(inboxes, partner, id, &mut grid.lock(seg, k).await, apply)
                    .await?;
            }
        }
        Ok::<(), CollectiveError>(())
    };
    tokio::try_join!(sender, receiver)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_ends_with_its_own_segment_and_partners_agree_on_the_halves() {
        for n in [2usize, 4, 8, 16, 64] {
            for p in 0..n {
                let steps = halving_steps(n, p);
                assert_eq!(steps.len(), n.trailing_zeros() as usize);
                assert_eq!(steps.last().map(|s| s.keep.clone()), Some(p..p + 1));
                for (s, step) in steps.iter().enumerate() {
                    // The partner keeps what this rank gives, and gives what it keeps.
                    let theirs = &halving_steps(n, step.partner)[s];
                    assert_eq!(theirs.partner, p);
                    assert_eq!((&theirs.keep, &theirs.give), (&step.give, &step.keep));
                    assert_eq!(step.keep.len(), n >> (s + 1), "halves at step {s}");
                }
            }
        }
    }
}
