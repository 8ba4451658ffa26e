//! Writing the driver's files (CDI specs, the checkpoint) atomically and durably, their directory created first:
//! a reader (the container runtime, or a restarted driver) sees the old file or the new one, never a part.

use rdu_tiles::durable_file;
use std::path::{Path, PathBuf};

/// Errors writing a file atomically.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    #[error("cannot create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot replace {path} (through {path}.tmp)")]
    Replace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Replaces `path` with `contents` (creating its directory if needed), durably: [`durable_file::replace`].
pub(crate) fn write(path: &Path, contents: &[u8]) -> Result<(), AtomicWriteError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| AtomicWriteError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    durable_file::replace(path, contents).map_err(|source| AtomicWriteError::Replace {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("f.json");
        write(&path, b"one").unwrap();
        write(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.json")]);
    }

    #[test]
    fn a_directory_in_the_way_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taken");
        std::fs::create_dir_all(path.join("inner")).unwrap();
        let err = write(&path, b"x").unwrap_err();
        assert!(err.to_string().contains("taken"), "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }
}
