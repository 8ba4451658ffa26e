//! `--breakdown`: where one call's time goes, in three measured parts. `fixed_us` is a call that
//! moves one value (the same algorithm and options): the runtime, the bookkeeping and the
//! hand-over between ranks that every call pays, whatever its size. `copies_us` is this rank's
//! own copy of the whole buffer into another and its add of one back, timed alone on warm
//! memory: the least a shared-memory all-reduce copies (recursive doubling on 2 ranks does
//! exactly this; the ring about 2(n-1)/n of it). `rest_us` is what neither explains: waiting for
//! the other ranks, and the cache lines crossing cores.

use std::hint::black_box;
use std::time::Instant;

/// The three parts of one call of `time_us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Breakdown {
    pub fixed_us: f64,
    pub copies_us: f64,
    pub rest_us: f64,
}

impl Breakdown {
    /// `time_us` split: the rest is what the two measured parts leave (never below zero).
    pub(crate) fn of(time_us: f64, fixed_us: f64, copies_us: f64) -> Breakdown {
        Breakdown {
            fixed_us,
            copies_us,
            rest_us: (time_us - fixed_us - copies_us).max(0.0),
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let r = |x: f64| (x * 100.0).round() / 100.0;
        serde_json::json!({
            "fixed_us": r(self.fixed_us),
            "copies_us": r(self.copies_us),
            "rest_us": r(self.rest_us),
        })
    }
}

/// Microseconds to copy `bytes` of f32 into another buffer and add them back onto it, the best
/// of 5 runs of `iters` (each pass over memory the previous one warmed).
pub(crate) fn copies_us(bytes: usize, iters: u32) -> f64 {
    let n = bytes / 4;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut ring = vec![0f32; n];
    let mut dst = vec![1f32; n];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..iters.max(1) {
            ring.copy_from_slice(black_box(&src));
            for (d, r) in dst.iter_mut().zip(black_box(&ring)) {
                *d += *r;
            }
            black_box(&mut dst);
        }
        best = best.min(started.elapsed().as_secs_f64() * 1e6 / f64::from(iters.max(1)));
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_is_what_the_measured_parts_leave() {
        let b = Breakdown::of(10.0, 2.0, 3.0);
        assert_eq!(b.rest_us, 5.0);
        assert_eq!(Breakdown::of(4.0, 2.0, 3.0).rest_us, 0.0, "never negative");
        assert_eq!(b.json()["fixed_us"], 2.0);
    }

    #[test]
    fn copies_take_longer_for_more_bytes() {
        // 4 MiB against 4 KiB: a thousand times the bytes can not take less time.
        assert!(copies_us(4 << 20, 3) > copies_us(4096, 3));
    }
}
