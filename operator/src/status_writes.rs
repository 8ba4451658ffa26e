//! Status writes a reconcile made that the controller's job cache has not shown yet, so the next reconcile waits
//! for them instead of deciding from the status before them.
//!
//! The lifecycle decides from the job's status as much as from its pods (the generation, the culprit of a
//! generation being stopped, the counters), and reads the job from the controller's cache. Right after a reconcile
//! wrote a status, another one woken by a pod event may run before the job's own watch event arrived: it would
//! decide from the old status, for instance end a generation on the culprit the previous reconcile had just
//! replaced, or take a new generation's pods for an old one's. As with pod writes (`expectations`), the reconcile
//! records the status the API server returned for its write, and while the cached status differs from it, skips
//! the decision until the watch brings it. `status.progress` is left out of the comparison: the progress endpoint
//! writes it under its own field manager. A write the cache never shows (someone else wrote the status since) is
//! waited for at most [`STATUS_WRITE_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdu_crds::RduJobStatus;

/// How long a reconcile waits for the cache to show its own status write before it acts on the cache as it is.
pub(crate) const STATUS_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The last status written per job (keyed by the job's uid), as the API server returned it.
#[derive(Debug)]
pub struct StatusWrites {
    timeout: Duration,
    jobs: Mutex<HashMap<String, (RduJobStatus, Instant)>>,
}

impl Default for StatusWrites {
    fn default() -> Self {
        Self::with_timeout(STATUS_WRITE_TIMEOUT)
    }
}

impl StatusWrites {
    pub fn with_timeout(timeout: Duration) -> Self {
        StatusWrites {
            timeout,
            jobs: Mutex::default(),
        }
    }

    /// Records the status the API server returned for this reconcile's write.
    pub fn written(&self, job: &str, stored: &RduJobStatus) {
        let Ok(mut jobs) = self.jobs.lock() else {
            return;
        };
        let timeout = self.timeout;
        jobs.retain(|_, (_, at)| at.elapsed() < timeout);
        jobs.insert(job.to_string(), (without_progress(stored), Instant::now()));
    }

    /// `None` when the cache shows the last write (or it expired); else how long the wait may still last.
    pub fn behind(&self, job: &str, cached: Option<&RduJobStatus>) -> Option<Duration> {
        let Ok(mut jobs) = self.jobs.lock() else {
            return None;
        };
        let (written, at) = jobs.get(job)?;
        let shown = cached.is_some_and(|c| without_progress(c) == *written);
        let waited = at.elapsed();
        if shown || waited >= self.timeout {
            jobs.remove(job);
            return None;
        }
        Some(self.timeout.saturating_sub(waited))
    }

    /// Forgets a job (it is being deleted).
    pub fn forget(&self, job: &str) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.remove(job);
        }
    }
}

fn without_progress(status: &RduJobStatus) -> RduJobStatus {
    RduJobStatus {
        progress: None,
        ..status.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_crds::{JobPhase, TrainingProgress};

    fn status(restarts: u32) -> RduJobStatus {
        RduJobStatus {
            phase: Some(JobPhase::Restarting),
            restarts,
            ..RduJobStatus::default()
        }
    }

    #[test]
    fn a_cache_behind_the_last_write_is_waited_for_until_it_shows_it() {
        let writes = StatusWrites::default();
        assert_eq!(
            writes.behind("u", Some(&status(0))),
            None,
            "nothing written"
        );
        writes.written("u", &status(1));
        assert!(writes.behind("u", Some(&status(0))).is_some());
        assert!(writes.behind("u", None).is_some());
        // The progress endpoint's own field does not matter.
        let mut shown = status(1);
        shown.progress = Some(TrainingProgress::default());
        assert_eq!(writes.behind("u", Some(&shown)), None);
        // Caught up: forgotten, so an older cache later (it cannot go back) would not hold the job.
        assert_eq!(writes.behind("u", Some(&status(0))), None);
    }

    #[test]
    fn a_write_never_shown_is_waited_for_at_most_the_timeout() {
        let writes = StatusWrites::with_timeout(Duration::ZERO);
        writes.written("u", &status(1));
        assert_eq!(writes.behind("u", Some(&status(0))), None);
        let writes = StatusWrites::default();
        writes.written("u", &status(1));
        writes.forget("u");
        assert_eq!(writes.behind("u", Some(&status(0))), None);
    }
}
