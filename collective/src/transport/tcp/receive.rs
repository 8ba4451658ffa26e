//! Reading chunks from an admitted TCP data stream: each frame's header is checked against the
//! chunk expected next, then its payload is read straight into the values it updates.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::framing::{ChunkHeader, HEADER_LEN};
use crate::kernels::{add_from_le, copy_from_le};
use crate::transport::ChunkId;
use crate::transport::inbox::{Apply, InboxError, check, ended};

/// Bytes of a TCP chunk read at a time before they are added: small enough to stay in cache
/// between the kernel's copy and the add, large enough to keep system calls few.
const ADD_PIECE: usize = 256 << 10;

/// An admitted raw TCP data stream (see `port`) and the buffer chunks to be added go through.
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
    ) -> Result<(), InboxError> {
        let mut header = [0u8; HEADER_LEN];
        match self.stream.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ended()),
            Err(e) => return Err(broken(e)),
        }
        let header = ChunkHeader::decode(&header);
        let got = ChunkId {
            op_id: header.op_id,
            phase: header.phase,
            segment: header.segment,
            chunk: header.chunk,
        };
        check(expected, got, header.len as usize, dst.len())?;
        read_payload(&mut self.stream, &mut self.scratch, dst, apply).await
    }
}

fn broken(e: std::io::Error) -> InboxError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        InboxError::Lost("its stream ended inside a chunk".into())
    } else {
        InboxError::Lost(format!("reading its stream: {e}"))
    }
}

/// Reads `dst.len() * 4` payload bytes: copied straight into `dst` where its memory already is
/// the little-endian encoding, otherwise through `scratch` a cache-sized piece at a time.
async fn read_payload(
    stream: &mut TcpStream,
    scratch: &mut Vec<u8>,
    dst: &mut [f32],
    apply: Apply,
) -> Result<(), InboxError> {
    #[cfg(target_endian = "little")]
    if apply == Apply::Copy {
        stream
            .read_exact(crate::kernels::le_bytes_mut(dst))
            .await
            .map_err(broken)?;
        return Ok(());
    }
    let need = ADD_PIECE.min(dst.len() * 4);
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    for piece in dst.chunks_mut(ADD_PIECE / 4) {
        let bytes = &mut scratch[..piece.len() * 4];
        stream.read_exact(bytes).await.map_err(broken)?;
        match apply {
            Apply::Add => add_from_le(piece, bytes),
            Apply::Copy => copy_from_le(piece, bytes),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;
    use crate::transport::inbox::{Handoff, Inbox};

    const GENERATION: u64 = 3;

    fn id(chunk: u32) -> ChunkId {
        ChunkId {
            op_id: 9,
            phase: 16,
            segment: 1,
            chunk,
        }
    }

    fn frame(id: ChunkId, values: &[f32]) -> Vec<u8> {
        let header = ChunkHeader {
            op_id: id.op_id,
            phase: id.phase,
            segment: id.segment,
            chunk: id.chunk,
            len: (values.len() * 4) as u32,
        };
        let payload = values.iter().flat_map(|v| v.to_le_bytes());
        header.encode().into_iter().chain(payload).collect()
    }

    async fn take(
        inbox: &mut Inbox,
        expected: ChunkId,
        values: &mut [f32],
        apply: Apply,
    ) -> Result<(), InboxError> {
        inbox.receive(GENERATION, expected, values, apply).await
    }

    /// An open inbox reading a TCP stream, and the peer's end of that stream.
    async fn connected() -> (Inbox, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mine, _) = listener.accept().await.unwrap();
        (
            Inbox::Open(Box::new(Handoff::tcp(TcpSource::new(mine)))),
            peer,
        )
    }

    #[tokio::test]
    async fn chunks_longer_than_a_piece_are_added_and_copied_whole() {
        let (mut inbox, mut peer) = connected().await;
        // Not a multiple of the piece, so the last piece is short.
        let len = ADD_PIECE / 4 * 2 + 1001;
        let sent: Vec<f32> = (0..len).map(|i| i as f32 * 0.5).collect();
        let writer = tokio::spawn(async move {
            peer.write_all(&frame(id(0), &sent)).await.unwrap();
            peer.write_all(&frame(id(1), &sent)).await.unwrap();
            peer
        });
        let mut values = vec![1.0f32; len];
        take(&mut inbox, id(0), &mut values, Apply::Add)
            .await
            .unwrap();
        assert!(
            values
                .iter()
                .enumerate()
                .all(|(i, v)| *v == i as f32 * 0.5 + 1.0)
        );
        take(&mut inbox, id(1), &mut values, Apply::Copy)
            .await
            .unwrap();
        assert!(values.iter().enumerate().all(|(i, v)| *v == i as f32 * 0.5));
        drop(writer.await.unwrap());
        let error = take(&mut inbox, id(2), &mut values, Apply::Add).await;
        assert!(
            matches!(error, Err(InboxError::Lost(r)) if r.contains("stream to this rank ended"))
        );
    }

    #[tokio::test]
    async fn a_stream_ending_inside_a_chunk_is_lost_and_stays_closed() {
        let (mut inbox, mut peer) = connected().await;
        let whole = frame(id(0), &[1.0, 2.0]);
        peer.write_all(&whole[..whole.len() - 2]).await.unwrap();
        drop(peer);
        let mut values = [0f32; 2];
        let error = take(&mut inbox, id(0), &mut values, Apply::Copy).await;
        assert!(matches!(error, Err(InboxError::Lost(r)) if r.contains("inside a chunk")));
        let again = take(&mut inbox, id(0), &mut values, Apply::Copy).await;
        assert!(matches!(again, Err(InboxError::Lost(r)) if r.contains("inside a chunk")));
    }

    #[tokio::test]
    async fn an_unexpected_chunk_is_a_violation_that_closes_the_inbox() {
        let (mut inbox, mut peer) = connected().await;
        peer.write_all(&frame(id(5), &[1.0])).await.unwrap();
        let mut values = [0f32];
        let error = take(&mut inbox, id(4), &mut values, Apply::Add).await;
        assert!(
            matches!(error, Err(InboxError::Violation(ref r)) if r.contains("sequence of collectives")),
            "{error:?}"
        );
        assert_eq!(values, [0.0]);
        let again = take(&mut inbox, id(5), &mut values, Apply::Add).await;
        assert!(matches!(again, Err(InboxError::Lost(r)) if r.contains("broke the protocol")));
    }

    #[tokio::test]
    async fn a_chunk_of_the_wrong_length_is_refused_before_its_payload_is_read() {
        let (mut inbox, mut peer) = connected().await;
        let mut huge = frame(id(0), &[]);
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        peer.write_all(&huge).await.unwrap();
        let mut values = [0f32; 4];
        let error = take(&mut inbox, id(0), &mut values, Apply::Copy).await;
        assert!(
            matches!(error, Err(InboxError::Violation(ref r)) if r.contains("4294967295 bytes where 16")),
            "{error:?}"
        );
    }
}
