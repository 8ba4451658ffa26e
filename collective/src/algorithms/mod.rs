//! The collective algorithms, one file each, and what they share: the `Wire` one operation talks
//! to peers through (the whole operation bounded by its deadline and the failure latch; every
//! receive checked against what this rank expects next from that peer), the chunk phases, and the
//! pipelining helpers. `choice` says which all-reduce algorithm runs.
//!
//! - `ring`: reduce-scatter then all-gather; bandwidth-optimal for large buffers.
//! - `doubling`: recursive doubling; log2(n) swaps for small buffers on 2^k ranks.
//! - `halving`: recursive halving then doubling; the ring's bytes in 2 log2(n) steps on 2^k ranks.
//! - `star`: reduce to a root and broadcast from it ("through the host").
//! - `tree`: broadcast down a binomial tree and the dissemination barrier, log2(n) links per rank.
//! - `hierarchical`: within nodes, then between node leaders, then back.

pub(crate) mod choice;
mod doubling;
mod halving;
mod hierarchical;
mod ring;
mod star;
mod tree;

pub(crate) use tree::{barrier, broadcast, children_of};

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::kernels::Apply;
use crate::segments::ChunkGrid;
use crate::transport::{ChunkId, Inbox, InboxError, Links, ReceiveMode};

use self::choice::{ChosenAlgorithm, NodeGroups};

/// Chunks sent to a root to be reduced there.
pub(crate) const PHASE_GATHER: u32 = 1;
/// Chunks broadcast from a root.
pub(crate) const PHASE_BCAST: u32 = 2;
/// Ring step `t` uses phase `PHASE_RING + t`.
pub(crate) const PHASE_RING: u32 = 16;
/// Recursive-doubling step `s` uses phase `PHASE_DOUBLING + s`.
pub(crate) const PHASE_DOUBLING: u32 = 1 << 16;
/// Dissemination-barrier round `r` uses phase `PHASE_BARRIER + r`.
pub(crate) const PHASE_BARRIER: u32 = 2 << 16;
/// Recursive-halving step `s` uses phase `PHASE_HALVING + s`, its all-gather step `s` phase
/// `PHASE_HALVING + log2(n) + s`.
pub(crate) const PHASE_HALVING: u32 = 3 << 16;

/// All-reduce (sum) of `buf` over `all_ranks` (every rank, ascending) with `chosen`.
pub(crate) async fn all_reduce(
    chosen: ChosenAlgorithm,
    wire: &Wire<'_>,
    inboxes: &mut [Option<Inbox>],
    all_ranks: &[u32],
    groups: &NodeGroups,
    buf: &mut [f32],
) -> Result<(), CollectiveError> {
    match chosen {
        ChosenAlgorithm::Ring => ring::ring(wire, inboxes, all_ranks, buf).await,
        ChosenAlgorithm::Star => star::star(wire, inboxes, all_ranks, buf).await,
        ChosenAlgorithm::Doubling => doubling::doubling(wire, inboxes, all_ranks, buf).await,
        ChosenAlgorithm::Halving => halving::halving(wire, inboxes, all_ranks, buf).await,
        ChosenAlgorithm::Hierarchical => {
            hierarchical::hierarchical(wire, inboxes, groups, buf).await
        }
    }
}

/// Everything one collective operation needs to talk to peers.
pub(crate) struct Wire<'a> {
    pub(crate) me: u32,
    pub(crate) op: &'static str,
    pub(crate) op_id: u64,
    pub(crate) generation: u64,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    pub(crate) chunk_elems: usize,
    /// The values' wire encoding and how long small frames are polled for.
    pub(crate) mode: ReceiveMode,
    pub(crate) fail: &'a FailState,
    /// This rank's links, each dialled the first time it is used.
    pub(crate) links: &'a Links,
}

impl Wire<'_> {
    /// Runs a whole operation, `fut`, until it ends, the failure latch trips or the deadline
    /// passes: one timer and one watch per operation, not per chunk sent or received.
    pub(crate) async fn bounded<T>(
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

    /// Sends `values` to `dst` (dialling it first if this rank never sent to it); compressed
    /// values are rounded in place first, so this rank keeps what `dst` receives.
    async fn send(&self, dst: u32, id: ChunkId, values: &mut [f32]) -> Result<(), CollectiveError> {
        let link = self.links.to(dst, self.deadline).await?;
        link.send(id, values, self.mode.compression).await
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
        self.recv_as(inboxes, src, expected, dst, apply, self.mode)
            .await
    }

    /// Like `recv`, when nothing else of this task has to run while it waits (this rank's sends
    /// of the step went out already): a ring is then polled in place.
    async fn recv_alone(
        &self,
        inboxes: &mut [Option<Inbox>],
        src: u32,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
    ) -> Result<(), CollectiveError> {
        let mode = ReceiveMode {
            in_place: true,
            ..self.mode
        };
        self.recv_as(inboxes, src, expected, dst, apply, mode).await
    }

    async fn recv_as(
        &self,
        inboxes: &mut [Option<Inbox>],
        src: u32,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), CollectiveError> {
        let inbox = inbox_of(inboxes, src)?;
        inbox
            .receive(self.generation, expected, dst, apply, mode)
            .await
            .map_err(|e| match e {
                InboxError::Lost(reason) => CollectiveError::PeerLost { rank: src, reason },
                InboxError::Violation(reason) => CollectiveError::Protocol { rank: src, reason },
            })
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

/// Refuses a group that `algorithm` (recursive doubling or halving) cannot pair off: it needs a power of two ranks.
fn power_of_two(group: &[u32], algorithm: &str) -> Result<(), CollectiveError> {
    let n = group.len();
    if n.is_power_of_two() {
        return Ok(());
    }
    Err(CollectiveError::InvalidArgument {
        field: "group",
        reason: format!("{algorithm} needs a power-of-two group, not {n} ranks"),
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
        if chunks == 1 {
            // One chunk (a small buffer) is received only after it was sent, as below; done in
            // turn, the receive is then all this task waits for, and polls in place.
            let id = wire.id(self.send_phase, 0, 0);
            wire.send(self.to, id, &mut grid.lock(0, 0).await).await?;
            let id = wire.id(self.receive_phase, 0, 0);
            let mut cell = grid.lock(0, 0).await;
            return wire
                .recv_alone(inboxes, self.from, id, &mut cell, self.apply)
                .await;
        }
        let sent = Progress::new();
        let sender = async {
            for k in 0..chunks {
                let id = wire.id(self.send_phase, 0, k);
                wire.send(self.to, id, &mut grid.lock(0, k).await).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_power_of_two_groups_pair_off() {
        for n in [1u32, 2, 4, 8, 64] {
            let group: Vec<u32> = (0..n).collect();
            assert!(power_of_two(&group, "recursive halving").is_ok(), "{n}");
        }
        for n in [0u32, 3, 6, 100] {
            let group: Vec<u32> = (0..n).collect();
            let error = power_of_two(&group, "recursive halving").unwrap_err();
            assert!(
                error.to_string().contains(&format!(
                    "recursive halving needs a power-of-two group, not {n} ranks"
                )),
                "{error}"
            );
        }
    }
}
