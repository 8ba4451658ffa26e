//! How much memory a rank's rings may take: before a ring's memory is made, its bytes are
//! checked against two limits, and a ring that does not fit is not made (its link keeps frames
//! on TCP, with one warning per rank naming the limit):
//!
//! - this rank's own cap (`RDU_SHM_MAX_BYTES`, [`RingMemory`](crate::RingMemory)): the most all
//!   its rings may hold at once;
//! - what the host can give: the ring must leave `MemAvailable` (`/proc/meminfo`) above a
//!   quarter of `MemTotal`, so rings never push the machine into its OOM killer. Every rank of
//!   the host checks the same number, and a ring's memory is committed when it is made
//!   (`fallocate`), so the next rank's check already sees it.
//!
//! A reservation is held by the segment it paid for and given back when that is unmapped.

use std::fmt;
use std::sync::{Arc, Mutex};

/// `MemAvailable` must stay above `MemTotal` divided by this once a ring is made.
const HOST_RESERVE_DIVISOR: u64 = 4;

/// The host's memory as `/proc/meminfo` tells it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostMemory {
    pub(crate) available: u64,
    pub(crate) total: u64,
}

impl HostMemory {
    /// Reads `/proc/meminfo`; `None` where it cannot be read or lacks the fields.
    pub(crate) fn read() -> Option<HostMemory> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        HostMemory::parse(&text)
    }

    fn parse(text: &str) -> Option<HostMemory> {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|rest| rest.trim().strip_suffix("kB"))
                .and_then(|kb| kb.trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        };
        Some(HostMemory {
            available: field("MemAvailable")?,
            total: field("MemTotal")?,
        })
    }

    /// What must stay available once rings are made.
    pub(crate) fn reserve(&self) -> u64 {
        self.total / HOST_RESERVE_DIVISOR
    }
}

/// Why a ring was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Over this rank's own cap.
    RankCap { held: u64, bytes: u64, max: u64 },
    /// The host would fall under its reserve.
    Host {
        available: u64,
        bytes: u64,
        reserve: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Refusal::RankCap { held, bytes, max } => write!(
                f,
                "this rank's rings would hold {} MiB, over its limit RDU_SHM_MAX_BYTES={max} ({} MiB)",
                mib(held + bytes),
                mib(max)
            ),
            Refusal::Host {
                available,
                bytes,
                reserve,
            } => write!(
                f,
                "the host has {} MiB available (MemAvailable) and a ring of {} MiB would leave less \
                 than the {} MiB (a quarter of MemTotal) that rings always leave",
                mib(available),
                mib(bytes),
                mib(reserve)
            ),
        }
    }
}

fn mib(bytes: u64) -> String {
    let mib = bytes as f64 / f64::from(1 << 20);
    if mib.fract() == 0.0 {
        format!("{mib:.0}")
    } else {
        format!("{mib:.1}")
    }
}

/// Whether a ring of `bytes` fits, this rank's rings holding `held` under a cap of `max` and
/// the host as `host` says (no host check when it could not be read).
pub(crate) fn fits(
    bytes: u64,
    held: u64,
    max: u64,
    host: Option<HostMemory>,
) -> Result<(), Refusal> {
    if held.saturating_add(bytes) > max {
        return Err(Refusal::RankCap { held, bytes, max });
    }
    if let Some(host) = host
        && host.available.saturating_sub(bytes) < host.reserve()
    {
        return Err(Refusal::Host {
            available: host.available,
            bytes,
            reserve: host.reserve(),
        });
    }
    Ok(())
}

/// One rank's ring memory: its cap, what its rings hold, the most they held.
#[derive(Debug)]
pub(crate) struct RingBudget {
    max: u64,
    state: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    now: u64,
    peak: u64,
    refused: bool,
}

impl RingBudget {
    pub(crate) fn new(max: u64) -> Arc<RingBudget> {
        Arc::new(RingBudget {
            max,
            state: Mutex::new(Held::default()),
        })
    }

    /// Reserves `bytes` for a ring, checked against both limits (the host as `host` reads it).
    /// The first refusal of this rank is logged as a warning naming the limit, later ones at
    /// debug level.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        peer: u32,
        host: impl FnOnce() -> Option<HostMemory>,
    ) -> Option<Reservation> {
        let mut held = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match fits(bytes, held.now, self.max, host()) {
            Ok(()) => {
                held.now += bytes;
                held.peak = held.peak.max(held.now);
                Some(Reservation {
                    budget: self.clone(),
                    bytes,
                })
            }
            Err(refusal) => {
                if std::mem::replace(&mut held.refused, true) {
                    tracing::debug!(peer, %refusal, "no shared-memory ring; frames go on TCP");
                } else {
                    tracing::warn!(
                        peer,
                        "no shared-memory ring to rank {peer}: {refusal}; its frames go on TCP \
                         (further rings refused are logged at debug level)"
                    );
                }
                None
            }
        }
    }

    /// Bytes this rank's rings hold now.
    pub(crate) fn held(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).now
    }

    /// The most this rank's rings held at once.
    pub(crate) fn peak(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).peak
    }

    fn release(&self, bytes: u64) {
        let mut held = self.state.lock().unwrap_or_else(|p| p.into_inner());
        held.now = held.now.saturating_sub(bytes);
    }
}

/// Ring memory reserved in a budget, given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<RingBudget>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn host(available: u64, total: u64) -> Option<HostMemory> {
        Some(HostMemory { available, total })
    }

    /// A ring's bytes, what the rank's rings hold, its cap, the host, and the refusal expected.
    type Case = (u64, u64, u64, Option<HostMemory>, Option<&'static str>);

    #[test]
    fn a_ring_fits_under_both_limits_or_is_refused_naming_the_one_it_breaks() {
        let cases: [Case; 7] = [
            (2 * MIB, 0, 64 * MIB, host(20 * GIB, 24 * GIB), None),
            (2 * MIB, 62 * MIB, 64 * MIB, host(20 * GIB, 24 * GIB), None),
            (
                2 * MIB,
                63 * MIB,
                64 * MIB,
                host(20 * GIB, 24 * GIB),
                Some("65 MiB, over its limit RDU_SHM_MAX_BYTES=67108864 (64 MiB)"),
            ),
            (
                2 * MIB,
                0,
                0,
                host(20 * GIB, 24 * GIB),
                Some("RDU_SHM_MAX_BYTES=0"),
            ),
            // 6 GiB + 2 MiB available: the ring leaves exactly the reserve.
            (
                2 * MIB,
                0,
                64 * MIB,
                host(6 * GIB + 2 * MIB, 24 * GIB),
                None,
            ),
            (
                2 * MIB,
                0,
                64 * MIB,
                host(6 * GIB + MIB, 24 * GIB),
                Some(
                    "has 6145 MiB available (MemAvailable) and a ring of 2 MiB would leave less than the 6144 MiB",
                ),
            ),
            // No /proc/meminfo: only the rank's cap applies.
            (2 * MIB, 0, 64 * MIB, None, None),
        ];
        for (bytes, held, max, host, refused) in cases {
            let got = fits(bytes, held, max, host);
            match refused {
                None => assert_eq!(got, Ok(()), "{bytes} {held} {max} {host:?}"),
                Some(text) => {
                    let error = got.expect_err("refused").to_string();
                    assert!(error.contains(text), "{error}");
                }
            }
        }
    }

    #[test]
    fn reservations_count_while_held_and_the_peak_stays() {
        let budget = RingBudget::new(5 * MIB);
        let room = || host(20 * GIB, 24 * GIB);
        let first = budget.reserve(2 * MIB, 1, room).expect("fits");
        let second = budget.reserve(2 * MIB, 2, room).expect("fits");
        assert_eq!(budget.held(), 4 * MIB);
        assert!(budget.reserve(2 * MIB, 3, room).is_none(), "6 MiB > 5 MiB");
        drop(first);
        assert_eq!(budget.held(), 2 * MIB);
        let third = budget.reserve(2 * MIB, 3, room).expect("fits again");
        assert!(budget.reserve(MIB, 4, || host(GIB, 24 * GIB)).is_none());
        assert_eq!((budget.held(), budget.peak()), (4 * MIB, 4 * MIB));
        drop((second, third));
        assert_eq!((budget.held(), budget.peak()), (0, 4 * MIB));
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24684084 kB\nMemFree:        11083888 kB\nMemAvailable:   23122600 kB\n";
        assert_eq!(
            HostMemory::parse(text),
            Some(HostMemory {
                available: 23_122_600 * 1024,
                total: 24_684_084 * 1024
            })
        );
        assert_eq!(HostMemory::parse("MemTotal: 1 kB\n"), None);
        assert!(HostMemory::read().is_some(), "this test runs on Linux");
    }
}
