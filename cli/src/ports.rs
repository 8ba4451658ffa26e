//! A free loopback port for rank 0's rendezvous (the ranks' collective servers bind port 0 themselves).

use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::ops::Range;

use crate::error::CliError;

/// Where the kernel says its ephemeral ports are, the ones a bind to port 0 gets.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// The lowest port picked: above the well-known ports and the common services' registered ones.
const LOWEST: u16 = 20_000;
/// How many ports are tried before falling back to one the kernel hands out.
const TRIES: usize = 64;

/// A free port on 127.0.0.1, released for rank 0 to bind. Picked at random below the kernel's ephemeral range when
/// there is room: a port the kernel handed out for port 0 could be handed out again, between its release and rank
/// 0's bind, to any process binding port 0 (the ranks' own servers among them); seen in CI as rank 0's "Address
/// already in use" and a gang restart counted against the job's backoff limit.
pub(crate) fn free_port() -> Result<u16, CliError> {
    let ephemeral = std::fs::read_to_string(EPHEMERAL_RANGE)
        .ok()
        .and_then(|text| parse_range(&text));
    if let Some(window) = ephemeral.and_then(outside_ephemeral) {
        let len = usize::from(window.end - window.start);
        let start = (RandomState::new().hash_one(std::process::id()) % len as u64) as usize;
        for offset in 0..TRIES.min(len) {
            let port = window.start + ((start + offset) % len) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|source| CliError::Io {
            what: "picking a free port on 127.0.0.1 for the rendezvous".into(),
            source,
        })
}

/// `ip_local_port_range`'s two numbers ("32768\t60999\n").
fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut numbers = text.split_whitespace().map(str::parse::<u16>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// The ports to pick from, none in the ephemeral range `(low, high)`: from [`LOWEST`] up to it, else above it;
/// none when neither side has a thousand ports.
fn outside_ephemeral((low, high): (u16, u16)) -> Option<Range<u16>> {
    const ROOM: u16 = 1_000;
    if low >= LOWEST.saturating_add(ROOM) {
        Some(LOWEST..low)
    } else if high <= u16::MAX - ROOM {
        Some(high + 1..u16::MAX)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_bindable_again_and_not_one_the_kernel_hands_out() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind(("127.0.0.1", port)).expect("free after release");
        let text = std::fs::read_to_string(EPHEMERAL_RANGE).unwrap_or_default();
        if let Some((low, high)) = parse_range(&text).filter(|r| outside_ephemeral(*r).is_some()) {
            assert!(!(low..=high).contains(&port), "{port} in {low}-{high}");
        }
    }

    #[test]
    fn the_kernels_range_is_read_from_its_two_numbers() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("1024 65535"), Some((1024, 65535)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("32768"), None);
        assert_eq!(parse_range("a b"), None);
    }

    #[test]
    fn ports_are_picked_below_the_ephemeral_range_else_above_it_else_not_at_all() {
        let cases = [
            ((32768, 60999), Some(20_000..32768)),
            ((49152, 65535), Some(20_000..49152)),
            ((1024, 40000), Some(40001..65535)),
            ((10000, 65000), None),
            ((1024, 65535), None),
        ];
        for (range, want) in cases {
            assert_eq!(outside_ephemeral(range), want, "{range:?}");
        }
    }
}
