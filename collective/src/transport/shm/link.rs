//! The sending side of a shared-memory ring: a link that copies chunk frames from the caller's
//! buffer into the ring, its data stream only ringing the receiver awake and telling each end
//! when the other is gone.

use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::task::JoinHandle;

use super::bell::LinkBell;
use super::ring::{RingWriter, WriteError};
use crate::compression::Compression;
use crate::error::CollectiveError;
use crate::transport::frame::{ChunkHeader, ChunkId};
use crate::transport::stream::StreamEnd;

/// This rank's ring to one peer on its host, beside the data stream that admitted it.
pub(crate) struct ShmLink {
    end: StreamEnd,
    write: tokio::sync::Mutex<Outgoing>,
}

/// What sending a frame uses, one frame at a time.
struct Outgoing {
    ring: RingWriter,
    /// The stream's write half: only ever a bell.
    bell: OwnedWriteHalf,
    /// The buffer compressed chunks are encoded into.
    encoded: Vec<u8>,
}

impl ShmLink {
    /// A link on an admitted data stream whose peer took `ring`.
    pub(crate) fn new(peer: u32, stream: TcpStream, ring: RingWriter) -> ShmLink {
        let (read, bell) = stream.into_split();
        ShmLink {
            end: StreamEnd::new(peer, read),
            write: tokio::sync::Mutex::new(Outgoing {
                ring,
                bell,
                encoded: Vec::new(),
            }),
        }
    }

    /// Copies one chunk of `values` into the ring (f32 straight from them; compressed, rounded
    /// in place and encoded first); returns once all of it is in the ring (the caller may then
    /// change `values`). Fails when the peer is gone or broke the ring's protocol.
    pub(crate) async fn send(
        &self,
        id: ChunkId,
        values: &mut [f32],
        compression: Compression,
    ) -> Result<(), CollectiveError> {
        self.end.check_open()?;
        let mut guard = self.write.lock().await;
        let Outgoing {
            ring,
            bell,
            encoded,
        } = &mut *guard;
        let bytes = compression.wire_bytes(values, encoded);
        let header = ChunkHeader::of(id, bytes.len())?.encode();
        let bell = LinkBell {
            read: &self.end.read,
            write: bell,
        };
        // A write cancelled half-way (timeout, abort) leaves a torn frame: the ring is
        // unusable from then on, which the failure latch already implies.
        ring.write_frame(&bell, &header, &bytes)
            .await
            .map_err(|e| match e {
                WriteError::Lost(reason) => self.end.break_off(reason),
                WriteError::Violation(reason) => self.end.violation(reason),
            })
    }

    /// Shuts the stream down after everything sent; the handle finishes when the peer has
    /// taken it all and let go of it.
    pub(crate) fn close(self) -> JoinHandle<()> {
        self.end.close(self.write.into_inner().bell)
    }
}
