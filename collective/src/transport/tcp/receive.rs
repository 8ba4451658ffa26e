//! Reading chunks from an admitted TCP data stream: each frame's header is checked against the
//! chunk expected next, then its payload is read straight into the values it updates.

use std::io::{ErrorKind, Read};

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::kernels::Apply;
use crate::spin::SPIN_MAX_FRAME_BYTES;
use crate::transport::frame::{ChunkId, HEADER_LEN, InboxError, ReceiveMode, check_header, ended};

/// Bytes of a TCP chunk read at a time before they are added: small enough to stay in cache
/// between the kernel's copy and the add, large enough to keep system calls few.
const ADD_PIECE: usize = 256 << 10;

/// An admitted raw TCP data stream (see `port`), and the buffer chunks to be added go through.
pub(crate) struct TcpSource {
    stream: TcpStream,
    scratch: Vec<u8>,
}

impl TcpSource {
    /// A data stream whose hello is done.
    pub(crate) fn new(stream: TcpStream) -> Self {
        TcpSource {
            stream,
            scratch: Vec::new(),
        }
    }

    /// Reads the next frame, which must be `expected` with `dst.len()` values, and applies it
    /// to `dst` (the stream's generation was checked by its hello).
    pub(crate) async fn receive(
        &mut self,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), InboxError> {
        let payload = dst.len() * mode.compression.bytes_per_value();
        if payload <= SPIN_MAX_FRAME_BYTES {
            return self.receive_small(expected, dst, apply, mode).await;
        }
        let mut header = [0u8; HEADER_LEN];
        match self.stream.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Err(ended()),
            Err(e) => return Err(broken(e)),
        }
        check_header(&header, expected, payload)?;
        read_payload(&mut self.stream, &mut self.scratch, dst, apply, mode).await
    }

    /// A small frame, header and payload, in as few reads as the kernel allows (one when it
    /// has all arrived), polling the socket for `mode.spin` (yielding the core between polls)
    /// before parking in epoll.
    async fn receive_small(
        &mut self,
        expected: ChunkId,
        dst: &mut [f32],
        apply: Apply,
        mode: ReceiveMode,
    ) -> Result<(), InboxError> {
        let payload = dst.len() * mode.compression.bytes_per_value();
        let total = HEADER_LEN + payload;
        if self.scratch.len() < total {
            self.scratch.resize(total, 0);
        }
        let mut spin_until = mode.spin.map(|d| std::time::Instant::now() + d);
        let mut filled = 0;
        while filled < total {
            let unread = &mut self.scratch[filled..total];
            let result = match spin_until {
                // The reactor only learns of new bytes when this task yields, so polling
                // reads the socket itself; the stream is non-blocking.
                Some(until) => match (&*socket2::SockRef::from(&self.stream)).read(unread) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if std::time::Instant::now() >= until {
                            spin_until = None;
                        }
                        // Give the core to any other runnable thread between polls: a peer
                        // rank sharing this core, or this rank's own compute.
                        std::thread::yield_now();
                        continue;
                    }
                    other => other,
                },
                None => {
                    self.stream.readable().await.map_err(broken)?;
                    match self.stream.try_read(unread) {
                        Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                        other => other,
                    }
                }
            };
            let n = match result {
                Ok(0) if filled == 0 => return Err(ended()),
                Ok(0) => return Err(broken(ErrorKind::UnexpectedEof.into())),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(broken(e)),
            };
            if filled < HEADER_LEN && filled + n >= HEADER_LEN {
                let header: &[u8; HEADER_LEN] = self.scratch[..HEADER_LEN]
                    .try_into()
                    .expect("HEADER_LEN bytes");
                check_header(header, expected, payload)?;
            }
            filled += n;
        }
        mode.compression
            .decode_apply(dst, &self.scratch[HEADER_LEN..total], apply);
        Ok(())
    }
}

fn broken(e: std::io::Error) -> InboxError {
    if e.kind() == ErrorKind::UnexpectedEof {
        InboxError::Lost("its stream ended inside a chunk".into())
    } else {
        InboxError::Lost(format!("reading its stream: {e}"))
    }
}

/// Reads the payload of `dst.len()` values: copied straight into `dst` where its memory already
/// is the wire encoding (f32, little-endian), otherwise through `scratch` a cache-sized piece at
/// a time.
async fn read_payload(
    stream: &mut TcpStream,
    scratch: &mut Vec<u8>,
    dst: &mut [f32],
    apply: Apply,
    mode: ReceiveMode,
) -> Result<(), InboxError> {
    #[cfg(target_endian = "little")]
    if apply == Apply::Copy && mode.compression == crate::Compression::None {
        stream
            .read_exact(crate::kernels::le_bytes_mut(dst))
            .await
            .map_err(broken)?;
        return Ok(());
    }
    let width = mode.compression.bytes_per_value();
    let need = ADD_PIECE.min(dst.len() * width);
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    for piece in dst.chunks_mut(ADD_PIECE / width) {
        let bytes = &mut scratch[..piece.len() * width];
        stream.read_exact(bytes).await.map_err(broken)?;
        mode.compression.decode_apply(piece, bytes, apply);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;
    use crate::compression::Compression;
    use crate::transport::frame::ChunkHeader;

    fn id(chunk: u32) -> ChunkId {
        ChunkId {
            op_id: 9,
            phase: 16,
            segment: 1,
            chunk,
        }
    }

    /// Chunk `id`'s frame of f32 `values`.
    fn frame(id: ChunkId, values: &[f32]) -> Vec<u8> {
        let header = ChunkHeader::of(id, values.len() * 4).unwrap();
        let payload = values.iter().flat_map(|v| v.to_le_bytes());
        header.encode().into_iter().chain(payload).collect()
    }

    async fn take(
        source: &mut TcpSource,
        expected: ChunkId,
        values: &mut [f32],
        apply: Apply,
    ) -> Result<(), InboxError> {
        source
            .receive(expected, values, apply, ReceiveMode::default())
            .await
    }

    /// A source reading one end of a loopback TCP stream, and the peer's end.
    async fn connected() -> (TcpSource, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mine, _) = listener.accept().await.unwrap();
        (TcpSource::new(mine), peer)
    }

    #[tokio::test]
    async fn chunks_longer_than_a_piece_are_added_and_copied_whole() {
        let (mut source, mut peer) = connected().await;
        // Not a multiple of the piece, so the last piece is short.
        let len = ADD_PIECE / 4 * 2 + 1001;
        let sent: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
        let writer = tokio::spawn(async move {
            peer.write_all(&frame(id(0), &sent)).await.unwrap();
            peer.write_all(&frame(id(1), &sent)).await.unwrap();
            peer
        });
        let mut values = vec![1.0f32; len];
        take(&mut source, id(0), &mut values, Apply::Add)
            .await
            .unwrap();
        assert!(
            values
                .iter()
                .enumerate()
                .all(|(i, v)| *v == i as f32 * 0.5 + 1.0)
        );
        take(&mut source, id(1), &mut values, Apply::Copy)
            .await
            .unwrap();
        assert!(values.iter().enumerate().all(|(i, v)| *v == i as f32 * 0.5));
        drop(writer.await.unwrap());
        let error = take(&mut source, id(2), &mut values, Apply::Add).await;
        assert!(
            matches!(error, Err(InboxError::Lost(r)) if r.contains("stream to this rank ended"))
        );
    }

    fn polling(spin_us: u64, compression: Compression) -> ReceiveMode {
        ReceiveMode {
            compression,
            spin: Some(std::time::Duration::from_micros(spin_us)),
            in_place: false,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_frames_split_across_writes_arrive_whole_polled_or_parked() {
        let (mut source, mut peer) = connected().await;
        let sent: Vec<f32> = (0..1000).map(|i| i as f32 - 300.5).collect();
        let modes = [
            polling(1_000_000, Compression::None),
            polling(1, Compression::None),
            ReceiveMode::default(),
        ];
        let frames: Vec<Vec<u8>> = (0..modes.len() as u32)
            .map(|k| frame(id(k), &sent))
            .collect();
        let writer = tokio::spawn(async move {
            for bytes in frames {
                // Header split, then the payload in two writes: the receiver sees partial reads.
                for piece in [&bytes[..10], &bytes[10..2000], &bytes[2000..]] {
                    peer.write_all(piece).await.unwrap();
                    peer.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
            peer
        });
        for (k, mode) in modes.into_iter().enumerate() {
            let mut values = vec![1.0f32; sent.len()];
            source
                .receive(id(k as u32), &mut values, Apply::Add, mode)
                .await
                .unwrap();
            let expected: Vec<f32> = sent.iter().map(|v| v + 1.0).collect();
            assert_eq!(values, expected, "{mode:?}");
        }
        drop(writer.await.unwrap());
        let mut values = vec![0f32; sent.len()];
        let error = source
            .receive(
                id(9),
                &mut values,
                Apply::Add,
                polling(100, Compression::None),
            )
            .await;
        assert!(
            matches!(error, Err(InboxError::Lost(r)) if r.contains("stream to this rank ended"))
        );
    }

    #[tokio::test]
    async fn sixteen_bit_frames_small_and_large_decode_onto_the_values() {
        let (mut source, mut peer) = connected().await;
        // Exactly representable in both bf16 and fp16.
        let wire: Vec<f32> = (0..ADD_PIECE).map(|i| (i % 64) as f32 * 0.25).collect();
        for (k, (compression, len)) in [
            (Compression::Bf16, 100),
            (Compression::Fp16, 100),
            (Compression::Bf16, wire.len()),
            (Compression::Fp16, wire.len()),
        ]
        .into_iter()
        .enumerate()
        {
            let mut encoded = Vec::new();
            compression.round_and_encode(&mut wire[..len].to_vec(), &mut encoded);
            let header = ChunkHeader::of(id(k as u32), encoded.len()).unwrap();
            peer.write_all(&header.encode()).await.unwrap();
            let writer = peer.write_all(&encoded);
            let mut values = vec![0.5f32; len];
            let mode = ReceiveMode {
                compression,
                spin: None,
                in_place: false,
            };
            let (written, received) = tokio::join!(
                writer,
                source.receive(id(k as u32), &mut values, Apply::Add, mode)
            );
            written.unwrap();
            received.unwrap();
            let expected: Vec<f32> = wire[..len].iter().map(|v| v + 0.5).collect();
            assert_eq!(values, expected, "{compression} {len}");
        }
    }

    #[tokio::test]
    async fn a_stream_ending_inside_a_chunk_is_lost() {
        let (mut source, mut peer) = connected().await;
        let whole = frame(id(0), &[1.0, 2.0]);
        peer.write_all(&whole[..whole.len() - 2]).await.unwrap();
        drop(peer);
        let mut values = [0f32; 2];
        let error = take(&mut source, id(0), &mut values, Apply::Copy).await;
        assert!(matches!(error, Err(InboxError::Lost(r)) if r.contains("inside a chunk")));
    }

    #[tokio::test]
    async fn an_unexpected_chunk_is_a_violation_that_changes_no_value() {
        let (mut source, mut peer) = connected().await;
        peer.write_all(&frame(id(5), &[1.0])).await.unwrap();
        let mut values = [0f32];
        let error = take(&mut source, id(4), &mut values, Apply::Add).await;
        assert!(
            matches!(error, Err(InboxError::Violation(ref r)) if r.contains("sequence of collectives")),
            "{error:?}"
        );
        assert_eq!(values, [0.0]);
    }

    #[tokio::test]
    async fn a_chunk_of_the_wrong_length_is_refused_before_its_payload_is_read() {
        let (mut source, mut peer) = connected().await;
        let mut huge = frame(id(0), &[]);
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        peer.write_all(&huge).await.unwrap();
        let mut values = [0f32; 4];
        let error = take(&mut source, id(0), &mut values, Apply::Copy).await;
        assert!(
            matches!(error, Err(InboxError::Violation(ref r)) if r.contains("4294967295 bytes where 16")),
            "{error:?}"
        );
    }
}
