//! Polling with a deadline: how tests wait for the cluster (never a bare sleep).

use std::path::Path;
use std::time::{Duration, Instant};

/// How often a condition is re-checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A condition that did not hold in time.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
pub struct PollError {
    pub what: String,
    pub waited: Duration,
    pub last: String,
}

/// Re-runs `check` until it returns `Ok(value)`, or fails after `timeout` with the last error text.
/// `check` (an async closure, or a closure returning a future) returns `Err(description)` for "not yet,
/// and here is what I saw".
pub async fn poll_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> Result<T, PollError> {
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if start.elapsed() >= timeout {
            return Err(PollError {
                what: what.to_string(),
                waited: start.elapsed(),
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Like [`poll_until`] for something that advances on its way (a job's step): `check` returns `Err((seen,
/// progress))`, and the wait fails only once `progress` has not passed its highest value for `stalled`, or after
/// `cap` in all. A job that is slow because the machine is busy is waited for; one that stopped is not.
pub async fn poll_while_progressing<T>(
    what: &str,
    stalled: Duration,
    cap: Duration,
    mut check: impl AsyncFnMut() -> Result<T, (String, Option<u64>)>,
) -> Result<T, PollError> {
    let start = Instant::now();
    let mut best: Option<u64> = None;
    let mut advanced = start;
    loop {
        let last = match check().await {
            Ok(value) => return Ok(value),
            Err((seen, progress)) => {
                if progress > best {
                    best = progress;
                    advanced = Instant::now();
                }
                seen
            }
        };
        let why = if advanced.elapsed() >= stalled {
            format!("{what} (no progress past {best:?} for {stalled:?})")
        } else if start.elapsed() >= cap {
            format!("{what} (still progressing, at {best:?}, after the cap of {cap:?})")
        } else {
            tokio::time::sleep(POLL_INTERVAL).await;
            continue;
        };
        return Err(PollError {
            what: why,
            waited: start.elapsed(),
            last,
        });
    }
}

/// Waits until `path` exists (another process makes it once what it marks is ready), for at most `timeout`.
pub async fn wait_for_file(path: &Path, timeout: Duration) -> Result<(), PollError> {
    let what = format!("{} to exist", path.display());
    poll_until(&what, timeout, async || {
        if path.exists() {
            Ok(())
        } else {
            Err("it does not yet".to_string())
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_the_condition_holds() {
        let mut calls = 0;
        let value = poll_until("three calls", Duration::from_secs(10), || {
            calls += 1;
            let n = calls;
            async move {
                if n >= 3 {
                    Ok(n)
                } else {
                    Err(format!("call {n}"))
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test]
    async fn reports_the_last_observation_on_timeout() {
        let err = poll_until::<()>("never", Duration::ZERO, || async {
            Err("still no".to_string())
        })
        .await
        .unwrap_err();
        assert_eq!(err.last, "still no");
        assert!(err.to_string().contains("waiting for never"));
    }

    #[tokio::test]
    async fn a_wait_that_keeps_progressing_outlives_the_stall_bound() {
        let stalled = POLL_INTERVAL * 3;
        let mut calls = 0u64;
        let started = Instant::now();
        let value = poll_while_progressing("a slow job", stalled, Duration::from_secs(30), || {
            calls += 1;
            let n = calls;
            async move {
                if n >= 10 {
                    Ok(n)
                } else {
                    Err((format!("step {n}"), Some(n)))
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 10);
        assert!(started.elapsed() > stalled, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_wait_without_progress_fails_after_the_stall_bound_naming_it() {
        let err = poll_while_progressing::<()>(
            "a stuck job",
            POLL_INTERVAL * 2,
            Duration::from_secs(30),
            || async { Err(("step 7".to_string(), Some(7))) },
        )
        .await
        .unwrap_err();
        assert_eq!(err.last, "step 7");
        assert!(err.waited < Duration::from_secs(30), "{err}");
        assert!(
            err.to_string().contains("no progress past Some(7)"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn progress_below_the_best_seen_does_not_count() {
        // After a restart a job resumes below the step it had reached: that is no progress yet.
        let mut calls = 0u64;
        let err = poll_while_progressing::<()>(
            "a restarted job",
            POLL_INTERVAL * 4,
            Duration::from_secs(30),
            || {
                calls += 1;
                let step = if calls == 1 { 100 } else { 50 + calls };
                async move { Err((format!("step {step}"), Some(step))) }
            },
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("no progress past Some(100)"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_wait_that_progresses_forever_ends_at_the_cap() {
        let mut calls = 0u64;
        let err = poll_while_progressing::<()>(
            "an endless job",
            Duration::from_secs(30),
            POLL_INTERVAL * 3,
            || {
                calls += 1;
                let n = calls;
                async move { Err((format!("step {n}"), Some(n))) }
            },
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("after the cap"), "{err}");
    }

    #[tokio::test]
    async fn waits_for_a_file_another_task_makes() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ready");
        let writer = {
            let marker = marker.clone();
            tokio::spawn(async move {
                tokio::time::sleep(POLL_INTERVAL * 3).await;
                std::fs::write(marker, b"").unwrap();
            })
        };
        wait_for_file(&marker, Duration::from_secs(30))
            .await
            .unwrap();
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_missing_file_times_out_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("never");
        let err = wait_for_file(&marker, Duration::ZERO).await.unwrap_err();
        assert!(err.to_string().contains("never to exist"), "{err}");
    }
}
