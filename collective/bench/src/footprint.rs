//! What one rank process holds: its open file descriptors (sockets, rings, epoll) and its peak resident memory,
//! read from `/proc/self`, so the bench can report them per rank as the world grows.

use anyhow::{Context, Result};

/// A rank's descriptors and peak memory at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footprint {
    /// Entries of `/proc/self/fd` (the listing's own descriptor not counted).
    pub open_fds: u64,
    /// `VmHWM`: the most resident memory the process has had, in KiB.
    pub peak_rss_kib: u64,
}

impl Footprint {
    /// This process's footprint now.
    pub(crate) fn now() -> Result<Footprint> {
        let listing = std::fs::read_dir("/proc/self/fd").context("listing /proc/self/fd")?;
        // The directory being read holds a descriptor of its own while it is listed.
        let open_fds = (listing.count() as u64).saturating_sub(1);
        let status =
            std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
        let peak_rss_kib =
            status_kib(&status, "VmHWM").context("/proc/self/status has no VmHWM line in kB")?;
        Ok(Footprint {
            open_fds,
            peak_rss_kib,
        })
    }
}

/// Field `name` of a `/proc/PID/status` text, in kB.
fn status_kib(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib_and_only_whole() {
        let status = "Name:\tallreduce-bench\nVmPeak:\t  200 kB\nVmHWM:\t    5120 kB\nVmRSS:\t    4096 kB\nThreads:\t1\n";
        assert_eq!(status_kib(status, "VmHWM"), Some(5120));
        assert_eq!(status_kib(status, "VmRSS"), Some(4096));
        assert_eq!(status_kib(status, "Threads"), None, "not in kB");
        assert_eq!(status_kib(status, "VmSwap"), None, "absent");
        assert_eq!(
            status_kib("VmHWMX:\t1 kB\n", "VmHWM"),
            None,
            "another field's prefix"
        );
    }

    #[test]
    fn descriptors_opened_are_counted() {
        let before = Footprint::now().expect("footprint");
        let files: Vec<_> = (0..8)
            .map(|_| std::fs::File::open("/proc/self/status").expect("open"))
            .collect();
        let after = Footprint::now().expect("footprint");
        assert!(before.peak_rss_kib > 0);
        // No other test of this binary keeps a descriptor open (they parse text or set an
        // affinity), so the count moves by these 8 alone.
        assert_eq!(after.open_fds, before.open_fds + 8);
        drop(files);
    }
}
