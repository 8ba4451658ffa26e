//! Bounded polling before parking: a receive of a small frame first polls its socket for a
//! while, because waking a thread parked in epoll costs more than a small message itself (a 4 KiB
//! ping-pong on loopback is mostly two wake-ups). Between polls the thread yields its core
//! (`sched_yield`), so polling never takes a core from a rank or a compute thread that could run:
//! with 4 ranks on 2 cores a waiting rank hands its core to the rank it waits for. Measured with
//! `allreduce-bench` (4 KiB, 2000 iterations), on 2 cores: 2 ranks 19-25 us polling vs 24-26
//! parking at once, 4 ranks 63-83 us vs 87-140. Polling without yielding was bimodal (12 us, or
//! 65 us when the scheduler put both ranks on one core) and 2-3x slower with 4 ranks.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::CollectiveError;

/// How long `Auto` polls: a few one-way latencies of loopback TCP, short next to a training step
/// (50 us measured best of 30, 50, 100 and 200 with 2 and 4 ranks).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// TCP frames up to this many payload bytes are polled for; larger ones are bandwidth-bound and
/// park. A shared-memory ring polls for every frame (and a full ring's sender for space): there a
/// poll costs no system call, and waking a parked end costs a bell on the socket.
pub const SPIN_MAX_FRAME_BYTES: usize = 64 << 10;

/// Whether waits poll before parking: receives of small TCP frames, and both ends of a
/// shared-memory ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spin {
    /// Poll for [`DEFAULT_SPIN`].
    #[default]
    Auto,
    /// Never poll: park at once.
    Off,
    /// Poll for this long.
    For(Duration),
}

impl Spin {
    /// How long to poll, if at all.
    pub(crate) fn duration(self) -> Option<Duration> {
        match self {
            Spin::Auto => Some(DEFAULT_SPIN),
            Spin::Off => None,
            Spin::For(d) if d.is_zero() => None,
            Spin::For(d) => Some(d),
        }
    }
}

impl fmt::Display for Spin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spin::Auto => f.write_str("auto"),
            Spin::Off => f.write_str("off"),
            Spin::For(d) => write!(f, "{}us", d.as_micros()),
        }
    }
}

impl FromStr for Spin {
    type Err = CollectiveError;

    /// `auto`, `off`, or microseconds such as `50us`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            CollectiveError::invalid_config(
                "spin",
                format!("{s:?} is not auto, off or microseconds such as 50us"),
            )
        };
        match s {
            "auto" => Ok(Spin::Auto),
            "off" => Ok(Spin::Off),
            _ => {
                let micros: u64 = s
                    .strip_suffix("us")
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?;
                if micros > 1_000_000 {
                    return Err(CollectiveError::invalid_config(
                        "spin",
                        format!("{s} is longer than a second; poll for less"),
                    ));
                }
                Ok(Spin::For(Duration::from_micros(micros)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(Spin::Auto.duration(), Some(DEFAULT_SPIN));
        assert_eq!(Spin::Off.duration(), None);
        let fixed = Duration::from_micros(30);
        assert_eq!(Spin::For(fixed).duration(), Some(fixed));
        assert_eq!(Spin::For(Duration::ZERO).duration(), None);
    }

    #[test]
    fn spins_parse_and_print() {
        for spin in [Spin::Auto, Spin::Off, Spin::For(Duration::from_micros(50))] {
            assert_eq!(spin.to_string().parse::<Spin>().ok(), Some(spin));
        }
        for bad in ["", "50", "50ms", "-1us", "2000000us"] {
            let error = bad.parse::<Spin>().unwrap_err().to_string();
            assert!(error.contains("spin"), "{bad}: {error}");
        }
    }
}
