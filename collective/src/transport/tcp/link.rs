//! The sending side of the TCP data path: dialling a peer's data port, the hello (offering a
//! shared-memory ring when this rank can make one), and the link that writes chunk frames
//! straight from the caller's buffer to the socket, or into the ring when the peer took it.

use std::borrow::Cow;
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Buf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Code;

use super::framing::{self, ChunkHeader, REPLY_FIXED};
use crate::compression::Compression;
use crate::error::CollectiveError;
use crate::kernels::le_bytes;
use crate::transport::shm::bell::LinkBell;
use crate::transport::shm::{RING_BYTES, RingWriter, Segment, WriteError};
use crate::transport::{ChunkId, Link};

/// This rank's data stream to one peer: frames written to the socket (or the ring) by the
/// sending collective itself, from its buffer.
pub(crate) struct TcpLink {
    peer: u32,
    write: tokio::sync::Mutex<Outgoing>,
    /// Where the peer's rings arrive (and, at the end, its close).
    read: OwnedReadHalf,
    broken: Mutex<Option<String>>,
    /// Whether `write` holds a ring: kept apart so asking needs no lock on the async mutex.
    shares_memory: bool,
}

/// What sending a frame uses, one frame at a time.
struct Outgoing {
    socket: OwnedWriteHalf,
    /// The buffer compressed chunks are encoded into.
    encoded: Vec<u8>,
    /// Frames go here instead of the socket when the peer took the ring.
    ring: Option<RingWriter>,
}

impl TcpLink {
    /// A link on an admitted TCP data stream (the hello is done), sending through `ring` if the
    /// peer took it.
    pub(crate) fn new(peer: u32, stream: TcpStream, ring: Option<RingWriter>) -> TcpLink {
        let (read, socket) = stream.into_split();
        TcpLink {
            peer,
            shares_memory: ring.is_some(),
            write: tokio::sync::Mutex::new(Outgoing {
                socket,
                encoded: Vec::new(),
                ring,
            }),
            read,
            broken: Mutex::new(None),
        }
    }

    /// Whether frames go through a shared-memory ring.
    pub(crate) fn shares_memory(&self) -> bool {
        self.shares_memory
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
        if let Some(reason) = self
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(self.lost(reason));
        }
        let mut guard = self.write.lock().await;
        let Outgoing {
            socket,
            encoded,
            ring,
        } = &mut *guard;
        let bytes = match compression {
            Compression::None => le_bytes(values),
            _ => {
                encoded.clear();
                compression.round_and_encode(values, encoded);
                Cow::Borrowed(&encoded[..])
            }
        };
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
        // A write cancelled half-way (timeout, abort) leaves a torn frame: the stream
        // is unusable from then on, which the failure latch already implies.
        if let Some(ring) = ring {
            let bell = LinkBell {
                read: &self.read,
                write: socket,
            };
            return ring
                .write_frame(&bell, &header, &bytes)
                .await
                .map_err(|e| match e {
                    WriteError::Lost(reason) => self.break_off(reason),
                    WriteError::Violation(reason) => CollectiveError::Protocol {
                        rank: self.peer,
                        reason,
                    },
                });
        }
        let mut frame = Buf::chain(&header[..], &bytes[..]);
        socket
            .write_all_buf(&mut frame)
            .await
            .map_err(|e| self.break_off(format!("sending to the peer failed: {e}")))
    }

    /// Marks the link broken for `reason`; the error to return.
    fn break_off(&self, reason: String) -> CollectiveError {
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
        self.lost(reason)
    }

    fn lost(&self, reason: String) -> CollectiveError {
        CollectiveError::PeerLost {
            rank: self.peer,
            reason,
        }
    }

    /// Shuts the stream down after everything sent; the handle finishes when the peer has
    /// taken it all and let go of it.
    pub(crate) fn close(self) -> JoinHandle<()> {
        let TcpLink {
            write, mut read, ..
        } = self;
        tokio::spawn(async move {
            let mut write = write.into_inner().socket;
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
        })
    }
}

/// Where and how a link may share memory with its peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingChoice<'a> {
    /// Directory rings are made in; `None` keeps frames on TCP.
    pub(crate) dir: Option<&'a Path>,
    /// How long a full ring is polled before the sender sleeps.
    pub(crate) spin: Option<Duration>,
}

/// Connects to `peer`'s data port at `address` and introduces this rank, offering a ring in
/// `ring.dir`; the link then streams chunks until closed, through the ring if the peer took it.
pub(crate) async fn open_link(
    me: u32,
    peer: u32,
    generation: u64,
    address: &str,
    token: &str,
    deadline: Instant,
    ring: RingChoice<'_>,
) -> Result<Link, CollectiveError> {
    let lost = |reason: String| CollectiveError::PeerLost { rank: peer, reason };
    let offered = ring
        .dir
        .and_then(|dir| match Segment::create(dir, RING_BYTES) {
            Ok(made) => Some(made),
            Err(error) => {
                tracing::debug!(%error, "no ring to offer; frames stay on TCP");
                None
            }
        });
    let hello = framing::encode_hello(me, generation, token, offered.as_ref().map(|o| &o.1))
        .map_err(|e| CollectiveError::invalid_config("identity.token", e.to_string()))?;
    let mut stream = connect_until(address, deadline).await.map_err(lost)?;
    let handshake = async {
        stream.write_all(&hello).await?;
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await?;
        let reply = framing::decode_reply(&fixed)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut message = vec![0u8; reply.message_len];
        stream.read_exact(&mut message).await?;
        Ok::<_, io::Error>((reply, String::from_utf8_lossy(&message).into_owned()))
    };
    let (reply, message) = tokio::time::timeout_at(deadline, handshake)
        .await
        .map_err(|_| {
            lost(format!(
                "{address} did not answer the data-stream hello in time"
            ))
        })?
        .map_err(|e| lost(format!("data-stream hello to {address} failed: {e}")))?;
    // The peer has mapped the segment or never will: its file goes (dropped with `offered`).
    let code = reply.code;
    match code {
        Code::Ok => {
            let ring = match (reply.took_ring, offered) {
                (false, _) => None,
                (true, Some((segment, _, _file))) => Some(RingWriter::new(segment, ring.spin)),
                (true, None) => {
                    return Err(CollectiveError::Protocol {
                        rank: peer,
                        reason: "took a shared-memory ring this rank never offered".into(),
                    });
                }
            };
            Ok(Link::Tcp(TcpLink::new(peer, stream, ring)))
        }
        Code::Unauthenticated | Code::InvalidArgument | Code::PermissionDenied => {
            Err(CollectiveError::Protocol {
                rank: peer,
                reason: format!("refused this rank's data stream ({code:?}): {message}"),
            })
        }
        _ => Err(lost(format!(
            "refused this rank's data stream ({code:?}): {message}"
        ))),
    }
}

/// Connects, retrying refused connections until `deadline` (the peer may still be starting).
async fn connect_until(address: &str, deadline: Instant) -> Result<TcpStream, String> {
    let mut backoff = Duration::from_millis(10);
    loop {
        let error = match tokio::time::timeout_at(deadline, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connect did not finish in time".to_string(),
        };
        if Instant::now() + backoff >= deadline {
            return Err(format!("cannot connect to {address}: {error}"));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}
