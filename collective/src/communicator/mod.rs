//! `Communicator`: one rank's membership in the job, and its collectives (all-reduce, broadcast,
//! barrier), which run one at a time, in the same order on every rank. Connecting (serve, join,
//! dial) is in `connect`; how an abort reaches every rank, in `abort`.

mod abort;
mod connect;

pub use connect::ConnectOptions;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::algorithms::choice::{ChosenAlgorithm, NodeGroups};
use crate::algorithms::{self, Wire};
use crate::compression::Compression;
use crate::config::{Algorithm, CommConfig, PeerInfo};
use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::kernels::BufferPool;
use crate::proto;
use crate::transport::{Inbox, Links, ReceiveMode, RingMemoryUse};

/// Longest a shutdown waits for streams to flush and servers to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Longest a rank's part of an abort (its calls down the tree, takeovers included) may take.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// How one all-reduce runs: its algorithm, and how its values travel (see [`Compression`]).
/// An [`Algorithm`] alone means uncompressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReduceOptions {
    pub algorithm: Algorithm,
    pub compression: Compression,
}

impl From<Algorithm> for ReduceOptions {
    fn from(algorithm: Algorithm) -> Self {
        ReduceOptions {
            algorithm,
            compression: Compression::None,
        }
    }
}

/// State used by one collective at a time.
struct OpState {
    next_op_id: u64,
    inboxes: Vec<Option<Inbox>>,
}

/// One rank's handle on the job's communication.
pub struct Communicator {
    cfg: CommConfig,
    peers: Vec<PeerInfo>,
    all_ranks: Vec<u32>,
    node_groups: NodeGroups,
    /// Each peer's link, dialled when first used; `None` until the rendezvous completed.
    links: Option<Links>,
    /// This rank's calls down abort trees; `None` until the rendezvous completed.
    aborts: Option<Arc<abort::AbortTree>>,
    /// The abort that latched this rank's failure, from the router, until `dial` starts forwarding it.
    relayed: Option<mpsc::UnboundedReceiver<proto::AbortRequest>>,
    fail: Arc<FailState>,
    /// How long receives of small frames poll before parking (resolved from `Spin`).
    spin: Option<Duration>,
    pool: Arc<BufferPool>,
    ops: Mutex<OpState>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    span: tracing::Span,
}

impl Communicator {
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }

    pub fn world_size(&self) -> u32 {
        self.cfg.world_size
    }

    /// Every rank of the job, ordered by rank.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// The peers this rank has sent to so far, ascending: links open at first use, so these are
    /// the peers the collectives it ran exchange with.
    pub fn linked_peers(&self) -> Vec<u32> {
        self.links
            .as_ref()
            .map(Links::open_peers)
            .unwrap_or_default()
    }

    /// The peers this rank has called `Abort` on, ascending: its children in the binomial tree of
    /// each abort it spread or forwarded (rooted at the aborting rank), and the children of any of
    /// them that did not answer. At most ceil(log2 n) while every rank answers.
    pub fn abort_links(&self) -> Vec<u32> {
        self.aborts
            .as_ref()
            .map(|tree| tree.called())
            .unwrap_or_default()
    }

    /// The peers this rank sends to through a shared-memory ring (same host, see
    /// [`DataPath::Auto`](crate::DataPath::Auto)), ascending; TCP or gRPC carries the rest.
    pub fn shared_memory_peers(&self) -> Vec<u32> {
        self.links
            .as_ref()
            .map(Links::shared_memory_peers)
            .unwrap_or_default()
    }

    /// The shared memory this rank's rings hold now, and the most they held at once (the rings
    /// this rank made; the ones it reads from are its peers').
    pub fn ring_memory(&self) -> RingMemoryUse {
        self.links
            .as_ref()
            .map(Links::ring_memory)
            .unwrap_or_default()
    }

    /// In-place average over all ranks; bitwise identical on every rank afterwards.
    pub async fn all_reduce_mean(
        &self,
        buf: &mut [f32],
        options: impl Into<ReduceOptions>,
    ) -> Result<(), CollectiveError> {
        self.all_reduce_sum(buf, options).await?;
        divide_by_world_size(buf, self.cfg.world_size);
        Ok(())
    }

    /// In-place sum over all ranks; bitwise identical on every rank afterwards (compressed:
    /// the sum of every rank's values rounded to the wire's 16 bits, summed in f32, and rounded
    /// once more for the way back).
    pub async fn all_reduce_sum(
        &self,
        buf: &mut [f32],
        options: impl Into<ReduceOptions>,
    ) -> Result<(), CollectiveError> {
        let ReduceOptions {
            algorithm,
            compression,
        } = options.into();
        let chosen = self.choose(algorithm, buf.len() * compression.bytes_per_value());
        self.run(
            "all_reduce",
            compression,
            buf,
            |_| Ok(()),
            move |comm, wire, inboxes, buf| {
                Box::pin(algorithms::all_reduce(
                    chosen,
                    wire,
                    inboxes,
                    &comm.all_ranks,
                    &comm.node_groups,
                    buf,
                ))
            },
        )
        .await
    }

    /// Copies `root`'s buffer into every rank's buffer (all must have the same length).
    pub async fn broadcast(&self, buf: &mut [f32], root: u32) -> Result<(), CollectiveError> {
        let world = self.cfg.world_size;
        let check = move |_: &[f32]| {
            if root < world {
                Ok(())
            } else {
                Err(CollectiveError::InvalidArgument {
                    field: "root",
                    reason: format!("root {root} is outside 0..{world}"),
                })
            }
        };
        self.run(
            "broadcast",
            Compression::None,
            buf,
            check,
            move |comm, wire, inboxes, buf| {
                Box::pin(algorithms::broadcast(
                    wire,
                    inboxes,
                    &comm.all_ranks,
                    root,
                    buf,
                ))
            },
        )
        .await
    }

    /// Returns once every rank has entered the barrier.
    pub async fn barrier(&self) -> Result<(), CollectiveError> {
        let mut token = [0.0f32];
        self.run(
            "barrier",
            Compression::None,
            &mut token,
            |_| Ok(()),
            |comm, wire, inboxes, buf| {
                Box::pin(algorithms::barrier(wire, inboxes, &comm.all_ranks, buf))
            },
        )
        .await
    }

    /// Marks this communicator failed and tells every peer to abort (best effort, bounded by
    /// about a second): down a binomial tree rooted at this rank, each peer forwarding to its
    /// children (see `abort`); a restart of the job may succeed.
    pub async fn abort(&self, reason: &str) {
        self.abort_as(reason, false).await;
    }

    /// Like [`Communicator::abort`] for a failure no restart can fix (a bad spec): every peer
    /// fails permanently too ([`CollectiveError::AbortedByPeer`] with `permanent`), even one that
    /// had not yet seen the data that would have shown it the same failure.
    pub async fn abort_permanently(&self, reason: &str) {
        self.abort_as(reason, true).await;
    }

    async fn abort_as(&self, reason: &str, permanent: bool) {
        self.fail.fail(CollectiveError::Aborted {
            reason: reason.to_string(),
        });
        self.tell_peers_to_abort(reason, permanent).await;
    }

    /// The error that failed this communicator (an abort, a lost peer, a timeout), if one did.
    pub fn failure(&self) -> Option<CollectiveError> {
        self.fail.current()
    }

    /// Stops receiving, closes the streams to peers and waits (bounded) until every peer has
    /// taken them in full, then stops the servers. Call after a final barrier so no peer still
    /// needs data from this rank.
    pub async fn shutdown(mut self) {
        let grace = SHUTDOWN_GRACE.min(self.cfg.timeout);
        // Stop receiving first: peers' streams to this rank complete, so their shutdowns,
        // which wait for their streams to be taken in full, do not wait on ours.
        self.ops.get_mut().inboxes.clear();
        let flushing: Vec<JoinHandle<()>> = self.links.take().map(Links::close).unwrap_or_default();
        for task in flushing {
            if tokio::time::timeout(grace, task).await.is_err() {
                tracing::debug!(parent: &self.span, "a link did not close in time");
            }
        }
        self.shutdown.send_replace(true);
        for mut task in std::mem::take(&mut self.servers) {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
            }
        }
        tracing::info!(parent: &self.span, "communicator shut down");
    }

    fn choose(&self, algorithm: Algorithm, bytes: usize) -> ChosenAlgorithm {
        ChosenAlgorithm::choose(
            algorithm,
            bytes,
            self.cfg.world_size as usize,
            &self.node_groups,
        )
    }

    /// Runs one collective: serialized with the others, numbered, bounded by the timeout; a
    /// failure latches and is announced to the peers.
    async fn run<C, F>(
        &self,
        op: &'static str,
        compression: Compression,
        buf: &mut [f32],
        check: C,
        body: F,
    ) -> Result<(), CollectiveError>
    where
        C: FnOnce(&[f32]) -> Result<(), CollectiveError>,
        F: for<'a> FnOnce(
            &'a Communicator,
            &'a Wire<'a>,
            &'a mut [Option<Inbox>],
            &'a mut [f32],
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), CollectiveError>> + Send + 'a>,
        >,
    {
        check(buf)?;
        if let Some(error) = self.fail.current() {
            return Err(error);
        }
        if self.cfg.world_size == 1 {
            return Ok(());
        }
        let Some(links) = &self.links else {
            return Err(CollectiveError::Aborted {
                reason: "communicator is not connected".into(),
            });
        };
        let mut state = self.ops.lock().await;
        let op_id = state.next_op_id;
        state.next_op_id += 1;
        let wire = Wire {
            me: self.cfg.rank,
            op,
            op_id,
            generation: self.cfg.identity.generation,
            deadline: Instant::now() + self.cfg.timeout,
            timeout: self.cfg.timeout,
            chunk_elems: self.cfg.chunk_elems(),
            mode: ReceiveMode {
                compression,
                spin: self.spin,
                in_place: false,
            },
            fail: &self.fail,
            links,
        };
        let result = wire
            .bounded(body(self, &wire, &mut state.inboxes, buf))
            .instrument(tracing::debug_span!(parent: &self.span, "op", op, op_id))
            .await;
        drop(state);
        if let Err(error) = &result {
            let first = self.fail.fail(error.clone());
            let from_peer = matches!(error, CollectiveError::AbortedByPeer { .. });
            tracing::warn!(parent: &self.span, op, op_id, error = %rdu_error_chain::Chain(error), "collective failed");
            if first && !from_peer {
                self.tell_peers_to_abort(&rdu_error_chain::chain(error), !error.is_retryable())
                    .await;
            }
            return Err(self.fail.current().unwrap_or_else(|| error.clone()));
        }
        Ok(())
    }

    async fn tell_peers_to_abort(&self, reason: &str, permanent: bool) {
        let Some(tree) = &self.aborts else {
            return;
        };
        let request = proto::AbortRequest {
            generation: self.cfg.identity.generation,
            from_rank: self.cfg.rank,
            reason: reason.to_string(),
            permanent,
        };
        tree.spread(request).instrument(self.span.clone()).await;
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

/// `buf[i] / n` for every value: by the reciprocal when `n` is a power of two (then `x * (1/n)` is
/// exactly `x / n`, and a multiply costs a fraction of a divide), by division otherwise.
fn divide_by_world_size(buf: &mut [f32], world_size: u32) {
    if world_size <= 1 {
        return;
    }
    let n = world_size as f32;
    if world_size.is_power_of_two() {
        let reciprocal = 1.0 / n;
        buf.iter_mut().for_each(|v| *v *= reciprocal);
    } else {
        buf.iter_mut().for_each(|v| *v /= n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_divides_exactly_as_division_does_for_every_world_size() {
        let mut x = 0x1234_5678u32;
        let values: Vec<f32> = (0..50_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f32::from_bits(x)
            })
            .chain([f32::MIN_POSITIVE / 3.0, 1.0e-45, -0.0, f32::MAX])
            .collect();
        for world_size in 1..=9u32 {
            let mut got = values.clone();
            divide_by_world_size(&mut got, world_size);
            for (g, v) in got.iter().zip(&values) {
                let want = v / world_size as f32;
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{v:e} / {world_size}: {g:e} != {want:e}"
                );
            }
        }
    }
}
