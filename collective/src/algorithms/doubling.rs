//! Recursive doubling: log2(n) pairwise swaps of the whole buffer, for small buffers on 2^k
//! ranks.

use crate::error::CollectiveError;
use crate::kernels::Apply;
use crate::segments::ChunkGrid;
use crate::transport::Inbox;

use super::{Exchange, PHASE_DOUBLING, Wire, position, power_of_two};

/// Recursive-doubling all-reduce over a group of 2^k ranks, for small buffers: log2(n) hops in
/// which every rank works, where the star takes two hops through one busy root. At step `s` each
/// rank swaps its whole buffer with the rank whose position differs in bit `s` and adds what it
/// receives. IEEE addition is commutative, so both partners compute the same bits, and by
/// induction every rank ends with the same sum.
pub(crate) async fn doubling(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    power_of_two(group, "recursive doubling")?;
    let n = group.len();
    let p = position(group, wire.me)?;
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    for step in 0..n.trailing_zeros() {
        let partner = group[p ^ (1 << step)];
        let swap = Exchange {
            to: partner,
            send_phase: PHASE_DOUBLING + step,
            from: partner,
            receive_phase: PHASE_DOUBLING + step,
            apply: Apply::Add,
        };
        swap.run(wire, inboxes, &grid).await?;
    }
    Ok(())
}
