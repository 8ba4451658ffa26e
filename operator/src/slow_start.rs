//! Many writes of one kind (a gang's pods), made with a slow start: one write first, then one more in flight for
//! every write that succeeds (the window doubles each round trip, as TCP's slow start and the Kubernetes Job
//! controller's doubling batches grow), never more than a cap at once, and none started once one failed. A write
//! starts as soon as the window has room, not when a whole batch has ended, so the API server is never left
//! waiting on one slow write. Each item's write (and whatever it builds, such as the pod) is made only when it
//! starts, so at most a window of built objects is in memory, and a job whose writes all fail (a quota, an
//! admission webhook) costs one request, not one per rank.

use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

/// The widest window: at most this many writes of one reconcile are in flight at once. The Job controller doubles
/// its batches up to its 500 writes per sync; 16 here left the API server waiting while a 4,096-rank job was
/// created (BENCHMARKS 3); 64 keeps it busy and still holds few built pods.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// Runs `write` over `items`, at most `max_in_flight` (at least 1) at once: one first, then one more in flight for
/// each success. After a failure no write starts; those in flight finish, and the first failure is returned.
pub(crate) async fn slow_start<T, E, Fut>(
    items: impl IntoIterator<Item = T>,
    max_in_flight: usize,
    mut write: impl FnMut(T) -> Fut,
) -> Result<(), E>
where
    Fut: Future<Output = Result<(), E>>,
{
    let max_in_flight = max_in_flight.max(1);
    let mut items = items.into_iter();
    let mut window = 1;
    let mut in_flight = FuturesUnordered::new();
    let mut failure = None;
    loop {
        while failure.is_none() && in_flight.len() < window {
            let Some(item) = items.next() else { break };
            in_flight.push(write(item));
        }
        match in_flight.next().await {
            None => return failure.map_or(Ok(()), Err),
            Some(Ok(())) => window = (window + 1).min(max_in_flight),
            Some(Err(error)) => {
                failure.get_or_insert(error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// What the writes saw: how many were in flight and how many had finished when each started, and how many were
    /// started and finished.
    #[derive(Default)]
    struct Log {
        in_flight_at_start: Vec<usize>,
        finished_at_start: Vec<usize>,
        started: usize,
        finished: usize,
    }

    /// Writes items `0..items`, each finishing after `ticks(item)` yields, failing when `fail` holds it.
    async fn run(
        items: u32,
        max_in_flight: usize,
        ticks: impl Fn(u32) -> u32,
        fail: &[u32],
    ) -> (Result<(), u32>, Log) {
        let log = RefCell::new(Log::default());
        let result = slow_start(0..items, max_in_flight, |item| {
            {
                let mut l = log.borrow_mut();
                let in_flight = l.started - l.finished;
                l.in_flight_at_start.push(in_flight);
                let finished = l.finished;
                l.finished_at_start.push(finished);
                l.started += 1;
            }
            let (log, ticks) = (&log, ticks(item));
            async move {
                for _ in 0..ticks {
                    tokio::task::yield_now().await;
                }
                log.borrow_mut().finished += 1;
                if fail.contains(&item) {
                    Err(item)
                } else {
                    Ok(())
                }
            }
        })
        .await;
        (result, log.into_inner())
    }

    #[tokio::test]
    async fn the_window_opens_one_write_per_success_up_to_the_cap_and_builds_nothing_ahead() {
        let (result, log) = run(200, 16, |_| 1, &[]).await;
        assert_eq!(result, Ok(()));
        assert_eq!((log.started, log.finished), (200, 200));
        assert_eq!(log.in_flight_at_start[0], 0, "one write first, alone");
        let widest = log.in_flight_at_start.iter().max().copied();
        assert_eq!(widest, Some(15), "never more than 16 in flight");
        // Every write that starts finds fewer in flight than the successes so far allow (1 + successes).
        for (in_flight, finished) in log.in_flight_at_start.iter().zip(&log.finished_at_start) {
            assert!(
                *in_flight < 1 + finished,
                "{in_flight} in flight after {finished} successes"
            );
        }
        let (_, log) = run(5, 16, |_| 1, &[]).await;
        assert_eq!(log.started, 5);
        let (_, log) = run(4, 0, |_| 1, &[]).await;
        assert_eq!(
            log.in_flight_at_start,
            [0, 0, 0, 0],
            "a cap of 0 still makes progress"
        );
        let (result, log) = run(0, 16, |_| 1, &[]).await;
        assert_eq!((result, log.started), (Ok(()), 0));
    }

    #[tokio::test]
    async fn a_slow_write_holds_back_only_its_own_slot() {
        // Item 1 takes 100 ticks, the others 1: writes keep starting past it, where a batch would wait for it.
        let started_while_slow = RefCell::new(0);
        let started = RefCell::new(0);
        let result: Result<(), ()> = slow_start(0..64u32, 8, |item| {
            *started.borrow_mut() += 1;
            let (started, started_while_slow) = (&started, &started_while_slow);
            async move {
                let ticks = if item == 1 { 100 } else { 1 };
                for _ in 0..ticks {
                    tokio::task::yield_now().await;
                }
                if item == 1 {
                    *started_while_slow.borrow_mut() = *started.borrow();
                }
                Ok(())
            }
        })
        .await;
        assert_eq!(result, Ok(()));
        assert_eq!(*started.borrow(), 64);
        assert!(
            *started_while_slow.borrow() > 32,
            "only {} writes started before the slow one ended",
            started_while_slow.borrow()
        );
    }

    #[tokio::test]
    async fn after_a_failure_no_write_starts_and_those_in_flight_finish() {
        // Item 0 fails: one write, no other is even built.
        let (result, log) = run(4096, 16, |_| 1, &[0]).await;
        assert_eq!((result, log.started, log.finished), (Err(0), 1, 1));
        // Item 4 fails while others are in flight: they finish, none starts after, the failure is returned.
        let (result, log) = run(100, 16, |_| 1, &[4, 6]).await;
        assert!(matches!(result, Err(4 | 6)), "{result:?}");
        assert!(log.started < 20, "{} writes started", log.started);
        assert_eq!(log.started, log.finished);
    }
}
