//! The links a rank sends on: one per peer, each dialled the first time a collective sends to
//! that peer (as Open MPI connects lazily), so a rank holds data streams, and rings, only to the
//! peers its algorithms exchange with: its two neighbours for the ring, log2(n) partners for
//! recursive doubling, every rank for the root of the star (barriers and broadcasts).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::auth::AttachToken;
use crate::config::{DataPath, PeerInfo};
use crate::error::CollectiveError;
use crate::kernels::BufferPool;
use crate::net;
use crate::transport::Link;
use crate::transport::dial::{RingChoice, open_link};
use crate::transport::grpc::GrpcLink;
use crate::transport::shm::RingMaker;

/// How this rank dials its peers.
pub(crate) struct LinkSettings {
    pub(crate) me: u32,
    pub(crate) generation: u64,
    pub(crate) token: String,
    pub(crate) attach: AttachToken,
    pub(crate) data_path: DataPath,
    /// This rank's node: rings only to peers on it.
    pub(crate) node: String,
    /// How long a full ring is polled before its sender sleeps.
    pub(crate) spin: Option<Duration>,
    /// Largest gRPC message (gRPC links).
    pub(crate) max_message: usize,
    /// Bound on dialling a gRPC channel.
    pub(crate) timeout: Duration,
    pub(crate) span: tracing::Span,
}

/// This rank's link to each peer, open or not yet.
pub(crate) struct Links {
    settings: LinkSettings,
    peers: Vec<PeerInfo>,
    slots: Vec<OnceCell<Link>>,
    /// Makes this rank's rings (`DataPath::Auto` only).
    rings: Option<RingMaker>,
    pool: Arc<BufferPool>,
}

/// Shared memory this rank's rings hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingMemoryUse {
    /// Bytes held now.
    pub bytes: u64,
    /// The most held at once.
    pub peak_bytes: u64,
}

impl Links {
    /// Links to `peers` (every rank, ordered by rank), none open yet.
    pub(crate) fn new(
        settings: LinkSettings,
        peers: Vec<PeerInfo>,
        rings: Option<RingMaker>,
        pool: Arc<BufferPool>,
    ) -> Links {
        let slots = peers.iter().map(|_| OnceCell::new()).collect();
        Links {
            settings,
            peers,
            slots,
            rings,
            pool,
        }
    }

    /// The link to `peer`, dialled now if it is not open yet (by `deadline`).
    pub(crate) async fn to(&self, peer: u32, deadline: Instant) -> Result<&Link, CollectiveError> {
        let slot = self
            .slots
            .get(peer as usize)
            .filter(|_| peer != self.settings.me)
            .ok_or_else(|| CollectiveError::PeerLost {
                rank: peer,
                reason: "no link to this rank".into(),
            })?;
        slot.get_or_try_init(|| self.dial(&self.peers[peer as usize], deadline))
            .await
    }

    async fn dial(&self, peer: &PeerInfo, deadline: Instant) -> Result<Link, CollectiveError> {
        let s = &self.settings;
        let link = match s.data_path {
            DataPath::Auto | DataPath::Tcp => {
                // Rings only to peers on this rank's node (NODE_NAME): others cannot share.
                let ring = RingChoice {
                    maker: self.rings.as_ref().filter(|_| peer.node == s.node),
                    spin: s.spin,
                };
                open_link(
                    s.me,
                    peer.rank,
                    s.generation,
                    &peer.address,
                    &s.token,
                    deadline,
                    ring,
                )
                .instrument(s.span.clone())
                .await?
            }
            DataPath::Grpc => {
                let channel = net::dial_until(&peer.address, deadline, s.timeout)
                    .await
                    .map_err(|reason| CollectiveError::PeerLost {
                        rank: peer.rank,
                        reason,
                    })?;
                let _entered = s.span.enter();
                Link::Grpc(GrpcLink::open(
                    s.me,
                    peer.rank,
                    s.generation,
                    channel,
                    &s.attach,
                    s.max_message,
                    self.pool.clone(),
                ))
            }
        };
        tracing::debug!(parent: &s.span, peer = peer.rank, shared_memory = link.shares_memory(), "link open");
        Ok(link)
    }

    /// The peers this rank has opened a link to, ascending.
    pub(crate) fn open_peers(&self) -> Vec<u32> {
        self.ranks_where(|_| true)
    }

    /// The peers this rank sends to through a shared-memory ring, ascending.
    pub(crate) fn shared_memory_peers(&self) -> Vec<u32> {
        self.ranks_where(Link::shares_memory)
    }

    fn ranks_where(&self, keep: impl Fn(&Link) -> bool) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.get().is_some_and(&keep))
            .map(|(rank, _)| rank as u32)
            .collect()
    }

    /// What this rank's rings hold.
    pub(crate) fn ring_memory(&self) -> RingMemoryUse {
        self.rings
            .as_ref()
            .map(|maker| RingMemoryUse {
                bytes: maker.held_bytes(),
                peak_bytes: maker.peak_bytes(),
            })
            .unwrap_or_default()
    }

    /// Closes every open link after everything sent; each handle finishes when its peer has
    /// taken it all and let go of it.
    pub(crate) fn close(self) -> Vec<JoinHandle<()>> {
        self.slots
            .into_iter()
            .filter_map(OnceCell::into_inner)
            .map(Link::close)
            .collect()
    }
}
