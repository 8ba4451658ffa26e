//! A `Link` is this rank's outgoing stream to one peer: either a TCP data stream written
//! directly from the caller's buffer, or a gRPC `Send` stream fed through a queue.

pub(crate) mod grpc;
pub(crate) mod inbox;
pub(crate) mod tcp;

pub use grpc::{FROM_RANK, GENERATION};

use std::sync::{Arc, Mutex};

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Request;
use tracing::Instrument;

use crate::auth::AttachToken;
use crate::error::CollectiveError;
use crate::kernels::{BufferPool, le_bytes};
use crate::proto;
use crate::proto::collective_client::CollectiveClient;
use crate::transport::tcp::framing::ChunkHeader;

/// Chunks queued per gRPC link before the sender waits (on top of the HTTP/2 window).
const LINK_QUEUE: usize = 4;

/// Which chunk a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkId {
    pub(crate) op_id: u64,
    pub(crate) phase: u32,
    pub(crate) segment: u32,
    pub(crate) chunk: u32,
}

/// This rank's outgoing stream to one peer.
pub(crate) struct Link {
    pub(crate) peer: u32,
    kind: Kind,
}

enum Kind {
    /// Frames written to the socket by the sending collective itself, from its buffer.
    Direct {
        write: tokio::sync::Mutex<OwnedWriteHalf>,
        read: OwnedReadHalf,
        broken: Mutex<Option<String>>,
    },
    /// Encoded chunks queued for a task that streams them.
    Queued {
        generation: u64,
        tx: mpsc::Sender<proto::Chunk>,
        pool: Arc<BufferPool>,
        closed_reason: Arc<Mutex<Option<String>>>,
        task: JoinHandle<()>,
    },
}

impl Link {
    /// A link on an admitted TCP data stream (the hello is done).
    pub(crate) fn direct(peer: u32, stream: TcpStream) -> Link {
        let (read, write) = stream.into_split();
        Link {
            peer,
            kind: Kind::Direct {
                write: tokio::sync::Mutex::new(write),
                read,
                broken: Mutex::new(None),
            },
        }
    }

    /// Opens a gRPC `Send` stream on an already connected channel.
    pub(crate) fn open_grpc(
        me: u32,
        peer: u32,
        generation: u64,
        channel: tonic::transport::Channel,
        token: &AttachToken,
        max_message: usize,
        pool: Arc<BufferPool>,
    ) -> Link {
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
        Link {
            peer,
            kind: Kind::Queued {
                generation,
                tx,
                pool,
                closed_reason,
                task,
            },
        }
    }

    /// Sends one chunk of `values`; returns once the stream took it (the caller may then
    /// change `values`). Fails when the stream to the peer is gone.
    pub(crate) async fn send(&self, id: ChunkId, values: &[f32]) -> Result<(), CollectiveError> {
        match &self.kind {
            Kind::Direct { write, broken, .. } => {
                if let Some(reason) = broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    return Err(self.lost(reason));
                }
                let bytes = le_bytes(values);
                let len = u32::try_from(bytes.len()).map_err(|_| {
                    CollectiveError::invalid_config("chunk_bytes", "chunk does not fit 32 bits")
                })?;
                let header = ChunkHeader {
                    op_id: id.op_id,
                    phase: id.phase,
                    segment: id.segment,
                    chunk: id.chunk,
                    len,
                }
                .encode();
                let mut frame = Buf::chain(&header[..], &bytes[..]);
                // A write cancelled half-way (timeout, abort) leaves a torn frame: the stream
                // is unusable from then on, which the failure latch already implies.
                let mut socket = write.lock().await;
                socket.write_all_buf(&mut frame).await.map_err(|e| {
                    let reason = format!("sending to the peer failed: {e}");
                    *broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
                    self.lost(reason)
                })
            }
            Kind::Queued {
                generation,
                tx,
                pool,
                closed_reason,
                ..
            } => {
                let message = proto::Chunk {
                    generation: *generation,
                    op_id: id.op_id,
                    phase: id.phase,
                    segment: id.segment,
                    chunk: id.chunk,
                    payload: pool.encode(values),
                };
                tx.send(message).await.map_err(|_| {
                    let reason = closed_reason
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone()
                        .unwrap_or_else(|| "stream to peer closed".into());
                    self.lost(reason)
                })
            }
        }
    }

    fn lost(&self, reason: String) -> CollectiveError {
        CollectiveError::PeerLost {
            rank: self.peer,
            reason,
        }
    }

    /// Ends the stream after everything sent; the handle finishes when the peer has taken it
    /// all and let go of it.
    pub(crate) fn close(self) -> JoinHandle<()> {
        match self.kind {
            Kind::Queued { tx, task, .. } => {
                drop(tx);
                task
            }
            Kind::Direct {
                write, mut read, ..
            } => tokio::spawn(async move {
                let mut write = write.into_inner();
                if write.shutdown().await.is_err() {
                    return;
                }
                // The peer closes its side once its inbox let go of the stream.
                let mut scratch = [0u8; 64];
                while let Ok(n) = read.read(&mut scratch).await {
                    if n == 0 {
                        break;
                    }
                }
            }),
        }
    }
}
