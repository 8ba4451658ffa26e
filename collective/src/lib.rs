//! Rendezvous and collectives between the ranks of one job, over gRPC, with chunks on a raw
//! TCP data path beside it by default ([`DataPath`]).
//!
//! A rank builds a [`Communicator`] from a [`CommConfig`]; rank 0 also serves the rendezvous.
//! `all_reduce_sum`/`all_reduce_mean` run the ring, hierarchical or star algorithm and leave
//! bitwise-identical results on every rank. Failures of peers or timeouts abort every rank with
//! a retryable [`CollectiveError`].

mod algorithms;
mod auth;
mod communicator;
mod compression;
mod config;
mod error;
mod fault;
mod kernels;
mod net;
mod rendezvous;
mod segments;
mod spin;
mod transport;
mod warm;

/// Generated gRPC code of `proto/collective/v1/collective.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("rdu.collective.v1");
}

pub use algorithms::choice::AUTO_SMALL_MAX_BYTES;
pub use auth::{AUTHORIZATION, AttachToken, RequireToken};
pub use communicator::{Communicator, ConnectOptions, ReduceOptions};
pub use compression::Compression;
pub use config::{
    Algorithm, CommConfig, DEFAULT_CHUNK_BYTES, DEFAULT_RING_MEMORY, DataPath, JobIdentity,
    MAX_CHUNK_BYTES, MAX_RING_DIR_BYTES, PeerInfo, RING_DIR_ENV, RING_MEMORY_ENV, RingMemory,
    RingPlace, RingSockets,
};
pub use error::CollectiveError;
pub use rendezvous::{RendezvousHandler, RendezvousService, RendezvousTable};
pub use segments::{chunk_count, segment_range, segment_ranges};
pub use spin::{DEFAULT_SPIN, SPIN_MAX_FRAME_BYTES, Spin};
pub use transport::{FROM_RANK, GENERATION, RING_SEGMENT_BYTES, RingMemoryUse};
pub use warm::{MAX_WARM_BYTES, warm_len, warm_up};
