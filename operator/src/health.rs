//! The operator's HTTP endpoints: /metrics (Prometheus text), /healthz (alive), /readyz (a standby waiting for the
//! Lease, or the leader with its caches synced).

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
    /// Leads, and the controller's caches hold their first full list.
    synced: AtomicBool,
    /// Waits for the Lease, ready to take over.
    standby: AtomicBool,
}

impl Health {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Health {
            metrics,
            synced: AtomicBool::new(false),
            standby: AtomicBool::new(false),
        }
    }

    /// Whether this replica leads and the controller's caches are synced: only then it reconciles and takes
    /// progress reports.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// Marks the controller's caches synced (true) or the controller stopped (false).
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::SeqCst);
    }

    /// Marks this replica waiting for the Lease (true) or leading or stopping (false). A standby is ready: a
    /// rolling update replaces the leader only once its successor is ready, and a successor that had to lead to
    /// be ready would never be.
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::SeqCst);
    }

    /// What /readyz answers: ready as a standby or as the leader with synced caches, not while the new leader
    /// lists or once the replica stops.
    fn readiness(&self) -> Result<&'static str, &'static str> {
        if self.standby.load(Ordering::SeqCst) {
            Ok("ready: standby")
        } else if self.is_synced() {
            Ok("ready: leading")
        } else {
            Err("not ready: leading with caches not synced yet, or stopping")
        }
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

/// Serves the routes until the listener fails (the binary serves them with the progress routes, `crate::serve`).
#[cfg(test)]
async fn serve(listener: tokio::net::TcpListener, health: Arc<Health>) -> std::io::Result<()> {
    axum::serve(listener, router(health)).await
}

async fn metrics_text(State(health): State<Arc<Health>>) -> String {
    health.metrics.render()
}

async fn readyz(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    match health.readiness() {
        Ok(ready) => (StatusCode::OK, ready),
        Err(not) => (StatusCode::SERVICE_UNAVAILABLE, not),
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
        health.set_standby(true);
        let standby = get(addr, "/readyz").await;
        assert!(standby.starts_with("HTTP/1.1 200"), "{standby}");
        assert!(standby.ends_with("ready: standby"), "{standby}");
        assert!(
            !health.is_synced(),
            "a standby neither reconciles nor takes reports"
        );
        health.set_standby(false);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_synced(true);
        assert!(get(addr, "/readyz").await.ends_with("ready: leading"));
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
