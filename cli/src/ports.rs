//! Free loopback ports for rank 0's rendezvous and each rank's collective server.

use std::net::TcpListener;

use crate::error::CliError;

/// `n` distinct free ports on 127.0.0.1 (bound to port 0, read, then released together).
pub fn free_ports(n: usize) -> Result<Vec<u16>, CliError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::Io {
            what: "picking free ports on 127.0.0.1".into(),
            reason: e.to_string(),
        })?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::Io {
            what: "reading a bound port".into(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports = free_ports(5).unwrap();
        let set: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(set.len(), 5);
        assert!(!set.contains(&0));
    }
}
