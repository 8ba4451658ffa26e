//! Many writes of one kind (a gang's pods), made as the Kubernetes Job controller's "slow start" makes them:
//! batches of 1, 2, 4, … up to a cap, every write of a batch in flight at once, and the first batch with a failure
//! the last. Each item's write (and whatever it builds, such as the pod) is made only when its batch starts, so
//! at most one batch of built objects is in memory, and a job whose writes all fail (a quota, an admission
//! webhook) costs one request, not one per rank.

use std::future::Future;

/// The largest batch: at most this many writes of one reconcile are in flight at once. The Job controller doubles
/// its batches up to its 500 writes per sync; 16 here left the API server waiting on each batch's slowest write
/// while a 4,096-rank job was created (DESIGN 5.1); 64 keeps it busy and still holds few built pods.
pub const MAX_BATCH: usize = 64;

/// Runs `write` over `items` in slow-start batches of at most `max_batch` (at least 1). Every write of a batch
/// completes before the next batch starts; after a batch with a failure none starts, and the first failure of
/// that batch is returned.
pub async fn slow_start<T, E, Fut>(
    items: impl IntoIterator<Item = T>,
    max_batch: usize,
    mut write: impl FnMut(T) -> Fut,
) -> Result<(), E>
where
    Fut: Future<Output = Result<(), E>>,
{
    let max_batch = max_batch.max(1);
    let mut items = items.into_iter();
    let mut size = 1;
    loop {
        let batch: Vec<Fut> = items.by_ref().take(size).map(&mut write).collect();
        if batch.is_empty() {
            return Ok(());
        }
        let results = futures::future::join_all(batch).await;
        if let Some(error) = results.into_iter().find_map(Result::err) {
            return Err(error);
        }
        size = (size * 2).min(max_batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// What the writes saw: the batch each item's write was made in, and how many writes were made before the
    /// batch ran (the items built while another batch was in flight would show here).
    #[derive(Default)]
    struct Log {
        batches: Vec<Vec<u32>>,
        made: usize,
        written: usize,
    }

    async fn run(items: u32, max_batch: usize, fail: &[u32]) -> (Result<(), u32>, Log) {
        let log = RefCell::new(Log::default());
        let result = slow_start(0..items, max_batch, |item| {
            let mut l = log.borrow_mut();
            // A new batch starts once every write made so far has run.
            if l.made == l.written {
                l.batches.push(Vec::new());
            }
            l.made += 1;
            l.batches.last_mut().expect("batch").push(item);
            let log = &log;
            async move {
                tokio::task::yield_now().await;
                log.borrow_mut().written += 1;
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

    fn sizes(log: &Log) -> Vec<usize> {
        log.batches.iter().map(Vec::len).collect()
    }

    #[tokio::test]
    async fn batches_double_up_to_the_cap_and_build_nothing_ahead() {
        let (result, log) = run(40, 16, &[]).await;
        assert_eq!(result, Ok(()));
        assert_eq!(sizes(&log), [1, 2, 4, 8, 16, 9]);
        assert_eq!(log.made, 40);
        let (_, log) = run(5, 16, &[]).await;
        assert_eq!(sizes(&log), [1, 2, 2]);
        let (_, log) = run(4, 0, &[]).await;
        assert_eq!(sizes(&log), [1, 1, 1, 1], "a cap of 0 still makes progress");
        let (result, log) = run(0, 16, &[]).await;
        assert_eq!((result, log.made), (Ok(()), 0));
    }

    #[tokio::test]
    async fn the_first_failing_batch_is_the_last_and_finishes_its_writes() {
        // Item 0 fails: one write, no other is even built.
        let (result, log) = run(4096, 16, &[0]).await;
        assert_eq!((result, log.made, log.written), (Err(0), 1, 1));
        // Item 4 fails in the batch [3, 4, 5, 6]: that batch completes, none follows.
        let (result, log) = run(100, 16, &[4, 6]).await;
        assert_eq!(result, Err(4), "the batch's first failure");
        assert_eq!(sizes(&log), [1, 2, 4]);
        assert_eq!((log.made, log.written), (7, 7));
    }
}
