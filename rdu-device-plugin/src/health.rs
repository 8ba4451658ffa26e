//! Fault injection through the health file: device IDs (`rdu<R>-tile<T>`) or whole RDUs (`rdu<R>`), one per
//! line, `#` comments allowed. The file is watched (inotify via `notify`, plus a slow re-read as a fallback);
//! every change updates the node's health, which ListAndWatch streams. A missing file means all healthy.

use notify::{RecursiveMode, Watcher};
use rdu_tiles::node::TileNode;
use rdu_tiles::topology::{TileIndex, Topology};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How often the file is re-read even without a change notification.
const FALLBACK_REREAD: Duration = Duration::from_secs(2);

/// Errors setting up the health-file watch.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error(
        "--health-file {path} has no parent directory to watch; give a path like /var/run/rdu/health"
    )]
    NoParent { path: PathBuf },
    #[error("cannot create {path}, the directory of --health-file")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Logged, not returned: without a watch the plugin keeps to the timed re-reads.
    #[error("cannot watch the directory of --health-file {path}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
}

/// The tiles a health file marks unhealthy (with the reason given after the ID, e.g. `rdu0-tile1 hung`),
/// and a warning for every line it could not use.
pub fn parse_health(
    topology: &Topology,
    text: &str,
) -> (BTreeMap<TileIndex, Option<String>>, Vec<String>) {
    let mut unhealthy = BTreeMap::new();
    let mut warnings = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        let (id, reason) = match entry.split_once(char::is_whitespace) {
            Some((id, reason)) => (id, Some(reason.trim().to_string())),
            None => (entry, None),
        };
        match topology.parse_any(id) {
            Ok(tiles) => unhealthy.extend(tiles.into_iter().map(|t| (t, reason.clone()))),
            Err(e) => warnings.push(format!("health file line {}: {e}", number + 1)),
        }
    }
    (unhealthy, warnings)
}

/// Reads the file (missing: all healthy) and applies it to the node. Returns whether the device list changed.
pub fn apply_health_file(node: &TileNode, path: &Path) -> bool {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %rdu_error_chain::Chain(&e), "cannot read health file; health unchanged");
            return false;
        }
    };
    let (unhealthy, warnings) = parse_health(&node.topology(), &text);
    for warning in warnings {
        tracing::warn!(path = %path.display(), "{warning}");
    }
    let changed = node.set_health(&unhealthy);
    if changed {
        tracing::info!(unhealthy_tiles = unhealthy.len(), "device health changed");
    }
    changed
}

/// A running health-file watch; dropping it stops the watch.
pub struct HealthWatcher {
    /// None when the kernel gave no inotify instance: the file is then only re-read every [`FALLBACK_REREAD`].
    watcher: Option<Box<dyn Watcher + Send>>,
    task: JoinHandle<()>,
    reads: Arc<AtomicU64>,
}

impl HealthWatcher {
    /// How many times the file has been read so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Whether change notifications arrive (false: re-reads every [`FALLBACK_REREAD`] only).
    pub fn notified(&self) -> bool {
        self.watcher.is_some()
    }
}

impl Drop for HealthWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the watcher's callback gets.
type EventHandler = Box<dyn FnMut(notify::Result<notify::Event>) + Send>;

/// Applies the file now, then on every change of it (and every couple of seconds as a fallback). Without an
/// inotify instance (the host's `fs.inotify.max_user_instances` used up, as kind's nodes can do) it warns and
/// keeps to the fallback re-reads: a slower health signal is better than a plugin that cannot start and takes
/// every tile of the node with it.
pub fn watch_health_file(node: Arc<TileNode>, path: PathBuf) -> Result<HealthWatcher, HealthError> {
    watch_with(node, path, |handler| {
        notify::recommended_watcher(handler).map(|w| Box::new(w) as Box<dyn Watcher + Send>)
    })
}

fn watch_with(
    node: Arc<TileNode>,
    path: PathBuf,
    make_watcher: impl FnOnce(EventHandler) -> notify::Result<Box<dyn Watcher + Send>>,
) -> Result<HealthWatcher, HealthError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => return Err(HealthError::NoParent { path }),
    };
    // The directory is watched, so it must exist; the file itself may come later.
    std::fs::create_dir_all(&parent).map_err(|source| HealthError::CreateDir {
        path: parent.clone(),
        source,
    })?;
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let file_name = path.file_name().map(|n| n.to_os_string());
    let handler: EventHandler = Box::new(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            // Reading the file ourselves raises open and close-after-read events: reacting to them would
            // re-read the file forever. Close-after-write is the best sign that a writer is done.
            Ok(e) if e.kind.is_access() => matches!(
                e.kind,
                notify::EventKind::Access(notify::event::AccessKind::Close(
                    notify::event::AccessMode::Write
                ))
            ),
            Ok(e) => {
                e.paths.is_empty()
                    || e.paths
                        .iter()
                        .any(|p| p.file_name().map(|n| n.to_os_string()) == file_name)
            }
            Err(_) => true,
        };
        tracing::trace!(?event, relevant, "health file directory event");
        if relevant {
            let _ = tx.send(());
        }
    });
    let watcher = make_watcher(handler).and_then(|mut watcher| {
        watcher
            .watch(&parent, RecursiveMode::NonRecursive)
            .map(|()| watcher)
    });
    let watcher = match watcher {
        Ok(watcher) => Some(watcher),
        Err(source) => {
            let error = HealthError::Watch {
                path: path.clone(),
                source,
            };
            tracing::warn!(
                error = %rdu_error_chain::chain(&error),
                every_seconds = FALLBACK_REREAD.as_secs(),
                "no change notifications for the health file; re-reading it on a timer only \
                 (raise fs.inotify.max_user_instances if the kernel ran out)"
            );
            None
        }
    };
    apply_health_file(&node, &path);
    let reads = Arc::new(AtomicU64::new(1));
    let task_reads = reads.clone();
    let task = tokio::spawn(async move {
        let mut fallback = tokio::time::interval(FALLBACK_REREAD);
        fallback.tick().await;
        loop {
            tokio::select! {
                // Without a watcher the sender is gone and the channel closed: the timer alone drives reads.
                event = rx.recv(), if !rx.is_closed() => {
                    if event.is_none() {
                        continue;
                    }
                    // Coalesce a burst of events (truncate + write) into one read.
                    while rx.try_recv().is_ok() {}
                }
                _ = fallback.tick() => {}
            }
            task_reads.fetch_add(1, Ordering::Relaxed);
            apply_health_file(&node, &path);
        }
    });
    Ok(HealthWatcher {
        watcher,
        task,
        reads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_tiles::topology::ResourceMode;

    #[test]
    fn parses_tiles_rdus_comments_and_warns_on_junk() {
        let topo = Topology::new(8, 4).unwrap();
        let text =
            "# hung tiles\nrdu0-tile1 hung\n\n  rdu7  # whole RDU failed\nrdu9-tile0\nbanana\n";
        let (faults, warnings) = parse_health(&topo, text);
        assert_eq!(
            faults.keys().copied().collect::<Vec<_>>(),
            [1, 28, 29, 30, 31]
        );
        assert_eq!(faults[&1].as_deref(), Some("hung"));
        assert_eq!(faults[&28], None);
        assert_eq!(warnings.len(), 2);
        assert!(warnings[0].contains("line 5") && warnings[0].contains("rdu9-tile0"));
        assert!(warnings[1].contains("banana"));
    }

    #[test]
    fn applying_a_missing_file_means_all_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let node = TileNode::in_memory(Topology::new(2, 2).unwrap(), ResourceMode::Tile, None);
        let path = dir.path().join("health");
        std::fs::write(&path, "rdu1-tile1\n").unwrap();
        assert!(apply_health_file(&node, &path));
        assert!(!node.devices()[3].healthy);
        std::fs::remove_file(&path).unwrap();
        assert!(apply_health_file(&node, &path));
        assert!(node.devices().iter().all(|d| d.healthy));
    }

    #[tokio::test]
    async fn reading_the_file_does_not_trigger_more_reads() {
        let dir = tempfile::tempdir().unwrap();
        let node = Arc::new(TileNode::in_memory(
            Topology::new(2, 2).unwrap(),
            ResourceMode::Tile,
            None,
        ));
        // The directory is created when missing.
        let path = dir.path().join("not-yet").join("health");
        let watcher = watch_health_file(node.clone(), path.clone()).unwrap();
        let writes = [("rdu0-tile1\n", 1), ("", 0), ("rdu1\n", 2), ("", 0)];
        for (round, (text, wanted)) in writes.into_iter().enumerate() {
            std::fs::write(&path, text).unwrap();
            let started = std::time::Instant::now();
            while node.devices().iter().filter(|d| !d.healthy).count() != wanted {
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(20),
                    "round {round}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
        // A few reads per write; a read that triggered another read would have made thousands by now.
        assert!(
            watcher.reads() < 40,
            "{} reads for 4 writes",
            watcher.reads()
        );
    }

    #[tokio::test]
    async fn without_an_inotify_instance_the_file_is_still_read_on_the_timer() {
        let dir = tempfile::tempdir().unwrap();
        let node = Arc::new(TileNode::in_memory(
            Topology::new(2, 2).unwrap(),
            ResourceMode::Tile,
            None,
        ));
        let path = dir.path().join("health");
        let watcher = watch_with(node.clone(), path.clone(), |_handler| {
            Err(notify::Error::io(std::io::Error::from_raw_os_error(24)))
        })
        .expect("a plugin without change notifications still starts");
        assert!(!watcher.notified());
        std::fs::write(&path, "rdu1-tile0\n").unwrap();
        let started = std::time::Instant::now();
        while node.devices().iter().all(|d| d.healthy) {
            assert!(
                started.elapsed() < FALLBACK_REREAD * 5,
                "the timer's re-read never saw the file"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(!node.devices()[2].healthy);
    }

    #[test]
    fn a_path_without_parent_is_refused() {
        let node = Arc::new(TileNode::in_memory(
            Topology::new(1, 1).unwrap(),
            ResourceMode::Tile,
            None,
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _guard = rt.enter();
        assert!(matches!(
            watch_health_file(node, PathBuf::from("")),
            Err(HealthError::NoParent { .. })
        ));
    }
}
