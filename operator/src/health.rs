//! The operator's HTTP endpoints: /metrics (Prometheus text), /healthz (alive), /readyz (caches synced).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// What the endpoints report, shared with the controller.
pub struct Health {
    pub metrics: Arc<Metrics>,
    ready: AtomicBool,
}

impl Health {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Health {
            metrics,
            ready: AtomicBool::new(false),
        }
    }

    /// Whether the controller's caches are synced (and this replica leads).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Marks the controller's caches synced (true) or the controller stopped (false).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

/// The routes of the health and metrics server.
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health)
}

/// Serves the routes until the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, health: Arc<Health>) -> std::io::Result<()> {
    axum::serve(listener, router(health)).await
}

async fn metrics_text(State(health): State<Arc<Health>>) -> String {
    health.metrics.render()
}

async fn readyz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if health.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: caches not synced or not the leader",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[tokio::test]
    async fn endpoints_report_health_readiness_and_metrics() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (jobs, _writer) = kube::runtime::reflector::store();
        let health = Arc::new(Health::new(Arc::new(Metrics::new(jobs))));
        tokio::spawn(serve(listener, health.clone()));

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_ready(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        health.metrics.reconciles.inc();
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("rdu_operator_reconciles_total 1"),
            "{metrics}"
        );
        assert!(
            metrics.contains("rdu_operator_reconcile_duration_seconds"),
            "{metrics}"
        );
        assert!(
            metrics.contains("rdu_operator_jobs{phase=\"Pending\"} 0"),
            "{metrics}"
        );
    }
}
