//! Shared harness: a whole job of N ranks in one process on loopback.

#![allow(dead_code)]

use std::time::Duration;

use futures::future::join_all;
use rdu_collective::{
    CommConfig, Communicator, ConnectOptions, DEFAULT_RING_MEMORY, DataPath, JobIdentity,
    ReduceOptions, RingMemory, RingSockets, Spin,
};

pub(crate) const TOKEN: &str = "test-token";
pub(crate) const JOB: &str = "job-uid";
pub(crate) const GENERATION: u64 = 4;
/// Small chunks so modest buffers still pipeline through many chunks.
pub(crate) const CHUNK_BYTES: usize = 64 << 10;

pub(crate) fn config(
    rank: u32,
    world: u32,
    master_port: u16,
    node: &str,
    timeout: Duration,
) -> CommConfig {
    CommConfig {
        identity: JobIdentity {
            job_uid: JOB.into(),
            token: TOKEN.into(),
            generation: GENERATION,
        },
        rank,
        world_size: world,
        master_addr: "127.0.0.1".into(),
        master_port,
        advertise_host: "127.0.0.1".into(),
        collective_port: 0,
        node: node.into(),
        timeout,
        chunk_bytes: CHUNK_BYTES,
    }
}

/// A bound rendezvous listener and its port.
pub(crate) async fn rendezvous_listener() -> (tokio::net::TcpListener, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    (listener, port)
}

/// Connects `world` ranks; `node_of(rank)` names each rank's node.
pub(crate) async fn world(
    world: u32,
    node_of: impl Fn(u32) -> String,
    timeout: Duration,
) -> Vec<Communicator> {
    world_on(world, node_of, timeout, |_| DataPath::default()).await
}

/// Like [`world`], each rank sending chunks on `path_of(rank)`.
pub(crate) async fn world_on(
    world: u32,
    node_of: impl Fn(u32) -> String,
    timeout: Duration,
    path_of: impl Fn(u32) -> DataPath,
) -> Vec<Communicator> {
    world_polling(world, node_of, timeout, path_of, Spin::Auto).await
}

/// [`world_on`] with every rank polling small frames as `spin` says.
pub(crate) async fn world_polling(
    world: u32,
    node_of: impl Fn(u32) -> String,
    timeout: Duration,
    path_of: impl Fn(u32) -> DataPath,
    spin: Spin,
) -> Vec<Communicator> {
    let ring_memory = RingMemory::Bytes(DEFAULT_RING_MEMORY);
    world_with(world, node_of, timeout, path_of, spin, ring_memory).await
}

/// [`world`] on one node, every rank's rings capped at `ring_memory`.
pub(crate) async fn world_with_rings(
    world: u32,
    timeout: Duration,
    ring_memory: RingMemory,
) -> Vec<Communicator> {
    let node = |_| "node0".to_string();
    world_with(
        world,
        node,
        timeout,
        |_| DataPath::Auto,
        Spin::Auto,
        ring_memory,
    )
    .await
}

async fn world_with(
    world: u32,
    node_of: impl Fn(u32) -> String,
    timeout: Duration,
    path_of: impl Fn(u32) -> DataPath,
    spin: Spin,
    ring_memory: RingMemory,
) -> Vec<Communicator> {
    let (listener, port) = rendezvous_listener().await;
    let mut listener = Some(listener);
    let connects = (0..world).map(|rank| {
        let cfg = config(rank, world, port, &node_of(rank), timeout);
        let options = ConnectOptions {
            data_path: path_of(rank),
            rendezvous_listener: if rank == 0 { listener.take() } else { None },
            spin,
            ring_memory,
            ring_sockets: RingSockets::Abstract,
        };
        Communicator::connect_with(cfg, options)
    });
    join_all(connects)
        .await
        .into_iter()
        .map(|c| c.expect("connect"))
        .collect()
}

/// Deterministic, non-trivial values for `rank` (exercises rounding, so order matters).
pub(crate) fn data(rank: u32, len: usize) -> Vec<f32> {
    let mut state =
        0x9E37_79B9_7F4A_7C15u64 ^ (u64::from(rank) + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.7
        })
        .collect()
}

/// Sum over ranks in f64, the reference.
pub(crate) fn reference_sum(world: u32, len: usize) -> Vec<f64> {
    let mut acc = vec![0f64; len];
    for r in 0..world {
        for (a, v) in acc.iter_mut().zip(data(r, len)) {
            *a += f64::from(v);
        }
    }
    acc
}

/// Sums `bufs` (one per rank) in place on every rank at once; panics naming the rank that failed.
pub(crate) async fn reduce_in_place(
    comms: &[Communicator],
    bufs: &mut [Vec<f32>],
    options: impl Into<ReduceOptions>,
) {
    let options = options.into();
    let results = join_all(
        comms
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| c.all_reduce_sum(b, options)),
    )
    .await;
    for (rank, r) in results.into_iter().enumerate() {
        if let Err(e) = r {
            panic!("rank {rank} {options:?} len {}: {e}", bufs[rank].len());
        }
    }
}

/// Every rank's buffer holds rank 0's bits.
pub(crate) fn assert_bitwise_identical(bufs: &[Vec<f32>], what: &str) {
    for (rank, b) in bufs.iter().enumerate().skip(1) {
        assert_eq!(b.len(), bufs[0].len(), "{what}: rank {rank}'s length");
        let differing = b
            .iter()
            .zip(&bufs[0])
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(differing, None, "{what}: rank {rank} differs from rank 0");
    }
}
