//! The raw TCP data path beside gRPC: chunks travel on one plain TCP stream per directed pair of
//! ranks (hello with the job token and generation, then header + payload frames, see `framing`),
//! on the same port as the `Collective` gRPC server, which still carries aborts and accepts
//! `Send` streams. Compared with a gRPC stream this skips protobuf's payload copy and tonic's
//! re-buffering of HTTP/2 frames on both ends: the sender writes its values straight to the
//! socket (`link`), and the admitted socket (`port`) goes to the peer's inbox, whose collective
//! reads each chunk straight into the values it updates (`receive`).

pub(crate) mod framing;
mod link;
mod port;
mod receive;

pub(crate) use link::{TcpLink, open_link};
pub(crate) use port::{DataPort, demux};
pub(crate) use receive::TcpSource;

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;
    use tokio::time::Instant;
    use tokio_stream::StreamExt;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::Code;

    use super::framing::{self, ChunkHeader, REPLY_FIXED};
    use super::*;
    use crate::auth::RequireToken;
    use crate::compression::Compression;
    use crate::error::CollectiveError;
    use crate::fault::FailState;
    use crate::transport::ChunkId;
    use crate::transport::inbox::{Apply, Inbox, ReceiveMode};
    use crate::transport::router::InboundRouter;

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
        let hello = framing::encode_hello(from, generation, token).unwrap();
        stream.write_all(&hello).await.unwrap();
        let mut fixed = [0u8; REPLY_FIXED];
        stream.read_exact(&mut fixed).await.unwrap();
        let (code, len) = framing::decode_reply(&fixed).unwrap();
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
            framing::decode_reply(&fixed).unwrap().0,
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
            .receive(
                GENERATION,
                id,
                &mut value,
                Apply::Copy,
                ReceiveMode::default(),
            )
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
        link.send(id, &mut values.clone(), Compression::None)
            .await
            .unwrap();
        let inbox = h.inboxes[0].as_mut().unwrap();
        let mut got = [0f32; 2];
        inbox
            .receive(
                GENERATION,
                id,
                &mut got,
                Apply::Copy,
                ReceiveMode::default(),
            )
            .await
            .unwrap();
        assert_eq!(got, values);
        // Closing finishes once the receiver let go of the stream.
        let closing = link.close();
        h.inboxes.clear();
        closing.await.unwrap();
    }
}
