//! A rank killed (SIGKILL) after making and offering a ring but before its peer answered leaves
//! nothing behind: no file anywhere, and once the peer lets go of the mapping, no process holds
//! the memory. The offering rank is a child process running `offering_rank_process`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::pass::{PassError, fetch};
use super::segment::Segment;
use super::{Offer, RING_BYTES, RingMaker};

/// Set in the child: where to send its offer.
const OFFER_TO: &str = "RDU_TEST_OFFER_TO";

/// The offering rank: makes a ring, sends its offer to `OFFER_TO`, and waits for an answer that
/// never comes (the test kills it). Started by the tests below, not on its own.
#[test]
#[ignore = "a child process of the kill tests, started by them"]
fn offering_rank_process() {
    let Ok(address) = std::env::var(OFFER_TO) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let maker = RingMaker::start(8 << 20, &crate::config::RingPlace::Abstract).unwrap();
        let offering = maker.offer(1).expect("room for one ring");
        let mut stream = TcpStream::connect(&address).unwrap();
        stream.write_all(&offering.offer.encode()).unwrap();
        // The ring socket must keep serving while this waits: wait off the runtime's thread.
        let mut answer = [0u8; 1];
        let _ = tokio::task::spawn_blocking(move || stream.read(&mut answer)).await;
        drop(offering);
    });
}

/// Kills the child when dropped, whatever the test did.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the offering rank; returns it, its offer, and the stream it waits on for an answer.
fn offering_rank() -> (Killed, Offer, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "transport::shm::tests::offering_rank_process",
            "--ignored",
            "--nocapture",
        ])
        .env(OFFER_TO, listener.local_addr().unwrap().to_string())
        .spawn()
        .unwrap();
    let child = Killed(child);
    let (mut stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut offer = [0u8; Offer::LEN];
    stream.read_exact(&mut offer).unwrap();
    (child, Offer::decode(&offer), stream)
}

/// Entries of /dev/shm.
fn dev_shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Entries of /dev/shm that appeared since `before` and stay (other programs' short-lived
/// entries, made and removed while this ran, are given two seconds to go).
fn new_dev_shm_entries(before: &BTreeSet<String>) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let new: Vec<String> = dev_shm().difference(before).cloned().collect();
        if new.is_empty() || Instant::now() >= deadline {
            return new;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes that map the file with inode `ino` or hold a descriptor of it.
fn holders(ino: u64) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in procs.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let maps = std::fs::read_to_string(entry.path().join("maps")).unwrap_or_default();
        let mapped = maps.lines().any(|line| {
            line.split_whitespace().nth(4) == Some(ino.to_string().as_str())
                && line.contains("/memfd:rdu-ring")
        });
        let held = std::fs::read_dir(entry.path().join("fd"))
            .map(|fds| {
                fds.filter_map(Result::ok).any(|fd| {
                    std::fs::metadata(fd.path()).is_ok_and(|m| m.ino() == ino)
                        && std::fs::read_link(fd.path())
                            .is_ok_and(|l| l.to_string_lossy().contains("memfd:rdu-ring"))
                })
            })
            .unwrap_or(false);
        if mapped || held {
            found.push(pid);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_between_offering_a_ring_and_the_reply_leaves_nothing_behind() {
    let shm_before = dev_shm();
    let (mut child, offer, _unanswered) = offering_rank();
    let child_pid = child.0.id();
    // The peer takes the ring, as a receiving rank does before it replies.
    let fd = fetch(
        &crate::config::RingPlace::Abstract,
        &offer.server,
        &offer.nonce,
    )
    .await
    .unwrap();
    let ino = rustix::fs::fstat(&fd).unwrap().st_ino;
    let segment = Segment::attach(fd, &offer.nonce).unwrap();
    assert_eq!(segment.capacity(), RING_BYTES);
    let me = std::process::id();
    let both = holders(ino);
    assert!(both.contains(&child_pid) && both.contains(&me), "{both:?}");
    // SIGKILL between the offer and the reply.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert_eq!(holders(ino), [me], "only the peer's mapping is left");
    drop(segment);
    assert_eq!(
        holders(ino),
        Vec::<u32>::new(),
        "no process holds the memory"
    );
    assert_eq!(new_dev_shm_entries(&shm_before), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_offered_by_a_rank_killed_before_the_peer_took_it_cannot_be_taken() {
    let shm_before = dev_shm();
    let (mut child, offer, _unanswered) = offering_rank();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // The socket went with the process: there is nothing to fetch, and nothing was named.
    assert!(matches!(
        fetch(
            &crate::config::RingPlace::Abstract,
            &offer.server,
            &offer.nonce
        )
        .await,
        Err(PassError::Connect(_))
    ));
    assert_eq!(new_dev_shm_entries(&shm_before), Vec::<String>::new());
}
