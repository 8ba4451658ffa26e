//! Aborts down a binomial tree rooted at the rank that aborts (the origin), as Gloo and NCCL jobs
//! spread them: the origin calls `Abort` on its children in the tree over ranks counted from it
//! (`algorithms::children_of`), and a rank that latches its failure from that call forwards the same
//! request (`from_rank` stays the origin) to its own children in the origin's tree. A rank calls at most
//! about log2(n) peers per abort instead of n - 1, and every rank's children in any origin's tree are
//! among `rank + 2^j` (mod n), so over all the aborts of a job it connects to at most ceil(log2 n)
//! peers while none is lost.
//!
//! A child whose call fails or does not answer in time is taken over: the sender calls that child's
//! children in its stead, recursively ([`targets`] is the decision), so one dead rank does not cut off
//! its subtree. Every call is bounded by half of what remains of the sender's grace, so a whole spread,
//! takeovers included, ends within the grace. A rank answers an `Abort` as soon as it latched, before
//! it forwards: its parent's call measures the child only, not the subtree below it.
//!
//! A rank forwards only the abort that latched its failure; one that had already failed does not
//! forward (it spread its own abort, or forwards the one that failed it). Every live rank still hears
//! at least one abort, even when several ranks abort at once and cut each other's trees:
//! let rank `r` have heard an abort and latched from origin `o`'s tree (or be `o`), at position `p`
//! counted from `o`. Rank `r + 1` is at position `p + 1` (unless it is `o`, which aborted). If `p` is
//! even, `r + 1` is `r`'s own child. If `p` is odd, the parent of `p + 1` is `p + 1 - lowbit(p + 1)`,
//! which is `p` with its low set bits cleared: an ancestor of `r` in `o`'s tree, which forwarded `o`'s
//! abort (that is how `r` heard it), to `r + 1` among the rest. So whoever heard an abort, its successor
//! on the ring hears one too, and around the ring, every rank. A dead rank on the way counts as having
//! forwarded, since its sender takes it over. What this does not cover: a takeover that the grace cuts
//! short (a chain of ranks each never answering), and ranks that are alive but fail every call.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::algorithms::children_of;
use crate::auth::AttachToken;
use crate::proto;
use crate::proto::collective_client::CollectiveClient;

/// A peer's `Collective` client for aborts, on a channel that connects when first called.
pub(crate) type AbortClient = CollectiveClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, AttachToken>,
>;

/// Why one `Abort` call did not reach its rank (the sender then calls that rank's children).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoticeError {
    /// The rank answered with an error, or could not be reached.
    #[error("rank {rank} refused the abort")]
    Refused {
        rank: u32,
        #[source]
        source: tonic::Status,
    },
    /// The rank did not answer in time.
    #[error("rank {rank} did not answer the abort within {after:?}")]
    TimedOut {
        rank: u32,
        after: Duration,
        #[source]
        source: tokio::time::error::Elapsed,
    },
}

/// The ranks `me` calls with `origin`'s abort in a world of `n`, given the ranks whose calls `failed`:
/// its children in `origin`'s binomial tree, each failed one replaced by its own children, recursively.
/// Ascending; a failed rank stays out.
pub(crate) fn targets(origin: u32, me: u32, n: u32, failed: &BTreeSet<u32>) -> Vec<u32> {
    let mut out = BTreeSet::new();
    let mut pending = children_of(me, origin, n);
    while let Some(rank) = pending.pop() {
        if failed.contains(&rank) {
            pending.extend(children_of(rank, origin, n));
        } else {
            out.insert(rank);
        }
    }
    out.into_iter().collect()
}

/// One rank's side of the abort tree: a client per peer (connected on first use) and which peers it
/// has called.
pub(crate) struct AbortTree {
    me: u32,
    world_size: u32,
    generation: u64,
    grace: Duration,
    /// Indexed by rank; `None` for this rank.
    clients: Vec<Option<AbortClient>>,
    called: Mutex<BTreeSet<u32>>,
}

impl AbortTree {
    pub(crate) fn new(
        me: u32,
        generation: u64,
        grace: Duration,
        clients: Vec<Option<AbortClient>>,
    ) -> Self {
        AbortTree {
            me,
            world_size: clients.len() as u32,
            generation,
            grace,
            clients,
            called: Mutex::new(BTreeSet::new()),
        }
    }

    /// The peers this rank has called `Abort` on (connected to), ascending.
    pub(crate) fn called(&self) -> Vec<u32> {
        self.lock_called().iter().copied().collect()
    }

    fn lock_called(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.called.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls this rank's children in `request`'s origin's tree (this rank's own tree when it is the
    /// origin), taking over any that fail; returns within the grace.
    pub(crate) async fn spread(&self, request: proto::AbortRequest) {
        let origin = request.from_rank;
        let n = self.world_size;
        if origin >= n {
            return;
        }
        let deadline = Instant::now() + self.grace;
        let mut failed = BTreeSet::new();
        let mut tried = BTreeSet::new();
        let mut calls = FuturesUnordered::new();
        loop {
            for rank in targets(origin, self.me, n, &failed) {
                if tried.insert(rank) {
                    let bound = deadline.saturating_duration_since(Instant::now()) / 2;
                    calls.push(self.call(rank, request.clone(), bound));
                }
            }
            let Some((rank, outcome)) = calls.next().await else {
                break;
            };
            if let Err(error) = outcome {
                tracing::debug!(rank = self.me, generation = self.generation, origin, error = %rdu_error_chain::Chain(&error), "taking over a child of the abort tree");
                failed.insert(rank);
            }
        }
        tracing::debug!(
            rank = self.me,
            generation = self.generation,
            origin,
            called = tried.len(),
            failed = failed.len(),
            "abort spread"
        );
    }

    async fn call(
        &self,
        rank: u32,
        request: proto::AbortRequest,
        bound: Duration,
    ) -> (u32, Result<(), NoticeError>) {
        let Some(Some(client)) = self.clients.get(rank as usize) else {
            return (rank, Ok(()));
        };
        self.lock_called().insert(rank);
        let mut client = client.clone();
        let outcome = match tokio::time::timeout(bound, client.abort(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(NoticeError::Refused { rank, source }),
            Err(source) => Err(NoticeError::TimedOut {
                rank,
                after: bound,
                source,
            }),
        };
        (rank, outcome)
    }
}

/// Forwards the abort that latched this rank's failure (the router hands over only that one) down its
/// origin's tree, unless this rank stops first. One handed over before the stop is still forwarded;
/// after it the router's hand-over fails, so the router refuses the abort and the sender takes this
/// rank's children over: an answered abort is always forwarded.
pub(crate) async fn forward_first(
    tree: Arc<AbortTree>,
    mut relayed: mpsc::UnboundedReceiver<proto::AbortRequest>,
    mut stop: watch::Receiver<bool>,
) {
    let request = tokio::select! {
        biased;
        request = relayed.recv() => request,
        _ = stop.wait_for(|down| *down) => {
            relayed.close();
            relayed.try_recv().ok()
        }
    };
    if let Some(request) = request {
        tracing::debug!(
            rank = tree.me,
            generation = tree.generation,
            origin = request.from_rank,
            "forwarding the abort"
        );
        tree.spread(request).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranks: &[u32]) -> BTreeSet<u32> {
        ranks.iter().copied().collect()
    }

    #[test]
    fn targets_are_the_children_in_the_origins_tree_with_failed_ones_taken_over() {
        // (origin, me, n, failed, targets)
        type Row = (u32, u32, u32, &'static [u32], &'static [u32]);
        let table: &[Row] = &[
            (5, 5, 16, &[], &[6, 7, 9, 13]),
            (5, 13, 16, &[], &[1, 14, 15]),
            (5, 6, 16, &[], &[]),
            (5, 9, 16, &[], &[10, 11]),
            // Rank 13 is dead: the origin calls its children 1, 15, 14 itself.
            (5, 5, 16, &[13], &[1, 6, 7, 9, 14, 15]),
            // And 1 too (a child of 13): 1's children 3, 2 come next.
            (5, 5, 16, &[13, 1], &[2, 3, 6, 7, 9, 14, 15]),
            // A failed leaf is just dropped.
            (5, 5, 16, &[6], &[7, 9, 13]),
            // Every rank but the origin dead: nothing left to call.
            (0, 0, 4, &[1, 2, 3], &[]),
            (0, 0, 1, &[], &[]),
            (2, 2, 3, &[], &[0, 1]),
            (2, 0, 3, &[], &[]),
            // A forwarding rank takes over inside its own subtree only.
            (0, 8, 16, &[12], &[9, 10, 13, 14]),
        ];
        for &(origin, me, n, failed, want) in table {
            assert_eq!(
                targets(origin, me, n, &set(failed)),
                want,
                "origin {origin}, me {me}, n {n}, failed {failed:?}"
            );
        }
    }

    #[test]
    fn each_rank_calls_at_most_log2_n_peers_over_every_origin() {
        for n in 1..=70u32 {
            let bound = n.next_power_of_two().trailing_zeros() as usize;
            for me in 0..n {
                let mut peers = BTreeSet::new();
                for origin in 0..n {
                    peers.extend(targets(origin, me, n, &BTreeSet::new()));
                }
                assert!(peers.len() <= bound, "n {n}, rank {me}: {peers:?}");
            }
        }
    }

    /// Runs aborts from `origins` to the end, delivering calls in the order `pick` chooses among the
    /// pending ones; a rank forwards only the abort that latched it, `dead` ranks answer nothing (their
    /// sender takes them over). Returns the live ranks that heard no abort and were not origins.
    fn unheard(
        n: u32,
        origins: &[u32],
        dead: &[u32],
        mut pick: impl FnMut(usize) -> usize,
    ) -> Vec<u32> {
        let dead = set(dead);
        let mut latched: BTreeSet<u32> = origins.iter().copied().collect();
        let mut heard = latched.clone();
        // Pending calls: (origin, sender, to).
        let mut pending: Vec<(u32, u32, u32)> = Vec::new();
        for &o in origins {
            for to in children_of(o, o, n) {
                pending.push((o, o, to));
            }
        }
        while !pending.is_empty() {
            let (o, from, to) = pending.swap_remove(pick(pending.len()));
            if dead.contains(&to) {
                for grandchild in children_of(to, o, n) {
                    pending.push((o, from, grandchild));
                }
                continue;
            }
            heard.insert(to);
            if latched.insert(to) {
                for child in children_of(to, o, n) {
                    pending.push((o, to, child));
                }
            }
        }
        (0..n)
            .filter(|r| !heard.contains(r) && !dead.contains(r))
            .collect()
    }

    #[test]
    fn every_live_rank_hears_an_abort_when_aborts_cross_and_ranks_are_dead() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound as u64) as usize
        };
        for n in 2..=40u32 {
            for trial in 0..200 {
                let k = 1 + next(n as usize) as u32 % 4;
                let origins: BTreeSet<u32> = (0..k).map(|_| next(n as usize) as u32).collect();
                let origins: Vec<u32> = origins.into_iter().collect();
                let dead: Vec<u32> = (0..n)
                    .filter(|r| !origins.contains(r) && trial % 3 == 0 && next(5) == 0)
                    .collect();
                let missed = unheard(n, &origins, &dead, &mut next);
                assert!(
                    missed.is_empty(),
                    "n {n}, origins {origins:?}, dead {dead:?}: {missed:?} heard nothing"
                );
            }
        }
    }

    #[test]
    fn one_abort_reaches_every_rank_in_n_minus_1_calls() {
        let n = 16;
        assert!(unheard(n, &[5], &[], |_| 0).is_empty());
        let calls: usize = (0..n)
            .map(|me| targets(5, me, n, &BTreeSet::new()).len())
            .sum();
        assert_eq!(calls, 15);
    }

    fn tree_of_two(grace: Duration) -> Arc<AbortTree> {
        // Rank 1 of 2: its peer's port refuses, so a call fails at once but is recorded.
        let refusing = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = refusing.local_addr().expect("addr").to_string();
        drop(refusing);
        let channel = crate::net::lazy_channel(&addr, grace).expect("channel");
        let token = AttachToken::new("t").expect("token");
        let client = CollectiveClient::with_interceptor(channel, token);
        Arc::new(AbortTree::new(1, 3, grace, vec![Some(client), None]))
    }

    #[tokio::test]
    async fn an_abort_handed_over_before_the_stop_is_forwarded_and_none_after_it_is_accepted() {
        let grace = Duration::from_millis(200);
        let request = proto::AbortRequest {
            generation: 3,
            from_rank: 1,
            reason: "worker crashed".into(),
            permanent: false,
        };
        // Handed over, then stopped before the forwarder ran: still forwarded.
        let tree = tree_of_two(grace);
        let (relay, relayed) = mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        relay.send(request.clone()).expect("relay");
        stop_tx.send_replace(true);
        forward_first(tree.clone(), relayed, stop).await;
        assert_eq!(tree.called(), [0]);
        // Stopped first: nothing is forwarded, and a later hand-over fails (the router refuses).
        let tree = tree_of_two(grace);
        let (relay, relayed) = mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        stop_tx.send_replace(true);
        forward_first(tree.clone(), relayed, stop).await;
        assert!(tree.called().is_empty());
        assert!(relay.send(request).is_err());
    }
}
