//! The checkpoint directory's files, treated as untrusted (another process, or another generation on another
//! node, writes there too): listing and opening never follow a symlink and take regular files only, reads are
//! bounded, writes are durable (fsync of the file before its rename and of the directory after), and the lock
//! file serializes fencing against writes.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::CheckpointError;
use super::format::{NameParts, parse_name};

/// The lock file beside the checkpoints (`flock`: shared to write a checkpoint, exclusive to fence).
pub(crate) const LOCK_FILE: &str = "FENCE.lock";
/// How often a lock is tried again while another process holds it.
const LOCK_RETRY: Duration = Duration::from_millis(5);

/// One checkpoint file of the directory, as its name describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Listed {
    pub name: String,
    pub step: u64,
    pub generation: u64,
}

impl Listed {
    pub(super) fn new(name: &str, parts: NameParts) -> Self {
        Listed {
            name: name.to_string(),
            step: parts.step,
            generation: parts.generation,
        }
    }
}

/// The checkpoint files in `dir` (none when it does not exist yet): regular files named as checkpoints only;
/// a symlink, a directory or a FIFO under such a name is skipped.
pub(super) fn list(dir: &Path) -> Result<Vec<Listed>, CheckpointError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CheckpointError::io("list", dir, e)),
    };
    let mut listed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io("list", dir, e))?;
        let Some(parts) = entry.file_name().to_str().and_then(parse_name) else {
            continue;
        };
        // The entry's own type: a symlink is a symlink here, whatever it points at.
        let regular = entry.file_type().is_ok_and(|t| t.is_file());
        let name = entry.file_name().to_string_lossy().into_owned();
        if regular {
            listed.push(Listed::new(&name, parts));
        } else {
            tracing::warn!(dir = %dir.display(), name, "skipping a checkpoint name that is not a regular file");
        }
    }
    Ok(listed)
}

/// Opens `path` for reading if it is a regular file and not a symlink (O_NOFOLLOW; O_NONBLOCK so that a FIFO
/// put there cannot block the open).
fn open_regular(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// The content of the regular file `path` if it is at most `max_len` bytes; `Ok(None)` when it does not exist.
pub(super) fn read_bounded(path: &Path, max_len: u64) -> Result<Option<Vec<u8>>, CheckpointError> {
    let file = match open_regular(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CheckpointError::io("open", path, e)),
    };
    let len = file
        .metadata()
        .map_err(|e| CheckpointError::io("read", path, e))?
        .len();
    if len > max_len {
        return Err(CheckpointError::io(
            "read",
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{len} bytes, more than the {max_len} it can be"),
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_len + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CheckpointError::io("read", path, e))?;
    Ok(Some(bytes))
}

/// `bytes` in a new temporary file of `dir` (a random name starting with `.`, which no listing takes),
/// flushed to the disk, ready to be renamed into place with [`commit`]. Dropped, it is deleted.
pub(super) fn stage(
    dir: &Path,
    prefix: &str,
    bytes: &[u8],
) -> Result<tempfile::NamedTempFile, CheckpointError> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{prefix}"))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(|e| CheckpointError::io("create a file in", dir, e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| CheckpointError::io("write", tmp.path(), e))?;
    Ok(tmp)
}

/// Deletes files staged in `dir` and never renamed (a writer that crashed, or one whose write was refused
/// and that died before deleting its file). Call under the exclusive lock: no legitimate writer stages then
/// (whoever does is of an older generation, and its write would be refused anyway).
pub(super) fn remove_staged(dir: &Path, prefix: &str) -> Result<(), CheckpointError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CheckpointError::io("list", dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let staged = name.starts_with(&format!(".{prefix}")) && name.ends_with(".tmp");
        if staged && entry.file_type().is_ok_and(|t| t.is_file()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(name, "deleted a checkpoint file that was never completed")
                }
                Err(e) => {
                    tracing::warn!(name, error = %rdu_error_chain::Chain(&e), "cannot delete a staged checkpoint file")
                }
            }
        }
    }
    Ok(())
}

/// Renames the staged file to `dir/name` and flushes the directory, so that the new name survives a crash.
pub(super) fn commit(
    dir: &Path,
    tmp: tempfile::NamedTempFile,
    name: &str,
) -> Result<PathBuf, CheckpointError> {
    let path = dir.join(name);
    tmp.persist(&path)
        .map_err(|e| CheckpointError::io("rename into", &path, e.error))?;
    sync_dir(dir)?;
    Ok(path)
}

/// fsync of the directory: its entries (a rename, a removal) reach the disk.
pub(super) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io("flush", dir, e))
}

/// A held `flock` on the directory's lock file; released when dropped (the file is closed).
#[derive(Debug)]
pub(super) struct DirLock {
    _file: File,
}

/// Whether a lock admits others of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockKind {
    /// Checkpoint writers: any number at once, none while a generation fences.
    Shared,
    /// A starting generation's fence: alone.
    Exclusive,
}

/// Takes `kind` of lock on `dir`'s lock file, waiting at most `wait` for a holder of the other kind.
pub(super) fn lock(dir: &Path, kind: LockKind, wait: Duration) -> Result<DirLock, CheckpointError> {
    let path = dir.join(LOCK_FILE);
    // Read and write: an NFS client emulates flock with byte-range locks, which need both.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| CheckpointError::io("open", &path, e))?;
    let deadline = Instant::now() + wait;
    loop {
        let tried = match kind {
            LockKind::Shared => file.try_lock_shared(),
            LockKind::Exclusive => file.try_lock(),
        };
        match tried {
            Ok(()) => return Ok(DirLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(LOCK_RETRY)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(CheckpointError::LockTimeout { path, waited: wait });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(CheckpointError::io("lock", &path, e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::format::file_name;

    #[test]
    fn symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("secret");
        std::fs::write(&target, b"not a checkpoint").unwrap();
        std::fs::write(dir.path().join(file_name(10, 0)), b"x").unwrap();
        let link = dir.path().join(file_name(20, 0));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        std::fs::create_dir(dir.path().join(file_name(30, 0))).unwrap();
        let listed = list(dir.path()).unwrap();
        assert_eq!(
            listed.iter().map(|l| l.step).collect::<Vec<_>>(),
            vec![10],
            "only the regular file"
        );
        // Opened by name (a name read from the fence file, or swapped in after the listing), a symlink is refused.
        assert!(read_bounded(&link, 1 << 20).is_err());
        assert_eq!(
            read_bounded(&dir.path().join(file_name(10, 0)), 1 << 20).unwrap(),
            Some(b"x".to_vec())
        );
        assert_eq!(
            read_bounded(&dir.path().join("absent"), 1 << 20).unwrap(),
            None
        );
    }

    #[test]
    fn a_fifo_under_a_checkpoint_name_neither_lists_nor_blocks_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(file_name(5, 0));
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(list(dir.path()).unwrap().is_empty());
        assert!(read_bounded(&fifo, 1 << 20).is_err());
    }

    #[test]
    fn a_file_longer_than_a_checkpoint_can_be_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file_name(1, 0));
        std::fs::write(&path, vec![0u8; 100]).unwrap();
        assert!(read_bounded(&path, 99).is_err());
        assert_eq!(
            read_bounded(&path, 100).unwrap().map(|b| b.len()),
            Some(100)
        );
    }

    #[test]
    fn a_staged_file_appears_under_its_name_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = stage(dir.path(), "ckpt-", b"abc").unwrap();
        assert!(list(dir.path()).unwrap().is_empty());
        let path = commit(dir.path(), tmp, &file_name(3, 1)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert_eq!(list(dir.path()).unwrap().len(), 1);
        let dropped = stage(dir.path(), "ckpt-", b"abc").unwrap();
        drop(dropped);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(
            names.len(),
            1,
            "a dropped staged file is deleted: {names:?}"
        );
    }

    #[test]
    fn an_exclusive_lock_waits_for_shared_holders_and_gives_up_at_its_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let shared = lock(dir.path(), LockKind::Shared, Duration::ZERO).unwrap();
        let second = lock(dir.path(), LockKind::Shared, Duration::ZERO).unwrap();
        match lock(dir.path(), LockKind::Exclusive, Duration::from_millis(20)) {
            Err(CheckpointError::LockTimeout { .. }) => {}
            other => panic!("{other:?}"),
        }
        drop((shared, second));
        let exclusive = lock(dir.path(), LockKind::Exclusive, Duration::ZERO).unwrap();
        assert!(matches!(
            lock(dir.path(), LockKind::Shared, Duration::ZERO),
            Err(CheckpointError::LockTimeout { .. })
        ));
        drop(exclusive);
    }
}
