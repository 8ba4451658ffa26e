//! The sending side of the TCP data path: dialling a peer's data port, the hello, and the link
//! that writes chunk frames straight from the caller's buffer to the socket.

use std::borrow::Cow;
use std::io;
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
use crate::transport::{ChunkId, Link};

/// This rank's data stream to one peer: frames written to the socket by the sending collective
/// itself, from its buffer.
pub(crate) struct TcpLink {
    peer: u32,
    /// The socket, and the buffer compressed chunks are encoded into.
    write: tokio::sync::Mutex<(OwnedWriteHalf, Vec<u8>)>,
    read: OwnedReadHalf,
    broken: Mutex<Option<String>>,
}

impl TcpLink {
    /// A link on an admitted TCP data stream (the hello is done).
    pub(crate) fn new(peer: u32, stream: TcpStream) -> TcpLink {
        let (read, write) = stream.into_split();
        TcpLink {
            peer,
            write: tokio::sync::Mutex::new((write, Vec::new())),
            read,
            broken: Mutex::new(None),
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
        if let Some(reason) = self
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(self.lost(reason));
        }
        let mut guard = self.write.lock().await;
        let (socket, encoded) = &mut *guard;
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
        let mut frame = Buf::chain(&header[..], &bytes[..]);
        // A write cancelled half-way (timeout, abort) leaves a torn frame: the stream
        // is unusable from then on, which the failure latch already implies.
        socket.write_all_buf(&mut frame).await.map_err(|e| {
            let reason = format!("sending to the peer failed: {e}");
            *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
            self.lost(reason)
        })
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
            let (mut write, _) = write.into_inner();
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

/// Connects to `peer`'s data port at `address` and introduces this rank; the link then
/// streams chunks until closed.
pub(crate) async fn open_link(
    me: u32,
    peer: u32,
    generation: u64,
    address: &str,
    token: &str,
    deadline: Instant,
) -> Result<Link, CollectiveError> {
    let lost = |reason: String| CollectiveError::PeerLost { rank: peer, reason };
    let hello = framing::encode_hello(me, generation, token)
        .map_err(|e| CollectiveError::invalid_config("identity.token", e.to_string()))?;
    let mut stream = connect_until(address, deadline).await.map_err(lost)?;
    let handshake = async {
        stream.write_all(&hello).await?;
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await?;
        let (code, len) = framing::decode_reply(&fixed)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut message = vec![0u8; len];
        stream.read_exact(&mut message).await?;
        Ok::<_, io::Error>((code, String::from_utf8_lossy(&message).into_owned()))
    };
    let (code, message) = tokio::time::timeout_at(deadline, handshake)
        .await
        .map_err(|_| {
            lost(format!(
                "{address} did not answer the data-stream hello in time"
            ))
        })?
        .map_err(|e| lost(format!("data-stream hello to {address} failed: {e}")))?;
    match code {
        Code::Ok => Ok(Link::Tcp(TcpLink::new(peer, stream))),
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
