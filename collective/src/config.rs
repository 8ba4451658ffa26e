//! Configuration of one rank's communicator, the peer table, and the all-reduce algorithm names.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::error::CollectiveError;

/// Default pipelining chunk: 1 MiB measured best on loopback with 2 and 4 ranks
/// (`allreduce-bench`); larger chunks only add latency before the first reduction.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;
/// Upper bound for `chunk_bytes`; also bounds every message a peer may send us.
pub const MAX_CHUNK_BYTES: usize = 16 << 20;
/// Longest job token: it travels in every data stream's hello.
pub(crate) const MAX_TOKEN_BYTES: usize = 4096;

/// How chunks travel between ranks. Rendezvous and aborts always use gRPC, and every rank
/// accepts every kind of stream on its collective port, so ranks may even differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPath {
    /// One token-authenticated raw TCP stream per directed pair of ranks that exchange, whose
    /// frames go through a shared-memory ring when both ranks are on one node
    /// (`CommConfig::node`), can reach each other's ring socket (same host and network
    /// namespace) and the ring fits the memory budget ([`RingMemory`]).
    #[default]
    Auto,
    /// One token-authenticated raw TCP stream per directed pair of ranks that exchange, frames
    /// always on it (no protobuf or HTTP/2 re-buffering copies).
    Tcp,
    /// One gRPC `Send` stream per directed pair of ranks (slower; kept so tests and
    /// `allreduce-bench` can run the algorithms over a second transport and compare).
    Grpc,
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataPath::Auto => "auto",
            DataPath::Tcp => "tcp",
            DataPath::Grpc => "grpc",
        })
    }
}

impl FromStr for DataPath {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DataPath::Auto),
            "tcp" => Ok(DataPath::Tcp),
            "grpc" => Ok(DataPath::Grpc),
            other => Err(CollectiveError::invalid_config(
                "data_path",
                format!("{other:?} is not one of auto, tcp, grpc"),
            )),
        }
    }
}

/// The variable that caps a rank's shared-memory rings ([`RingMemory::FromEnv`]).
pub const RING_MEMORY_ENV: &str = "RDU_SHM_MAX_BYTES";
/// A rank's ring cap when [`RING_MEMORY_ENV`] is not set: 32 rings of 2 MiB, enough for the
/// root of a star over 33 ranks, and every rank of a ring or doubling job far beyond.
pub const DEFAULT_RING_MEMORY: u64 = 64 << 20;

/// How much memory one rank's shared-memory rings may hold at once. Whatever the cap, a ring is
/// made only if the host keeps a quarter of its memory available after it; a ring that does
/// not fit leaves its link on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingMemory {
    /// [`RING_MEMORY_ENV`] if set (bytes, or a number with a `KiB`, `MiB` or `GiB` suffix), else
    /// [`DEFAULT_RING_MEMORY`].
    #[default]
    FromEnv,
    /// At most this many bytes (0: no rings).
    Bytes(u64),
}

impl RingMemory {
    /// The cap in bytes; a malformed [`RING_MEMORY_ENV`] is an error naming it.
    pub fn resolve(self) -> Result<u64, CollectiveError> {
        match self {
            RingMemory::Bytes(bytes) => Ok(bytes),
            RingMemory::FromEnv => {
                let value = std::env::var(RING_MEMORY_ENV).ok();
                RingMemory::parse(value.as_deref())
            }
        }
    }

    /// The cap that `value` of [`RING_MEMORY_ENV`] sets (`None`: unset).
    pub fn parse(value: Option<&str>) -> Result<u64, CollectiveError> {
        let Some(text) = value.map(str::trim) else {
            return Ok(DEFAULT_RING_MEMORY);
        };
        let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
            Some(at) => text.split_at(at),
            None => (text, ""),
        };
        let scale: u64 = match unit.trim() {
            "" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            _ => 0,
        };
        number
            .parse::<u64>()
            .ok()
            .filter(|_| scale > 0)
            .and_then(|n| n.checked_mul(scale))
            .ok_or_else(|| {
                CollectiveError::invalid_config(
                    RING_MEMORY_ENV,
                    format!(
                        "{text:?} is not a size: use bytes, or a number with KiB, MiB or GiB                          (such as 64MiB), or unset it for {} MiB",
                        DEFAULT_RING_MEMORY >> 20
                    ),
                )
            })
    }
}

/// The variable naming the directory of a rank's ring sockets ([`RingSockets::FromEnv`]): the
/// shared-memory domain the DRA plugin mounts into the pods of one job on one node.
pub const RING_DIR_ENV: &str = "RDU_SHM_DOMAIN";
/// Longest ring socket directory: a unix socket's path is at most 107 bytes, and the socket's
/// name (`/rdu-rings-` and 32 hex digits) takes 43 of them.
pub const MAX_RING_DIR_BYTES: usize = 64;

/// Where a rank's ring socket is served, and where it finds those of the peers whose rings it
/// takes (`DataPath::Auto`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RingSockets {
    /// The directory [`RING_DIR_ENV`] names if it is set, else the abstract namespace.
    #[default]
    FromEnv,
    /// The abstract socket namespace.
    Abstract,
    /// Files in this directory.
    Dir(PathBuf),
}

/// A resolved [`RingSockets`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RingPlace {
    /// The abstract namespace: every process of the network namespace can reach the socket (ranks
    /// of one host, as local mode runs them).
    #[default]
    Abstract,
    /// A directory: only processes that see it (its mount) can reach the sockets in it.
    Dir(PathBuf),
}

impl RingSockets {
    /// Where the sockets are; a bad directory is an error naming it and the fix.
    pub fn resolve(&self) -> Result<RingPlace, CollectiveError> {
        match self {
            RingSockets::Abstract => Ok(RingPlace::Abstract),
            RingSockets::Dir(dir) => RingSockets::check_dir(dir),
            RingSockets::FromEnv => match std::env::var_os(RING_DIR_ENV) {
                None => Ok(RingPlace::Abstract),
                Some(dir) => RingSockets::check_dir(Path::new(&dir)),
            },
        }
    }

    /// `dir` must be an absolute path of at most [`MAX_RING_DIR_BYTES`] to a directory.
    fn check_dir(dir: &Path) -> Result<RingPlace, CollectiveError> {
        let bad = |reason: String| CollectiveError::invalid_config(RING_DIR_ENV, reason);
        let shown = dir.display();
        if !dir.is_absolute() {
            return Err(bad(format!(
                "{shown:?} is not an absolute path: name the shared-memory domain's directory, or unset it"
            )));
        }
        if dir.as_os_str().len() > MAX_RING_DIR_BYTES {
            return Err(bad(format!(
                "{shown:?} is longer than {MAX_RING_DIR_BYTES} bytes, too long for a socket path in it: \
                 mount the domain at a shorter path"
            )));
        }
        if !dir.is_dir() {
            return Err(bad(format!(
                "{shown:?} is not a directory: the pod did not get its shared-memory domain mounted there"
            )));
        }
        Ok(RingPlace::Dir(dir.to_path_buf()))
    }
}

/// Who this job is: every rank of one generation shares all three values.
#[derive(Clone, PartialEq, Eq)]
pub struct JobIdentity {
    pub job_uid: String,
    /// Shared secret sent as `authorization: Bearer <token>` on every call.
    pub token: String,
    /// Restart count of the job; ranks of different generations never talk to each other.
    pub generation: u64,
}

impl fmt::Debug for JobIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobIdentity")
            .field("job_uid", &self.job_uid)
            .field("token", &"<redacted>")
            .field("generation", &self.generation)
            .finish()
    }
}

/// Everything one rank needs to join the job and talk to its peers.
#[derive(Debug, Clone)]
pub struct CommConfig {
    pub identity: JobIdentity,
    pub rank: u32,
    pub world_size: u32,
    /// Host of rank 0's rendezvous server (MASTER_ADDR).
    pub master_addr: String,
    /// Port of rank 0's rendezvous server (MASTER_PORT).
    pub master_port: u16,
    /// Host or IP peers use to reach this rank (POD_IP, or 127.0.0.1 locally).
    pub advertise_host: String,
    /// Port of this rank's `Collective` server; 0 picks a free port.
    pub collective_port: u16,
    /// Node name (NODE_NAME); the hierarchical algorithm groups ranks by it.
    pub node: String,
    /// Bound on the rendezvous and on each collective (dataParallel.timeoutSeconds).
    pub timeout: Duration,
    /// Pipelining chunk size in bytes (see [`DEFAULT_CHUNK_BYTES`]); the same on every rank.
    pub chunk_bytes: usize,
}

impl CommConfig {
    /// Checks every field, naming the field and the fix on error.
    pub fn validate(&self) -> Result<(), CollectiveError> {
        fn bad(field: &'static str, reason: impl Into<String>) -> CollectiveError {
            CollectiveError::invalid_config(field, reason)
        }
        if self.identity.job_uid.is_empty() {
            return Err(bad("identity.job_uid", "must not be empty"));
        }
        if self.identity.token.is_empty() {
            return Err(bad(
                "identity.token",
                "must not be empty (set the job token)",
            ));
        }
        if self.identity.token.len() > MAX_TOKEN_BYTES {
            return Err(bad(
                "identity.token",
                format!(
                    "is {} bytes; use a token of at most {MAX_TOKEN_BYTES}",
                    self.identity.token.len()
                ),
            ));
        }
        if self.world_size == 0 {
            return Err(bad("world_size", "must be at least 1"));
        }
        if self.rank >= self.world_size {
            return Err(bad(
                "rank",
                format!(
                    "rank {} is outside the world of {} ranks (0..{})",
                    self.rank, self.world_size, self.world_size
                ),
            ));
        }
        if self.world_size > 1 {
            if self.master_addr.is_empty() {
                return Err(bad("master_addr", "must name rank 0's host"));
            }
            if self.advertise_host.is_empty() {
                return Err(bad(
                    "advertise_host",
                    "must be the host or IP peers reach this rank at",
                ));
            }
        }
        if self.timeout.is_zero() {
            return Err(bad("timeout", "must be greater than zero"));
        }
        if self.chunk_bytes < 4 || self.chunk_bytes > MAX_CHUNK_BYTES {
            return Err(bad(
                "chunk_bytes",
                format!(
                    "{} is outside 4..={MAX_CHUNK_BYTES} bytes",
                    self.chunk_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Number of f32 values per pipelining chunk.
    pub(crate) fn chunk_elems(&self) -> usize {
        (self.chunk_bytes / 4).max(1)
    }
}

/// IP to listen on for a server whose clients use `host`: loopback stays on loopback,
/// anything else listens on every interface.
pub(crate) fn listen_ip_for(host: &str) -> IpAddr {
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

/// `host:port`, with brackets around IPv6 literals.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One rank of the job as every rank sees it after rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: u32,
    /// `host:port` of the rank's `Collective` server.
    pub address: String,
    pub node: String,
}

/// How `all_reduce_*` moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// For small buffers recursive doubling (2^k ranks) or the star, then hierarchical when ranks
    /// share nodes, recursive halving and doubling on 2^k ranks, ring otherwise.
    #[default]
    Auto,
    /// Reduce-scatter then all-gather around all ranks.
    Ring,
    /// Reduce to a leader within each node, ring between leaders, broadcast within each node.
    Hierarchical,
    /// "Through the host": every rank sends to rank 0, which reduces in rank order and broadcasts.
    Star,
}

impl FromStr for Algorithm {
    type Err = CollectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Algorithm::Auto),
            "ring" => Ok(Algorithm::Ring),
            "hierarchical" => Ok(Algorithm::Hierarchical),
            "star" => Ok(Algorithm::Star),
            other => Err(CollectiveError::invalid_config(
                "algorithm",
                format!("unknown algorithm {other:?}; use auto, ring, hierarchical or star"),
            )),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Auto => "auto",
            Algorithm::Ring => "ring",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::Star => "star",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> CommConfig {
        CommConfig {
            identity: JobIdentity {
                job_uid: "uid".into(),
                token: "secret".into(),
                generation: 3,
            },
            rank: 1,
            world_size: 2,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            advertise_host: "127.0.0.1".into(),
            collective_port: 0,
            node: "n0".into(),
            timeout: Duration::from_secs(5),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }

    #[test]
    fn data_paths_parse_print_and_default_to_auto() {
        assert_eq!(DataPath::default(), DataPath::Auto);
        for path in [DataPath::Auto, DataPath::Tcp, DataPath::Grpc] {
            assert_eq!(path.to_string().parse::<DataPath>().ok(), Some(path));
        }
        assert_eq!(" GRPC ".parse::<DataPath>().ok(), Some(DataPath::Grpc));
        let error = "udp".parse::<DataPath>().unwrap_err().to_string();
        assert!(
            error.contains("data_path") && error.contains("auto, tcp, grpc"),
            "{error}"
        );
    }

    #[test]
    fn a_valid_config_passes() {
        assert!(sample().validate().is_ok());
    }

    #[test]
    fn each_bad_field_is_named() {
        type Mutation = Box<dyn Fn(&mut CommConfig)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("rank", Box::new(|c| c.rank = 2)),
            ("world_size", Box::new(|c| c.world_size = 0)),
            ("identity.token", Box::new(|c| c.identity.token.clear())),
            (
                "identity.token",
                Box::new(|c| c.identity.token = "t".repeat(MAX_TOKEN_BYTES + 1)),
            ),
            ("identity.job_uid", Box::new(|c| c.identity.job_uid.clear())),
            ("timeout", Box::new(|c| c.timeout = Duration::ZERO)),
            ("chunk_bytes", Box::new(|c| c.chunk_bytes = 2)),
            (
                "chunk_bytes",
                Box::new(|c| c.chunk_bytes = MAX_CHUNK_BYTES + 1),
            ),
            ("master_addr", Box::new(|c| c.master_addr.clear())),
            ("advertise_host", Box::new(|c| c.advertise_host.clear())),
        ];
        for (field, mutate) in cases {
            let mut c = sample();
            mutate(&mut c);
            match c.validate() {
                Err(CollectiveError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in [
            Algorithm::Auto,
            Algorithm::Ring,
            Algorithm::Hierarchical,
            Algorithm::Star,
        ] {
            assert_eq!(a.to_string().parse::<Algorithm>().ok(), Some(a));
        }
        assert!("tree".parse::<Algorithm>().is_err());
    }

    #[test]
    fn loopback_hosts_listen_on_loopback_only() {
        assert_eq!(listen_ip_for("127.0.0.1"), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(listen_ip_for("localhost"), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(listen_ip_for("10.1.2.3"), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        assert_eq!(host_port("::1", 5), "[::1]:5");
        assert_eq!(host_port("a", 5), "a:5");
    }

    #[test]
    fn ring_sockets_resolve_to_a_usable_directory_or_name_the_variable() {
        assert_eq!(
            RingSockets::Abstract.resolve().unwrap(),
            RingPlace::Abstract
        );
        let dir = tempfile::tempdir().unwrap();
        let domain = dir.path().to_path_buf();
        assert_eq!(
            RingSockets::Dir(domain.clone()).resolve().unwrap(),
            RingPlace::Dir(domain.clone())
        );
        let long = PathBuf::from(format!("/{}", "d".repeat(MAX_RING_DIR_BYTES)));
        let file = domain.join("file");
        std::fs::write(&file, b"").unwrap();
        for (bad, part) in [
            (PathBuf::from("relative/dir"), "not an absolute path"),
            (long, "longer than 64 bytes"),
            (domain.join("missing"), "not a directory"),
            (file, "not a directory"),
        ] {
            let error = RingSockets::Dir(bad.clone())
                .resolve()
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(RING_DIR_ENV) && error.contains(part),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn ring_memory_caps_parse_from_the_variable_or_name_it() {
        assert_eq!(RingMemory::parse(None).unwrap(), DEFAULT_RING_MEMORY);
        assert_eq!(RingMemory::parse(Some("0")).unwrap(), 0);
        assert_eq!(RingMemory::parse(Some(" 4096 ")).unwrap(), 4096);
        assert_eq!(RingMemory::parse(Some("64MiB")).unwrap(), 64 << 20);
        assert_eq!(RingMemory::parse(Some("2 GiB")).unwrap(), 2 << 30);
        assert_eq!(RingMemory::parse(Some("8KiB")).unwrap(), 8 << 10);
        for bad in [
            "",
            "lots",
            "64MB",
            "-1",
            "1.5GiB",
            "99999999999999999999GiB",
        ] {
            let error = RingMemory::parse(Some(bad)).unwrap_err().to_string();
            assert!(error.contains(RING_MEMORY_ENV), "{bad}: {error}");
        }
        assert_eq!(RingMemory::Bytes(7).resolve().unwrap(), 7);
    }

    #[test]
    fn debug_output_hides_the_token() {
        assert!(!format!("{:?}", sample()).contains("secret"));
    }
}
