//! `spec.runPolicy.activeDeadlineSeconds`, written once for the operator and local mode: a wall-clock bound on the
//! job from its start, after which every rank is stopped and the job fails (`DeadlineExceeded`), restarts or not.

/// The reason the job fails with once its deadline passed.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// Where a job started at `started_at` stands against `active_deadline_seconds` at `now` (seconds on one clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// No deadline.
    None,
    /// This many seconds are left (at least 1): look again then.
    Left(i64),
    /// The deadline passed: stop every rank, fail the job.
    Passed { limit: u64 },
}

impl Deadline {
    pub fn at(active_deadline_seconds: Option<u64>, started_at: i64, now: i64) -> Deadline {
        let Some(limit) = active_deadline_seconds else {
            return Deadline::None;
        };
        let left = started_at
            .saturating_add(i64::try_from(limit).unwrap_or(i64::MAX))
            .saturating_sub(now);
        if left > 0 {
            Deadline::Left(left)
        } else {
            Deadline::Passed { limit }
        }
    }
}

/// What both modes say when the deadline of `limit` seconds passed.
pub fn deadline_message(limit: u64) -> String {
    format!("the job ran longer than spec.runPolicy.activeDeadlineSeconds ({limit} s)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_counts_from_the_start_and_passes_at_its_second() {
        // (deadline, started at, now) -> where the job stands
        let table = [
            (None, 0, 1_000_000, Deadline::None),
            (Some(60), 100, 100, Deadline::Left(60)),
            (Some(60), 100, 159, Deadline::Left(1)),
            (Some(60), 100, 160, Deadline::Passed { limit: 60 }),
            (Some(60), 100, 10_000, Deadline::Passed { limit: 60 }),
            (
                Some(u64::MAX),
                100,
                10_000,
                Deadline::Left(i64::MAX - 10_000),
            ),
        ];
        for (i, (limit, started, now, want)) in table.into_iter().enumerate() {
            assert_eq!(Deadline::at(limit, started, now), want, "row {i}");
        }
        assert_eq!(
            deadline_message(60),
            "the job ran longer than spec.runPolicy.activeDeadlineSeconds (60 s)"
        );
    }
}
