//! How chunks travel between ranks. A rank sends to each peer on one [`Link`] and reads each
//! peer's stream from that peer's `inbox`; one long-lived stream per directed pair of ranks, so a
//! peer's chunks arrive in the order it sent them. The `router` hands each incoming stream to its
//! inbox. Two transports implement both ends, on the same collective port:
//!
//! - `tcp`: the default data path, raw TCP frames written from and read into the caller's values,
//!   or, between ranks on one host, through a shared-memory ring (`shm`) the TCP stream wakes;
//! - `grpc`: the `Collective` service (aborts; `Send` streams of chunks, see its docs for why
//!   they are kept).

pub(crate) mod grpc;
pub(crate) mod inbox;
pub(crate) mod router;
pub(crate) mod shm;
pub(crate) mod tcp;

pub use grpc::{FROM_RANK, GENERATION};

use tokio::task::JoinHandle;

use crate::compression::Compression;
use crate::error::CollectiveError;
use grpc::GrpcLink;
use tcp::TcpLink;

/// Which chunk a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkId {
    pub(crate) op_id: u64,
    pub(crate) phase: u32,
    pub(crate) segment: u32,
    pub(crate) chunk: u32,
}

/// This rank's outgoing stream to one peer.
pub(crate) enum Link {
    /// A TCP data stream written directly from the caller's buffer.
    Tcp(TcpLink),
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
            Link::Grpc(link) => link.send(id, values, compression).await,
        }
    }

    /// Whether chunks go through a shared-memory ring (see `shm`).
    pub(crate) fn shares_memory(&self) -> bool {
        match self {
            Link::Tcp(link) => link.shares_memory(),
            Link::Grpc(_) => false,
        }
    }

    /// Ends the stream after everything sent; the handle finishes when the peer has taken it
    /// all and let go of it.
    pub(crate) fn close(self) -> JoinHandle<()> {
        match self {
            Link::Tcp(link) => link.close(),
            Link::Grpc(link) => link.close(),
        }
    }
}
