//! The gRPC transport: with [`DataPath::Grpc`](crate::DataPath::Grpc) chunks travel as
//! `Send` streams of the `Collective` service (`service` serves them), one per directed pair of
//! ranks: `GrpcLink` sends, `GrpcSource` receives.
//!
//! Why chunks can still travel on gRPC although the raw TCP path (`tcp`) is faster: every rank
//! serves `Send` anyway (it is part of the wire protocol, `proto/collective/v1`, and lets ranks on
//! different data paths talk), so keeping the sending side costs only `GrpcLink`, the send-buffer
//! pool (`kernels::BufferPool`) and `net::dial_until`. In exchange the tests run every algorithm
//! over a second transport and over a mix of the two, which keeps the algorithms independent of
//! how chunks travel, and `allreduce-bench --data-path grpc` measures what the TCP path gains
//! over tonic's copies. It is a test and comparison path, not a fallback: nothing in the
//! workspace selects it outside the tests and the bench.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Streaming};
use tracing::Instrument;

use crate::auth::AttachToken;
use crate::compression::Compression;
use crate::error::CollectiveError;
use crate::kernels::{Apply, BufferPool};
use crate::proto;
use crate::proto::collective_client::CollectiveClient;
use crate::transport::frame::{ChunkId, InboxError, check, ended};

/// Chunks queued per gRPC link before the sender waits (on top of the HTTP/2 window).
const LINK_QUEUE: usize = 4;

/// Metadata key naming the sending rank of a `Send` stream.
pub const FROM_RANK: &str = "x-rdu-from-rank";
/// Metadata key naming the generation of a `Send` stream.
pub const GENERATION: &str = "x-rdu-generation";

/// This rank's `Send` stream to one peer: encoded chunks queued for a task that streams them.
pub(crate) struct GrpcLink {
    peer: u32,
    generation: u64,
    tx: mpsc::Sender<proto::Chunk>,
    pool: Arc<BufferPool>,
    closed_reason: Arc<Mutex<Option<String>>>,
    task: JoinHandle<()>,
}

impl GrpcLink {
    /// Opens a gRPC `Send` stream on an already connected channel.
    pub(crate) fn open(
        me: u32,
        peer: u32,
        generation: u64,
        channel: tonic::transport::Channel,
        token: &AttachToken,
        max_message: usize,
        pool: Arc<BufferPool>,
    ) -> GrpcLink {
        let mut client = CollectiveClient::with_interceptor(channel, token.clone())
            .max_encoding_message_size(max_message)
            .max_decoding_message_size(max_message);
        let (tx, rx) = mpsc::channel(LINK_QUEUE);
        let closed_reason = Arc::new(Mutex::new(None));
        let reason_slot = closed_reason.clone();
        let span = tracing::debug_span!("link", rank = me, peer);
        let task = tokio::spawn(
            async move {
                let mut request = Request::new(ReceiverStream::new(rx));
                request.metadata_mut().insert(FROM_RANK, me.into());
                request.metadata_mut().insert(GENERATION, generation.into());
                let why = match client.send(request).await {
                    Ok(summary) => {
                        format!("stream closed after {} chunks", summary.get_ref().chunks)
                    }
                    Err(status) => format!("{:?}: {}", status.code(), status.message()),
                };
                tracing::debug!(%why, "link ended");
                *reason_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            }
            .instrument(span),
        );
        GrpcLink {
            peer,
            generation,
            tx,
            pool,
            closed_reason,
            task,
        }
    }

    /// Queues one chunk of `values` (encoded, so the caller may change `values` once this
    /// returns), rounded in place first when compressed. Fails when the stream to the peer is
    /// gone.
    pub(crate) async fn send(
        &self,
        id: ChunkId,
        values: &mut [f32],
        compression: Compression,
    ) -> Result<(), CollectiveError> {
        let payload = match compression {
            Compression::None => self.pool.encode(values),
            _ => {
                let mut out = self.pool.take(values.len() * compression.bytes_per_value());
                compression.round_and_encode(values, &mut out);
                self.pool.wrap(out)
            }
        };
        let message = proto::Chunk {
            generation: self.generation,
            op_id: id.op_id,
            phase: id.phase,
            segment: id.segment,
            chunk: id.chunk,
            payload,
        };
        self.tx.send(message).await.map_err(|_| {
            let reason = self
                .closed_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "stream to peer closed".into());
            CollectiveError::PeerLost {
                rank: self.peer,
                reason,
            }
        })
    }

    /// Ends the stream after everything queued; the handle finishes when the peer answered.
    pub(crate) fn close(self) -> JoinHandle<()> {
        drop(self.tx);
        self.task
    }
}

/// A peer's `Send` stream, read by the inbox it was handed to.
pub(crate) struct GrpcSource(Box<Streaming<proto::Chunk>>);

impl GrpcSource {
    pub(crate) fn new(stream: Streaming<proto::Chunk>) -> Self {
        GrpcSource(Box::new(stream))
    }

    /// Reads the next chunk, which must be `expected` of this rank's `generation` with
    /// `dst.len()` values, and applies it to `dst`.
    pub(crate) async fn receive(
        &mut self,
        generation: u64,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        compression: Compression,
    ) -> Result<(), InboxError> {
        let chunk = self
            .0
            .message()
            .await
            .map_err(|status| {
                InboxError::Lost(format!("{:?}: {}", status.code(), status.message()))
            })?
            .ok_or_else(ended)?;
        if chunk.generation != generation {
            return Err(InboxError::Violation(format!(
                "chunk of generation {} on a stream of generation {generation}",
                chunk.generation
            )));
        }
        let got = ChunkId {
            op_id: chunk.op_id,
            phase: chunk.phase,
            segment: chunk.segment,
            chunk: chunk.chunk,
        };
        let expected_bytes = dst.len() * compression.bytes_per_value();
        check(expected, got, chunk.payload.len(), expected_bytes)?;
        compression.decode_apply(dst, &chunk.payload, apply);
        Ok(())
    }
}
