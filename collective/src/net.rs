//! Sockets and HTTP/2 settings shared by every server and client of the crate, sized for
//! throughput: large flow-control windows and frames, TCP_NODELAY.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};

use crate::error::CollectiveError;

/// Per-stream HTTP/2 window. 16 MiB measured best with 1 MiB chunks on loopback
/// (`allreduce-bench`, 2 ranks, against 4 MiB windows and 512 KiB / 2 MiB chunks).
pub(crate) const STREAM_WINDOW: u32 = 16 << 20;
/// Per-connection HTTP/2 window (one connection per directed pair of ranks).
pub(crate) const CONNECTION_WINDOW: u32 = 32 << 20;
/// Largest HTTP/2 frame we accept; fewer, larger frames cost less per byte.
pub(crate) const MAX_FRAME: u32 = 1 << 20;

/// Binds a listener; port 0 picks a free port.
pub(crate) async fn bind(ip: IpAddr, port: u16) -> Result<TcpListener, CollectiveError> {
    let addr = SocketAddr::new(ip, port);
    TcpListener::bind(addr)
        .await
        .map_err(|e| CollectiveError::bind(addr.to_string(), e))
}

/// A server builder with the throughput settings.
pub(crate) fn server() -> Server {
    Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
}

/// Accepted connections of `listener`, with TCP_NODELAY.
pub(crate) fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

fn endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, String> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad address {addr:?}: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW))
}

/// Connects to `addr`, retrying refused connections (the server may not be up yet) until
/// `deadline`.
pub(crate) async fn dial_until(
    addr: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<Channel, String> {
    let endpoint = endpoint(addr, timeout.min(Duration::from_secs(2)))?;
    let mut backoff = Duration::from_millis(10);
    loop {
        let attempt = tokio::time::timeout_at(deadline, endpoint.connect()).await;
        let error = match attempt {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connect did not finish in time".to_string(),
        };
        if Instant::now() + backoff >= deadline {
            return Err(format!(
                "cannot connect to {addr} within {timeout:?}: {error}"
            ));
        }
        tracing::debug!(%addr, %error, "not reachable yet, retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

/// A channel that connects on first use (for best-effort calls such as Abort).
pub(crate) fn lazy_channel(addr: &str, timeout: Duration) -> Result<Channel, String> {
    Ok(endpoint(addr, timeout)?.timeout(timeout).connect_lazy())
}
