//! Pod writes a reconcile made that the controller's pod cache has not shown yet, so the next reconcile waits for
//! them instead of acting on a cache that is behind its own writes.
//!
//! The reconcile reads a job's pods from the controller's reflector store, not from the API server. Right after it
//! created (or deleted) pods, a reconcile woken by another event may run before the watch delivered them: the
//! decision would then create the same pods again. As the Kubernetes Job controller does with its "expectations",
//! the reconcile records each pod it wrote, and while a pod it created is not in the cache yet (or one it deleted
//! is still there and not terminating), it skips the decision: the watch events that bring the cache up to date
//! wake it again. The check looks up only the pods still awaited, by name, so a reconcile that waits costs next
//! to nothing. Expectations older than [`EXPECTATION_TIMEOUT`] are dropped, so a pod that was created and
//! deleted by someone else before a reconcile saw it in the cache cannot hold a job forever.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a reconcile waits for the cache to show its own pod writes before it acts on the cache as it is.
pub(crate) const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

/// What the cache holds under a pod's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    Absent,
    Live,
    /// Present with a deletion timestamp.
    Terminating,
}

/// Pod writes per job (keyed by the job's uid) that the cache has not shown yet.
#[derive(Debug)]
pub struct Expectations {
    timeout: Duration,
    jobs: Mutex<HashMap<String, Pending>>,
}

#[derive(Debug)]
struct Pending {
    /// Pods created (applied) that the cache does not hold yet.
    created: HashSet<String>,
    /// Pods deleted that the cache still holds without a deletion timestamp.
    deleted: HashSet<String>,
    /// When the oldest of these writes was made.
    since: Instant,
}

/// The cache is behind this job's own writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Behind {
    /// Created pods not in the cache yet.
    pub created: usize,
    /// Deleted pods still in the cache and not terminating.
    pub deleted: usize,
    /// When the expectations expire (the job is looked at again then at the latest).
    pub expires_in: Duration,
}

impl Default for Expectations {
    fn default() -> Self {
        Self::with_timeout(EXPECTATION_TIMEOUT)
    }
}

impl Expectations {
    pub fn with_timeout(timeout: Duration) -> Self {
        Expectations {
            timeout,
            jobs: Mutex::default(),
        }
    }

    /// Records a pod this reconcile created (or re-applied).
    pub fn created(&self, job: &str, pod: &str) {
        self.record(job, |p| {
            p.deleted.remove(pod);
            p.created.insert(pod.to_string());
        });
    }

    /// Records a pod this reconcile deleted (or found already gone).
    pub fn deleted(&self, job: &str, pod: &str) {
        self.record(job, |p| {
            p.created.remove(pod);
            p.deleted.insert(pod.to_string());
        });
    }

    /// Forgets a job (it is being deleted).
    pub fn forget(&self, job: &str) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.remove(job);
        }
    }

    /// Drops the writes the cache already shows (`cached` tells what it holds under a pod name of the job's
    /// namespace). `None`: the cache has caught up (or the expectations expired); `Some`: what it still lacks.
    pub fn behind(&self, job: &str, cached: impl Fn(&str) -> Cached) -> Option<Behind> {
        let Ok(mut jobs) = self.jobs.lock() else {
            return None;
        };
        let pending = jobs.get_mut(job)?;
        pending.created.retain(|pod| cached(pod) == Cached::Absent);
        pending.deleted.retain(|pod| cached(pod) == Cached::Live);
        let waited = pending.since.elapsed();
        if (pending.created.is_empty() && pending.deleted.is_empty()) || waited >= self.timeout {
            jobs.remove(job);
            return None;
        }
        Some(Behind {
            created: pending.created.len(),
            deleted: pending.deleted.len(),
            expires_in: self.timeout.saturating_sub(waited),
        })
    }

    /// How many jobs have writes outstanding (for tests and debugging).
    pub fn len(&self) -> usize {
        self.jobs.lock().map_or(0, |jobs| jobs.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn record(&self, job: &str, change: impl FnOnce(&mut Pending)) {
        let Ok(mut jobs) = self.jobs.lock() else {
            return;
        };
        // Jobs deleted without a last reconcile leave their entry behind: drop expired ones on every write.
        let timeout = self.timeout;
        jobs.retain(|_, p| p.since.elapsed() < timeout);
        let pending = jobs.entry(job.to_string()).or_insert_with(|| Pending {
            created: HashSet::new(),
            deleted: HashSet::new(),
            since: Instant::now(),
        });
        change(pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache holding these pods: (name, terminating).
    fn cache(pods: &[(&str, bool)]) -> impl Fn(&str) -> Cached {
        let pods: Vec<(String, bool)> = pods.iter().map(|(n, t)| (n.to_string(), *t)).collect();
        move |name| match pods.iter().find(|(n, _)| n == name) {
            None => Cached::Absent,
            Some((_, false)) => Cached::Live,
            Some((_, true)) => Cached::Terminating,
        }
    }

    #[test]
    fn nothing_recorded_is_never_behind() {
        assert_eq!(Expectations::default().behind("u", cache(&[])), None);
    }

    #[test]
    fn created_pods_are_awaited_until_the_cache_holds_them() {
        let e = Expectations::default();
        e.created("u", "a");
        e.created("u", "b");
        let behind = e.behind("u", cache(&[("a", false)])).expect("b is missing");
        assert_eq!((behind.created, behind.deleted), (1, 0));
        assert!(behind.expires_in <= EXPECTATION_TIMEOUT);
        assert_eq!(e.behind("u", cache(&[("a", false), ("b", false)])), None);
        assert!(e.is_empty(), "a job whose writes all showed is dropped");
        assert_eq!(e.behind("other", cache(&[])), None, "jobs are kept apart");
    }

    #[test]
    fn deleted_pods_are_awaited_until_gone_or_terminating() {
        let e = Expectations::default();
        e.deleted("u", "a");
        e.deleted("u", "b");
        let behind = e.behind("u", cache(&[("a", false), ("b", true)]));
        assert_eq!(behind.map(|b| (b.created, b.deleted)), Some((0, 1)));
        assert_eq!(e.behind("u", cache(&[])), None);
    }

    #[test]
    fn expectations_expire() {
        let e = Expectations::with_timeout(Duration::ZERO);
        e.created("u", "a");
        assert_eq!(
            e.behind("u", cache(&[])),
            None,
            "an expired expectation lets the job act"
        );
        assert!(e.is_empty());
    }

    #[test]
    fn forget_drops_a_job() {
        let e = Expectations::default();
        e.created("u", "a");
        e.forget("u");
        assert_eq!(e.behind("u", cache(&[])), None);
    }
}
