//! The algorithms: ring all-reduce over a group of ranks, reduce to a root, broadcast from a
//! root. Each receive is checked against what this rank expects next from that peer; every
//! network wait is bounded by the operation's deadline and by the failure latch.

pub(crate) mod choice;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::segments::ChunkGrid;
use crate::transport::inbox::{Apply, Inbox, InboxError};
use crate::transport::{ChunkId, Link};

/// Chunks sent to a root to be reduced there.
pub(crate) const PHASE_GATHER: u32 = 1;
/// Chunks broadcast from a root.
pub(crate) const PHASE_BCAST: u32 = 2;
/// Ring step `t` uses phase `PHASE_RING + t`.
pub(crate) const PHASE_RING: u32 = 16;
/// Recursive-doubling step `s` uses phase `PHASE_DOUBLING + s`.
pub(crate) const PHASE_DOUBLING: u32 = 1 << 16;

/// Everything one collective operation needs to talk to peers.
pub(crate) struct Wire<'a> {
    pub(crate) me: u32,
    pub(crate) op: &'static str,
    pub(crate) op_id: u64,
    pub(crate) generation: u64,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    pub(crate) chunk_elems: usize,
    pub(crate) fail: &'a FailState,
    pub(crate) links: &'a [Option<Link>],
}

impl Wire<'_> {
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, CollectiveError>>,
    ) -> Result<T, CollectiveError> {
        tokio::select! {
            biased;
            result = fut => result,
            error = self.fail.failed() => Err(error),
            _ = tokio::time::sleep_until(self.deadline) => Err(CollectiveError::Timeout {
                op: self.op,
                after: self.timeout,
            }),
        }
    }

    /// This operation's name for chunk `chunk` of `segment` in `phase`.
    fn id(&self, phase: u32, segment: usize, chunk: usize) -> ChunkId {
        ChunkId {
            op_id: self.op_id,
            phase,
            segment: segment as u32,
            chunk: chunk as u32,
        }
    }

    async fn send(&self, dst: u32, id: ChunkId, values: &[f32]) -> Result<(), CollectiveError> {
        let link = self
            .links
            .get(dst as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| CollectiveError::PeerLost {
                rank: dst,
                reason: "no link to this rank".into(),
            })?;
        self.bounded(link.send(id, values)).await
    }

    /// Receives the next chunk from `src`, which must be exactly the expected one with
    /// `dst.len()` values, and applies it to `dst`.
    async fn recv(
        &self,
        inboxes: &mut [Option<Inbox>],
        src: u32,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
    ) -> Result<(), CollectiveError> {
        let inbox = inbox_of(inboxes, src)?;
        self.bounded(async {
            inbox
                .receive(self.generation, expected, dst, apply)
                .await
                .map_err(|e| match e {
                    InboxError::Lost(reason) => CollectiveError::PeerLost { rank: src, reason },
                    InboxError::Violation(reason) => {
                        CollectiveError::Protocol { rank: src, reason }
                    }
                })
        })
        .await
    }
}

fn inbox_of(inboxes: &mut [Option<Inbox>], src: u32) -> Result<&mut Inbox, CollectiveError> {
    inboxes
        .get_mut(src as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| CollectiveError::PeerLost {
            rank: src,
            reason: "no inbox for this rank".into(),
        })
}

fn position(group: &[u32], rank: u32) -> Result<usize, CollectiveError> {
    group
        .iter()
        .position(|&r| r == rank)
        .ok_or_else(|| CollectiveError::InvalidArgument {
            field: "group",
            reason: format!("rank {rank} is not in group {group:?}"),
        })
}

/// Counts finished chunks and wakes the other half of a pipeline waiting for one.
struct Progress {
    done: AtomicUsize,
    wake: Notify,
}

impl Progress {
    fn new() -> Self {
        Progress {
            done: AtomicUsize::new(0),
            wake: Notify::new(),
        }
    }

    fn advance(&self) {
        self.done.fetch_add(1, Ordering::Release);
        self.wake.notify_one();
    }

    async fn reach(&self, count: usize) {
        while self.done.load(Ordering::Acquire) < count {
            self.wake.notified().await;
        }
    }
}

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
                wire.send(right, id, &grid.lock(seg, k).await).await?;
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

/// Sums `buf` of every rank of `group` into the root's `buf` (the root must be `group[0]`,
/// the lowest rank): the root adds the others' chunks in group order, so the result is the
/// same however the network interleaves. Other ranks' `buf` is left unchanged.
pub(crate) async fn reduce_to_root(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let Some(&root) = group.first() else {
        return Ok(());
    };
    position(group, wire.me)?;
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    let chunks = grid.chunks_in(0);
    if wire.me != root {
        for k in 0..chunks {
            wire.send(root, wire.id(PHASE_GATHER, 0, k), &grid.lock(0, k).await)
                .await?;
        }
        return Ok(());
    }
    for k in 0..chunks {
        add_chunk_of_each(wire, inboxes, &group[1..], k, &mut grid.lock(0, k).await).await?;
    }
    Ok(())
}

/// A root's share of a gather: adds chunk `k` of each of `srcs`, in that order, into `cell`.
async fn add_chunk_of_each(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    srcs: &[u32],
    k: usize,
    cell: &mut [f32],
) -> Result<(), CollectiveError> {
    for &src in srcs {
        let id = wire.id(PHASE_GATHER, 0, k);
        wire.recv(inboxes, src, id, cell, Apply::Add).await?;
    }
    Ok(())
}

/// Copies the root's `buf` to every other rank of `group`.
pub(crate) async fn bcast_from_root(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    root: u32,
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    position(group, wire.me)?;
    position(group, root)?;
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    let chunks = grid.chunks_in(0);
    if wire.me == root {
        for k in 0..chunks {
            let cell = grid.lock(0, k).await;
            for &dst in group.iter().filter(|&&r| r != root) {
                wire.send(dst, wire.id(PHASE_BCAST, 0, k), &cell).await?;
            }
        }
        return Ok(());
    }
    for k in 0..chunks {
        let mut cell = grid.lock(0, k).await;
        let id = wire.id(PHASE_BCAST, 0, k);
        wire.recv(inboxes, root, id, &mut cell, Apply::Copy).await?;
    }
    Ok(())
}

/// Star all-reduce over `group` with root `group[0]` ("through the host"), pipelined: the
/// root adds chunk `k` of every rank in group order and sends the sum of chunk `k` back while
/// later chunks are still arriving; other ranks send and receive concurrently.
pub(crate) async fn star(
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    group: &[u32],
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    let Some(&root) = group.first() else {
        return Ok(());
    };
    position(group, wire.me)?;
    if group.len() == 1 {
        return Ok(());
    }
    let grid = ChunkGrid::new(buf, 1, wire.chunk_elems);
    let chunks = grid.chunks_in(0);
    if wire.me == root {
        for k in 0..chunks {
            let mut cell = grid.lock(0, k).await;
            add_chunk_of_each(wire, inboxes, &group[1..], k, &mut cell).await?;
            for &dst in &group[1..] {
                wire.send(dst, wire.id(PHASE_BCAST, 0, k), &cell).await?;
            }
        }
        return Ok(());
    }
    let to_root = Exchange {
        to: root,
        send_phase: PHASE_GATHER,
        from: root,
        receive_phase: PHASE_BCAST,
        // The sum of chunk k cannot exist before this rank sent chunk k; the exchange keeps the
        // overwrite after the send even so.
        apply: Apply::Copy,
    };
    to_root.run(wire, inboxes, &grid).await
}

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
    let n = group.len();
    if !n.is_power_of_two() {
        return Err(CollectiveError::InvalidArgument {
            field: "group",
            reason: format!("recursive doubling needs a power-of-two group, not {n} ranks"),
        });
    }
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

/// Sends every chunk of a one-segment buffer to `to` while receiving the same chunks from
/// `from` and applying them; chunk `k` is received only after it was sent, so what is sent is
/// always this rank's value from before the exchange.
struct Exchange {
    to: u32,
    send_phase: u32,
    from: u32,
    receive_phase: u32,
    apply: Apply,
}

impl Exchange {
    async fn run(
        &self,
        wire: &Wire<'_>,
        inboxes: &mut [Option<Inbox>],
        grid: &ChunkGrid<'_>,
    ) -> Result<(), CollectiveError> {
        let chunks = grid.chunks_in(0);
        let sent = Progress::new();
        let sender = async {
            for k in 0..chunks {
                let id = wire.id(self.send_phase, 0, k);
                wire.send(self.to, id, &grid.lock(0, k).await).await?;
                sent.advance();
            }
            Ok::<(), CollectiveError>(())
        };
        let receiver = async {
            for k in 0..chunks {
                sent.reach(k + 1).await;
                let id = wire.id(self.receive_phase, 0, k);
                let mut cell = grid.lock(0, k).await;
                wire.recv(inboxes, self.from, id, &mut cell, self.apply)
                    .await?;
            }
            Ok::<(), CollectiveError>(())
        };
        tokio::try_join!(sender, receiver)?;
        Ok(())
    }
}
