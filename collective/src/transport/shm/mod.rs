//! Shared memory between ranks on one host, a link kind of its own beside TCP and gRPC (as Open
//! MPI's `vader` and NCCL's SHM transport). A sending rank that may make a ring (same node, the
//! memory budget allows it: `budget`) makes its memory (`segment`: anonymous and sealed, never a
//! file) and offers it in its data stream's hello; the receiver fetches the memory's descriptor
//! from the sender's socket (`pass`), checks it and maps it, and says so in its reply. From then
//! on the pair's frames go through the ring (`link` writes, `source` reads) while the data
//! stream only wakes a sleeping end (`bell`) and tells each end when the other is gone. Ranks
//! that cannot share (other hosts; pods, whose network namespaces keep them from each other's
//! abstract socket, unless their job's shared-memory domain gives them a directory for the
//! sockets: `RingPlace`) keep frames on TCP. Whatever the other process writes into the segment is checked
//! before it is used.

mod bell;
mod budget;
mod link;
mod pass;
mod ring;
mod segment;
mod source;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::config::RingPlace;

pub(crate) use link::ShmLink;
pub(crate) use ring::RingReader;
pub(crate) use source::ShmSource;

use budget::{HostMemory, RingBudget};
use pass::{PassError, RingServer, ServerId};
use ring::RingWriter;
use segment::{HEADER_BYTES, Nonce, Segment, SegmentError};

/// Bytes of one pair's ring: 16 pieces in flight, and little memory for many ranks. 512 KiB, 2 MiB
/// and 8 MiB trained `examples/mlp-bench.yaml` on 2 ranks equally fast within the noise (33-36k
/// samples/s); `allreduce-bench` at 2 and 4 ranks favoured none of them consistently.
pub(crate) const RING_BYTES: usize = 2 << 20;
/// Memory one ring takes: its bytes and the segment's header.
pub const SEGMENT_BYTES: usize = RING_BYTES + HEADER_BYTES;

/// What a hello offers: the sender's socket, and the nonce its ring is offered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) server: ServerId,
    pub(crate) nonce: Nonce,
}

impl Offer {
    /// Bytes of an encoded offer.
    pub(crate) const LEN: usize = 32;

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..16].copy_from_slice(&self.server);
        out[16..].copy_from_slice(&self.nonce);
        out
    }

    pub(crate) fn decode(bytes: &[u8; Self::LEN]) -> Offer {
        let mut offer = Offer {
            server: [0; 16],
            nonce: [0; 16],
        };
        offer.server.copy_from_slice(&bytes[..16]);
        offer.nonce.copy_from_slice(&bytes[16..]);
        offer
    }
}

/// A sending rank's means to make rings: its socket for handing them over and its budget.
pub(crate) struct RingMaker {
    server: RingServer,
    budget: std::sync::Arc<RingBudget>,
}

impl RingMaker {
    /// Starts this rank's ring socket in `place`; its rings may hold `max_bytes` at once.
    pub(crate) fn start(max_bytes: u64, place: &RingPlace) -> std::io::Result<RingMaker> {
        Ok(RingMaker {
            server: RingServer::start(place)?,
            budget: RingBudget::new(max_bytes),
        })
    }

    /// A ring to offer `peer`, if the budget has room and the memory can be made.
    pub(crate) fn offer(&self, peer: u32) -> Option<Offering> {
        let reservation = self
            .budget
            .reserve(SEGMENT_BYTES as u64, peer, HostMemory::read)?;
        let made = match Segment::create(RING_BYTES, Some(reservation)) {
            Ok(made) => made,
            Err(error) => {
                tracing::debug!(peer, error = %rdu_error_chain::Chain(&error), "no ring to offer; frames stay on TCP");
                return None;
            }
        };
        let offer = Offer {
            server: self.server.id(),
            nonce: made.nonce,
        };
        Some(Offering {
            offer,
            segment: made.segment,
            _on_offer: self.server.offer(made.nonce, made.fd),
        })
    }

    /// Bytes this rank's rings hold now.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.budget.held()
    }

    /// The most this rank's rings held at once.
    pub(crate) fn peak_bytes(&self) -> u64 {
        self.budget.peak()
    }
}

/// A ring offered to one peer, waiting for its answer. Dropped unanswered or declined, the
/// offer is withdrawn and the memory goes.
pub(crate) struct Offering {
    pub(crate) offer: Offer,
    segment: Segment,
    _on_offer: pass::Offered,
}

impl Offering {
    /// The peer took the ring: its sending end, which polls a full ring for `spin`.
    pub(crate) fn taken(self, spin: Option<Duration>) -> RingWriter {
        RingWriter::new(self.segment, spin)
    }
}

/// Why an offered ring was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TakeError {
    #[error(transparent)]
    Pass(#[from] PassError),
    #[error(transparent)]
    Segment(#[from] SegmentError),
}

/// Takes the ring `offer` names: fetches its memory from the sender's socket in `place` and checks
/// it.
pub(crate) async fn take(offer: &Offer, place: &RingPlace) -> Result<RingReader, TakeError> {
    let fd = pass::fetch(place, &offer.server, &offer.nonce).await?;
    let segment = Segment::attach(fd, &offer.nonce)?;
    Ok(RingReader::new(segment))
}
