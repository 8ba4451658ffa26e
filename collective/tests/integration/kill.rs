//! A rank killed with SIGKILL in the middle of all-reduces through shared-memory rings leaves
//! nothing behind: the ranks never name anything in /dev/shm, and once the survivor has failed
//! and let go of its communicator, it maps no ring memory, so no process holds the dead rank's
//! rings or its own. The ranks are child processes of this test (`rank_process`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use rdu_collective::{
    Algorithm, CommConfig, Communicator, ConnectOptions, JobIdentity, RingMemory,
};

const RANK: &str = "RDU_KILL_TEST_RANK";
const PORT: &str = "RDU_KILL_TEST_PORT";
/// Longest the test waits for a rank to report.
const WAIT: Duration = Duration::from_secs(60);

/// One rank: all-reduces 1 MiB through the ring until one fails, reporting on stdout (lines
/// starting with `@`), then drops its communicator and waits for stdin to close. Started by the
/// test below, not on its own.
#[test]
#[ignore = "a child process of the kill test, started by it"]
fn rank_process() {
    let (Ok(rank), Ok(port)) = (std::env::var(RANK), std::env::var(PORT)) else {
        return;
    };
    let rank: u32 = rank.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let cfg = CommConfig {
            identity: JobIdentity {
                job_uid: "kill".into(),
                token: "kill-token".into(),
                generation: 0,
            },
            rank,
            world_size: 2,
            master_addr: "127.0.0.1".into(),
            master_port: port.parse().unwrap(),
            advertise_host: "127.0.0.1".into(),
            collective_port: 0,
            node: "n".into(),
            timeout: Duration::from_secs(5),
            chunk_bytes: 256 << 10,
        };
        let options = ConnectOptions {
            ring_memory: RingMemory::Bytes(64 << 20),
            ..ConnectOptions::default()
        };
        let comm = Communicator::connect_with(cfg, options).await.unwrap();
        let mut buf = vec![1.0f32; 1 << 18];
        let mut reported = false;
        let error = loop {
            if let Err(e) = comm.all_reduce_sum(&mut buf, Algorithm::Ring).await {
                break e;
            }
            buf.fill(1.0);
            if !reported {
                println!("@ready {:?}", comm.shared_memory_peers());
                reported = true;
            }
        };
        println!("@failed {error}");
        drop(comm);
        println!("@dropped");
    });
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
}

/// A rank process, killed when dropped, and the `@` lines it prints.
struct Rank {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Rank {
    fn start(rank: u32, port: u16) -> Rank {
        // The test's name inside the binary: its module path without the crate's name.
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let test = format!("{module}::rank_process");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test, "--ignored", "--nocapture"])
            .env(RANK, rank.to_string())
            .env(PORT, port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with('@') && tx.send(line).is_err() {
                    return;
                }
            }
        });
        Rank {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The next `@` line, which must start with `prefix`.
    fn expect(&self, prefix: &str) -> String {
        let line = self
            .lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("no {prefix} line: {e}"));
        assert!(line.starts_with(prefix), "expected {prefix}, got {line}");
        line
    }

    /// Lines of `/proc/PID/maps` mapping ring memory, and descriptors of it.
    fn ring_mappings_and_descriptors(&self) -> (usize, usize) {
        let pid = self.child.id();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let mapped = maps
            .lines()
            .filter(|l| l.contains("/memfd:rdu-ring"))
            .count();
        let held = links_of(pid)
            .iter()
            .filter(|l| l.contains("memfd:rdu-ring"))
            .count();
        (mapped, held)
    }

    /// Whether the process maps or holds anything under /dev/shm.
    fn touches_dev_shm(&self) -> bool {
        let pid = self.child.id();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        maps.contains("/dev/shm") || links_of(pid).iter().any(|l| l.starts_with("/dev/shm"))
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the descriptors of process `pid` point.
fn links_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

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

/// Entries of /dev/shm that appeared since `before` and stay (another program's short-lived
/// entries are given two seconds to go).
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_rank_killed_mid_all_reduce_leaves_no_file_and_no_ring_memory() {
    let shm_before = dev_shm();
    let port = free_port();
    let survivor = Rank::start(0, port);
    let mut victim = Rank::start(1, port);
    assert_eq!(survivor.expect("@ready"), "@ready [1]");
    assert_eq!(victim.expect("@ready"), "@ready [0]");
    // Each maps its own ring and its peer's; neither touches /dev/shm.
    for rank in [&survivor, &victim] {
        assert_eq!(rank.ring_mappings_and_descriptors().0, 2);
        assert!(!rank.touches_dev_shm());
    }
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    let failed = survivor.expect("@failed");
    assert!(failed.contains("rank 1"), "{failed}");
    survivor.expect("@dropped");
    assert_eq!(
        survivor.ring_mappings_and_descriptors(),
        (0, 0),
        "the survivor let go of both rings: no process holds their memory"
    );
    assert_eq!(new_dev_shm_entries(&shm_before), Vec::<String>::new());
}
