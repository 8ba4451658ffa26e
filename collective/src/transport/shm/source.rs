//! The receiving side of a shared-memory ring: frames taken from the ring straight into the
//! values they update, the data stream that admitted the ring waking this rank and telling it
//! when the sender is gone.

use tokio::net::TcpStream;

use super::ring::RingReader;
use crate::kernels::Apply;
use crate::transport::frame::{ChunkId, InboxError, ReceiveMode};

/// An admitted data stream whose sender shares a ring with this rank.
pub(crate) struct ShmSource {
    stream: TcpStream,
    ring: RingReader,
}

impl ShmSource {
    /// A data stream whose hello is done, with the ring its sender offered and this rank took.
    pub(crate) fn new(stream: TcpStream, ring: RingReader) -> Self {
        ShmSource { stream, ring }
    }

    /// Takes the next frame from the ring, which must be `expected` with `dst.len()` values,
    /// and applies it to `dst` (the stream's generation was checked by its hello).
    pub(crate) async fn receive(
        &mut self,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), InboxError> {
        self.ring
            .receive(&self.stream, expected, dst, apply, mode)
            .await
    }
}
