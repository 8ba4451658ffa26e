//! Listening for gRPC on a unix socket: the socket's directory is created and a stale socket file replaced.

use std::path::{Path, PathBuf};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

/// Errors listening on a unix socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create socket directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove stale socket {path}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on unix socket {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Listens on `path` (what a tonic server's `serve_with_incoming*` takes).
pub fn listen(path: &Path) -> Result<UnixListenerStream, SocketError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SocketError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SocketError::RemoveStale {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let listener = UnixListener::bind(path).map_err(|source| SocketError::Listen {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(UnixListenerStream::new(listener))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replaces_a_stale_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugins").join("dra.sock");
        drop(listen(&path).unwrap());
        assert!(path.exists(), "a dropped listener leaves its socket file");
        let _again = listen(&path).unwrap();
        tokio::net::UnixStream::connect(&path).await.unwrap();
    }

    #[tokio::test]
    async fn a_directory_in_the_way_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy");
        std::fs::create_dir_all(path.join("x")).unwrap();
        let err = listen(&path).unwrap_err();
        assert!(err.to_string().contains("busy"), "{err}");
    }
}
