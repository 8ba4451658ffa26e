//! Ring all-reduce: reduce-scatter then all-gather around the group, chunks pipelined across
//! steps; the bandwidth-optimal algorithm for large buffers.

use crate::error::CollectiveError;
use crate::kernels::Apply;
use crate::segments::ChunkGrid;
use crate::transport::Inbox;

use super::{PHASE_RING, Progress, Wire, position};

/// Ring all-reduce (sum) of `buf` over `group` (ranks in ring order, this rank included):
/// reduce-scatter then all-gather, in `2 (n - 1)` steps. At step `t` this rank sends segment
/// `(p - t) mod n` to the right and receives segment `(p - t - 1) mod n` from the left, adding
/// during the first `n - 1` steps and copying after. Each segment's final value is computed by
/// exactly one rank and copied by all others, so results are bitwise identical.
///
/// Chunks pipeline across steps: chunk `k` of step `t` is sent as soon as chunk `k` of step
/// `t - 1` has been received, and a received chunk is written only once the copy that was sent
/// from the same place has been taken.
pub(crate) async fn ring(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let n = group.len();
    if n <= 1 || buf.is_empty() {
        return Ok(());
    }
    let p = position(group, wire.me)?;
    let right = group[(p + 1) % n];
    let left = group[(p + n - 1) % n];
    let grid = ChunkGrid::new(buf, n, wire.chunk_elems);
    let steps = 2 * (n - 1);
    let send_seg = |t: usize| (p + n * steps - t) % n;
    let recv_seg = |t: usize| (p + n * steps - t - 1) % n;
    // prefix[t] = chunks handled before step t, on each side.
    let prefix = |seg_of: &dyn Fn(usize) -> usize| -> Vec<usize> {
        let mut acc = vec![0; steps + 1];
        for t in 0..steps {
            acc[t + 1] = acc[t] + grid.chunks_in(seg_of(t));
        }
        acc
    };
    let sent_before = prefix(&send_seg);
    let received_before = prefix(&recv_seg);
    let sent = Progress::new();
    let received = Progress::new();

    let sender = async {
        for t in 0..steps {
            let seg = send_seg(t);
            for k in 0..grid.chunks_in(seg) {
                if t > 0 {
                    received.reach(received_before[t - 1] + k + 1).await;
                }
                let id = wire.id(PHASE_RING + t as u32, seg, k);
                wire.send(right, id, &mut grid.lock(seg, k).await).await?;
                sent.advance();
            }
        }
        Ok::<(), CollectiveError>(())
    };
    let receiver = async {
        for t in 0..steps {
            let seg = recv_seg(t);
            for k in 0..grid.chunks_in(seg) {
                if t + 1 >= n {
                    sent.reach(sent_before[t + 1 - n] + k + 1).await;
                }
                let apply = if t < n - 1 { Apply::Add } else { Apply::Copy };
                let id = wire.id(PHASE_RING + t as u32, seg, k);
                wire.recv(inboxes, left, id, &mut grid.lock(seg, k).await, apply)
                    .await?;
                received.advance();
            }
        }
        Ok::<(), CollectiveError>(())
    };
    tokio::try_join!(sender, receiver)?;
    Ok(())
}
