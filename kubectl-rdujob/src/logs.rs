//! Merging the ranks' logs as local mode prints them: each line prefixed `[rank N] `; whole logs merged in time
//! order by their leading RFC 3339 timestamps (a line without one keeps its place after the line before it),
//! followed logs interleaved as lines arrive.

use futures::stream::{BoxStream, SelectAll, StreamExt};
use jiff::Timestamp;

/// `[rank N] line`.
pub fn prefixed(rank: u32, line: &str) -> String {
    format!("[rank {rank}] {line}")
}

/// The timestamp a worker's log line starts with, if any.
fn leading_time(line: &str) -> Option<Timestamp> {
    line.split_whitespace().next()?.parse().ok()
}

/// Every rank's whole log, merged by time, prefixed. Ties keep rank order; within a rank, line order.
pub fn merge_by_time(logs: &[(u32, String)]) -> Vec<String> {
    let mut stamped = Vec::new();
    for (rank, text) in logs {
        let mut last = Timestamp::MIN;
        for (index, line) in text.lines().enumerate() {
            if let Some(t) = leading_time(line) {
                last = t;
            }
            stamped.push((last, *rank, index, line));
        }
    }
    stamped.sort_by_key(|(time, rank, index, _)| (*time, *rank, *index));
    stamped
        .into_iter()
        .map(|(_, rank, _, line)| prefixed(rank, line))
        .collect()
}

/// Lines of several ranks as they come, each prefixed with its rank.
pub fn interleave(
    streams: Vec<(u32, BoxStream<'static, std::io::Result<String>>)>,
) -> SelectAll<BoxStream<'static, std::io::Result<String>>> {
    let mut all = SelectAll::new();
    for (rank, lines) in streams {
        all.push(
            lines
                .map(move |line| line.map(|l| prefixed(rank, &l)))
                .boxed(),
        );
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    #[test]
    fn whole_logs_merge_in_time_order_with_rank_prefixes() {
        let rank0 =
            "2026-11-24T10:00:00.100Z  INFO a\n2026-11-24T10:00:00.300Z  INFO c\n  continued\n";
        let rank1 = "2026-11-24T10:00:00.200Z  INFO b\n2026-11-24T10:00:00.300Z  INFO d\n";
        let merged = merge_by_time(&[(0, rank0.into()), (1, rank1.into())]);
        assert_eq!(
            merged,
            [
                "[rank 0] 2026-11-24T10:00:00.100Z  INFO a",
                "[rank 1] 2026-11-24T10:00:00.200Z  INFO b",
                "[rank 0] 2026-11-24T10:00:00.300Z  INFO c",
                "[rank 0]   continued",
                "[rank 1] 2026-11-24T10:00:00.300Z  INFO d",
            ]
        );
    }

    #[tokio::test]
    async fn followed_logs_interleave_with_their_prefixes() {
        let a = stream::iter(vec![Ok("a1".to_string()), Ok("a2".to_string())]).boxed();
        let b = stream::iter(vec![Ok("b1".to_string())]).boxed();
        let mut lines: Vec<String> = interleave(vec![(0, a), (3, b)])
            .map(|l| l.expect("line"))
            .collect()
            .await;
        lines.sort();
        assert_eq!(lines, ["[rank 0] a1", "[rank 0] a2", "[rank 3] b1"]);
    }
}
