//! A kubelet double for tests and benchmarks: serves `Registration` on `<dir>/kubelet.sock`, records every
//! registration, and dials a registered plugin the way the kubelet does; and a pod-resources API double.

use crate::api::device_plugin_client::DevicePluginClient;
use crate::api::registration_server::{Registration, RegistrationServer};
use crate::api::{Empty, RegisterRequest};
use crate::plugin::{API_VERSION, KUBELET_SOCKET};
use crate::podresources_api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use crate::podresources_api::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use crate::unix_socket::{TransportError, unix_channel};
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
    #[error("cannot listen on {path}")]
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

/// The kubelet's pod-resources API: answers `List` with whatever pods are set.
pub struct PodResourcesDouble {
    pods: Arc<std::sync::Mutex<Vec<PodResources>>>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

struct PodLister {
    pods: Arc<std::sync::Mutex<Vec<PodResources>>>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for PodLister {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let pods = self
            .pods
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }
}

impl PodResourcesDouble {
    /// Serves `List` on the unix socket `path`.
    pub fn start(path: &Path) -> Result<PodResourcesDouble, KubeletDoubleError> {
        let listener = UnixListener::bind(path).map_err(|source| KubeletDoubleError::Listen {
            path: path.to_path_buf(),
            source,
        })?;
        let pods = Arc::new(std::sync::Mutex::new(Vec::new()));
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let lister = PodLister {
            pods: pods.clone(),
            lists: lists.clone(),
        };
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(lister))
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
        });
        Ok(PodResourcesDouble { pods, lists, task })
    }

    /// How many `List` calls were answered.
    pub fn lists(&self) -> usize {
        self.lists.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sets the pods `List` returns: `(namespace, name, resource, device IDs)`.
    pub fn set_pods(&self, pods: &[(&str, &str, &str, &[&str])]) {
        let list = pods
            .iter()
            .map(|(namespace, name, resource, ids)| PodResources {
                name: name.to_string(),
                namespace: namespace.to_string(),
                containers: vec![ContainerResources {
                    name: "worker".to_string(),
                    devices: vec![ContainerDevices {
                        resource_name: resource.to_string(),
                        device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    }],
                }],
            })
            .collect();
        *self
            .pods
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = list;
    }
}

impl Drop for PodResourcesDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for KubeletDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}
