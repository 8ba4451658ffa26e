//! The receiving side of data streams: the collective port's accept loop, which tells data
//! streams from gRPC connections by their first byte, and the data port, which checks a data
//! stream's hello, takes the shared-memory ring it offers when it can open it, and hands the
//! stream (with its ring, if taken) to the sender's inbox.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};
use tracing::Instrument;

use crate::auth::RequireToken;
use crate::config::RingPlace;
use crate::transport::hello::{self, HELLO_FIXED};
use crate::transport::inbox::Handoff;
use crate::transport::router::{ChunkReceiver, InboundRouter};
use crate::transport::shm::{self, Offer, RingReader, ShmSource};
use crate::transport::tcp::TcpSource;

/// gRPC connections waiting for tonic to take them.
const GRPC_BACKLOG: usize = 16;

/// The receiving side of the data path: who may open a stream, and into which inbox it goes.
pub(crate) struct DataPort {
    router: Arc<InboundRouter>,
    token: RequireToken,
    handshake_timeout: Duration,
    /// Where offered rings are fetched from; `None`: not taken, every stream's frames stay on TCP.
    rings_from: Option<RingPlace>,
}

/// An admitted stream's inbox slot, and the ring it offered, if any.
struct Admitted {
    slot: oneshot::Sender<Handoff>,
    offer: Option<Offer>,
}

impl DataPort {
    pub(crate) fn new(
        router: Arc<InboundRouter>,
        token: RequireToken,
        handshake_timeout: Duration,
        rings_from: Option<RingPlace>,
    ) -> Arc<Self> {
        Arc::new(DataPort {
            router,
            token,
            handshake_timeout,
            rings_from,
        })
    }

    /// Checks the hello of a new data stream; on success the inbox slot to hand it to.
    async fn admit(&self, stream: &mut TcpStream) -> Result<Admitted, Status> {
        let incomplete = |e: io::Error| Status::invalid_argument(format!("incomplete hello: {e}"));
        let mut fixed = [0u8; HELLO_FIXED];
        stream.read_exact(&mut fixed).await.map_err(incomplete)?;
        let greeting =
            hello::decode_hello(&fixed).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut token = vec![0u8; greeting.token_len];
        stream.read_exact(&mut token).await.map_err(incomplete)?;
        let offer = if greeting.offers_ring {
            let mut offer = [0u8; Offer::LEN];
            stream.read_exact(&mut offer).await.map_err(incomplete)?;
            Some(Offer::decode(&offer))
        } else {
            None
        };
        if !self.token.accepts(&token) {
            return Err(Status::unauthenticated("wrong job token"));
        }
        let slot = self.router.open(greeting.from_rank, greeting.generation)?;
        Ok(Admitted { slot, offer })
    }

    /// The offered ring, if this rank can fetch and check the very segment offered.
    async fn take_ring(&self, offer: Option<Offer>) -> Option<RingReader> {
        let (offer, place) = offer.zip(self.rings_from.as_ref())?;
        match tokio::time::timeout(self.handshake_timeout, shm::take(&offer, place)).await {
            Ok(Ok(ring)) => Some(ring),
            Ok(Err(error)) => {
                tracing::debug!(error = %rdu_error_chain::Chain(&error), "offered ring not taken; frames stay on TCP");
                None
            }
            Err(_) => {
                tracing::debug!("offered ring not fetched in time; frames stay on TCP");
                None
            }
        }
    }

    /// Admits (or refuses, with a reply saying why) one data stream and hands it to its inbox.
    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        let admitted = tokio::time::timeout(self.handshake_timeout, self.admit(&mut stream)).await;
        let Admitted { slot, offer } = match admitted {
            Ok(Ok(admitted)) => admitted,
            Ok(Err(refusal)) => {
                tracing::warn!(code = ?refusal.code(), reason = refusal.message(), "data stream refused");
                let reply = hello::encode_reply(refusal.code(), false, refusal.message());
                let _ = stream.write_all(&reply).await;
                return;
            }
            Err(_) => {
                tracing::debug!("no hello within the timeout; connection closed");
                return;
            }
        };
        let ring = self.take_ring(offer).await;
        let reply = hello::encode_reply(Code::Ok, ring.is_some(), "");
        if stream.write_all(&reply).await.is_err() {
            return;
        }
        // The collective reads its chunks from here on; the inbox closes it when dropped.
        let handoff = match ring {
            Some(ring) => Handoff::shm(ShmSource::new(stream, ring)),
            None => Handoff::tcp(TcpSource::new(stream)),
        };
        let _ = slot.send(handoff);
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
                        tracing::warn!(error = %rdu_error_chain::Chain(&error), "accept failed");
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
        Ok(Ok(1)) if first[0] == hello::MAGIC[0] => port.serve(stream).await,
        Ok(Ok(_)) => {
            let _ = grpc.send(Ok(stream)).await;
        }
        Ok(Err(error)) => {
            tracing::debug!(error = %rdu_error_chain::Chain(&error), "connection failed before its first byte")
        }
        Err(_) => tracing::debug!("connection silent within the timeout; closed"),
    }
}
