//! One shared-memory segment: a file in a directory both ranks see (`/dev/shm` on one host),
//! created and filled in by the sending rank and attached by the receiving one, which proves it
//! mapped the very same memory by finding the nonce the sender told it over the authenticated
//! data stream. Layout: a 4 KiB header (magic, ring capacity, nonce, and the ring's counters on
//! cache lines of their own), then the ring's bytes.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};

/// Bytes before the ring.
const HEADER_BYTES: usize = 4096;
const MAGIC: [u8; 8] = *b"RDURING1";
const AT_MAGIC: usize = 0;
const AT_CAPACITY: usize = 8;
const AT_NONCE: usize = 16;
/// Written by the sender: bytes it has put in the ring so far, and whether it waits for space.
const AT_HEAD: usize = 64;
const AT_WRITER_PARKED: usize = 72;
/// Written by the receiver: bytes it has taken out so far, and whether it waits for data.
const AT_TAIL: usize = 128;
const AT_READER_PARKED: usize = 136;
/// Smallest and largest ring a receiver accepts.
pub(crate) const MIN_RING_BYTES: usize = 4096;
pub(crate) const MAX_RING_BYTES: usize = 64 << 20;

/// Why a segment could not be created or attached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not the offered segment: {reason}")]
    NotTheSegment { path: PathBuf, reason: String },
    #[error("no randomness for a segment name: {0}")]
    Random(getrandom::Error),
}

/// What a sender tells its receiver in the hello: which file, and the nonce inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) id: [u8; 16],
    pub(crate) nonce: [u8; 16],
}

impl Offer {
    /// Bytes of an encoded offer.
    pub(crate) const LEN: usize = 32;

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..16].copy_from_slice(&self.id);
        out[16..].copy_from_slice(&self.nonce);
        out
    }

    pub(crate) fn decode(bytes: &[u8; Self::LEN]) -> Offer {
        let mut offer = Offer {
            id: [0; 16],
            nonce: [0; 16],
        };
        offer.id.copy_from_slice(&bytes[..16]);
        offer.nonce.copy_from_slice(&bytes[16..]);
        offer
    }

    /// The segment's file in `dir`: derived from random bytes only, so a peer can never name
    /// a file of its choosing.
    pub(crate) fn path_in(&self, dir: &Path) -> PathBuf {
        let hex: String = self.id.iter().map(|b| format!("{b:02x}")).collect();
        dir.join(format!("rdu-ring-{hex}"))
    }
}

/// A segment's file, removed when this is dropped.
#[derive(Debug)]
pub(crate) struct SegmentFile(PathBuf);

impl SegmentFile {
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A mapped segment.
pub(crate) struct Segment {
    map: MmapRaw,
    capacity: usize,
}

impl Segment {
    /// Creates a segment with a ring of `capacity` bytes (a multiple of 4096) in `dir`, its
    /// memory reserved up front (a full tmpfs fails here, not with SIGBUS on a later write).
    /// Returns it, the offer naming it and its file, removed when dropped: once the receiver
    /// has answered, the mappings are all that is needed.
    pub(crate) fn create(
        dir: &Path,
        capacity: usize,
    ) -> Result<(Segment, Offer, SegmentFile), SegmentError> {
        debug_assert!(capacity.is_multiple_of(4096) && capacity <= MAX_RING_BYTES);
        let mut random = [0u8; 32];
        getrandom::fill(&mut random).map_err(SegmentError::Random)?;
        let offer = Offer::decode(&random);
        let path = offer.path_in(dir);
        let io = |what, source| SegmentError::Io {
            what,
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| io("cannot create", e))?;
        let made = (|| {
            let len = HEADER_BYTES + capacity;
            // SAFETY: a plain system call on a file descriptor this function owns.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
            if rc != 0 {
                return Err(io(
                    "cannot reserve memory for",
                    std::io::Error::from_raw_os_error(rc),
                ));
            }
            let segment = Segment::map(&file, &path, len, capacity)?;
            // SAFETY: the mapping is `len` bytes long and nobody else knows the file yet.
            unsafe {
                let base = segment.map.as_mut_ptr();
                base.add(AT_MAGIC)
                    .copy_from_nonoverlapping(MAGIC.as_ptr(), 8);
                base.add(AT_CAPACITY)
                    .copy_from_nonoverlapping((capacity as u64).to_le_bytes().as_ptr(), 8);
                base.add(AT_NONCE)
                    .copy_from_nonoverlapping(offer.nonce.as_ptr(), 16);
            }
            Ok(segment)
        })();
        match made {
            Ok(segment) => Ok((segment, offer, SegmentFile(path))),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Attaches the segment `offer` names in `dir`, checking that it is one (regular file,
    /// magic, a capacity in range that matches its size) and that it holds the offer's nonce.
    pub(crate) fn attach(dir: &Path, offer: &Offer) -> Result<Segment, SegmentError> {
        let path = offer.path_in(dir);
        let not = |reason: String| SegmentError::NotTheSegment {
            path: path.clone(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| SegmentError::Io {
                what: "cannot open",
                path: path.clone(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| SegmentError::Io {
            what: "cannot inspect",
            path: path.clone(),
            source,
        })?;
        if !meta.is_file() {
            return Err(not("not a regular file".into()));
        }
        let len = usize::try_from(meta.len()).map_err(|_| not("too large".into()))?;
        if !(HEADER_BYTES + MIN_RING_BYTES..=HEADER_BYTES + MAX_RING_BYTES).contains(&len) {
            return Err(not(format!("{len} bytes is not a segment's size")));
        }
        let capacity = len - HEADER_BYTES;
        let segment = Segment::map(&file, &path, len, capacity)?;
        let (magic, declared, nonce) = {
            let header = segment.header_bytes();
            let declared = u64::from_le_bytes(
                header[AT_CAPACITY..AT_CAPACITY + 8]
                    .try_into()
                    .expect("8 bytes"),
            );
            (
                header[AT_MAGIC..AT_MAGIC + 8].to_vec(),
                declared,
                header[AT_NONCE..AT_NONCE + 16].to_vec(),
            )
        };
        if magic != MAGIC {
            return Err(not("wrong magic".into()));
        }
        if declared != capacity as u64 || !capacity.is_multiple_of(4096) {
            return Err(not(format!(
                "declares a ring of {declared} bytes in a file of {len}"
            )));
        }
        if nonce != offer.nonce {
            return Err(not("holds another nonce".into()));
        }
        Ok(segment)
    }

    fn map(file: &File, path: &Path, len: usize, capacity: usize) -> Result<Segment, SegmentError> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(file)
            .map_err(|source| SegmentError::Io {
                what: "cannot map",
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Segment { map, capacity })
    }

    /// The magic, capacity and nonce, written once before the segment is offered.
    fn header_bytes(&self) -> &[u8] {
        // SAFETY: the mapping is at least HEADER_BYTES long; these bytes are written only
        // by `create`, before any other process knows the file.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), AT_NONCE + 16) }
    }

    fn atomic_u64(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is a constant offset inside the header, 8-aligned within a
        // page-aligned mapping that lives as long as `self`; the other process only ever
        // touches these bytes atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(at).cast()) }
    }

    fn atomic_u32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: as in `atomic_u64`, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(at).cast()) }
    }

    /// Ring bytes the sender has written in total (it only grows).
    pub(crate) fn head(&self) -> &AtomicU64 {
        self.atomic_u64(AT_HEAD)
    }

    /// Ring bytes the receiver has taken in total (it only grows).
    pub(crate) fn tail(&self) -> &AtomicU64 {
        self.atomic_u64(AT_TAIL)
    }

    /// Set by the sender before it sleeps waiting for space.
    pub(crate) fn writer_parked(&self) -> &AtomicU32 {
        self.atomic_u32(AT_WRITER_PARKED)
    }

    /// Set by the receiver before it sleeps waiting for data.
    pub(crate) fn reader_parked(&self) -> &AtomicU32 {
        self.atomic_u32(AT_READER_PARKED)
    }

    /// Bytes of the ring.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The first byte of the ring; `capacity()` bytes follow it.
    pub(crate) fn ring(&self) -> *mut u8 {
        // SAFETY: HEADER_BYTES is inside the mapping.
        unsafe { self.map.as_mut_ptr().add(HEADER_BYTES) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn a_created_segment_attaches_and_shares_its_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (created, offer, file) = Segment::create(dir.path(), 8192).unwrap();
        assert!(file.path().starts_with(dir.path()));
        let attached = Segment::attach(dir.path(), &offer).unwrap();
        assert_eq!(attached.capacity(), 8192);
        created.head().store(40, Ordering::SeqCst);
        assert_eq!(attached.head().load(Ordering::SeqCst), 40);
        // SAFETY: both rings are 8192 bytes of the same file.
        unsafe {
            created.ring().add(8191).write(7);
            assert_eq!(attached.ring().add(8191).read(), 7);
        }
        // Removing the file leaves both mappings working.
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists());
        attached.tail().store(8, Ordering::SeqCst);
        assert_eq!(created.tail().load(Ordering::SeqCst), 8);
    }

    #[test]
    fn a_wrong_nonce_a_missing_file_or_a_foreign_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_segment, offer, _file) = Segment::create(dir.path(), 4096).unwrap();
        let mut wrong = offer;
        wrong.nonce[0] ^= 1;
        let error = Segment::attach(dir.path(), &wrong)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("another nonce"), "{error}");
        let mut missing = offer;
        missing.id[0] ^= 1;
        let error = Segment::attach(dir.path(), &missing)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("cannot open"), "{error}");
        // A file of the right name that is not a segment.
        let mut foreign = offer;
        foreign.id[1] ^= 1;
        std::fs::write(foreign.path_in(dir.path()), vec![0u8; HEADER_BYTES + 4096]).unwrap();
        let error = Segment::attach(dir.path(), &foreign)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("wrong magic"), "{error}");
        std::fs::write(foreign.path_in(dir.path()), b"short").unwrap();
        let error = Segment::attach(dir.path(), &foreign)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("not a segment's size"), "{error}");
    }

    #[test]
    fn a_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (_segment, offer, file) = Segment::create(dir.path(), 4096).unwrap();
        let mut link = offer;
        link.id[0] ^= 0xff;
        std::os::unix::fs::symlink(file.path(), link.path_in(dir.path())).unwrap();
        let error = Segment::attach(dir.path(), &link)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("cannot open"), "{error}");
    }

    #[test]
    fn offers_round_trip_and_name_files_only_by_their_random_id() {
        let offer = Offer {
            id: [0xab; 16],
            nonce: [3; 16],
        };
        assert_eq!(Offer::decode(&offer.encode()), offer);
        let path = offer.path_in(Path::new("/dev/shm"));
        assert_eq!(
            path,
            Path::new("/dev/shm/rdu-ring-abababababababababababababababab")
        );
    }
}
