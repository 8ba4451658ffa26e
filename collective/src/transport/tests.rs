//! The transports together, as a rank uses them: links dialled to a rank's data port, hellos
//! admitted or refused, streams routed to inboxes, rings taken or declined.

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

use crate::auth::RequireToken;
use crate::compression::Compression;
use crate::config::RingPlace;
use crate::error::CollectiveError;
use crate::fault::FailState;
use crate::kernels::Apply;
use crate::transport::Link;
use crate::transport::dial::{RingChoice, open_link};
use crate::transport::frame::{ChunkHeader, ChunkId, ReceiveMode};
use crate::transport::hello::{self, REPLY_FIXED};
use crate::transport::inbox::Inbox;
use crate::transport::port::{DataPort, demux};
use crate::transport::router::InboundRouter;
use crate::transport::shm::{RING_BYTES, RingMaker, SEGMENT_BYTES};

const TOKEN: &str = "secret";
const GENERATION: u64 = 7;
const NO_RING: RingChoice<'static> = RingChoice {
    maker: None,
    spin: None,
};
/// A ring cap with room for a few rings.
const ROOM: u64 = 8 << 20;

/// Rank 1 of 3 with its data port listening.
struct Harness {
    address: String,
    inboxes: Vec<Option<Inbox>>,
    grpc: ReceiverStream<io::Result<TcpStream>>,
    _shutdown: watch::Sender<bool>,
}

async fn harness() -> Harness {
    harness_sharing(Some(RingPlace::Abstract)).await
}

/// Rank 1 of 3, taking offered rings from sockets in `rings_from`, or not at all.
async fn harness_sharing(rings_from: Option<RingPlace>) -> Harness {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (shutdown, rx) = watch::channel(false);
    let fail = Arc::new(FailState::new());
    let (relay, _) = tokio::sync::mpsc::unbounded_channel();
    let (router, inboxes) = InboundRouter::new(1, 3, GENERATION, fail, relay, rx.clone());
    let port = DataPort::new(
        Arc::new(router),
        RequireToken::new(TOKEN),
        Duration::from_secs(10),
        rings_from,
    );
    Harness {
        address,
        inboxes,
        grpc: demux(listener, port, rx),
        _shutdown: shutdown,
    }
}

/// Says hello as `from` and returns the connection and the reply.
async fn say_hello(address: &str, from: u32, generation: u64, token: &str) -> (TcpStream, Code) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let greeting = hello::encode_hello(from, generation, token, None).unwrap();
    stream.write_all(&greeting).await.unwrap();
    let mut fixed = [0u8; REPLY_FIXED];
    stream.read_exact(&mut fixed).await.unwrap();
    let reply = hello::decode_reply(&fixed).unwrap();
    let mut message = vec![0u8; reply.message_len];
    stream.read_exact(&mut message).await.unwrap();
    (stream, reply.code)
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
        let (_, code) = say_hello(&h.address, from, generation, token).await;
        assert_eq!(code, expected, "from {from} generation {generation}");
    }
    // The refusals did not use up rank 0's slot.
    let (_, code) = say_hello(&h.address, 0, GENERATION, TOKEN).await;
    assert_eq!(code, Code::Ok);
    let (_, code) = say_hello(&h.address, 0, GENERATION, TOKEN).await;
    assert_eq!(code, Code::AlreadyExists);
}

#[tokio::test]
async fn a_stream_that_is_not_a_hello_is_refused() {
    let h = harness().await;
    let mut stream = TcpStream::connect(&h.address).await.unwrap();
    stream
        .write_all(b"RUBBISH-AND-MORE-BYTES-THAN-A-HELLO")
        .await
        .unwrap();
    let mut fixed = [0u8; REPLY_FIXED];
    stream.read_exact(&mut fixed).await.unwrap();
    assert_eq!(
        hello::decode_reply(&fixed).unwrap().code,
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn an_admitted_stream_goes_to_its_senders_inbox() {
    let mut h = harness().await;
    let (mut stream, code) = say_hello(&h.address, 2, GENERATION, TOKEN).await;
    assert_eq!(code, Code::Ok);
    let id = ChunkId {
        op_id: 3,
        phase: 16,
        segment: 1,
        chunk: 0,
    };
    let header = ChunkHeader::of(id, 4).unwrap();
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
    let refused = open_link(0, 1, GENERATION, &h.address, "wrong", deadline, NO_RING).await;
    assert!(matches!(
        refused,
        Err(ref e @ CollectiveError::Protocol { rank: 1, .. }) if !e.is_retryable()
    ));
    let link = open_link(0, 1, GENERATION, &h.address, TOKEN, deadline, NO_RING)
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

/// Sends `chunks` chunks of `len` values on `link` while rank 1 takes them from rank 0's
/// inbox, adding them onto ones; checks every value.
async fn stream_chunks(h: &mut Harness, link: &Link, chunks: u32, len: usize) {
    let inbox = h.inboxes[0].as_mut().unwrap();
    let id = |chunk| ChunkId {
        op_id: 1,
        phase: 16,
        segment: 0,
        chunk,
    };
    let sender = async {
        for k in 0..chunks {
            let mut values: Vec<f32> = (0..len).map(|i| (i as u32 + k) as f32).collect();
            link.send(id(k), &mut values, Compression::None)
                .await
                .unwrap();
        }
    };
    let receiver = async {
        for k in 0..chunks {
            let mut got = vec![1.0f32; len];
            inbox
                .receive(
                    GENERATION,
                    id(k),
                    &mut got,
                    Apply::Add,
                    ReceiveMode::default(),
                )
                .await
                .unwrap();
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, v)| *v == (i as u32 + k) as f32 + 1.0),
                "chunk {k} of {len} values"
            );
        }
    };
    tokio::join!(sender, receiver);
}

/// Rank 0's link to the harness's rank 1, offering a ring `maker` makes.
async fn offer_ring(h: &Harness, maker: &RingMaker) -> Link {
    let deadline = Instant::now() + Duration::from_secs(10);
    let ring = RingChoice {
        maker: Some(maker),
        spin: None,
    };
    open_link(0, 1, GENERATION, &h.address, TOKEN, deadline, ring)
        .await
        .unwrap()
}

#[tokio::test]
async fn links_share_a_ring_when_the_receiver_takes_it_and_give_its_memory_back() {
    let mut h = harness().await;
    let maker = RingMaker::start(ROOM, &RingPlace::Abstract).unwrap();
    let link = offer_ring(&h, &maker).await;
    assert!(link.shares_memory());
    assert_eq!(maker.held_bytes(), SEGMENT_BYTES as u64);
    // Odd lengths (frames padded), and chunks larger than the ring (it wraps many times).
    stream_chunks(&mut h, &link, 20, 3).await;
    stream_chunks(&mut h, &link, 3, RING_BYTES / 4 * 2 + 5).await;
    let closing = link.close();
    h.inboxes.clear();
    closing.await.unwrap();
    assert_eq!(
        maker.held_bytes(),
        0,
        "the ring's memory went with its link"
    );
    assert_eq!(maker.peak_bytes(), SEGMENT_BYTES as u64);
}

#[tokio::test]
async fn a_ring_the_receiver_does_not_take_is_declined_and_frames_stay_on_tcp() {
    let mut h = harness_sharing(None).await;
    let maker = RingMaker::start(ROOM, &RingPlace::Abstract).unwrap();
    let link = offer_ring(&h, &maker).await;
    assert!(!link.shares_memory());
    assert_eq!(
        maker.held_bytes(),
        0,
        "the declined ring's memory is given back"
    );
    stream_chunks(&mut h, &link, 4, 1000).await;
}

/// Whether a ring offered from a socket in `offered_in` is taken by a receiver that looks in
/// `taken_from`; frames flow either way.
async fn shares_across(offered_in: RingPlace, taken_from: RingPlace) -> bool {
    let mut h = harness_sharing(Some(taken_from)).await;
    let maker = RingMaker::start(ROOM, &offered_in).unwrap();
    let link = offer_ring(&h, &maker).await;
    stream_chunks(&mut h, &link, 4, 1000).await;
    link.shares_memory()
}

#[tokio::test]
async fn ranks_that_see_the_same_socket_directory_share_a_ring_and_others_stay_on_tcp() {
    let domain = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let dir = |d: &tempfile::TempDir| RingPlace::Dir(d.path().to_path_buf());
    assert!(shares_across(dir(&domain), dir(&domain)).await);
    // Another job's domain, or none (the abstract namespace), does not reach the socket.
    assert!(!shares_across(dir(&domain), dir(&other)).await);
    assert!(!shares_across(dir(&domain), RingPlace::Abstract).await);
    assert!(!shares_across(RingPlace::Abstract, dir(&domain)).await);
    let left: Vec<_> = std::fs::read_dir(domain.path()).unwrap().collect();
    assert!(left.is_empty(), "ring sockets left behind: {left:?}");
}

#[tokio::test]
async fn a_ring_over_the_budget_is_never_made_and_frames_stay_on_tcp() {
    let mut h = harness().await;
    let maker = RingMaker::start(SEGMENT_BYTES as u64 - 1, &RingPlace::Abstract).unwrap();
    let link = offer_ring(&h, &maker).await;
    assert!(!link.shares_memory());
    assert_eq!(maker.peak_bytes(), 0);
    stream_chunks(&mut h, &link, 4, 1000).await;
}
