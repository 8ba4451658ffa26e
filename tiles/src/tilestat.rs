//! Tile status like SambaNova's `sntilestat`: the JSON the status endpoint serves, its table rendering,
//! and a small HTTP client that fetches it (used by `rdujob tilestat`).

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::Duration;

/// Biggest status document accepted (a 65,536-tile node is about 8 MiB of JSON).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// How long `fetch_and_render` waits for the endpoint.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors fetching or decoding the status endpoint.
#[derive(Debug, thiserror::Error)]
pub enum TileStatError {
    #[error("bad status URL `{url}`: {reason} (expected e.g. http://127.0.0.1:9464/status)")]
    BadUrl { url: String, reason: String },
    #[error("GET {url} failed: {reason}")]
    Request { url: String, reason: String },
    #[error("GET {url} timed out after {FETCH_TIMEOUT:?}")]
    Timeout { url: String },
    #[error("GET {url} answered HTTP {status}")]
    Status { url: String, status: StatusCode },
    #[error("GET {url} returned a body that is not a tile status document")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Health of one tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TileState {
    Healthy,
    Unhealthy,
}

/// One tile's line in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileStatus {
    /// `rdu<R>-tile<T>`.
    pub id: String,
    pub rdu: u32,
    pub tile: u32,
    pub state: TileState,
    /// Why the tile is unhealthy (`hung`, `failed`...), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub allocated: bool,
    /// `namespace/name` of the pod using the tile, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The rank of the RduJob worker using the tile, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// The whole node, as served by the status endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub resource_name: String,
    pub rdus_per_node: u32,
    pub tiles_per_rdu: u32,
    pub tiles_total: u32,
    pub tiles_healthy: u32,
    pub tiles_allocated: u32,
    pub tiles: Vec<TileStatus>,
}

/// The sntilestat-like table: one line per tile, then a summary line.
pub fn render_table(status: &NodeStatus) -> String {
    let mut out = String::new();
    if let Some(node) = &status.node {
        let _ = writeln!(out, "NODE {node}");
    }
    let _ = writeln!(
        out,
        "{:<24} {:<18} {:<10} {:<40} {:>5}",
        "TILE", "STATE", "ALLOCATED", "POD", "RANK"
    );
    for tile in &status.tiles {
        let path = format!("/RDU_{}/TILE_{}", tile.rdu, tile.tile);
        let state = match (tile.state, &tile.reason) {
            (TileState::Healthy, _) => "healthy".to_string(),
            (TileState::Unhealthy, None) => "unhealthy".to_string(),
            (TileState::Unhealthy, Some(reason)) => format!("unhealthy:{reason}"),
        };
        let allocated = if tile.allocated { "yes" } else { "no" };
        let pod = tile.pod.as_deref().unwrap_or("-");
        let rank = tile
            .rank
            .map(|r| r.to_string())
            .unwrap_or_else(|| "-".to_string());
        let _ = writeln!(
            out,
            "{path:<24} {state:<18} {allocated:<10} {pod:<40} {rank:>5}"
        );
    }
    let _ = writeln!(
        out,
        "{} tiles ({} RDUs x {}), {} healthy, {} allocated, {} free ({})",
        status.tiles_total,
        status.rdus_per_node,
        status.tiles_per_rdu,
        status.tiles_healthy,
        status.tiles_allocated,
        status
            .tiles
            .iter()
            .filter(|t| t.state == TileState::Healthy && !t.allocated)
            .count(),
        status.resource_name,
    );
    out
}

/// GETs the status endpoint at `url` (plain HTTP) and renders the table.
pub async fn fetch_and_render(url: &str) -> Result<String, TileStatError> {
    let status = fetch(url).await?;
    Ok(render_table(&status))
}

/// GETs and decodes the status endpoint at `url`; a URL without a path (`http://node:9464`) means
/// its `/status`.
pub async fn fetch(url: &str) -> Result<NodeStatus, TileStatError> {
    let bad_url = |reason: String| TileStatError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let mut uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad_url(e.to_string()))?;
    if matches!(uri.path(), "" | "/") && uri.query().is_none() {
        let mut parts = uri.into_parts();
        parts.path_and_query = Some(PathAndQuery::from_static("/status"));
        uri = Uri::from_parts(parts).map_err(|e| bad_url(e.to_string()))?;
    }
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(TileStatError::BadUrl {
            url: url.to_string(),
            reason: "only http://HOST:PORT/PATH URLs are supported".to_string(),
        });
    }
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let request = Request::get(uri)
        .body(Empty::new())
        .map_err(|e| TileStatError::BadUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    let request_error = |e: &dyn std::fmt::Display| TileStatError::Request {
        url: url.to_string(),
        reason: e.to_string(),
    };
    let response = tokio::time::timeout(FETCH_TIMEOUT, client.request(request))
        .await
        .map_err(|_| TileStatError::Timeout {
            url: url.to_string(),
        })?
        .map_err(|e| request_error(&e))?;
    if !response.status().is_success() {
        return Err(TileStatError::Status {
            url: url.to_string(),
            status: response.status(),
        });
    }
    let body = tokio::time::timeout(
        FETCH_TIMEOUT,
        Limited::new(response.into_body(), MAX_BODY_BYTES).collect(),
    )
    .await
    .map_err(|_| TileStatError::Timeout {
        url: url.to_string(),
    })?
    .map_err(|e| request_error(&e))?
    .to_bytes();
    serde_json::from_slice(&body).map_err(|source| TileStatError::Decode {
        url: url.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> NodeStatus {
        NodeStatus {
            node: Some("node-a".into()),
            resource_name: "rdu.dev/tile".into(),
            rdus_per_node: 1,
            tiles_per_rdu: 2,
            tiles_total: 2,
            tiles_healthy: 1,
            tiles_allocated: 1,
            tiles: vec![
                TileStatus {
                    id: "rdu0-tile0".into(),
                    rdu: 0,
                    tile: 0,
                    state: TileState::Healthy,
                    reason: None,
                    allocated: true,
                    pod: Some("default/mnist-worker-3".into()),
                    rank: Some(3),
                },
                TileStatus {
                    id: "rdu0-tile1".into(),
                    rdu: 0,
                    tile: 1,
                    state: TileState::Unhealthy,
                    reason: Some("hung".into()),
                    allocated: false,
                    pod: None,
                    rank: None,
                },
            ],
        }
    }

    #[test]
    fn table_has_a_line_per_tile_and_a_summary() {
        let text = render_table(&status());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "NODE node-a");
        assert!(lines[1].starts_with("TILE"));
        assert!(lines[2].starts_with("/RDU_0/TILE_0"));
        assert!(lines[2].contains("default/mnist-worker-3"));
        assert!(lines[2].trim_end().ends_with('3'));
        assert!(lines[3].contains("unhealthy:hung"));
        assert!(lines[4].contains("2 tiles (1 RDUs x 2), 1 healthy, 1 allocated, 0 free"));
    }

    #[test]
    fn status_json_round_trips_in_camel_case() {
        let json = serde_json::to_string(&status()).unwrap();
        assert!(json.contains("\"tilesAllocated\":1"));
        assert!(json.contains("\"state\":\"unhealthy\""));
        let back: NodeStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back, status());
    }

    #[tokio::test]
    async fn bad_urls_are_refused_with_the_url() {
        for url in ["not a url", "https://127.0.0.1:1/status", "/status"] {
            let err = fetch(url).await.unwrap_err();
            assert!(matches!(err, TileStatError::BadUrl { .. }), "{url}: {err}");
            assert!(err.to_string().contains(url));
        }
    }
}
