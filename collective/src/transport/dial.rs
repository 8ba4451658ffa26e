//! Opening this rank's data stream to one peer: dialling the peer's collective port, the hello
//! (offering a shared-memory ring when this rank may make one, see `shm`), and the link the
//! reply decides: the ring if the peer took it, else frames on the TCP stream.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::Code;

use crate::error::CollectiveError;
use crate::transport::Link;
use crate::transport::hello::{self, REPLY_FIXED};
use crate::transport::shm::{RingMaker, ShmLink};
use crate::transport::tcp::TcpLink;

/// Whether and how a link may share memory with its peer.
#[derive(Clone, Copy)]
pub(crate) struct RingChoice<'a> {
    /// What makes this rank's rings; `None` keeps frames on TCP.
    pub(crate) maker: Option<&'a RingMaker>,
    /// How long a full ring is polled before the sender sleeps.
    pub(crate) spin: Option<Duration>,
}

/// Connects to `peer`'s data port at `address` and introduces this rank, offering a ring made
/// by `ring.maker` if its budget has room; the link then streams chunks until closed, through
/// the ring if the peer took it.
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
    let offered = ring.maker.and_then(|maker| maker.offer(peer));
    let hello = hello::encode_hello(me, generation, token, offered.as_ref().map(|o| &o.offer))
        .map_err(|e| CollectiveError::invalid_config_from("identity.token", e.to_string(), e))?;
    let mut stream = connect_until(address, deadline).await.map_err(lost)?;
    let handshake = async {
        stream.write_all(&hello).await?;
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await?;
        let reply = hello::decode_reply(&fixed)
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
    // The peer has mapped the segment or never will: the offer is withdrawn (with `offered`),
    // and a ring not taken gives its memory back.
    let code = reply.code;
    match code {
        Code::Ok => match (reply.took_ring, offered) {
            (false, _) => Ok(Link::Tcp(TcpLink::new(peer, stream))),
            (true, Some(offering)) => {
                let writer = offering.taken(ring.spin);
                Ok(Link::Shm(ShmLink::new(peer, stream, writer)))
            }
            (true, None) => Err(CollectiveError::Protocol {
                rank: peer,
                reason: "took a shared-memory ring this rank never offered".into(),
            }),
        },
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
