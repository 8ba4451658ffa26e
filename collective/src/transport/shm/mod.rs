//! Shared memory between ranks on one host, a link kind of its own beside TCP and gRPC (as Open
//! MPI's `vader` and NCCL's SHM transport): a sending rank offers a ring in a segment of its own
//! making in its data stream's hello; a receiver that can open the very same segment (same host
//! and directory: the nonce proves it) accepts, and from then on the pair's frames go through the
//! ring (`link` writes, `source` reads) while the data stream only wakes a sleeping end (`bell`)
//! and tells each end when the other is gone. Ranks that cannot share (other hosts, pods with
//! private `/dev/shm`) keep frames on TCP. Whether a segment exists never depends on the peer's
//! word alone: the receiver opens only files of the offer's random name in its own directory,
//! never following links, and checks everything the other process writes into the segment
//! before using it.

mod bell;
mod link;
mod ring;
mod segment;
mod source;

use std::path::Path;

pub(crate) use link::ShmLink;
pub(crate) use ring::{RingReader, RingWriter};
pub(crate) use segment::{Offer, Segment};
pub(crate) use source::ShmSource;

/// Where segments are made: the tmpfs every Linux host has.
pub(crate) const SHM_DIR: &str = "/dev/shm";
/// Bytes of one pair's ring: 16 pieces in flight, and little memory for many ranks. 512 KiB, 2 MiB
/// and 8 MiB trained `examples/mlp-bench.yaml` on 2 ranks equally fast within the noise (33-36k
/// samples/s); `allreduce-bench` at 2 and 4 ranks favoured none of them consistently.
pub(crate) const RING_BYTES: usize = 2 << 20;

/// Where this rank makes and looks for segments, if it shares memory with peers at all.
pub(crate) fn shm_dir() -> Option<&'static Path> {
    let dir = Path::new(SHM_DIR);
    dir.is_dir().then_some(dir)
}
