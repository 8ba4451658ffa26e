//! The raw TCP data path beside gRPC: chunks travel on one plain TCP stream per directed pair of
//! ranks (hello with the job token and generation, then header + payload frames, see `frame`),
//! on the same port as the `Collective` gRPC server, which still carries aborts and accepts
//! `Send` streams. Compared with a gRPC stream this skips protobuf's payload copy and tonic's
//! re-buffering of HTTP/2 frames on both ends: the sender writes its values straight to the
//! socket, and the admitted socket goes to the peer's inbox, whose collective reads each chunk
//! straight into the values it updates.

pub(crate) mod framing;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};
use tracing::Instrument;

use self::framing as frame;
use self::framing::{HELLO_FIXED, REPLY_FIXED};
use crate::auth::RequireToken;
use crate::error::CollectiveError;
use crate::transport::Link;
use crate::transport::grpc::{ChunkReceiver, InboundRouter};
use crate::transport::inbox::Handoff;

/// gRPC connections waiting for tonic to take them.
const GRPC_BACKLOG: usize = 16;

/// The receiving side of the data path: who may open a stream, and into which inbox it goes.
pub(crate) struct DataPort {
    router: Arc<InboundRouter>,
    token: RequireToken,
    handshake_timeout: Duration,
}

impl DataPort {
    pub(crate) fn new(
        router: Arc<InboundRouter>,
        token: RequireToken,
        handshake_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(DataPort {
            router,
            token,
            handshake_timeout,
        })
    }

    /// Checks the hello of a new data stream; on success the inbox slot to hand it to.
    async fn admit(&self, stream: &mut TcpStream) -> Result<oneshot::Sender<Handoff>, Status> {
        let incomplete = |e: io::Error| Status::invalid_argument(format!("incomplete hello: {e}"));
        let mut fixed = [0u8; HELLO_FIXED];
        stream.read_exact(&mut fixed).await.map_err(incomplete)?;
        let hello =
            frame::decode_hello(&fixed).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut token = vec![0u8; hello.token_len];
        stream.read_exact(&mut token).await.map_err(incomplete)?;
        if !self.token.accepts(&token) {
            return Err(Status::unauthenticated("wrong job token"));
        }
        self.router.open(hello.from_rank, hello.generation)
    }

    /// Admits (or refuses, with a reply saying why) one data stream and hands it to its inbox.
    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        let admitted = tokio::time::timeout(self.handshake_timeout, self.admit(&mut stream)).await;
        let slot = match admitted {
            Ok(Ok(admitted)) => admitted,
            Ok(Err(refusal)) => {
                tracing::warn!(code = ?refusal.code(), reason = refusal.message(), "data stream refused");
                let reply = frame::encode_reply(refusal.code(), refusal.message());
                let _ = stream.write_all(&reply).await;
                return;
            }
            Err(_) => {
                tracing::debug!("no hello within the timeout; connection closed");
                return;
            }
        };
        if stream
            .write_all(&frame::encode_reply(Code::Ok, ""))
            .await
            .is_err()
        {
            return;
        }
        // The collective reads its chunks from here on; the inbox closes it when dropped.
        let _ = slot.send(Handoff::tcp(stream));
    }
}

/// Accepts connections on the collective port until shutdown: data streams (starting with the
/// data-path magic) go to `port`, everything else to the returned stream for tonic.
pub(crate) fn demux(
    listener: TcpListener,
    port: Arc<DataPort>,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<TcpStream>> {
    let (grpc_tx, grpc_rx) = mpsc::channel(GRPC_BACKLOG);
    let span = tracing::Span::current();
    tokio::spawn(
        async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = shutdown.wait_for(|down| *down) => return,
                };
                match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(
                            route(stream, port.clone(), grpc_tx.clone())
                                .instrument(tracing::Span::current()),
                        );
                    }
                    Err(error) => {
                        // Typically out of file descriptors: give closing sockets a moment.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
        .instrument(span),
    );
    ReceiverStream::new(grpc_rx)
}

/// Sends one accepted connection where its first byte says it belongs.
async fn route(stream: TcpStream, port: Arc<DataPort>, grpc: mpsc::Sender<io::Result<TcpStream>>) {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    match tokio::time::timeout(port.handshake_timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == frame::MAGIC[0] => port.serve(stream).await,
        Ok(Ok(_)) => {
            let _ = grpc.send(Ok(stream)).await;
        }
        Ok(Err(error)) => tracing::debug!(%error, "connection failed before its first byte"),
        Err(_) => tracing::debug!("connection silent within the timeout; closed"),
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
    let hello = frame::encode_hello(me, generation, token)
        .map_err(|e| CollectiveError::invalid_config("identity.token", e.to_string()))?;
    let mut stream = connect_until(address, deadline).await.map_err(lost)?;
    let handshake = async {
        stream.write_all(&hello).await?;
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await?;
        let (code, len) = frame::decode_reply(&fixed)
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
        Code::Ok => Ok(Link::direct(peer, stream)),
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

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;
    use crate::fault::FailState;
    use crate::transport::ChunkId;
    use crate::transport::inbox::{Apply, Inbox};
    use crate::transport::tcp::framing::ChunkHeader;

    const TOKEN: &str = "secret";
    const GENERATION: u64 = 7;

    /// Rank 1 of 3 with its data port listening.
    struct Harness {
        address: String,
        inboxes: Vec<Option<Inbox>>,
        grpc: ReceiverStream<io::Result<TcpStream>>,
        _shutdown: watch::Sender<bool>,
    }

    async fn harness() -> Harness {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (shutdown, rx) = watch::channel(false);
        let fail = Arc::new(FailState::new());
        let (router, inboxes) = InboundRouter::new(1, 3, GENERATION, fail, rx.clone());
        let port = DataPort::new(
            Arc::new(router),
            RequireToken::new(TOKEN),
            Duration::from_secs(10),
        );
        Harness {
            address,
            inboxes,
            grpc: demux(listener, port, rx),
            _shutdown: shutdown,
        }
    }

    /// Says hello as `from` and returns the connection and the reply.
    async fn hello(address: &str, from: u32, generation: u64, token: &str) -> (TcpStream, Code) {
        let mut stream = TcpStream::connect(address).await.unwrap();
        let hello = frame::encode_hello(from, generation, token).unwrap();
        stream.write_all(&hello).await.unwrap();
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await.unwrap();
        let (code, len) = frame::decode_reply(&fixed).unwrap();
        let mut message = vec![0u8; len];
        stream.read_exact(&mut message).await.unwrap();
        (stream, code)
    }

    #[tokio::test]
    async fn hellos_with_the_wrong_token_generation_or_rank_are_refused() {
        let h = harness().await;
        let cases = [
            (0, GENERATION, "wrong", Code::Unauthenticated),
            (0, GENERATION - 1, TOKEN, Code::FailedPrecondition),
            (1, GENERATION, TOKEN, Code::InvalidArgument),
            (9, GENERATION, TOKEN, Code::InvalidArgument),
        ];
        for (from, generation, token, expected) in cases {
            let (_, code) = hello(&h.address, from, generation, token).await;
            assert_eq!(code, expected, "from {from} generation {generation}");
        }
        // The refusals did not use up rank 0's slot.
        let (_, code) = hello(&h.address, 0, GENERATION, TOKEN).await;
        assert_eq!(code, Code::Ok);
        let (_, code) = hello(&h.address, 0, GENERATION, TOKEN).await;
        assert_eq!(code, Code::AlreadyExists);
    }

    #[tokio::test]
    async fn a_stream_that_is_not_a_hello_is_refused() {
        let h = harness().await;
        let mut stream = TcpStream::connect(&h.address).await.unwrap();
        stream.write_all(b"RUBBISH-AND-MORE-BYTES").await.unwrap();
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await.unwrap();
        assert_eq!(
            frame::decode_reply(&fixed).unwrap().0,
            Code::InvalidArgument
        );
    }

    #[tokio::test]
    async fn an_admitted_stream_goes_to_its_senders_inbox() {
        let mut h = harness().await;
        let (mut stream, code) = hello(&h.address, 2, GENERATION, TOKEN).await;
        assert_eq!(code, Code::Ok);
        let id = ChunkId {
            op_id: 3,
            phase: 16,
            segment: 1,
            chunk: 0,
        };
        let header = ChunkHeader {
            op_id: id.op_id,
            phase: id.phase,
            segment: id.segment,
            chunk: id.chunk,
            len: 4,
        };
        stream.write_all(&header.encode()).await.unwrap();
        stream.write_all(&2.5f32.to_le_bytes()).await.unwrap();
        let mut value = [0f32];
        let inbox = h.inboxes[2].as_mut().unwrap();
        inbox
            .receive(GENERATION, id, &mut value, Apply::Copy)
            .await
            .unwrap();
        assert_eq!(value, [2.5]);
        assert!(matches!(h.inboxes[0], Some(Inbox::Waiting(_))));
    }

    #[tokio::test]
    async fn other_connections_are_handed_to_grpc_untouched() {
        let mut h = harness().await;
        let mut client = TcpStream::connect(&h.address).await.unwrap();
        client.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        let mut server = h.grpc.next().await.unwrap().unwrap();
        let mut preface = [0u8; 16];
        server.read_exact(&mut preface).await.unwrap();
        assert_eq!(&preface, b"PRI * HTTP/2.0\r\n");
    }

    #[tokio::test]
    async fn links_deliver_chunks_and_report_refusals() {
        let mut h = harness().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let refused = open_link(0, 1, GENERATION, &h.address, "wrong", deadline).await;
        assert!(matches!(
            refused,
            Err(ref e @ CollectiveError::Protocol { rank: 1, .. }) if !e.is_retryable()
        ));
        let link = open_link(0, 1, GENERATION, &h.address, TOKEN, deadline)
            .await
            .unwrap();
        let values = [1.5f32, -2.0];
        let id = ChunkId {
            op_id: 5,
            phase: 2,
            segment: 0,
            chunk: 4,
        };
        link.send(id, &values).await.unwrap();
        let inbox = h.inboxes[0].as_mut().unwrap();
        let mut got = [0f32; 2];
        inbox
            .receive(GENERATION, id, &mut got, Apply::Copy)
            .await
            .unwrap();
        assert_eq!(got, values);
        // Closing finishes once the receiver let go of the stream.
        let closing = link.close();
        h.inboxes.clear();
        closing.await.unwrap();
    }
}
