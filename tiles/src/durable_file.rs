//! Replacing a file atomically and durably: the bytes go to a sibling temporary file (`<name>.tmp`), which is
//! flushed to the disk, renamed over the file, and then the directory is flushed. A reader, or a process restarted
//! after a crash or a power loss, finds the old content or the new, never a part and never an empty file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What [`replace_with`] flushes to the disk, in this order: the staged file (all its bytes written, not yet
/// renamed), then the directory holding the file (after the rename).
pub enum Flush<'a> {
    Staged(&'a File),
    Directory(&'a Path),
}

/// Replaces `path` with `contents`. Without the first flush a power loss after the rename can leave `path` empty
/// (the rename reached the disk, the data did not); without the second the rename itself can be lost.
pub fn replace(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    replace_with(path, contents, &mut |flush| match flush {
        Flush::Staged(file) => file.sync_all(),
        Flush::Directory(dir) => File::open(dir).and_then(|d| d.sync_all()),
    })
}

/// [`replace`] with the flushes done by `flush` (tests see when they happen). The staged file is removed when a
/// step before the rename fails.
pub fn replace_with(
    path: &Path,
    contents: &[u8],
    flush: &mut dyn FnMut(Flush<'_>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut staged_name = path.as_os_str().to_owned();
    staged_name.push(".tmp");
    let staged_path = PathBuf::from(staged_name);
    let staged = File::create(&staged_path).and_then(|mut staged| {
        staged.write_all(contents)?;
        flush(Flush::Staged(&staged))?;
        std::fs::rename(&staged_path, path)
    });
    if let Err(e) = staged {
        let _ = std::fs::remove_file(&staged_path);
        return Err(e);
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    flush(Flush::Directory(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_staged_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        replace(&path, b"one").unwrap();
        replace(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.json")]);
    }

    #[test]
    fn the_staged_file_is_flushed_whole_before_the_rename_and_the_directory_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        replace(&path, b"old").unwrap();
        let mut seen = Vec::new();
        replace_with(&path, b"newer", &mut |flush| {
            // What is on disk at each flush: the file under its name, and the staged file's length.
            let current = std::fs::read(&path).unwrap();
            match flush {
                Flush::Staged(file) => {
                    seen.push(("staged", current == b"old", file.metadata().unwrap().len()));
                }
                Flush::Directory(flushed) => {
                    assert_eq!(flushed, dir.path());
                    seen.push(("directory", current == b"old", 0));
                }
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(
            seen,
            [("staged", true, 5), ("directory", false, 0)],
            "the staged file is flushed with every byte while the old file is still in place, the directory \
             once the new one is"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"newer");
    }

    #[test]
    fn a_failed_step_leaves_the_old_file_and_no_staged_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        replace(&path, b"old").unwrap();
        let err = replace_with(&path, b"new", &mut |flush| match flush {
            Flush::Staged(_) => Err(std::io::Error::other("disk gone")),
            Flush::Directory(_) => Ok(()),
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk gone");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert!(!dir.path().join("f.json.tmp").exists());
        let taken = dir.path().join("taken");
        std::fs::create_dir_all(taken.join("inner")).unwrap();
        replace(&taken, b"x").unwrap_err();
        assert!(!dir.path().join("taken.tmp").exists());
    }
}
