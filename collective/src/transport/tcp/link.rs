//! The sending side of the TCP data path: a link that writes chunk frames straight from the
//! caller's buffer to the socket.

use bytes::Buf;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::task::JoinHandle;

use crate::compression::Compression;
use crate::error::CollectiveError;
use crate::transport::frame::{ChunkHeader, ChunkId};
use crate::transport::stream::StreamEnd;

/// This rank's data stream to one peer: frames written to the socket by the sending
/// collective itself, from its buffer.
pub(crate) struct TcpLink {
    end: StreamEnd,
    write: tokio::sync::Mutex<Outgoing>,
}

/// What sending a frame uses, one frame at a time.
struct Outgoing {
    socket: OwnedWriteHalf,
    /// The buffer compressed chunks are encoded into.
    encoded: Vec<u8>,
}

impl TcpLink {
    /// A link on an admitted TCP data stream (the hello is done).
    pub(crate) fn new(peer: u32, stream: TcpStream) -> TcpLink {
        let (read, socket) = stream.into_split();
        TcpLink {
            end: StreamEnd::new(peer, read),
            write: tokio::sync::Mutex::new(Outgoing {
                socket,
                encoded: Vec::new(),
            }),
        }
    }

    /// Writes one chunk of `values` (f32 straight from them; compressed, rounded in place and
    /// encoded first); returns once the socket took it (the caller may then change `values`).
    /// Fails when the stream to the peer is gone.
    pub(crate) async fn send(
        &self,
        id: ChunkId,
        values: &mut [f32],
        compression: Compression,
    ) -> Result<(), CollectiveError> {
        self.end.check_open()?;
        let mut guard = self.write.lock().await;
        let Outgoing { socket, encoded } = &mut *guard;
        let bytes = compression.wire_bytes(values, encoded);
        let header = ChunkHeader::of(id, bytes.len())?.encode();
        // A write cancelled half-way (timeout, abort) leaves a torn frame: the stream
        // is unusable from then on, which the failure latch already implies.
        let mut frame = Buf::chain(&header[..], &bytes[..]);
        socket.write_all_buf(&mut frame).await.map_err(|e| {
            self.end
                .break_off(format!("sending to the peer failed: {e}"))
        })
    }

    /// Shuts the stream down after everything sent; the handle finishes when the peer has
    /// taken it all and let go of it.
    pub(crate) fn close(self) -> JoinHandle<()> {
        self.end.close(self.write.into_inner().socket)
    }
}
