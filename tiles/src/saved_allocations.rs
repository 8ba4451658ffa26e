//! The saved allocations file (as the kubelet's device checkpoint): which tiles are allocated, and to whom when
//! known, so that a restarted plugin reports the same state. Written atomically and durably (a temporary file,
//! fsynced, renamed into place, then the directory fsynced).

use crate::durable_file;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Format version written in the file.
pub const FILE_VERSION: u32 = 1;

/// Errors reading or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum SavedAllocationsError {
    #[error("cannot read checkpoint {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot write checkpoint {path}: {source} (check --checkpoint-file points to a writable directory)"
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "checkpoint {path} is not valid JSON: {source}; delete it to start with no allocations"
    )]
    Decode {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("checkpoint {path} has version {found}, this plugin reads version {FILE_VERSION}")]
    Version { path: PathBuf, found: u32 },
}

/// One allocation: the tiles handed to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedGroup {
    /// Tile IDs (`rdu<R>-tile<T>`), whatever the resource mode.
    pub tiles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedAllocations {
    pub version: u32,
    pub rdus_per_node: u32,
    pub tiles_per_rdu: u32,
    pub allocations: Vec<SavedGroup>,
}

/// Reads the checkpoint; `Ok(None)` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<SavedAllocations>, SavedAllocationsError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SavedAllocationsError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let checkpoint: SavedAllocations =
        serde_json::from_slice(&bytes).map_err(|source| SavedAllocationsError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
    if checkpoint.version != FILE_VERSION {
        return Err(SavedAllocationsError::Version {
            path: path.to_path_buf(),
            found: checkpoint.version,
        });
    }
    Ok(Some(checkpoint))
}

/// Writes the checkpoint atomically and durably ([`durable_file::replace`]): a plugin that finds an empty or
/// partial file refuses to start.
pub fn save(path: &Path, checkpoint: &SavedAllocations) -> Result<(), SavedAllocationsError> {
    let json = serde_json::to_vec(checkpoint).map_err(|e| SavedAllocationsError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    durable_file::replace(path, &json).map_err(|source| SavedAllocationsError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Builds the checkpoint to write; run on the writer thread so the caller only pays for a cheap copy.
pub type SnapshotFn = Box<dyn FnOnce() -> SavedAllocations + Send>;

#[derive(Default)]
struct WriterState {
    pending: Option<SnapshotFn>,
    writing: bool,
    stop: bool,
}

type Shared = Arc<(Mutex<WriterState>, Condvar)>;

/// Writes checkpoints on a background thread, newest first: a burst of allocations costs one write, and
/// Allocate never waits for the disk. Dropping the writer writes what is pending, then stops.
pub struct SavedAllocationsWriter {
    shared: Shared,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock(shared: &Shared) -> MutexGuard<'_, WriterState> {
    shared
        .0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SavedAllocationsWriter {
    pub fn new(path: PathBuf) -> SavedAllocationsWriter {
        let shared: Shared = Arc::default();
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rdu-checkpoint".into())
            .spawn(move || write_loop(&path, &worker))
            .inspect_err(
                |e| tracing::warn!(error = %rdu_error_chain::Chain(e), "no checkpoint writer thread; checkpoints disabled"),
            )
            .ok();
        SavedAllocationsWriter { shared, thread }
    }

    /// Replaces any not yet written checkpoint with this one.
    pub fn submit(&self, snapshot: SnapshotFn) {
        lock(&self.shared).pending = Some(snapshot);
        self.shared.1.notify_all();
    }

    /// Waits until everything submitted so far is on disk.
    pub fn flush(&self) {
        if self.thread.is_none() {
            return;
        }
        let mut state = lock(&self.shared);
        while state.pending.is_some() || state.writing {
            state = self
                .shared
                .1
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

impl Drop for SavedAllocationsWriter {
    fn drop(&mut self) {
        lock(&self.shared).stop = true;
        self.shared.1.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn write_loop(path: &Path, shared: &Shared) {
    loop {
        let mut state = lock(shared);
        while state.pending.is_none() && !state.stop {
            state = shared
                .1
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        let Some(snapshot) = state.pending.take() else {
            return;
        };
        state.writing = true;
        drop(state);
        if let Err(e) = save(path, &snapshot()) {
            tracing::warn!(error = %rdu_error_chain::Chain(&e), "allocation state not checkpointed");
        }
        lock(shared).writing = false;
        shared.1.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SavedAllocations {
        SavedAllocations {
            version: FILE_VERSION,
            rdus_per_node: 8,
            tiles_per_rdu: 4,
            allocations: vec![SavedGroup {
                tiles: vec!["rdu0-tile0".into(), "rdu0-tile1".into()],
                pod: Some("ns/job-worker-1".into()),
                rank: Some(1),
            }],
        }
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        assert!(load(&path).unwrap().is_none());
        save(&path, &sample()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(sample()));
    }

    #[test]
    fn the_writer_writes_the_newest_checkpoint_and_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let writer = SavedAllocationsWriter::new(path.clone());
        for tiles in 1..=3u32 {
            let mut cp = sample();
            cp.tiles_per_rdu = tiles;
            writer.submit(Box::new(move || cp));
        }
        writer.flush();
        assert_eq!(load(&path).unwrap().map(|c| c.tiles_per_rdu), Some(3));
        let mut last = sample();
        last.rdus_per_node = 2;
        writer.submit(Box::new(move || last));
        drop(writer);
        assert_eq!(
            load(&path).unwrap().map(|c| c.rdus_per_node),
            Some(2),
            "drop writes what is pending"
        );
    }

    #[test]
    fn corrupt_and_future_files_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        std::fs::write(&path, b"{not json").unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, SavedAllocationsError::Decode { .. }));
        assert!(err.to_string().contains("cp.json"));
        let mut future = sample();
        future.version = 99;
        save(&path, &future).unwrap();
        assert!(matches!(
            load(&path),
            Err(SavedAllocationsError::Version { found: 99, .. })
        ));
    }
}
