//! How chunks travel between ranks, laid out as Gloo's transports: one interface here ([`Link`]
//! to send to a peer, `Inbox` to receive from one), each implementation beside the others.
//! One long-lived stream per directed pair of ranks, so a peer's chunks arrive in the order it
//! sent them.
//!
//! - `frame`: the chunk frame and its checks, which every transport shares;
//! - `tcp`: the default data path, raw TCP frames written from and read into the caller's values;
//! - `shm`: shared-memory rings between ranks on one host, woken through their data stream;
//! - `grpc`: chunks as `Send` streams of the `Collective` service (see its docs for why they are
//!   kept);
//! - `hello` and `dial`: how a data stream starts, and which link (TCP or ring) it becomes;
//!   `links`: each peer's link, dialled when first used;
//! - `port` and `service`: the receiving side of the collective port (data streams, and the
//!   gRPC service with aborts), which `router` hands to each peer's `inbox`.

mod dial;
mod frame;
mod grpc;
mod hello;
mod inbox;
mod links;
mod port;
mod router;
mod service;
mod shm;
mod stream;
mod tcp;
#[cfg(test)]
mod tests;

pub use grpc::{FROM_RANK, GENERATION};

pub use links::RingMemoryUse;
pub use shm::SEGMENT_BYTES as RING_SEGMENT_BYTES;

pub(crate) use frame::{ChunkId, InboxError, ReceiveMode};
pub(crate) use inbox::Inbox;
pub(crate) use links::{LinkSettings, Links};
pub(crate) use port::{DataPort, demux};
pub(crate) use router::InboundRouter;
pub(crate) use service::CollectiveService;
pub(crate) use shm::RingMaker;

use tokio::task::JoinHandle;

use crate::compression::Compression;
use crate::error::CollectiveError;
use grpc::GrpcLink;
use shm::ShmLink;
use tcp::TcpLink;

/// This rank's outgoing stream to one peer.
pub(crate) enum Link {
    /// A TCP data stream written directly from the caller's buffer.
    Tcp(TcpLink),
    /// A shared-memory ring, beside the data stream that admitted it.
    Shm(ShmLink),
    /// A gRPC `Send` stream fed through a queue.
    Grpc(GrpcLink),
}

impl Link {
    /// Sends one chunk of `values`, compressed values rounded in place first (so this rank
    /// keeps exactly what the peer decodes); returns once the stream took it (the caller may
    /// then change `values`). Fails when the stream to the peer is gone.
    pub(crate) async fn send(
        &self,
        id: ChunkId,
        values: &mut [f32],
        compression: Compression,
    ) -> Result<(), CollectiveError> {
        match self {
            Link::Tcp(link) => link.send(id, values, compression).await,
            Link::Shm(link) => link.send(id, values, compression).await,
            Link::Grpc(link) => link.send(id, values, compression).await,
        }
    }

    /// Whether chunks go through a shared-memory ring (see `shm`).
    pub(crate) fn shares_memory(&self) -> bool {
        matches!(self, Link::Shm(_))
    }

    /// Ends the stream after everything sent; the handle finishes when the peer has taken it
    /// all and let go of it.
    pub(crate) fn close(self) -> JoinHandle<()> {
        match self {
            Link::Tcp(link) => link.close(),
            Link::Shm(link) => link.close(),
            Link::Grpc(link) => link.close(),
        }
    }
}
