//! Aborts reach every live rank down a binomial tree rooted at the aborting rank: each rank calls
//! at most ceil(log2 n) peers, and a rank of the tree that is gone, or never answers, does not cut
//! off the ranks below it.

use crate::common;

use std::time::Duration;

use futures::future::join_all;
use rdu_collective::{CollectiveError, Communicator, ConnectOptions};
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(5);
/// The communicator's bound on one rank's part of an abort (`ABORT_GRACE`).
const GRACE: Duration = Duration::from_secs(1);
const WORLD: u32 = 16;
const ORIGIN: u32 = 5;
/// A child of rank 5 in its tree of 16 (position 8) with the subtree 1, 15, 14, 3, 2 below it.
const INNER: u32 = 13;

/// Waits until every communicator of `comms` (by rank) but `origin` failed by `origin`'s abort, or
/// until `deadline`; returns the ranks that did not.
async fn wait_for_abort(
    comms: &[(u32, &Communicator)],
    origin: u32,
    deadline: Instant,
) -> Vec<u32> {
    loop {
        let missing: Vec<u32> = comms
            .iter()
            .filter(|(rank, comm)| {
                *rank != origin
                    && !matches!(
                        comm.failure(),
                        Some(CollectiveError::AbortedByPeer { by_rank, .. }) if by_rank == origin
                    )
            })
            .map(|(rank, _)| *rank)
            .collect();
        if missing.is_empty() || Instant::now() >= deadline {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn ceil_log2(n: u32) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_from_rank_5_of_16_reaches_all_15_others_over_log2_n_links_per_rank() {
    let comms = common::world(WORLD, |_| "n".into(), TIMEOUT).await;
    let start = Instant::now();
    comms[ORIGIN as usize].abort("worker crashed").await;
    let ranked: Vec<(u32, &Communicator)> = comms.iter().map(|c| (c.rank(), c)).collect();
    let missing = wait_for_abort(&ranked, ORIGIN, start + TIMEOUT).await;
    let took = start.elapsed();
    assert!(
        missing.is_empty(),
        "no abort within {TIMEOUT:?} at {missing:?}"
    );
    // Forwarding happens after a rank answers; wait (bounded) until the leaves' calls are counted.
    let deadline = start + TIMEOUT;
    let links = loop {
        let links: Vec<Vec<u32>> = comms.iter().map(Communicator::abort_links).collect();
        if links.iter().map(Vec::len).sum::<usize>() >= WORLD as usize - 1
            || Instant::now() >= deadline
        {
            break links;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    eprintln!(
        "abort of rank {ORIGIN} of {WORLD} reached every rank in {took:?}; abort links per rank: {:?}",
        links.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for (rank, peers) in links.iter().enumerate() {
        assert!(
            peers.len() <= ceil_log2(WORLD),
            "rank {rank} called {peers:?}"
        );
    }
    // The origin calls its children 13, 9, 7, 6, and every rank is called exactly once.
    assert_eq!(links[ORIGIN as usize], [6, 7, 9, 13]);
    assert_eq!(
        links.iter().map(Vec::len).sum::<usize>(),
        WORLD as usize - 1
    );
    let mut called: Vec<u32> = links.into_iter().flatten().collect();
    called.sort_unstable();
    let others: Vec<u32> = (0..WORLD).filter(|&r| r != ORIGIN).collect();
    assert_eq!(called, others);
    match comms[0].barrier().await {
        Err(
            e @ CollectiveError::AbortedByPeer {
                by_rank: ORIGIN, ..
            },
        ) => {
            assert!(e.is_retryable(), "{e:?}")
        }
        other => panic!("expected AbortedByPeer by {ORIGIN}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_goes_around_a_dropped_rank_of_the_tree() {
    let mut comms: Vec<Option<Communicator>> = common::world(WORLD, |_| "n".into(), TIMEOUT)
        .await
        .into_iter()
        .map(Some)
        .collect();
    // Rank 13 is gone (its servers stop, its port refuses) before rank 5 aborts. Its servers stop
    // on their own tasks after the drop: wait (bounded) until its port refuses.
    let inner_address = comms[0].as_ref().expect("rank 0").peers()[INNER as usize]
        .address
        .clone();
    drop(comms[INNER as usize].take());
    let refused_by = Instant::now() + TIMEOUT;
    while tokio::net::TcpStream::connect(&inner_address).await.is_ok() {
        assert!(
            Instant::now() < refused_by,
            "rank {INNER}'s port {inner_address} still accepts {TIMEOUT:?} after its drop"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let start = Instant::now();
    comms[ORIGIN as usize]
        .as_ref()
        .expect("origin")
        .abort("worker crashed")
        .await;
    let live: Vec<(u32, &Communicator)> = comms.iter().flatten().map(|c| (c.rank(), c)).collect();
    let missing = wait_for_abort(&live, ORIGIN, start + TIMEOUT).await;
    eprintln!(
        "around a dropped rank {INNER}: every live rank aborted in {:?}",
        start.elapsed()
    );
    assert!(
        missing.is_empty(),
        "no abort within {TIMEOUT:?} at {missing:?}"
    );
    // The origin took over 13's children (1, 15, 14).
    let origin_links = comms[ORIGIN as usize]
        .as_ref()
        .expect("origin")
        .abort_links();
    assert_eq!(origin_links, [1, 6, 7, 9, 13, 14, 15]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_goes_around_a_rank_of_the_tree_that_never_answers() {
    let (listener, port) = common::rendezvous_listener().await;
    let mut listener = Some(listener);
    // Rank 13 runs on a runtime of its own, which stops running once it connected: its port
    // still accepts connections (the kernel's backlog) but nothing answers on them.
    let (connected_tx, connected_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let frozen = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let cfg = common::config(INNER, WORLD, port, "n", TIMEOUT);
            let comm = Communicator::connect(cfg).await.expect("connect rank 13");
            let _ = connected_tx.send(());
            // Blocks this runtime's only thread: rank 13's servers stop answering.
            let _ = release_rx.recv();
            drop(comm);
        });
    });
    let connects = (0..WORLD).filter(|&r| r != INNER).map(|rank| {
        let cfg = common::config(rank, WORLD, port, "n", TIMEOUT);
        let options = ConnectOptions {
            rendezvous_listener: if rank == 0 { listener.take() } else { None },
            ..ConnectOptions::default()
        };
        Communicator::connect_with(cfg, options)
    });
    let comms: Vec<Communicator> = join_all(connects)
        .await
        .into_iter()
        .map(|c| c.expect("connect"))
        .collect();
    connected_rx.await.expect("rank 13 connected");
    let origin = comms.iter().find(|c| c.rank() == ORIGIN).expect("origin");
    let start = Instant::now();
    origin.abort("worker crashed").await;
    let origin_took = start.elapsed();
    let live: Vec<(u32, &Communicator)> = comms.iter().map(|c| (c.rank(), c)).collect();
    let missing = wait_for_abort(&live, ORIGIN, start + TIMEOUT).await;
    eprintln!(
        "around a silent rank {INNER}: abort() returned in {origin_took:?}, every live rank aborted in {:?}",
        start.elapsed()
    );
    release_tx.send(()).expect("release rank 13");
    frozen.join().expect("rank 13's thread");
    assert!(
        missing.is_empty(),
        "no abort within {TIMEOUT:?} at {missing:?}"
    );
    assert!(
        // Its part is bounded by the grace (slack for a loaded machine), not by the 5 s timeout.
        origin_took < GRACE * 3,
        "{origin_took:?}"
    );
    assert_eq!(origin.abort_links(), [1, 6, 7, 9, 13, 14, 15]);
}
