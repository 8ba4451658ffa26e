//! A benchmark's warm-up of the machine before its first timed size (`allreduce-bench
//! --warmup-seconds`, `spec.allReduceBenchmark.warmupMilliseconds`): the ranks all-reduce the
//! largest timed buffer (at most 16 MiB) over and over for that long. On the 2-vCPU VM the bench
//! was tuned on, a machine that had sat idle for a few seconds ran every size 2-3x slower until
//! something heavy had run for a fraction of a second (2 ranks, `--no-baseline`: 4 KiB 8-23 us
//! against 2.8-3.4 us, 1 MiB 265-515 us against 146-245), whatever the ring's size or the spin;
//! a 1 GiB TCP stream or a quarter second of large all-reduces before the first size brought it
//! to the steady state a training job runs in, and the per-size warm-up iterations are far too
//! short to. The warm-up's buffer is the largest timed size, capped at 16 MiB, far above where
//! `auto` switches algorithms, so it runs an algorithm the timed runs run and opens no link they
//! do not.

use std::time::{Duration, Instant};

use crate::{CollectiveError, Communicator, ReduceOptions};

/// The largest buffer the warm-up all-reduces.
pub const MAX_WARM_BYTES: usize = 16 << 20;

/// The warm-up's buffer length in f32s: the largest timed size (bytes), at most [`MAX_WARM_BYTES`].
pub fn warm_len(sizes: impl IntoIterator<Item = u64>) -> usize {
    let largest = sizes.into_iter().max().unwrap_or(4);
    usize::try_from(largest)
        .unwrap_or(usize::MAX)
        .min(MAX_WARM_BYTES)
        / 4
}

/// This rank's vote in a round: 1 once its clock reached `until` or it is asked to stop, 0 before.
fn vote(now: Instant, until: Instant, stopping: bool) -> f32 {
    if stopping || now >= until { 1.0 } else { 0.0 }
}

/// All-reduces a `len`-value buffer until `duration` has passed on some rank, or some rank's
/// `stopping` says it was asked to stop (a SIGTERM then waits one round, not the whole warm-up);
/// returns the rounds. The buffer's last value carries each rank's vote to stop, so every rank sees
/// the same sum and all stop after the same round (a collective's calls must line up on every
/// rank); the others stay 0, so the sums never grow.
pub async fn warm_up(
    comm: &Communicator,
    reduce: ReduceOptions,
    len: usize,
    duration: Duration,
    stopping: impl Fn() -> bool,
) -> Result<u32, CollectiveError> {
    if duration.is_zero() || len == 0 {
        return Ok(0);
    }
    let mut buf = vec![0f32; len];
    let until = Instant::now() + duration;
    let mut rounds = 0;
    loop {
        buf.fill(0.0);
        buf[len - 1] = vote(Instant::now(), until, stopping());
        comm.all_reduce_sum(&mut buf, reduce).await?;
        rounds += 1;
        if buf[len - 1] > 0.0 {
            return Ok(rounds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_the_largest_size_up_to_the_cap() {
        assert_eq!(warm_len([4096, 65536]), 16384);
        assert_eq!(warm_len([4096, 64 << 20]), MAX_WARM_BYTES / 4);
        assert_eq!(warm_len([]), 1);
    }

    #[test]
    fn a_rank_votes_to_stop_once_its_time_is_up() {
        let start = Instant::now();
        let until = start + Duration::from_millis(5);
        assert_eq!(vote(start, until, false), 0.0);
        assert_eq!(vote(until, until, false), 1.0);
        assert_eq!(vote(until + Duration::from_millis(1), until, false), 1.0);
    }

    #[test]
    fn a_rank_asked_to_stop_votes_to_stop_at_once() {
        let start = Instant::now();
        let until = start + Duration::from_secs(60);
        assert_eq!(vote(start, until, true), 1.0);
    }
}
