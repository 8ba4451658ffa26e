//! A rank that goes away, or stops taking part, fails every other rank's collective with a
//! retryable error within the timeout instead of hanging; aborts reach idle ranks.

use crate::common;

use std::time::Duration;

use crate::common::{world, world_on, world_polling};
use rdu_collective::{Algorithm, CollectiveError, Communicator, DataPath, Spin};

const TIMEOUT: Duration = Duration::from_secs(2);
/// Safety net so a regression fails the test instead of hanging it (not a speed assertion).
const HANG_GUARD: Duration = Duration::from_secs(30);

async fn all_reduce_on(
    comms: &[&Communicator],
    algorithm: Algorithm,
) -> Vec<Result<(), CollectiveError>> {
    all_reduce_len(comms, algorithm, 300_000).await
}

async fn all_reduce_len(
    comms: &[&Communicator],
    algorithm: Algorithm,
    len: usize,
) -> Vec<Result<(), CollectiveError>> {
    let runs = comms.iter().map(|c| async move {
        let mut buf = vec![1.0f32; len];
        c.all_reduce_sum(&mut buf, algorithm).await
    });
    tokio::time::timeout(HANG_GUARD, futures::future::join_all(runs))
        .await
        .expect("collective hung past its timeout")
}

fn assert_all_retryable(results: &[Result<(), CollectiveError>]) {
    for (i, r) in results.iter().enumerate() {
        match r {
            Err(e) => assert!(e.is_retryable(), "survivor {i}: {e} is not retryable"),
            Ok(()) => panic!("survivor {i} succeeded without the lost rank"),
        }
    }
}

fn assert_some_timed_out(results: &[Result<(), CollectiveError>]) {
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CollectiveError::Timeout { .. }))),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_rank_fails_every_other_ranks_ring() {
    dropped_rank_fails_the_ring_on(DataPath::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_rank_fails_every_other_ranks_ring_through_shared_memory() {
    dropped_rank_fails_the_ring_on(DataPath::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_rank_fails_every_other_ranks_ring_on_grpc_streams() {
    dropped_rank_fails_the_ring_on(DataPath::Grpc).await;
}

async fn dropped_rank_fails_the_ring_on(data_path: DataPath) {
    let mut comms = world_on(3, |_| "n".into(), TIMEOUT, |_| data_path).await;
    let ok = all_reduce_on(&comms.iter().collect::<Vec<_>>(), Algorithm::Ring).await;
    assert!(ok.iter().all(Result::is_ok), "{ok:?}");
    let rings = comms[0].shared_memory_peers();
    assert_eq!(rings.is_empty(), data_path != DataPath::Auto, "{rings:?}");
    drop(comms.pop());
    let results = all_reduce_on(&comms.iter().collect::<Vec<_>>(), Algorithm::Ring).await;
    assert_all_retryable(&results);
    // The failure is latched: the next collective fails at once, retryably.
    let again = comms[0].barrier().await;
    assert!(
        again.as_ref().is_err_and(CollectiveError::is_retryable),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_whose_task_is_aborted_fails_the_star() {
    let mut comms = world(3, |_| "n".into(), TIMEOUT).await;
    let doomed = comms.remove(1);
    let task = tokio::spawn(async move {
        let _held = doomed;
        std::future::pending::<()>().await;
    });
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    let results = all_reduce_on(&comms.iter().collect::<Vec<_>>(), Algorithm::Star).await;
    assert_all_retryable(&results);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_rank_times_out_the_others_and_is_told_to_abort() {
    let comms = world(3, |r| format!("n{}", r % 2), TIMEOUT).await;
    // Rank 2 stays connected but never joins the collective.
    let results = all_reduce_on(&[&comms[0], &comms[1]], Algorithm::Hierarchical).await;
    assert_all_retryable(&results);
    assert_some_timed_out(&results);
    // The ranks that failed told rank 2, so its next collective fails at once.
    match comms[2].barrier().await {
        Err(e @ CollectiveError::AbortedByPeer { .. }) => assert!(e.is_retryable(), "{e:?}"),
        other => panic!("expected AbortedByPeer, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_ranks_fail_on_a_dropped_rank_and_time_out_on_a_silent_one() {
    // Small frames (1024 values) are polled for before parking; the bounded poll must not
    // hide a lost peer or outlast the timeout.
    // Rings poll for every frame, TCP streams for small ones.
    let poll = Spin::For(Duration::from_millis(2));
    for path in [DataPath::Tcp, DataPath::Auto] {
        let mut comms = world_polling(4, |_| "n".into(), TIMEOUT, |_| path, poll).await;
        let ok = all_reduce_len(&comms.iter().collect::<Vec<_>>(), Algorithm::Auto, 1024).await;
        assert!(ok.iter().all(Result::is_ok), "{path}: {ok:?}");
        drop(comms.pop());
        let results =
            all_reduce_len(&comms.iter().collect::<Vec<_>>(), Algorithm::Star, 1024).await;
        assert_all_retryable(&results);

        let comms = world_polling(3, |_| "n".into(), TIMEOUT, |_| path, poll).await;
        let results = all_reduce_len(&[&comms[0], &comms[1]], Algorithm::Star, 1024).await;
        assert_all_retryable(&results);
        assert_some_timed_out(&results);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_abort_reaches_every_peer() {
    let comms = world(2, |_| "n".into(), TIMEOUT).await;
    comms[1].abort("worker crashed").await;
    let error = comms[0].barrier().await.expect_err("rank 1 aborted");
    assert!(error.is_retryable(), "{error:?}");
    match error {
        CollectiveError::AbortedByPeer {
            by_rank, reason, ..
        } => {
            assert_eq!(by_rank, 1);
            assert!(reason.contains("worker crashed"), "{reason}");
        }
        other => panic!("expected AbortedByPeer, got {other:?}"),
    }
    assert!(matches!(
        comms[1].barrier().await,
        Err(CollectiveError::Aborted { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_abort_fails_every_peer_permanently() {
    // A rank with a bad spec tells the others before they could find out for themselves: they
    // must not exit as if a restart could help.
    let comms = world(3, |_| "n".into(), TIMEOUT).await;
    comms[0]
        .abort_permanently("bad config: spec.checkpoint")
        .await;
    for comm in &comms[1..] {
        match comm.barrier().await {
            Err(e @ CollectiveError::AbortedByPeer { by_rank: 0, .. }) => {
                assert!(!e.is_retryable(), "{e:?}");
                assert!(e.to_string().contains("spec.checkpoint"), "{e}");
            }
            other => panic!("expected a permanent AbortedByPeer, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_ranks_fail_the_rendezvous_retryably() {
    let (listener, port) = common::rendezvous_listener().await;
    let cfg = common::config(0, 2, port, "n", Duration::from_millis(300));
    let result = tokio::time::timeout(
        HANG_GUARD,
        Communicator::connect_with_rendezvous_listener(cfg, listener),
    )
    .await
    .expect("rendezvous hung");
    match result {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(_) => panic!("rendezvous of 2 completed with 1 rank"),
    }
}
