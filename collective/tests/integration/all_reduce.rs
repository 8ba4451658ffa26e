//! All-reduce, broadcast and barrier correctness for 1 to 5 ranks, every algorithm, every data
//! path (shared-memory rings, TCP frames, gRPC streams).

use std::time::Duration;

use crate::common::{
    assert_bitwise_identical, data, reduce_in_place, reference_sum, world, world_on, world_polling,
    world_with_rings,
};
use futures::future::join_all;
use rdu_collective::{
    Algorithm, CollectiveError, Communicator, DataPath, RING_SEGMENT_BYTES, RingMemory, Spin,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const SIZES: [usize; 4] = [1, 7, 1000, 1_000_003];

async fn all_reduce(comms: &[Communicator], len: usize, algorithm: Algorithm) -> Vec<Vec<f32>> {
    let mut bufs: Vec<Vec<f32>> = (0..comms.len() as u32).map(|r| data(r, len)).collect();
    reduce_in_place(comms, &mut bufs, algorithm).await;
    bufs
}

fn assert_sum_and_identical(bufs: &[Vec<f32>], len: usize, what: &str) {
    let world = bufs.len() as u32;
    let expected = reference_sum(world, len);
    for (i, (got, want)) in bufs[0].iter().zip(&expected).enumerate() {
        let tolerance = 1e-5 * f64::from(world) * (1.0 + want.abs());
        assert!(
            (f64::from(*got) - want).abs() <= tolerance,
            "{what}: element {i} is {got}, expected {want}"
        );
    }
    assert_eq!(bufs[0].len(), len);
    assert_bitwise_identical(bufs, what);
}

async fn check_world(n: u32, node_of: impl Fn(u32) -> String) {
    check_comms(world(n, node_of, TIMEOUT).await).await;
}

async fn check_comms(comms: Vec<Communicator>) {
    run_every_algorithm(&comms).await;
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

/// Every algorithm on every size, then a barrier; the results of all of them, in order.
async fn run_every_algorithm(comms: &[Communicator]) -> Vec<Vec<Vec<f32>>> {
    let n = comms.len();
    let mut results = Vec::new();
    for algorithm in [
        Algorithm::Ring,
        Algorithm::Star,
        Algorithm::Hierarchical,
        Algorithm::Auto,
    ] {
        for len in SIZES {
            let bufs = all_reduce(comms, len, algorithm).await;
            assert_sum_and_identical(&bufs, len, &format!("{n} ranks {algorithm} len {len}"));
            results.push(bufs);
        }
    }
    join_all(comms.iter().map(Communicator::barrier)).await;
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_data_path_gives_the_same_results() {
    let comms = world_on(3, |r| format!("node{}", r % 2), TIMEOUT, |_| DataPath::Grpc).await;
    check_comms(comms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_on_one_host_send_through_shared_memory_rings() {
    // The default data path: ranks of one node send through rings, made when first used.
    let comms = world(3, |_| "node0".into(), TIMEOUT).await;
    assert!(comms.iter().all(|c| c.linked_peers().is_empty()));
    run_every_algorithm(&comms).await;
    // Links, and rings, only to the peers the algorithms sent to: the ring's right-hand
    // neighbour (0 -> 1 -> 2 -> 0), for the star rank 0 to every rank and every rank to rank 0,
    // and for the barrier every rank to the ranks 1 and 2 after it.
    let linked: Vec<Vec<u32>> = comms.iter().map(Communicator::linked_peers).collect();
    assert_eq!(linked, [vec![1, 2], vec![0, 2], vec![0, 1]]);
    for comm in &comms {
        assert_eq!(comm.shared_memory_peers(), comm.linked_peers());
        let rings = comm.linked_peers().len() as u64 * RING_SEGMENT_BYTES as u64;
        let memory = comm.ring_memory();
        assert_eq!((memory.bytes, memory.peak_bytes), (rings, rings));
    }
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_over_the_budget_fall_back_to_tcp_with_identical_bits() {
    // One ring's worth of budget: each rank rings its first peer and sends to the others on
    // TCP; no budget at all: everything on TCP. The bits are those of the unbounded rings.
    let rings = world_with_rings(3, TIMEOUT, RingMemory::Bytes(64 << 20)).await;
    let one = world_with_rings(3, TIMEOUT, RingMemory::Bytes(RING_SEGMENT_BYTES as u64)).await;
    let none = world_with_rings(3, TIMEOUT, RingMemory::Bytes(0)).await;
    let want = run_every_algorithm(&rings).await;
    assert_eq!(rings[0].shared_memory_peers(), [1, 2]);
    for (comms, most) in [(&one, 1), (&none, 0)] {
        let got = run_every_algorithm(comms).await;
        for (g, w) in got.iter().zip(&want) {
            let bits = |b: &Vec<Vec<f32>>| -> Vec<Vec<u32>> {
                b.iter()
                    .map(|v| v.iter().map(|x| x.to_bits()).collect())
                    .collect()
            };
            assert_eq!(bits(g), bits(w), "budget of {most} ring(s)");
        }
        for comm in comms.iter() {
            assert!(
                comm.shared_memory_peers().len() <= most,
                "rank {}",
                comm.rank()
            );
            assert!(comm.ring_memory().peak_bytes <= most as u64 * RING_SEGMENT_BYTES as u64);
        }
    }
    assert_eq!(
        one[0].shared_memory_peers().len(),
        1,
        "rank 0 links to two peers, one ring"
    );
    assert_eq!(one[0].linked_peers(), [1, 2]);
    for comms in [rings, one, none] {
        join_all(comms.into_iter().map(Communicator::shutdown)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_on_other_nodes_get_no_ring() {
    let comms = world(3, |r| format!("node{r}"), TIMEOUT).await;
    run_every_algorithm(&comms).await;
    assert!(comms.iter().all(|c| !c.linked_peers().is_empty()));
    assert!(comms.iter().all(|c| c.shared_memory_peers().is_empty()));
    assert!(comms.iter().all(|c| c.ring_memory().peak_bytes == 0));
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_on_tcp_give_the_same_results() {
    let comms = world_on(3, |r| format!("node{}", r % 2), TIMEOUT, |_| DataPath::Tcp).await;
    run_every_algorithm(&comms).await;
    assert!(comms.iter().all(|c| c.shared_memory_peers().is_empty()));
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_on_different_data_paths_still_agree() {
    // Rings from the auto ranks (a TCP-only rank still takes the rings offered to it), TCP
    // frames and gRPC streams in one job.
    let path_of = |r: u32| match r % 3 {
        0 => DataPath::Auto,
        1 => DataPath::Tcp,
        _ => DataPath::Grpc,
    };
    let comms = world_on(5, |r| format!("node{}", r / 3), TIMEOUT, path_of).await;
    run_every_algorithm(&comms).await;
    // Rank 0 (auto) shares rings with ranks 1 and 2 on its node, not with 3 and 4 on the
    // other; rank 3 (auto) with rank 4; rank 1 (tcp) with nobody, though it sent to rank 0.
    assert_eq!(comms[0].linked_peers(), vec![1, 2, 3, 4]);
    assert_eq!(comms[0].shared_memory_peers(), vec![1, 2]);
    assert_eq!(comms[3].shared_memory_peers(), vec![4]);
    assert!(comms[1].linked_peers().contains(&0));
    assert!(comms[1].shared_memory_peers().is_empty());
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_poll_small_frames_and_ranks_that_park_agree() {
    // Every rank polls (2 ranks), then every other rank polls (4 ranks); small and large
    // buffers, so both the polled single-read frames and the parked piecewise ones run.
    let poll = Spin::For(Duration::from_micros(500));
    let comms = world_polling(2, |r| format!("n{r}"), TIMEOUT, |_| DataPath::Tcp, poll).await;
    check_comms(comms).await;
    // Rings poll every frame, small or large.
    let comms = world_polling(3, |_| "n".into(), TIMEOUT, |_| DataPath::Auto, poll).await;
    check_comms(comms).await;
    let comms = world_polling(
        4,
        |r| format!("n{r}"),
        TIMEOUT,
        |_| DataPath::Tcp,
        Spin::Off,
    )
    .await;
    check_comms(comms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_rank_is_a_no_op() {
    let comms = world(1, |_| "n".into(), TIMEOUT).await;
    let mut buf = data(0, 7);
    let before = buf.clone();
    comms[0]
        .all_reduce_mean(&mut buf, Algorithm::Ring)
        .await
        .expect("no-op");
    assert_eq!(buf, before);
    comms[0].barrier().await.expect("barrier of one");
    assert_eq!(comms[0].peers().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_on_two_nodes() {
    check_world(2, |r| format!("node{r}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ranks_on_one_node() {
    check_world(3, |_| "node0".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_on_two_interleaved_nodes() {
    check_world(4, |r| format!("node{}", r % 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_ranks_on_two_uneven_nodes() {
    check_world(5, |r| if r < 3 { "a".into() } else { "b".into() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_ranks_agree_bitwise_after_three_doubling_steps() {
    // Auto runs recursive doubling on small buffers over 2^k ranks: here 3 steps.
    let comms = world(8, |r| format!("node{r}"), TIMEOUT).await;
    for len in [1, 7, 1000, 16_000] {
        let bufs = all_reduce(&comms, len, Algorithm::Auto).await;
        assert_sum_and_identical(&bufs, len, &format!("8 ranks auto len {len}"));
    }
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_ranks_agree_bitwise_after_halving_and_doubling_with_their_three_partners() {
    // Auto runs recursive halving then doubling above 64 KiB on 2^k ranks without shared nodes:
    // each rank sends to the ranks 4, 2 and 1 positions away (the ring would send to one).
    let comms = world(8, |r| format!("node{r}"), TIMEOUT).await;
    for len in [16_385 * 5, 1_000_003] {
        let bufs = all_reduce(&comms, len, Algorithm::Auto).await;
        assert_sum_and_identical(&bufs, len, &format!("8 ranks auto len {len}"));
    }
    for (p, linked) in links_of(&comms).into_iter().enumerate() {
        let mut partners = vec![(p ^ 1) as u32, (p ^ 2) as u32, (p ^ 4) as u32];
        partners.sort_unstable();
        assert_eq!(linked, partners, "rank {p}");
    }
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mean_divides_the_sum_and_repeated_calls_stay_in_step() {
    let comms = world(3, |r| format!("n{r}"), TIMEOUT).await;
    for round in 0..3 {
        let mut bufs: Vec<Vec<f32>> = (0..3).map(|r| vec![(r + round) as f32; 5]).collect();
        let results = join_all(
            comms
                .iter()
                .zip(bufs.iter_mut())
                .map(|(c, b)| c.all_reduce_mean(b, Algorithm::Ring)),
        )
        .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let expected = (round * 3 + 3) as f32 / 3.0;
        for b in &bufs {
            assert_eq!(b, &vec![expected; 5]);
        }
    }
}

/// Each rank's links, sorted.
fn links_of(comms: &[Communicator]) -> Vec<Vec<u32>> {
    comms.iter().map(Communicator::linked_peers).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_links_each_rank_to_log_n_peers_not_to_a_root_of_all() {
    for n in [5u32, 16] {
        let comms = world_on(n, |_| "n".into(), TIMEOUT, |_| DataPath::Tcp).await;
        let results = join_all(comms.iter().map(Communicator::barrier)).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        // Round r: rank p tells rank p + 2^r.
        let expected: Vec<Vec<u32>> = (0..n)
            .map(|p| {
                let mut peers: Vec<u32> = (0..n.next_power_of_two().trailing_zeros())
                    .map(|r| (p + (1 << r)) % n)
                    .collect();
                peers.sort_unstable();
                peers
            })
            .collect();
        assert_eq!(links_of(&comms), expected, "{n} ranks");
        join_all(comms.into_iter().map(Communicator::shutdown)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_goes_down_a_tree_of_n_minus_1_links() {
    let n = 12u32;
    let comms = world_on(n, |_| "n".into(), TIMEOUT, |_| DataPath::Tcp).await;
    let len = 100_003;
    let mut bufs: Vec<Vec<f32>> = (0..n).map(|r| data(r, len)).collect();
    let results = join_all(
        comms
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| c.broadcast(b, 5)),
    )
    .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let root = data(5, len);
    assert!(bufs.iter().all(|b| *b == root));
    let links = links_of(&comms);
    // The root sends to 4 children (8, 4, 2 and 1 positions after it); every rank is reached once.
    assert_eq!(links[5], vec![1, 6, 7, 9]);
    assert!(links.iter().all(|l| l.len() <= 4), "{links:?}");
    assert_eq!(links.iter().map(Vec::len).sum::<usize>(), n as usize - 1);
    join_all(comms.into_iter().map(Communicator::shutdown)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_copies_the_roots_buffer() {
    let comms = world(4, |_| "n".into(), TIMEOUT).await;
    let len = 200_001;
    let mut bufs: Vec<Vec<f32>> = (0..4).map(|r| data(r, len)).collect();
    let results = join_all(
        comms
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| c.broadcast(b, 2)),
    )
    .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let root = data(2, len);
    for b in &bufs {
        assert_eq!(b, &root);
    }
    let mut small = vec![0.0f32; 3];
    match comms[0].broadcast(&mut small, 4).await {
        Err(e @ CollectiveError::InvalidArgument { .. }) => assert!(!e.is_retryable()),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // The refused call did not desynchronize the ranks.
    let results = join_all(comms.iter().map(Communicator::barrier)).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_buffer_lengths_are_a_protocol_error_not_a_crash() {
    let comms = world(2, |_| "n".into(), TIMEOUT).await;
    let mut a = vec![1.0f32; 10];
    let mut b = vec![1.0f32; 11];
    let (ra, rb) = tokio::join!(
        comms[0].all_reduce_sum(&mut a, Algorithm::Ring),
        comms[1].all_reduce_sum(&mut b, Algorithm::Ring)
    );
    assert!(ra.is_err() && rb.is_err(), "{ra:?} {rb:?}");
    assert!(
        matches!(ra, Err(CollectiveError::Protocol { .. }))
            || matches!(rb, Err(CollectiveError::Protocol { .. })),
        "{ra:?} {rb:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_holds_everyone_until_the_last_rank_arrives() {
    let comms = world(3, |_| "n".into(), TIMEOUT).await;
    let mut early = Box::pin(futures::future::join(
        comms[1].barrier(),
        comms[2].barrier(),
    ));
    let finished_alone = tokio::time::timeout(Duration::from_millis(100), &mut early).await;
    assert!(finished_alone.is_err(), "barrier passed without rank 0");
    let (late, (a, b)) = tokio::join!(comms[0].barrier(), early);
    assert!(
        late.is_ok() && a.is_ok() && b.is_ok(),
        "{late:?} {a:?} {b:?}"
    );
}

/// The worker spawns collectives on a multi-threaded runtime: they must be `Send`.
#[test]
fn communicator_and_its_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    fn is_sync<T: Sync>() {}
    is_sync::<Communicator>();
    fn check(c: &Communicator, buf: &mut [f32]) {
        is_send(&c.all_reduce_sum(buf, Algorithm::Auto));
        is_send(&c.barrier());
        is_send(&c.abort("x"));
    }
    let _ = check;
}
