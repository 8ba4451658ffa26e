//! Writing a file atomically: the content goes to a temporary file in the same directory, is synced, and is
//! renamed over the target, so a reader (or a restarted driver) sees the old file or the new one, never a part.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors writing a file atomically.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    #[error("`{0}` has no parent directory or file name to write a temporary file next to")]
    NoParent(PathBuf),
    #[error("cannot create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write temporary file {path}")]
    WriteTemp {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot rename {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Replaces `path` with `contents` (creating its directory if needed).
pub(crate) fn write(path: &Path, contents: &[u8]) -> Result<(), AtomicWriteError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(AtomicWriteError::NoParent(path.to_path_buf()));
    };
    std::fs::create_dir_all(dir).map_err(|source| AtomicWriteError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}", std::process::id()));
    let temp = dir.join(temp_name);
    let written = std::fs::File::create(&temp).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()
    });
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(AtomicWriteError::WriteTemp { path: temp, source });
    }
    std::fs::rename(&temp, path).map_err(|source| {
        let _ = std::fs::remove_file(&temp);
        AtomicWriteError::Rename {
            from: temp.clone(),
            to: path.to_path_buf(),
            source,
        }
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
