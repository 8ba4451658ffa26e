//! Latency percentiles of timed steps or batches (nearest rank, as `measure-performance` reports them).

use std::time::Duration;

/// The `q`-quantile (0 < q ≤ 1) of `samples` by the nearest-rank method, in seconds; none for no samples.
pub(crate) fn percentile(samples: &[Duration], q: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = samples.iter().map(Duration::as_secs_f64).collect();
    sorted.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile(&ms, 0.5), Some(0.050));
        assert_eq!(percentile(&ms, 0.99), Some(0.099));
        assert_eq!(percentile(&ms[..1], 0.99), Some(0.100));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
