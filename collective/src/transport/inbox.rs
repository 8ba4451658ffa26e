//! Receiving one peer's chunks, whichever transport they come on: the peer's stream, handed over
//! by the router once admitted, and read by the collective that expects the next chunk, straight
//! into the values it updates. Each received chunk must be exactly the expected one: same
//! operation, phase, segment, chunk and length.

use std::time::Duration;

use tokio::sync::oneshot;

use crate::compression::Compression;
use crate::transport::ChunkId;
use crate::transport::grpc::GrpcSource;
use crate::transport::tcp::TcpSource;
use crate::transport::tcp::framing::{ChunkHeader, HEADER_LEN};

/// What a received chunk does to the values it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Apply {
    /// `dst[i] += received[i]` (reduce).
    Add,
    /// `dst[i] = received[i]` (gather, broadcast).
    Copy,
}

/// How a collective receives: the encoding its values travel in, and how long a small frame is
/// polled for before the task parks (see `spin`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReceiveMode {
    pub(crate) compression: Compression,
    pub(crate) spin: Option<Duration>,
}

/// Why reading from a peer failed.
#[derive(Debug)]
pub(crate) enum InboxError {
    /// The stream broke or ended (peer gone).
    Lost(String),
    /// The peer sent something it must not.
    Violation(String),
}

/// A peer's incoming stream, handed by a server to the receiving side. Dropping it lets the
/// gRPC server answer the call, or closes the TCP data stream.
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
}

impl Handoff {
    /// An admitted TCP data stream (its hello is done).
    pub(crate) fn tcp(source: TcpSource) -> Self {
        Handoff {
            source: Source::Tcp(source),
            received: 0,
            done: None,
        }
    }

    /// A gRPC `Send` stream; `done` learns how many chunks were taken when this is dropped.
    pub(crate) fn grpc(source: GrpcSource, done: oneshot::Sender<u64>) -> Self {
        Handoff {
            source: Source::Grpc(source),
            received: 0,
            done: Some(done),
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

/// The peer's stream ended where a chunk was expected.
pub(super) fn ended() -> InboxError {
    InboxError::Lost("its stream to this rank ended".into())
}

/// The frame's header must name `expected` with `payload` bytes.
pub(super) fn check_header(
    header: &[u8; HEADER_LEN],
    expected: ChunkId,
    payload: usize,
) -> Result<(), InboxError> {
    let header = ChunkHeader::decode(header);
    let got = ChunkId {
        op_id: header.op_id,
        phase: header.phase,
        segment: header.segment,
        chunk: header.chunk,
    };
    check(expected, got, header.len as usize, payload)
}

/// The chunk that arrived must be the one expected, with `expected_bytes` of payload (one
/// encoded value per destination slot).
pub(super) fn check(
    expected: ChunkId,
    got: ChunkId,
    bytes: usize,
    expected_bytes: usize,
) -> Result<(), InboxError> {
    if got != expected {
        let tuple = |id: ChunkId| (id.op_id, id.phase, id.segment, id.chunk);
        return Err(InboxError::Violation(format!(
            "expected (op, phase, segment, chunk) {:?}, got {:?}; ranks disagree on the sequence of collectives",
            tuple(expected),
            tuple(got)
        )));
    }
    if bytes != expected_bytes {
        return Err(InboxError::Violation(format!(
            "chunk of {bytes} bytes where {expected_bytes} were expected; ranks disagree on the buffer length or on the compression"
        )));
    }
    Ok(())
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
