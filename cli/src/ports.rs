//! A free loopback port for rank 0's rendezvous (the ranks' collective servers bind port 0 themselves).

use std::net::TcpListener;

use crate::error::CliError;

/// A free port on 127.0.0.1: bound to port 0, read, and released for rank 0 to bind.
pub(crate) fn free_port() -> Result<u16, CliError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|source| CliError::Io {
            what: "picking a free port on 127.0.0.1 for the rendezvous".into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_bindable_again() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind(("127.0.0.1", port)).expect("free after release");
    }
}
