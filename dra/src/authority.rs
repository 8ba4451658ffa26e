//! The kubelet dials a plugin's registration socket with the socket's path as the HTTP/2 `:authority`
//! (`grpc.DialContext(ctx, "/var/lib/kubelet/plugins_registry/…sock", …)`), which the `h2` crate under tonic
//! refuses as malformed, resetting the stream (hyperium/h2#487, open). So each connection the plugin accepts is
//! relayed to tonic through an in-memory pipe, with the `:authority` of every request header block that is not a
//! valid authority replaced by `localhost` (what grpc-go itself sends for `unix:` targets); every other byte passes
//! as it came. The client side is untrusted: frames and header blocks are bounded, and anything malformed ends the
//! connection.

use crate::socket::{SocketError, listen};
use loona_hpack::decoder::DecoderError;
use loona_hpack::{Decoder, Encoder};
use std::path::Path;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What replaces an authority that is not one.
pub const LOCAL_AUTHORITY: &[u8] = b"localhost";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload relayed: HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`, which tonic's server keeps.
const MAX_FRAME: usize = 16_384;
/// The largest header block (HEADERS and its CONTINUATIONs) relayed.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// HPACK's default dynamic table size, which tonic's server advertises (a client may not ask for more).
const HPACK_TABLE_SIZE: usize = 4096;
/// Bytes in flight in each direction of the in-memory pipe.
const PIPE_BYTES: usize = 64 * 1024;

/// Why a relayed connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("connection I/O")]
    Io(#[from] std::io::Error),
    #[error("the client did not open with the HTTP/2 connection preface")]
    NoPreface,
    #[error("frame of {0} bytes exceeds {MAX_FRAME}")]
    FrameTooLarge(usize),
    #[error("header block exceeds {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge,
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("cannot decode a header block")]
    Hpack(#[source] DecoderError),
}

/// `authority` as sent, or `localhost` when it is not a valid URI authority (a socket path).
pub fn fixed_authority(authority: &[u8]) -> &[u8] {
    match http::uri::Authority::try_from(authority) {
        Ok(_) => authority,
        Err(_) => LOCAL_AUTHORITY,
    }
}

/// Listens on `path` and yields, for every accepted connection, the server end of a pipe whose client end relays
/// that connection with its authorities fixed: what a tonic server's `serve_with_incoming*` takes. Accepting stops
/// when the returned stream is dropped.
pub fn listen_fixing_authority(
    path: &Path,
) -> Result<ReceiverStream<std::io::Result<DuplexStream>>, SocketError> {
    let mut incoming = listen(path)?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = incoming.next() => accepted,
            };
            let Some(accepted) = accepted else { return };
            let next = accepted.map(|client| {
                let (relayed, server) = tokio::io::duplex(PIPE_BYTES);
                tokio::spawn(relay(client, relayed));
                server
            });
            if tx.send(next).await.is_err() {
                return;
            }
        }
    });
    Ok(ReceiverStream::new(rx))
}

async fn relay(client: UnixStream, server: DuplexStream) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = tokio::io::split(server);
    let (requests, _) = tokio::join!(
        fix_requests(client_read, server_write),
        tokio::io::copy(&mut server_read, &mut client_write),
    );
    if let Err(e) = requests {
        tracing::warn!(error = %rdu_error_chain::chain(&e), "closing a kubelet connection");
    }
}

/// Copies an HTTP/2 client's bytes from `from` to `to`, re-encoding each request header block with its authority
/// fixed, until `from` ends; then shuts `to` down.
pub async fn fix_requests(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> Result<(), RelayError> {
    let result = fix_frames(&mut from, &mut to).await;
    let _ = to.shutdown().await;
    result
}

async fn fix_frames(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
) -> Result<(), RelayError> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(RelayError::NoPreface);
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(HPACK_TABLE_SIZE);
    let mut encoder = Encoder::new();
    // The header block being gathered: stream, END_STREAM, fragments so far.
    let mut block: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_FRAME {
            return Err(RelayError::FrameTooLarge(len));
        }
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        match (kind, block.as_mut()) {
            (HEADERS, None) => {
                let fragment = header_fragment(flags, &payload)?;
                block = Some((stream, flags & END_STREAM, fragment.to_vec()));
            }
            (CONTINUATION, Some((open, _, fragments))) if *open == stream => {
                if fragments.len() + payload.len() > MAX_HEADER_BLOCK {
                    return Err(RelayError::HeaderBlockTooLarge);
                }
                fragments.extend_from_slice(&payload);
            }
            (_, Some(_)) => {
                return Err(RelayError::Malformed(
                    "a header block interrupted by another frame",
                ));
            }
            (CONTINUATION, None) => {
                return Err(RelayError::Malformed("CONTINUATION without HEADERS"));
            }
            (_, None) => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS != 0
            && let Some((stream, end_stream, fragments)) = block.take()
        {
            let fixed = fix_block(&mut decoder, &mut encoder, &fragments)?;
            write_header_block(to, stream, end_stream, &fixed).await?;
        }
    }
}

/// The header block fragment of a HEADERS frame's payload: without its padding and priority fields.
fn header_fragment(flags: u8, payload: &[u8]) -> Result<&[u8], RelayError> {
    let (pad, rest) = if flags & PADDED != 0 {
        let (&pad, rest) = payload
            .split_first()
            .ok_or(RelayError::Malformed("PADDED HEADERS without a pad length"))?;
        (usize::from(pad), rest)
    } else {
        (0, payload)
    };
    let rest = if flags & PRIORITY != 0 {
        rest.get(5..)
            .ok_or(RelayError::Malformed("PRIORITY HEADERS too short"))?
    } else {
        rest
    };
    rest.len()
        .checked_sub(pad)
        .map(|end| &rest[..end])
        .ok_or(RelayError::Malformed(
            "padding longer than the HEADERS frame",
        ))
}

/// `block` decoded and encoded again with its authority fixed.
fn fix_block(
    decoder: &mut Decoder<'_>,
    encoder: &mut Encoder<'_>,
    block: &[u8],
) -> Result<Vec<u8>, RelayError> {
    let headers = decoder.decode(block).map_err(RelayError::Hpack)?;
    Ok(encoder.encode(headers.iter().map(|(name, value)| {
        let value = if name == b":authority" {
            fixed_authority(value)
        } else {
            value
        };
        (name.as_slice(), value)
    })))
}

/// `block` as a HEADERS frame and as many CONTINUATION frames as its size needs.
async fn write_header_block(
    to: &mut (impl AsyncWrite + Unpin),
    stream: u32,
    end_stream: u8,
    block: &[u8],
) -> Result<(), RelayError> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![block]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (index, chunk) in chunks.into_iter().enumerate() {
        let kind = if index == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if index == 0 { end_stream } else { 0 };
        if index == last {
            flags |= END_HEADERS;
        }
        let len = chunk.len().to_be_bytes();
        let mut head = [0u8; 9];
        head[..3].copy_from_slice(&len[len.len() - 3..]);
        head[3] = kind;
        head[4] = flags;
        head[5..].copy_from_slice(&stream.to_be_bytes());
        to.write_all(&head).await?;
        to.write_all(chunk).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
