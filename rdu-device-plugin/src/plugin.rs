//! The plugin's life with the kubelet: serve on a socket in the device plugin directory, then Register on
//! `kubelet.sock` (with backoff); when `kubelet.sock` is recreated (a kubelet restart wipes the directory) or
//! the plugin's own socket vanishes, serve again and re-register; on shutdown, stop and remove the socket.

use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::api::{DevicePluginOptions, RegisterRequest};
use crate::service::DevicePluginService;
use crate::unix_socket::{TransportError, unix_channel};
use notify::{RecursiveMode, Watcher};
use rdu_tiles::node::TileNode;
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnixListenerStream;

/// Version of the device plugin API this plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// File name of the kubelet's registration socket.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// Errors that stop the plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(
        "cannot create the device plugin directory {path}: {source} (check --device-plugin-dir)"
    )]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot listen on {path}: {source} (is another plugin running? check --device-plugin-dir)"
    )]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Errors of one registration attempt.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Dial(#[from] TransportError),
    #[error("kubelet refused the registration: {0}")]
    Refused(tonic::Status),
    #[error("registration timed out after {0:?}")]
    Timeout(Duration),
}

/// Timing of registration retries and of the fallback directory check.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub first_retry: Duration,
    pub max_retry: Duration,
    pub register_timeout: Duration,
    /// How often the directory is checked even without a change notification (inotify can be unavailable,
    /// e.g. when the user's inotify instances are used up).
    pub recheck: Duration,
    /// Watch the directory with inotify (false: rely on `recheck` alone, as when inotify is unavailable).
    pub watch_directory: bool,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            first_retry: Duration::from_millis(10),
            max_retry: Duration::from_secs(5),
            register_timeout: Duration::from_secs(5),
            recheck: Duration::from_millis(200),
            watch_directory: true,
        }
    }
}

/// Calls `Register` on the kubelet socket once.
pub async fn register_once(
    kubelet_socket: &Path,
    request: RegisterRequest,
    timeout: Duration,
) -> Result<(), RegisterError> {
    let attempt = async {
        let channel = unix_channel(kubelet_socket).await?;
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(RegisterError::Refused)?;
        Ok(())
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| RegisterError::Timeout(timeout))?
}

/// Runs the plugin in `dir` until `shutdown` completes; then removes its socket. One restart loop over three
/// steps, as NVIDIA's plugin splits them: serve on a fresh socket, register with the kubelet, and wait until the
/// kubelet restarts or the socket is removed.
pub async fn run_plugin(
    dir: PathBuf,
    node: Arc<TileNode>,
    timing: Timing,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PluginError> {
    tokio::pin!(shutdown);
    let kubelet = dir.join(KUBELET_SOCKET);
    loop {
        std::fs::create_dir_all(&dir).map_err(|source| PluginError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        let mut changes = DirectoryChanges::watch(&dir, timing.watch_directory);
        let socket_path = dir.join(node.mode().socket_name());
        let server = Served::start(&socket_path, node.clone())?;
        tracing::info!(socket = %socket_path.display(), resource = node.mode().resource_name(), "serving");
        let registration = Registration {
            kubelet: &kubelet,
            node: &node,
            timing: &timing,
        };
        let ended = match registration
            .until_registered(&server, &mut changes, shutdown.as_mut())
            .await
        {
            Ended::Done(Some(kubelet_id)) => {
                registration
                    .until_kubelet_changes(&server, kubelet_id, &mut changes, shutdown.as_mut())
                    .await
            }
            // The plugin's own socket vanished before it registered: serve again.
            Ended::Done(None) => Ended::Done(()),
            Ended::Shutdown => Ended::Shutdown,
        };
        if let Ended::Shutdown = ended {
            finish(server, &node).await;
            return Ok(());
        }
        server.stop().await;
    }
}

/// How a step of the plugin's loop ended: done (with what it found), or told to shut down.
enum Ended<T> {
    Done(T),
    Shutdown,
}

/// Changes in the device plugin directory (kubelet.sock appearing or replaced), from inotify where available.
/// They only wake the checks: they arrive asynchronously, so one can be about a kubelet.sock already registered
/// with; the file's identity says whether it is a new one.
struct DirectoryChanges {
    events: mpsc::UnboundedReceiver<()>,
    /// Keeps the channel open when no watcher could be made, so `recv` waits instead of returning None.
    _open: mpsc::UnboundedSender<()>,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl DirectoryChanges {
    fn watch(dir: &Path, enabled: bool) -> DirectoryChanges {
        let (events_tx, events) = mpsc::unbounded_channel::<()>();
        let open = events_tx.clone();
        let mut watcher = enabled
            .then(|| {
                notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                    tracing::trace!(?event, "device plugin directory event");
                    if !matches!(&event, Ok(e) if e.kind.is_access()) {
                        let _ = events_tx.send(());
                    }
                })
                .inspect_err(|e| {
                    tracing::warn!(error = %rdu_error_chain::Chain(e), "cannot watch the device plugin directory; checking it periodically");
                })
                .ok()
            })
            .flatten();
        if let Some(w) = watcher.as_mut()
            && let Err(e) = w.watch(dir, RecursiveMode::NonRecursive)
        {
            tracing::warn!(error = %rdu_error_chain::Chain(&e), "cannot watch the device plugin directory; checking it periodically");
        }
        DirectoryChanges {
            events,
            _open: open,
            _watcher: watcher,
        }
    }

    /// Forgets the changes so far: looking at the directory now accounts for them.
    fn forget(&mut self) {
        while self.events.try_recv().is_ok() {}
    }

    async fn next(&mut self) {
        let _ = self.events.recv().await;
    }
}

/// Registering this plugin's resource with the kubelet behind `kubelet`.
struct Registration<'a> {
    kubelet: &'a Path,
    node: &'a TileNode,
    timing: &'a Timing,
}

impl Registration<'_> {
    fn request(&self) -> RegisterRequest {
        RegisterRequest {
            version: API_VERSION.to_string(),
            endpoint: self.node.mode().socket_name().to_string(),
            resource_name: self.node.mode().resource_name().to_string(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        }
    }

    /// Registers, retrying with backoff while the same kubelet.sock refuses; a new kubelet.sock (or any change in
    /// the directory) is tried at once. Done with the kubelet.sock registered with, or none when the plugin's own
    /// socket vanished first.
    async fn until_registered<F: Future<Output = ()>>(
        &self,
        server: &Served,
        changes: &mut DirectoryChanges,
        mut shutdown: std::pin::Pin<&mut F>,
    ) -> Ended<Option<FileId>> {
        let timing = self.timing;
        let mut delay = timing.first_retry;
        let mut refused_by: Option<(FileId, tokio::time::Instant)> = None;
        let mut said_waiting = false;
        loop {
            // Changes so far are accounted for by looking at the directory now; any queued from here on (while
            // Register is in flight) is newer than the kubelet we register with.
            changes.forget();
            if !server.socket_is_ours() {
                return Ended::Done(None);
            }
            let kubelet_now = inode(self.kubelet);
            if kubelet_now.is_none() && !said_waiting {
                said_waiting = true;
                tracing::info!(kubelet = %self.kubelet.display(), "waiting for the kubelet's socket");
            }
            if let Some(kubelet_id) = kubelet_now {
                let due = match refused_by {
                    Some((id, retry_at)) if id == kubelet_id => {
                        tokio::time::Instant::now() >= retry_at
                    }
                    Some(_) => {
                        delay = timing.first_retry;
                        true
                    }
                    None => true,
                };
                if due {
                    match register_once(self.kubelet, self.request(), timing.register_timeout).await
                    {
                        Ok(()) => {
                            tracing::info!(kubelet = %self.kubelet.display(), "registered with the kubelet");
                            return Ended::Done(Some(kubelet_id));
                        }
                        Err(e) => {
                            tracing::warn!(error = %rdu_error_chain::Chain(&e), retry_in = ?delay, "registration failed");
                            refused_by = Some((kubelet_id, tokio::time::Instant::now() + delay));
                            delay = (delay * 2).min(timing.max_retry);
                        }
                    }
                }
            }
            let wait = match refused_by {
                Some((_, retry_at)) => retry_at
                    .saturating_duration_since(tokio::time::Instant::now())
                    .min(timing.recheck),
                None => timing.recheck,
            };
            tokio::select! {
                _ = &mut shutdown => return Ended::Shutdown,
                // Something changed in the directory: try again now rather than after the backoff.
                _ = changes.next() => refused_by = None,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Serves until the kubelet restarts (kubelet.sock recreated) or the plugin's own socket is removed.
    async fn until_kubelet_changes<F: Future<Output = ()>>(
        &self,
        server: &Served,
        registered: FileId,
        changes: &mut DirectoryChanges,
        mut shutdown: std::pin::Pin<&mut F>,
    ) -> Ended<()> {
        // Set once kubelet.sock is seen missing: whatever appears next is a new kubelet.
        let mut kubelet_went_away = false;
        loop {
            if !server.socket_is_ours() {
                tracing::info!("plugin socket removed; serving again");
                return Ended::Done(());
            }
            match inode(self.kubelet) {
                None => kubelet_went_away = true,
                Some(now) if kubelet_went_away || now != registered => {
                    tracing::info!(
                        "kubelet.sock recreated (kubelet restart); serving again and re-registering"
                    );
                    return Ended::Done(());
                }
                Some(_) => {}
            }
            tokio::select! {
                _ = &mut shutdown => return Ended::Shutdown,
                _ = changes.next() => {}
                _ = tokio::time::sleep(self.timing.recheck) => {}
            }
        }
    }
}

/// Shutdown: stop serving, remove the socket, and wait for the allocation checkpoint to be written.
async fn finish(server: Served, node: &Arc<TileNode>) {
    server.stop().await;
    let node = node.clone();
    let _ = tokio::task::spawn_blocking(move || node.flush_checkpoint()).await;
    tracing::info!("device plugin stopped");
}

/// A running gRPC server on the plugin's socket.
struct Served {
    path: PathBuf,
    inode: Option<FileId>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    fn start(path: &Path, node: Arc<TileNode>) -> Result<Served, PluginError> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PluginError::Listen {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        let listener = UnixListener::bind(path).map_err(|source| PluginError::Listen {
            path: path.to_path_buf(),
            source,
        })?;
        let (stop, stop_rx) = watch::channel(false);
        let service = DevicePluginService::new(node, stop_rx.clone());
        let mut server_stop = stop_rx;
        let task = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = server_stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %rdu_error_chain::Chain(&e), "device plugin server failed");
            }
        });
        Ok(Served {
            path: path.to_path_buf(),
            inode: inode(path),
            stop,
            task,
        })
    }

    fn socket_is_ours(&self) -> bool {
        self.inode.is_some() && inode(&self.path) == self.inode
    }

    /// Ends the streams, waits briefly for a graceful stop, and removes the socket if it is still ours.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let ours = self.socket_is_ours();
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Identity of a file: inode and change time, which tell a recreated socket from the old one even when
/// the file system reuses the inode number.
type FileId = (u64, u64, i64, i64);

fn inode(path: &Path) -> Option<FileId> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}
