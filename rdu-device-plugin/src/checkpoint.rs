//! The allocation checkpoint file: which tiles are allocated (and to whom, when known), so that a restarted
//! plugin reports the same state. Written atomically (temporary file then rename).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Format version written in the file.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Errors reading or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read checkpoint {path}: {source}")]
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
    #[error(
        "checkpoint {path} has version {found}, this plugin reads version {CHECKPOINT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
}

/// One allocation: the tiles handed to one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointEntry {
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
pub struct Checkpoint {
    pub version: u32,
    pub rdus_per_node: u32,
    pub tiles_per_rdu: u32,
    pub allocations: Vec<CheckpointEntry>,
}

/// Reads the checkpoint; `Ok(None)` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let checkpoint: Checkpoint =
        serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
    if checkpoint.version != CHECKPOINT_VERSION {
        return Err(CheckpointError::Version {
            path: path.to_path_buf(),
            found: checkpoint.version,
        });
    }
    Ok(Some(checkpoint))
}

/// Writes the checkpoint atomically: a sibling temporary file, then a rename over `path`.
pub fn save(path: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let write_error = |source| CheckpointError::Write {
        path: path.to_path_buf(),
        source,
    };
    let json = serde_json::to_vec(checkpoint)
        .map_err(|e| write_error(std::io::Error::other(e.to_string())))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, json).map_err(write_error)?;
    std::fs::rename(&tmp, path).map_err(write_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            rdus_per_node: 8,
            tiles_per_rdu: 4,
            allocations: vec![CheckpointEntry {
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
    fn corrupt_and_future_files_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        std::fs::write(&path, b"{not json").unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, CheckpointError::Decode { .. }));
        assert!(err.to_string().contains("cp.json"));
        let mut future = sample();
        future.version = 99;
        save(&path, &future).unwrap();
        assert!(matches!(
            load(&path),
            Err(CheckpointError::Version { found: 99, .. })
        ));
    }
}
