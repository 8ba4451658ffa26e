//! The chunk frame every transport carries, and how a receiver checks it: a chunk's name
//! ([`ChunkId`]), the fixed little-endian header that precedes its payload on a TCP stream or in
//! a shared-memory ring ([`ChunkHeader`]), how a collective receives ([`ReceiveMode`]), and why
//! receiving failed ([`InboxError`]). Each received chunk must be exactly the expected one: same
//! operation, phase, segment, chunk and length. Pure types and checks, no I/O.

use std::time::Duration;

use crate::compression::Compression;
use crate::error::CollectiveError;

/// Which chunk a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkId {
    pub(crate) op_id: u64,
    pub(crate) phase: u32,
    pub(crate) segment: u32,
    pub(crate) chunk: u32,
}

/// Chunk header bytes: op_id (u64), phase, segment, chunk, payload length (u32 each).
pub(crate) const HEADER_LEN: usize = 24;

/// Where a chunk belongs and how many payload bytes follow the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkHeader {
    pub(crate) op_id: u64,
    pub(crate) phase: u32,
    pub(crate) segment: u32,
    pub(crate) chunk: u32,
    pub(crate) len: u32,
}

impl ChunkHeader {
    /// The header of chunk `id` with `payload` bytes.
    pub(crate) fn of(id: ChunkId, payload: usize) -> Result<ChunkHeader, CollectiveError> {
        let len = u32::try_from(payload).map_err(|_| {
            CollectiveError::invalid_config("chunk_bytes", "chunk does not fit 32 bits")
        })?;
        Ok(ChunkHeader {
            op_id: id.op_id,
            phase: id.phase,
            segment: id.segment,
            chunk: id.chunk,
            len,
        })
    }

    pub(crate) fn id(&self) -> ChunkId {
        ChunkId {
            op_id: self.op_id,
            phase: self.phase,
            segment: self.segment,
            chunk: self.chunk,
        }
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(&self.op_id.to_le_bytes());
        out[8..12].copy_from_slice(&self.phase.to_le_bytes());
        out[12..16].copy_from_slice(&self.segment.to_le_bytes());
        out[16..20].copy_from_slice(&self.chunk.to_le_bytes());
        out[20..24].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8; HEADER_LEN]) -> Self {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut op_id = [0u8; 8];
        op_id.copy_from_slice(&bytes[..8]);
        ChunkHeader {
            op_id: u64::from_le_bytes(op_id),
            phase: word(8),
            segment: word(12),
            chunk: word(16),
            len: word(20),
        }
    }
}

/// How a collective receives: the encoding its values travel in, how long a wait polls before
/// the task parks (see `spin`), and whether it may poll in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReceiveMode {
    pub(crate) compression: Compression,
    pub(crate) spin: Option<Duration>,
    /// Nothing else of this task has to run while the receive waits (its sends went out
    /// already), so a shared-memory ring is polled without handing the task back to the
    /// runtime between polls (which costs a wake-up through the runtime's driver each time).
    pub(crate) in_place: bool,
}

/// Why reading from a peer failed.
#[derive(Debug)]
pub(crate) enum InboxError {
    /// The stream broke or ended (peer gone).
    Lost(String),
    /// The peer sent something it must not.
    Violation(String),
}

/// The peer's stream ended where a chunk was expected.
pub(crate) fn ended() -> InboxError {
    InboxError::Lost("its stream to this rank ended".into())
}

/// The frame's header must name `expected` with `payload` bytes.
pub(crate) fn check_header(
    header: &[u8; HEADER_LEN],
    expected: ChunkId,
    payload: usize,
) -> Result<(), InboxError> {
    let header = ChunkHeader::decode(header);
    check(expected, header.id(), header.len as usize, payload)
}

/// The chunk that arrived must be the one expected, with `expected_bytes` of payload (one
/// encoded value per destination slot).
pub(crate) fn check(
    expected: ChunkId,
    got: ChunkId,
    bytes: usize,
    expected_bytes: usize,
) -> Result<(), InboxError> {
    if got != expected {
        let tuple = |id: ChunkId| (id.op_id, id.phase, id.segment, id.chunk);
        return Err(InboxError::Violation(format!(
            "expected (op, phase, segment, chunk) {:?}, got {:?}; ranks disagree on the sequence of collectives",
            tuple(expected),
            tuple(got)
        )));
    }
    if bytes != expected_bytes {
        return Err(InboxError::Violation(format!(
            "chunk of {bytes} bytes where {expected_bytes} were expected; ranks disagree on the buffer length or on the compression"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: ChunkId = ChunkId {
        op_id: u64::MAX - 1,
        phase: 17,
        segment: 2,
        chunk: 40_000,
    };

    #[test]
    fn chunk_headers_round_trip() {
        let header = ChunkHeader::of(ID, 1 << 20).unwrap();
        assert_eq!(ChunkHeader::decode(&header.encode()), header);
        assert_eq!(header.id(), ID);
        assert!(ChunkHeader::of(ID, 1 << 32).is_err());
    }

    #[test]
    fn a_header_must_name_the_expected_chunk_and_length() {
        let header = ChunkHeader::of(ID, 16).unwrap().encode();
        assert!(check_header(&header, ID, 16).is_ok());
        let other = ChunkId { chunk: 1, ..ID };
        assert!(matches!(
            check_header(&header, other, 16),
            Err(InboxError::Violation(r)) if r.contains("sequence of collectives")
        ));
        assert!(matches!(
            check_header(&header, ID, 8),
            Err(InboxError::Violation(r)) if r.contains("16 bytes where 8")
        ));
    }
}
