//! One shared-memory segment: anonymous memory (a memfd) that the sending rank creates, sizes,
//! commits and seals before anyone else sees it, and hands to the receiving rank as a file
//! descriptor (`pass`). Nothing is ever named in a filesystem: the memory lives exactly as long as
//! some process maps it or holds its descriptor, so a rank killed at any moment leaves nothing
//! behind. The seals (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) mean no process can truncate
//! it under a reader, which would kill that reader with SIGBUS; the receiver checks them, and
//! everything else it can, before mapping a descriptor it was given, and that the segment holds
//! the nonce the sender told it over the authenticated data stream. Layout: a 4 KiB header
//! (magic, ring capacity, nonce, and the ring's counters on cache lines of their own), then the
//! ring's bytes.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FallocateFlags, FileType, MemfdFlags, SealFlags};

use super::budget::Reservation;

/// Bytes before the ring.
pub(crate) const HEADER_BYTES: usize = 4096;
const MAGIC: [u8; 8] = *b"RDURING2";
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
/// The seals a segment must carry: its size is fixed, and so are its seals.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);
/// The name memfds get (shown in `/proc/PID/maps` as `/memfd:rdu-ring (deleted)`).
pub(crate) const MEMFD_NAME: &str = "rdu-ring";

/// A random number the sender puts in a segment and tells the receiver over the data stream.
pub(crate) type Nonce = [u8; 16];

/// Why a segment could not be created or attached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentError {
    #[error("cannot {what} a ring segment")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the descriptor offered is not a ring segment: {0}")]
    NotTheSegment(String),
    #[error("no randomness for a segment nonce")]
    Random(#[source] getrandom::Error),
}

fn io(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> SegmentError {
    move |errno| SegmentError::Io {
        what,
        source: errno.into(),
    }
}

/// A mapped segment, and the ring memory it holds in its creator's budget.
pub(crate) struct Segment {
    map: MmapRaw,
    capacity: usize,
    /// Given back when the mapping goes (declared after `map`, so dropped after it).
    _reservation: Option<Reservation>,
}

/// A segment just made, and what its creator hands over.
pub(crate) struct Created {
    pub(crate) segment: Segment,
    /// The memory's descriptor, to give to the peer.
    pub(crate) fd: OwnedFd,
    pub(crate) nonce: Nonce,
}

impl Segment {
    /// Creates a sealed segment with a ring of `capacity` bytes (a multiple of 4096), its memory
    /// committed up front (a host out of memory fails here, not with a fault on a later write),
    /// paid for by `reservation`.
    pub(crate) fn create(
        capacity: usize,
        reservation: Option<Reservation>,
    ) -> Result<Created, SegmentError> {
        debug_assert!(capacity.is_multiple_of(4096) && capacity <= MAX_RING_BYTES);
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(SegmentError::Random)?;
        let len = (HEADER_BYTES + capacity) as u64;
        let fd =
            rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .map_err(io("create"))?;
        rustix::fs::ftruncate(&fd, len).map_err(io("size"))?;
        rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, len)
            .map_err(io("commit memory for"))?;
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(io("seal"))?;
        let mut segment = Segment::map(&fd, HEADER_BYTES + capacity, capacity)?;
        segment._reservation = reservation;
        // SAFETY: the mapping is `len` bytes long and no other process has the memory yet.
        unsafe {
            let base = segment.map.as_mut_ptr();
            base.add(AT_MAGIC)
                .copy_from_nonoverlapping(MAGIC.as_ptr(), 8);
            base.add(AT_CAPACITY)
                .copy_from_nonoverlapping((capacity as u64).to_le_bytes().as_ptr(), 8);
            base.add(AT_NONCE)
                .copy_from_nonoverlapping(nonce.as_ptr(), 16);
        }
        Ok(Created { segment, fd, nonce })
    }

    /// Attaches the segment behind `fd`, a descriptor another process handed over, after
    /// checking that it is one: a regular file of this user, sealed against any change of size,
    /// of a size in range, with the magic, a capacity that matches its size, and `nonce`.
    pub(crate) fn attach(fd: OwnedFd, nonce: &Nonce) -> Result<Segment, SegmentError> {
        let not = |reason: String| SegmentError::NotTheSegment(reason);
        let stat = rustix::fs::fstat(&fd).map_err(io("inspect"))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(not("not a regular file".into()));
        }
        let me = rustix::process::geteuid().as_raw();
        if stat.st_uid != me {
            return Err(not(format!(
                "owned by user {}, not this rank's user {me}",
                stat.st_uid
            )));
        }
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| not(format!("its seals cannot be read ({e}): not a memfd")))?;
        if !seals.contains(SEALS) {
            return Err(not(format!(
                "sealed {seals:?}, not against shrinking, growing and resealing: a truncation \
                 could fault this rank"
            )));
        }
        let len = usize::try_from(stat.st_size).map_err(|_| not("negative size".into()))?;
        if !(HEADER_BYTES + MIN_RING_BYTES..=HEADER_BYTES + MAX_RING_BYTES).contains(&len) {
            return Err(not(format!("{len} bytes is not a segment's size")));
        }
        let capacity = len - HEADER_BYTES;
        let segment = Segment::map(&fd, len, capacity)?;
        let header = segment.header_bytes();
        let declared = u64::from_le_bytes(
            header[AT_CAPACITY..AT_CAPACITY + 8]
                .try_into()
                .expect("8 bytes"),
        );
        if header[AT_MAGIC..AT_MAGIC + 8] != MAGIC {
            return Err(not("wrong magic".into()));
        }
        if declared != capacity as u64 || !capacity.is_multiple_of(4096) {
            return Err(not(format!(
                "declares a ring of {declared} bytes in {len} bytes"
            )));
        }
        if header[AT_NONCE..AT_NONCE + 16] != nonce[..] {
            return Err(not("holds another nonce".into()));
        }
        Ok(segment)
    }

    fn map(fd: &OwnedFd, len: usize, capacity: usize) -> Result<Segment, SegmentError> {
        let file = File::from(fd.try_clone().map_err(|source| SegmentError::Io {
            what: "duplicate the descriptor of",
            source,
        })?);
        // Populated: the page tables are filled here, at link set-up, so the first pass of frames
        // through the ring does not take a page fault per page (512 for 2 MiB, on the first calls
        // of every job).
        let map = MmapOptions::new()
            .len(len)
            .populate()
            .map_raw(&file)
            .map_err(|source| SegmentError::Io {
                what: "map",
                source,
            })?;
        Ok(Segment {
            map,
            capacity,
            _reservation: None,
        })
    }

    /// The magic, capacity and nonce, written once before the segment is handed over.
    fn header_bytes(&self) -> &[u8] {
        // SAFETY: the mapping is at least HEADER_BYTES long; these bytes are written only
        // by `create`, before any other process has the memory.
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

    fn clone(fd: &OwnedFd) -> OwnedFd {
        fd.try_clone().unwrap()
    }

    /// Minor page faults this thread has taken (`/proc/thread-self/stat`, field 10).
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 1..];
        after_name
            .split_whitespace()
            .nth(7)
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Faults taken writing one byte into every page of `segment`'s ring.
    fn faults_writing_every_page(segment: &Segment) -> u64 {
        let before = minor_faults();
        for page in (0..segment.capacity).step_by(4096) {
            // SAFETY: `page` is inside the ring, which no other thread touches in this test.
            unsafe { segment.ring().add(page).write_volatile(1) };
        }
        minor_faults() - before
    }

    #[test]
    fn both_ends_map_a_populated_ring_so_its_first_pass_takes_no_faults() {
        let capacity = 2 << 20;
        let made = Segment::create(capacity, None).unwrap();
        let attached = Segment::attach(clone(&made.fd), &made.nonce).unwrap();
        // Unpopulated, each end would take a fault per page: 512 here.
        for (end, segment) in [("creator", &made.segment), ("attacher", &attached)] {
            let faults = faults_writing_every_page(segment);
            assert!(
                faults < 8,
                "the {end} took {faults} faults writing 512 pages"
            );
        }
    }

    #[test]
    fn a_created_segment_attaches_through_its_descriptor_and_shares_its_memory() {
        let made = Segment::create(8192, None).unwrap();
        let attached = Segment::attach(clone(&made.fd), &made.nonce).unwrap();
        assert_eq!(attached.capacity(), 8192);
        made.segment.head().store(40, Ordering::SeqCst);
        assert_eq!(attached.head().load(Ordering::SeqCst), 40);
        // SAFETY: both rings are 8192 bytes of the same memory.
        unsafe {
            made.segment.ring().add(8191).write(7);
            assert_eq!(attached.ring().add(8191).read(), 7);
        }
        // The descriptors can go: the mappings are all that is needed.
        drop(made.fd);
        attached.tail().store(8, Ordering::SeqCst);
        assert_eq!(made.segment.tail().load(Ordering::SeqCst), 8);
    }

    #[test]
    fn nobody_can_change_a_segments_size_or_its_seals() {
        let made = Segment::create(4096, None).unwrap();
        let len = (HEADER_BYTES + 4096) as u64;
        for (what, attempt) in [
            ("shrink", rustix::fs::ftruncate(&made.fd, 4096)),
            ("grow", rustix::fs::ftruncate(&made.fd, len * 2)),
            (
                "unseal",
                rustix::fs::fcntl_add_seals(&made.fd, SealFlags::FUTURE_WRITE),
            ),
        ] {
            assert_eq!(attempt, Err(rustix::io::Errno::PERM), "{what}");
        }
        assert_eq!(rustix::fs::fstat(&made.fd).unwrap().st_size as u64, len);
    }

    #[test]
    fn a_wrong_nonce_an_unsealed_memfd_or_a_file_are_refused() {
        let made = Segment::create(4096, None).unwrap();
        let mut wrong = made.nonce;
        wrong[0] ^= 1;
        let error = Segment::attach(clone(&made.fd), &wrong).err().unwrap();
        assert!(error.to_string().contains("another nonce"), "{error}");

        // Right size, magic and nonce, but nothing stops its owner from truncating it.
        let unsealed = rustix::fs::memfd_create("x", MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&unsealed, (HEADER_BYTES + 4096) as u64).unwrap();
        let mut header = vec![0u8; HEADER_BYTES];
        header[..8].copy_from_slice(&MAGIC);
        header[8..16].copy_from_slice(&4096u64.to_le_bytes());
        header[16..32].copy_from_slice(&made.nonce);
        rustix::io::write(&unsealed, &header).unwrap();
        let error = Segment::attach(unsealed, &made.nonce).err().unwrap();
        assert!(error.to_string().contains("a truncation"), "{error}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        std::fs::write(&path, vec![0u8; HEADER_BYTES + 4096]).unwrap();
        let file = OwnedFd::from(File::open(&path).unwrap());
        let error = Segment::attach(file, &made.nonce).err().unwrap();
        assert!(error.to_string().contains("not a memfd"), "{error}");
    }

    #[test]
    fn a_sealed_memfd_of_the_wrong_size_or_magic_is_refused() {
        let nonce = [3u8; 16];
        for (len, magic, expected) in [
            (HEADER_BYTES + 100, MAGIC, "not a segment's size"),
            (HEADER_BYTES + 4096, *b"RDURING1", "wrong magic"),
        ] {
            let fd = rustix::fs::memfd_create("x", MemfdFlags::ALLOW_SEALING).unwrap();
            rustix::fs::ftruncate(&fd, len as u64).unwrap();
            rustix::io::write(&fd, &magic).unwrap();
            rustix::fs::fcntl_add_seals(&fd, SEALS).unwrap();
            let error = Segment::attach(fd, &nonce).err().unwrap();
            assert!(error.to_string().contains(expected), "{error}");
        }
    }
}
