//! A kubelet double for tests and benchmarks: serves `Registration` on `<dir>/kubelet.sock`, records every
//! registration, and dials a registered plugin the way the kubelet does.

use crate::api::device_plugin_client::DevicePluginClient;
use crate::api::registration_server::{Registration, RegistrationServer};
use crate::api::{Empty, RegisterRequest};
use crate::plugin::{API_VERSION, KUBELET_SOCKET};
use crate::transport::{TransportError, unix_channel};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Errors of the double.
#[derive(Debug, thiserror::Error)]
pub enum KubeletDoubleError {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Dial(#[from] TransportError),
}

struct Recorder {
    registrations: mpsc::UnboundedSender<RegisterRequest>,
    /// Registrations still to refuse with UNAVAILABLE (a kubelet that is not ready yet).
    refuse: AtomicUsize,
    attempts: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("kubelet not ready"));
        }
        // The kubelet refuses versions it does not support; so does the double.
        if request.version != API_VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version `{}`",
                request.version
            )));
        }
        let _ = self.registrations.send(request);
        Ok(Response::new(Empty {}))
    }
}

/// A running kubelet double.
pub struct KubeletDouble {
    dir: PathBuf,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    attempts: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl KubeletDouble {
    /// Creates `<dir>/kubelet.sock` and serves `Registration` on it.
    pub fn start(dir: &Path) -> Result<KubeletDouble, KubeletDoubleError> {
        KubeletDouble::start_refusing(dir, 0)
    }

    /// Like [`KubeletDouble::start`], but refuses the first `refuse` registrations with UNAVAILABLE.
    pub fn start_refusing(dir: &Path, refuse: usize) -> Result<KubeletDouble, KubeletDoubleError> {
        let path = dir.join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|source| KubeletDoubleError::Listen {
            path: path.clone(),
            source,
        })?;
        let (tx, registrations) = mpsc::unbounded_channel();
        let attempts = Arc::new(AtomicUsize::new(0));
        let recorder = Recorder {
            registrations: tx,
            refuse: AtomicUsize::new(refuse),
            attempts: attempts.clone(),
        };
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(recorder))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                })
                .await;
        });
        Ok(KubeletDouble {
            dir: dir.to_path_buf(),
            registrations,
            attempts,
            stop: Some(stop),
            task,
        })
    }

    /// The next registration, waiting at most `deadline`.
    pub async fn next_registration(&mut self, deadline: Duration) -> Option<RegisterRequest> {
        tokio::time::timeout(deadline, self.registrations.recv())
            .await
            .ok()
            .flatten()
    }

    /// Register calls received so far, refused ones included.
    pub fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Dials the plugin's socket named in its registration, as the kubelet does.
    pub async fn dial_plugin(
        &self,
        registration: &RegisterRequest,
    ) -> Result<DevicePluginClient<Channel>, KubeletDoubleError> {
        let channel = unix_channel(&self.dir.join(&registration.endpoint)).await?;
        Ok(DevicePluginClient::new(channel))
    }

    /// Stops serving (the socket file stays, as after a crash; remove it to simulate a wipe).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let mut task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for KubeletDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}
