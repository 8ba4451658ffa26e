//! Free loopback TCP ports for the control-plane processes.

use std::net::TcpListener;

/// A port the OS reports free on 127.0.0.1 now (released before it is returned).
pub fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_free_port_can_be_bound() {
        let port = super::free_port().unwrap();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
