//! The operator's HTTP listeners, bounded so that no client can hold them: at most `max_connections` served at
//! once (the next wait in the kernel's accept queue until one ends), at most `max_per_client` of them from one
//! address (one more is closed at once, so one pod cannot take the slots other pods need), the request head read within
//! `header_read_timeout`, one request per connection (no idle keep-alive), and every connection closed after
//! `connection_deadline` whatever it is doing (a slow body, a slow reader). `axum::serve` sets none of these.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What one listener allows its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections served at once from one address.
    pub max_per_client: usize,
    /// Time to send the whole request head, from the connection's start.
    pub header_read_timeout: Duration,
    /// Time a connection may live, request and response included.
    pub connection_deadline: Duration,
}

/// The limits of `/metrics`, `/healthz` and `/readyz` (the kubelet's probes and a scraper).
pub const HEALTH_LIMITS: ServerLimits = ServerLimits {
    max_connections: 64,
    max_per_client: 16,
    header_read_timeout: Duration::from_secs(5),
    connection_deadline: Duration::from_secs(10),
};

/// The limits of the progress endpoint (one rank 0 per running job, a report every few seconds).
pub const PROGRESS_LIMITS: ServerLimits = ServerLimits {
    max_connections: 256,
    // A rank 0 sends one report at a time, every few seconds.
    max_per_client: 4,
    header_read_timeout: Duration::from_secs(5),
    connection_deadline: Duration::from_secs(10),
};

/// Serves `router` on `listener` within `limits` until accepting fails for good.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Clients::default();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors and the like: wait for some to be released, as axum::serve does.
                tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot accept a connection");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Over its share: closed at once, the slot free again for others.
        let Some(client) = clients.enter(peer.ip(), limits.max_per_client) else {
            tracing::debug!(peer = %peer.ip(), "too many connections from one address; closed");
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _client = client;
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .keep_alive(false);
            let connection = http.serve_connection(TokioIo::new(stream), service);
            let served: Result<Result<(), hyper::Error>, _> =
                tokio::time::timeout(limits.connection_deadline, connection).await;
            if let Ok(Err(e)) = served {
                tracing::trace!(error = %rdu_error_chain::Chain(&e), "connection ended with an error");
            }
        });
    }
}

/// Connections open per client address.
#[derive(Clone, Default)]
struct Clients(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection counted against its client until dropped.
struct ClientSlot {
    clients: Clients,
    ip: IpAddr,
}

impl Clients {
    /// Counts a connection from `ip`, unless it already has `max` open.
    fn enter(&self, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const TIGHT: ServerLimits = ServerLimits {
        max_connections: 2,
        max_per_client: 3,
        header_read_timeout: Duration::from_millis(300),
        connection_deadline: Duration::from_secs(2),
    };

    async fn start(limits: ServerLimits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = Router::new().route("/healthz", get(|| async { "ok" }));
        tokio::spawn(serve(listener, router, limits));
        addr
    }

    /// A GET on a fresh connection, its response, and how long it took.
    async fn fetch(addr: std::net::SocketAddr) -> (String, Duration) {
        let started = Instant::now();
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        (response, started.elapsed())
    }

    /// How long the server keeps a connection that sends part of a request head and then a byte every 50 ms.
    async fn slow_loris(addr: std::net::SocketAddr, give_up: Duration) -> Option<Duration> {
        let started = Instant::now();
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(b"GET /healthz HTTP/1.1\r\n").await.ok()?;
        let mut byte = [0u8; 1];
        while started.elapsed() < give_up {
            if stream.write_all(b"X").await.is_err() {
                return Some(started.elapsed());
            }
            let read = tokio::time::timeout(Duration::from_millis(50), stream.read(&mut byte));
            if let Ok(Ok(0) | Err(_)) = read.await {
                return Some(started.elapsed());
            }
        }
        None
    }

    #[tokio::test]
    async fn a_slow_request_head_is_cut_off_at_the_header_timeout() {
        let addr = start(TIGHT).await;
        let held = slow_loris(addr, Duration::from_secs(5))
            .await
            .expect("the server closed the connection");
        assert!(held >= TIGHT.header_read_timeout, "{held:?}");
        assert!(held < TIGHT.connection_deadline, "{held:?}");
    }

    #[tokio::test]
    async fn one_request_per_connection_and_the_server_closes_it() {
        let addr = start(TIGHT).await;
        let (response, took) = fetch(addr).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            response.to_ascii_lowercase().contains("connection: close"),
            "{response}"
        );
        assert!(
            took < Duration::from_secs(1),
            "read to the end: the server closed it"
        );
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_for_a_slot_and_are_then_served() {
        let addr = start(TIGHT).await;
        // Two idle connections, first in the accept queue, take both slots until the header timeout ends them.
        let mut holders = Vec::new();
        for _ in 0..TIGHT.max_connections {
            holders.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let (response, took) = fetch(addr).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            took >= TIGHT.header_read_timeout - Duration::from_millis(100),
            "served only once a slot was free: {took:?}"
        );
        drop(holders);
    }

    /// Whether `check` holds within `deadline`, polled.
    async fn until<F, Fut>(deadline: Duration, mut check: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if check().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// A GET from `source` (a loopback address), and the response ("" when the server closed it unanswered).
    async fn fetch_from(addr: std::net::SocketAddr, source: [u8; 4]) -> String {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from((source, 0)))
            .expect("bind the source");
        let mut stream = socket.connect(addr).await.expect("connect");
        let _ = stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .await;
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response).await;
        response
    }

    #[tokio::test]
    async fn one_client_cannot_take_the_slots_another_needs() {
        // Idle holders are kept for the whole test (long timeouts).
        let limits = ServerLimits {
            max_connections: 8,
            max_per_client: 2,
            header_read_timeout: Duration::from_secs(30),
            connection_deadline: Duration::from_secs(30),
        };
        let addr = start(limits).await;
        let mut holders = Vec::new();
        for _ in 0..limits.max_per_client {
            holders.push(TcpStream::connect(addr).await.expect("connect"));
        }
        // The holders are counted once accepted: the server answers their own next request only after.
        let refused = until(Duration::from_secs(2), || async {
            fetch_from(addr, [127, 0, 0, 1]).await.is_empty()
        })
        .await;
        assert!(
            refused,
            "a third connection of the same client is closed unanswered"
        );
        let other = fetch_from(addr, [127, 0, 0, 2]).await;
        assert!(
            other.starts_with("HTTP/1.1 200"),
            "another client is served: {other}"
        );
        drop(holders);
        let again = until(Duration::from_secs(2), || async {
            fetch_from(addr, [127, 0, 0, 1])
                .await
                .starts_with("HTTP/1.1 200")
        })
        .await;
        assert!(again, "served again once its connections closed");
    }
}
