//! Accepted progress waiting for its status write: at most one accepted report per job every
//! [`MIN_REPORT_INTERVAL`], and at most one status write per job every [`STATUS_WRITE_INTERVAL`] (the newest
//! report wins), so a chatty or hostile rank 0 cannot turn into API server load.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdu_crds::TrainingProgress;

/// Reports of one job closer together than this are refused (429).
pub(crate) const MIN_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// A job's `status.progress` is written at most this often.
pub(crate) const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(5);
/// A job heard nothing from for this long is forgotten.
const IDLE_FORGET: Duration = Duration::from_secs(600);

/// A job by namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobKey {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug)]
struct Entry {
    last_accepted: Instant,
    last_written: Option<Instant>,
    pending: Option<TrainingProgress>,
}

/// The report came too soon after the last accepted one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("too many progress reports for this job: at most one per {}s; retry in {}s", MIN_REPORT_INTERVAL.as_secs(), retry_after.as_secs().max(1))]
pub struct TooFrequent {
    pub retry_after: Duration,
}

/// Progress accepted per job, and when each job's status was last written.
#[derive(Debug, Default)]
pub struct Board {
    jobs: Mutex<HashMap<JobKey, Entry>>,
}

impl Board {
    /// Takes `progress` as the job's newest, unless the last accepted report is less than
    /// [`MIN_REPORT_INTERVAL`] old.
    pub fn accept(
        &self,
        job: JobKey,
        progress: TrainingProgress,
        now: Instant,
    ) -> Result<(), TooFrequent> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        match jobs.get_mut(&job) {
            Some(entry) => {
                let since = now.saturating_duration_since(entry.last_accepted);
                if since < MIN_REPORT_INTERVAL {
                    return Err(TooFrequent {
                        retry_after: MIN_REPORT_INTERVAL - since,
                    });
                }
                entry.last_accepted = now;
                entry.pending = Some(progress);
            }
            None => {
                jobs.insert(
                    job,
                    Entry {
                        last_accepted: now,
                        last_written: None,
                        pending: Some(progress),
                    },
                );
            }
        }
        Ok(())
    }

    /// The progress whose write is due at `now` (marked written), and when the next one falls due.
    pub fn take_due(&self, now: Instant) -> (Vec<(JobKey, TrainingProgress)>, Option<Instant>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.retain(|_, e| {
            e.pending.is_some() || now.saturating_duration_since(e.last_accepted) < IDLE_FORGET
        });
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (job, entry) in jobs.iter_mut() {
            if entry.pending.is_none() {
                continue;
            }
            let at = entry
                .last_written
                .map_or(now, |written| written + STATUS_WRITE_INTERVAL);
            if at <= now {
                if let Some(progress) = entry.pending.take() {
                    due.push((job.clone(), progress));
                }
                entry.last_written = Some(now);
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        due.sort_by(|a, b| a.0.cmp(&b.0));
        (due, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> JobKey {
        JobKey {
            namespace: "ml".into(),
            name: name.into(),
        }
    }

    fn at_step(step: u64) -> TrainingProgress {
        TrainingProgress {
            step,
            total_steps: 100,
            percent: step as u32,
            ..Default::default()
        }
    }

    #[test]
    fn reports_closer_than_the_interval_are_refused_per_job() {
        let board = Board::default();
        let t0 = Instant::now();
        assert!(board.accept(key("a"), at_step(1), t0).is_ok());
        let refused = board
            .accept(key("a"), at_step(2), t0 + Duration::from_millis(300))
            .expect_err("too soon");
        assert_eq!(refused.retry_after, Duration::from_millis(700));
        assert!(
            board.accept(key("b"), at_step(1), t0).is_ok(),
            "another job"
        );
        assert!(
            board
                .accept(key("a"), at_step(3), t0 + MIN_REPORT_INTERVAL)
                .is_ok()
        );
    }

    #[test]
    fn one_write_per_job_per_interval_and_the_newest_report_wins() {
        let board = Board::default();
        let t0 = Instant::now();
        board.accept(key("a"), at_step(1), t0).expect("first");
        let (due, next) = board.take_due(t0);
        assert_eq!(due, vec![(key("a"), at_step(1))]);
        assert_eq!(next, None);

        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        board.accept(key("a"), at_step(2), t1).expect("second");
        board.accept(key("a"), at_step(3), t2).expect("third");
        let (due, next) = board.take_due(t2);
        assert!(due.is_empty(), "written at t0, next write at t0 + 5 s");
        assert_eq!(next, Some(t0 + STATUS_WRITE_INTERVAL));
        let (due, _) = board.take_due(t0 + STATUS_WRITE_INTERVAL);
        assert_eq!(due, vec![(key("a"), at_step(3))], "only the newest");
        assert!(board.take_due(t0 + Duration::from_secs(20)).0.is_empty());
    }
}
