//! The HTTP status endpoint: `/status` (the sntilestat JSON), `/metrics` (Prometheus text), `/healthz`.

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use rdu_tiles::node::TileNode;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The router of the status endpoint.
pub fn router(node: Arc<TileNode>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(node)
}

async fn status(State(node): State<Arc<TileNode>>) -> impl IntoResponse {
    Json(node.status())
}

async fn metrics(State(node): State<Arc<TileNode>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        node.metrics().encode(),
    )
}

/// Serves the status endpoint on `listener` until `shutdown` completes.
pub async fn serve_status(
    listener: TcpListener,
    node: Arc<TileNode>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(node))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_tiles::tilestat::{fetch, fetch_and_render};
    use rdu_tiles::topology::{ResourceMode, Topology};

    async fn fetch_text(url: &str) -> String {
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::TokioExecutor;
        let client: Client<_, axum::body::Body> =
            Client::builder(TokioExecutor::new()).build_http();
        let response = client.get(url.parse().unwrap()).await.unwrap();
        assert!(response.status().is_success());
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1 << 20)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn serves_status_that_tilestat_renders_and_metrics() {
        let node = Arc::new(
            TileNode::new(
                Topology::new(2, 4).unwrap(),
                ResourceMode::Tile,
                Some("node-a".into()),
                None,
            )
            .unwrap(),
        );
        node.allocate(&["rdu1-tile2".to_string()]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_status(listener, node.clone(), async {
            let _ = rx.await;
        }));
        let status = fetch(&format!("http://{addr}/status")).await.unwrap();
        assert_eq!(status, node.status());
        assert_eq!(
            fetch(&format!("http://{addr}")).await.unwrap(),
            status,
            "bare URL means /status"
        );
        assert_eq!(status.tiles_allocated, 1);
        let table = fetch_and_render(&format!("http://{addr}/status"))
            .await
            .unwrap();
        assert!(
            table.contains("8 tiles (2 RDUs x 4), 8 healthy, 1 allocated, 7 free"),
            "{table}"
        );
        let err = fetch(&format!("http://{addr}/nope")).await.unwrap_err();
        assert!(err.to_string().contains("404"), "{err}");
        let metrics = fetch_text(&format!("http://{addr}/metrics")).await;
        assert!(metrics.contains("rdu_tiles_allocated 1"), "{metrics}");
        assert!(
            metrics.contains("rdu_allocate_seconds_count 1"),
            "{metrics}"
        );
        let _ = tx.send(());
        server.await.unwrap().unwrap();
    }
}
