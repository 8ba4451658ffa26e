use super::*;
use crate::registration::Registrar;
use crate::registration_api::registration_server::RegistrationServer;
use tokio::io::AsyncReadExt;

/// A frame: type, flags, stream, payload.
type Frame = (u8, u8, u32, Vec<u8>);

const SOCKET_PATH: &[u8] = b"/var/lib/kubelet/plugins_registry/rdu.dev-reg.sock";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len().to_be_bytes();
    let mut out = len[len.len() - 3..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A request's headers as grpc-go sends them to a unix socket dialed by path.
fn request_headers(method: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (":method", "POST".as_bytes()),
        (":scheme", b"http"),
        (":path", method.as_bytes()),
        (":authority", SOCKET_PATH),
        ("content-type", b"application/grpc"),
        ("te", b"trailers"),
    ]
    .into_iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec()))
    .collect()
}

fn encode(encoder: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// The whole frames at the start of `bytes`: (type, flags, stream, payload), and how many bytes they took.
fn parse_frames(bytes: &[u8]) -> (Vec<Frame>, usize) {
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(head) = bytes.get(at..at + 9) {
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let Some(payload) = bytes.get(at + 9..at + 9 + len) else {
            break;
        };
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        out.push((head[3], head[4], stream, payload.to_vec()));
        at += 9 + len;
    }
    (out, at)
}

/// The frames of `bytes`, which must hold whole frames only.
fn frames(bytes: &[u8]) -> Vec<Frame> {
    let (out, used) = parse_frames(bytes);
    assert_eq!(used, bytes.len(), "a partial frame");
    out
}

async fn fixed(input: Vec<u8>) -> (Result<(), RelayError>, Vec<u8>) {
    let mut out = Vec::new();
    let result = fix_requests(input.as_slice(), &mut out).await;
    (result, out)
}

#[test]
fn only_an_authority_that_is_not_one_is_replaced() {
    assert_eq!(fixed_authority(SOCKET_PATH), b"localhost");
    assert_eq!(fixed_authority(b""), b"localhost");
    assert_eq!(fixed_authority(b"localhost"), b"localhost");
    assert_eq!(fixed_authority(b"10.0.0.1:8080"), b"10.0.0.1:8080");
}

#[tokio::test]
async fn every_request_gets_a_valid_authority_and_every_other_byte_passes() {
    let mut client = Encoder::new();
    let first = encode(&mut client, &request_headers("/a.B/C"));
    // The second block refers to the first one's entries in the dynamic table.
    let second = encode(&mut client, &request_headers("/a.B/D"));
    let (part1, part2) = first.split_at(first.len() / 2);
    let mut padded = vec![3u8]; // pad length
    padded.extend([0, 0, 0, 0, 16]); // priority
    padded.extend(part1);
    padded.extend([0, 0, 0]);
    let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
    let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(&settings);
    input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &padded));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, part2));
    input.extend(&data);
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));

    let (result, out) = fixed(input).await;
    result.unwrap();
    assert_eq!(&out[..24], PREFACE);
    let out = frames(&out[24..]);
    assert_eq!(out.len(), 4, "{out:?}");
    assert_eq!(out[0], (0x4, 0, 0, settings[9..].to_vec()));
    assert_eq!(out[2], (0x0, END_STREAM, 1, data[9..].to_vec()));
    let mut server = Decoder::new();
    for (frame, stream, flags, method) in [
        (&out[1], 1, END_HEADERS, "/a.B/C"),
        (&out[3], 3, END_HEADERS | END_STREAM, "/a.B/D"),
    ] {
        assert_eq!((frame.0, frame.1, frame.2), (HEADERS, flags, stream));
        let mut expected = request_headers(method);
        expected[3].1 = b"localhost".to_vec();
        assert_eq!(server.decode(&frame.3).unwrap(), expected);
    }
}

#[tokio::test]
async fn malformed_input_ends_the_connection() {
    let block = encode(&mut Encoder::new(), &request_headers("/a.B/C"));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "preface"),
        (
            frame(CONTINUATION, END_HEADERS, 1, &block),
            "CONTINUATION without HEADERS",
        ),
        (
            [frame(HEADERS, 0, 1, &block), frame(0x0, 0, 1, b"x")].concat(),
            "interrupted",
        ),
        (
            [
                frame(HEADERS, 0, 1, &block),
                frame(CONTINUATION, END_HEADERS, 3, b""),
            ]
            .concat(),
            "interrupted",
        ),
        (frame(0x0, 0, 1, &vec![0; MAX_FRAME + 1]), "exceeds"),
        (
            frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 1, 2]),
            "padding longer",
        ),
        (
            frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]),
            "decode",
        ),
    ];
    for (bytes, why) in cases {
        let input = if why == "preface" {
            bytes
        } else {
            [PREFACE.as_slice(), &bytes].concat()
        };
        let (result, _) = fixed(input).await;
        let err = rdu_error_chain::chain(&result.expect_err(why));
        assert!(err.contains(why), "{why}: {err}");
    }
}

/// What grpc-go sends for `GetInfo` on a socket dialed by its path; the server's frames, until it ends or resets
/// the stream.
async fn get_info_as_the_kubelet(socket: &Path) -> Vec<Frame> {
    let mut conn = UnixStream::connect(socket).await.unwrap();
    let block = encode(
        &mut Encoder::new(),
        &request_headers("/pluginregistration.Registration/GetInfo"),
    );
    let mut request = PREFACE.to_vec();
    request.extend(frame(0x4, 0, 0, &[]));
    request.extend(frame(HEADERS, END_HEADERS, 1, &block));
    // An empty InfoRequest: not compressed, length 0.
    request.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
    conn.write_all(&request).await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server closed before ending the stream");
        received.extend(&buf[..n]);
        let (parsed, _) = parse_frames(&received);
        let ended = parsed.iter().any(|(kind, flags, stream, _)| {
            *stream == 1 && (*kind == 0x3 || (*kind == HEADERS && flags & END_STREAM != 0))
        });
        if ended {
            return parsed;
        }
    }
}

/// A Registration server on `incoming` connections.
fn serve_registration<S, IO>(incoming: S)
where
    S: tokio_stream::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: tonic::transport::server::Connected + AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let registrar = Registrar::new(Path::new("/var/lib/kubelet/plugins/rdu.dev/dra.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(registrar))
            .serve_with_incoming(incoming),
    );
}

#[tokio::test]
async fn the_kubelets_get_info_is_answered_through_the_relay_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let direct = dir.path().join("direct.sock");
    serve_registration(listen(&direct).unwrap());
    let refused = get_info_as_the_kubelet(&direct).await;
    // RST_STREAM PROTOCOL_ERROR (1): why the relay exists.
    assert!(
        refused.contains(&(0x3, 0, 1, vec![0, 0, 0, 1])),
        "{refused:?}"
    );

    let relayed = dir.path().join("relayed.sock");
    serve_registration(listen_fixing_authority(&relayed).unwrap());
    let answered = get_info_as_the_kubelet(&relayed).await;
    let mut decoder = Decoder::new();
    let mut headers = Vec::new();
    let mut body: Vec<u8> = Vec::new();
    for (kind, _, stream, payload) in &answered {
        match (kind, stream) {
            (0x1, 1) => headers.extend(decoder.decode(payload).unwrap()),
            (0x0, 1) => body.extend(payload),
            (0x3, 1) => panic!("the relayed request was reset: {answered:?}"),
            _ => {}
        }
    }
    assert!(
        headers.contains(&(b"grpc-status".to_vec(), b"0".to_vec())),
        "{headers:?}"
    );
    assert!(
        body.windows(b"rdu.dev".len()).any(|w| w == b"rdu.dev"),
        "GetInfo names the driver: {body:?}"
    );
}
