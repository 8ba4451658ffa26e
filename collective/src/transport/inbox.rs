//! Receiving one peer's chunks, whichever transport they come on: the peer's stream, handed over
//! by the router once admitted, and read by the collective that expects the next chunk, straight
//! into the values it updates (the checks are `frame`'s).

use tokio::sync::oneshot;

use crate::kernels::Apply;
use crate::transport::frame::{ChunkId, InboxError, ReceiveMode};
use crate::transport::grpc::GrpcSource;
use crate::transport::shm::ShmSource;
use crate::transport::tcp::TcpSource;

/// A peer's incoming stream, handed by a server to the receiving side. Dropping it lets the
/// gRPC server answer the call, or closes the data stream.
pub(crate) struct Handoff {
    source: Source,
    received: u64,
    done: Option<oneshot::Sender<u64>>,
}

/// Where a peer's chunks come from.
enum Source {
    /// A gRPC `Send` stream.
    Grpc(GrpcSource),
    /// An admitted raw TCP data stream.
    Tcp(TcpSource),
    /// A shared-memory ring, beside the data stream that admitted it.
    Shm(ShmSource),
}

impl Handoff {
    /// An admitted TCP data stream (its hello is done).
    pub(crate) fn tcp(source: TcpSource) -> Self {
        Handoff::of(Source::Tcp(source), None)
    }

    /// An admitted data stream whose frames come through a ring.
    pub(crate) fn shm(source: ShmSource) -> Self {
        Handoff::of(Source::Shm(source), None)
    }

    /// A gRPC `Send` stream; `done` learns how many chunks were taken when this is dropped.
    pub(crate) fn grpc(source: GrpcSource, done: oneshot::Sender<u64>) -> Self {
        Handoff::of(Source::Grpc(source), Some(done))
    }

    fn of(source: Source, done: Option<oneshot::Sender<u64>>) -> Self {
        Handoff {
            source,
            received: 0,
            done,
        }
    }

    async fn receive(
        &mut self,
        generation: u64,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), InboxError> {
        match &mut self.source {
            Source::Grpc(stream) => {
                stream
                    .receive(generation, expected, dst, apply, mode.compression)
                    .await?
            }
            Source::Tcp(stream) => stream.receive(expected, dst, apply, mode).await?,
            Source::Shm(ring) => ring.receive(expected, dst, apply, mode).await?,
        }
        self.received += 1;
        Ok(())
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(self.received);
        }
    }
}

/// The receiving end of one peer's stream: waiting for the peer to open it, then open.
pub(crate) enum Inbox {
    Waiting(oneshot::Receiver<Handoff>),
    Open(Box<Handoff>),
    Closed(String),
}

impl Inbox {
    /// Receives the next chunk of this peer's stream, which must be `expected` with
    /// `dst.len()` values of this rank's `generation`, and applies it to `dst`. After any
    /// error the inbox is closed: a half-read chunk leaves nothing usable behind it, and the
    /// collective that saw the error has failed. Not cancel safe for the same reason.
    pub(crate) async fn receive(
        &mut self,
        generation: u64,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), InboxError> {
        if let Inbox::Waiting(handoff) = self {
            *self = match handoff.await {
                Ok(h) => Inbox::Open(Box::new(h)),
                Err(_) => Inbox::Closed("this rank's server stopped".into()),
            };
        }
        let error = match self {
            Inbox::Open(handoff) => match handoff
                .receive(generation, expected, dst, apply, mode)
                .await
            {
                Ok(()) => return Ok(()),
                Err(error) => error,
            },
            Inbox::Closed(reason) => return Err(InboxError::Lost(reason.clone())),
            Inbox::Waiting(_) => InboxError::Lost("stream not open".into()),
        };
        *self = Inbox::Closed(match &error {
            InboxError::Lost(reason) => reason.clone(),
            InboxError::Violation(_) => "it broke the protocol".into(),
        });
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::transport::frame::ChunkHeader;

    const GENERATION: u64 = 3;

    fn id(chunk: u32) -> ChunkId {
        ChunkId {
            op_id: 9,
            phase: 16,
            segment: 1,
            chunk,
        }
    }

    /// An open inbox reading a TCP stream, and the peer's end of that stream.
    async fn connected() -> (Inbox, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mine, _) = listener.accept().await.unwrap();
        let handoff = Handoff::tcp(TcpSource::new(mine));
        (Inbox::Open(Box::new(handoff)), peer)
    }

    async fn take(inbox: &mut Inbox, chunk: u32, values: &mut [f32]) -> Result<(), InboxError> {
        inbox
            .receive(
                GENERATION,
                id(chunk),
                values,
                Apply::Add,
                ReceiveMode::default(),
            )
            .await
    }

    /// Chunk `chunk`'s frame of one f32.
    fn frame(chunk: u32) -> Vec<u8> {
        let header = ChunkHeader::of(id(chunk), 4).unwrap().encode();
        header.into_iter().chain(1.5f32.to_le_bytes()).collect()
    }

    #[tokio::test]
    async fn a_lost_stream_stays_closed_for_the_same_reason() {
        let (mut inbox, mut peer) = connected().await;
        let whole = frame(0);
        peer.write_all(&whole[..whole.len() - 2]).await.unwrap();
        drop(peer);
        let mut values = [0f32];
        let error = take(&mut inbox, 0, &mut values).await;
        assert!(matches!(error, Err(InboxError::Lost(r)) if r.contains("inside a chunk")));
        let again = take(&mut inbox, 0, &mut values).await;
        assert!(matches!(again, Err(InboxError::Lost(r)) if r.contains("inside a chunk")));
    }

    #[tokio::test]
    async fn a_violation_closes_the_inbox_though_the_next_frame_would_fit() {
        let (mut inbox, mut peer) = connected().await;
        peer.write_all(&frame(5)).await.unwrap();
        peer.write_all(&frame(5)).await.unwrap();
        let mut values = [0f32];
        let error = take(&mut inbox, 4, &mut values).await;
        assert!(
            matches!(error, Err(InboxError::Violation(ref r)) if r.contains("sequence of collectives")),
            "{error:?}"
        );
        let again = take(&mut inbox, 5, &mut values).await;
        assert!(matches!(again, Err(InboxError::Lost(r)) if r.contains("broke the protocol")));
        assert_eq!(values, [0.0]);
    }

    #[tokio::test]
    async fn a_stream_that_never_opens_is_lost_once_its_server_stops() {
        let (handoff, waiting) = oneshot::channel::<Handoff>();
        let mut inbox = Inbox::Waiting(waiting);
        drop(handoff);
        let error = take(&mut inbox, 0, &mut [0f32]).await;
        assert!(matches!(error, Err(InboxError::Lost(r)) if r.contains("server stopped")));
    }
}
