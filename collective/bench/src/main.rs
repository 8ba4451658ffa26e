//! `allreduce-bench`: all-reduce bus bandwidth of N local ranks (one process each, loopback),
//! beside a raw TCP stream between two processes measured in the same run. Chunks travel on
//! the TCP data path, through shared-memory rings between these same-host ranks unless
//! `--data-path tcp` (or `grpc`). Links open when first used: `linked_peers` on each line says
//! how many peers rank 0 has sent to so far, `shared_memory_peers` through how many rings, and
//! `ring_memory_peak_bytes` the most memory each rank's own rings held at once (by rank). For the
//! world's growth: `links_per_rank` (peers each rank sent to: max and mean), `fds_per_rank` (open
//! descriptors, max), `peak_rss_mib_per_rank` (max), `connect_seconds_rank0` (rank 0's connect, all
//! other ranks' start-up included) and `rendezvous_seconds` (the shortest connect of any rank: the
//! last to join waits only for the exchange itself).
//!
//! Before the first size the ranks warm the machine up for `--warmup-seconds` (`rdu_collective::warm_up`; the rounds it took
//! are each line's `warmup_rounds`). Prints one JSON line per size with nccl-tests' definitions: algbw = bytes / time,
//! busbw = algbw * 2 (n - 1) / n; bandwidths in GB/s where 1 GB = 1e9 bytes; and `busbw_vs_tcp`, busbw over the
//! baseline. Then one line `{"baseline":"tcp_stream","gbps":..}` (same unit): the mean of a raw TCP stream
//! measured before and after the ranks ran (`gbps_before`, `gbps_after`). Then, per size, the second baseline
//! `{"baseline":"tcp_pingpong","bytes":..,"rtt_us":..}`: the median round trip of a blocking TCP ping-pong of
//! those bytes between two processes, and each size line's `time_vs_pingpong` is its time over that round trip.

mod breakdown;
mod footprint;
mod mpi;
mod pingpong;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use rdu_collective::{
    Algorithm, CommConfig, Communicator, Compression, ConnectOptions, DEFAULT_CHUNK_BYTES,
    DataPath, JobIdentity, ReduceOptions, Spin,
};

/// Every rank's `mine`, gathered to all (rank by rank): each rank puts its values in its slot of a
/// vector the ranks sum with the timed runs' algorithm (never compressed), so the gather opens no
/// link the timed runs did not. `Auto` picks by size, so the vector is as long as the timed
/// buffer (`timed_bytes`) when that is longer: it resolves as the timed runs did (and when the
/// slots alone are longer, both stay on the same side of `AUTO_SMALL_MAX_BYTES` up to 3,276
/// ranks). Values are counts of KiB, of 4 KiB pages or of milliseconds, exact in f32 up to 2^24
/// units.
async fn gather(
    comm: &Communicator,
    algorithm: Algorithm,
    timed_bytes: usize,
    mine: &[f32],
) -> Result<Vec<Vec<f32>>> {
    let k = mine.len();
    let slots = comm.world_size() as usize * k;
    let mut all = vec![0f32; gather_len(slots, timed_bytes)];
    let at = comm.rank() as usize * k;
    all[at..at + k].copy_from_slice(mine);
    let exact = ReduceOptions {
        algorithm,
        compression: Compression::None,
    };
    comm.all_reduce_sum(&mut all, exact).await?;
    Ok(all[..slots].chunks(k).map(<[f32]>::to_vec).collect())
}

/// Values in the gather's vector: the ranks' slots, padded to the timed buffer's length.
fn gather_len(slots: usize, timed_bytes: usize) -> usize {
    slots.max(timed_bytes.div_ceil(4))
}

/// Per rank: what it holds after the timed runs, gathered to all.
struct RankFootprints {
    ring_memory_peak_bytes: Vec<u64>,
    links: Vec<u64>,
    open_fds: Vec<u64>,
    peak_rss_kib: Vec<u64>,
    connect_ms: Vec<u64>,
}

impl RankFootprints {
    async fn gather(
        comm: &Communicator,
        algorithm: Algorithm,
        timed_bytes: usize,
        connect: Duration,
    ) -> Result<RankFootprints> {
        let own = footprint::Footprint::now()?;
        // Ring bytes in 4 KiB pages, so they stay exact in f32.
        let mine = [
            (comm.ring_memory().peak_bytes / 4096) as f32,
            comm.linked_peers().len() as f32,
            own.open_fds as f32,
            own.peak_rss_kib as f32,
            connect.as_millis() as f32,
        ];
        let all = gather(comm, algorithm, timed_bytes, &mine).await?;
        let column = |i: usize| all.iter().map(|r| r[i] as u64).collect::<Vec<_>>();
        Ok(RankFootprints {
            ring_memory_peak_bytes: column(0).into_iter().map(|p| p * 4096).collect(),
            links: column(1),
            open_fds: column(2),
            peak_rss_kib: column(3),
            connect_ms: column(4),
        })
    }

    fn json(&self) -> serde_json::Value {
        let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
        let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        serde_json::json!({
            "ring_memory_peak_bytes": self.ring_memory_peak_bytes,
            "links_per_rank": {"max": max(&self.links), "mean": round3(mean(&self.links))},
            "fds_per_rank": {"max": max(&self.open_fds), "mean": round3(mean(&self.open_fds))},
            "peak_rss_mib_per_rank": {"max": round3(max(&self.peak_rss_kib) as f64 / 1024.0),
                                      "mean": round3(mean(&self.peak_rss_kib) / 1024.0)},
            "connect_seconds_rank0": self.connect_ms.first().copied().unwrap_or(0) as f64 / 1000.0,
            "rendezvous_seconds": self.connect_ms.iter().copied().min().unwrap_or(0) as f64 / 1000.0,
        })
    }
}

#[derive(Parser, Debug)]
#[command(
    about = "All-reduce bandwidth of local ranks (gRPC control, chunks on --data-path), beside a raw TCP stream"
)]
struct Args {
    /// Number of ranks (processes).
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Buffer sizes in bytes (multiples of 4), comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096,65536,1048576,16777216,67108864"
    )]
    sizes: Vec<usize>,
    /// auto (what jobs use unless spec.dataParallel.algorithm says otherwise), ring, hierarchical or star.
    #[arg(long, default_value = "auto")]
    algorithm: String,
    /// Timed iterations per size (default: about 256 MiB of traffic, between 5 and 2000).
    #[arg(long)]
    iters: Option<u32>,
    /// Untimed iterations per size before timing.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Seconds of all-reduces of the largest size (at most 16 MiB) before the first size: an idle
    /// machine runs every size slower until warm (see `rdu_collective::warm_up`); 0 skips it.
    #[arg(long, default_value_t = 0.25)]
    warmup_seconds: f64,
    /// How chunks travel: auto (raw TCP streams, frames in shared-memory rings between ranks
    /// of one host), tcp (frames always on the TCP streams) or grpc (gRPC Send streams).
    #[arg(long, default_value = "auto")]
    data_path: String,
    /// Pipelining chunk size in bytes.
    #[arg(long, default_value_t = DEFAULT_CHUNK_BYTES)]
    chunk_bytes: usize,
    /// Bytes sent over the raw TCP baseline stream.
    #[arg(long, default_value_t = 1 << 30)]
    baseline_bytes: u64,
    /// Run each rank on tokio's multi-thread runtime instead of the single-threaded one `rdu-worker` uses.
    #[arg(long)]
    multi_thread: bool,
    /// With --multi-thread: worker threads per rank process (0: tokio's default, one per core).
    #[arg(long, default_value_t = 0)]
    worker_threads: usize,
    /// Ranks per node (node = rank / this); 0: every rank on one node, as they are. Ranks of one
    /// node share memory rings (`--data-path auto`); several nodes make `auto` run `hierarchical`.
    #[arg(long, default_value_t = 0)]
    ranks_per_node: u32,
    /// Leave glibc malloc at its defaults in the rank processes (see `MALLOC_TUNABLES`).
    #[arg(long)]
    default_malloc: bool,
    /// Whether receives of small frames poll (yielding the core) before parking: auto, off, or
    /// for how long, e.g. 30us.
    #[arg(long, default_value = "auto")]
    spin: String,
    /// How values travel: none (f32), bf16 or fp16.
    #[arg(long, default_value = "none")]
    compression: String,
    /// Skip the TCP baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Pin rank r to core r mod (cores), as `mpirun --bind-to core` does (and, with --compare-mpi, bind MPI's
    /// ranks the same way; unbound otherwise, for both). Unbound, two ranks often start on one core and
    /// share it until the kernel's load balancer moves one: the first thousands of small calls pay for it.
    #[arg(long)]
    bind_to_core: bool,
    /// Also run the sizes through Open MPI's MPI_Allreduce, over its shared memory and over TCP, in this
    /// run (needs `mpicc` and `mpirun`): lines with "baseline":"mpi_shared_memory" and "mpi_tcp", and on
    /// each of this bench's lines `time_vs_<baseline>` (its time over MPI's; below 1 is faster).
    #[arg(long)]
    compare_mpi: bool,
    /// Split each line's time per call into the fixed cost of any call (one value through the same
    /// algorithm), this rank's copies of the buffer (timed alone) and the rest (waiting, cores
    /// handing cache lines over): "breakdown" on each line.
    #[arg(long)]
    breakdown: bool,
    /// Internal: run as this rank.
    #[arg(long, hide = true)]
    rank: Option<u32>,
    /// Internal: rank 0's rendezvous port.
    #[arg(long, hide = true)]
    master_port: Option<u16>,
    /// Internal: send `baseline_bytes` to this address and exit.
    #[arg(long, hide = true)]
    tcp_send_to: Option<String>,
    /// Internal: echo ping-pong messages to this address (sizes and counts in `--echo-plan`) and exit.
    #[arg(long, hide = true)]
    tcp_echo_to: Option<String>,
    /// Internal: `<bytes>x<count>,…` for `--tcp-echo-to`.
    #[arg(long, hide = true, default_value = "")]
    echo_plan: String,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    if let Some(addr) = &args.tcp_send_to {
        return tcp_send(addr, args.baseline_bytes);
    }
    if let Some(addr) = &args.tcp_echo_to {
        return pingpong::echo(addr, &args.echo_plan);
    }
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    if !(args.warmup_seconds.is_finite() && (0.0..=600.0).contains(&args.warmup_seconds)) {
        bail!(
            "--warmup-seconds {}: give a number of seconds from 0 to 600",
            args.warmup_seconds
        );
    }
    if let Some(bad) = args.sizes.iter().find(|s| **s % 4 != 0 || **s == 0) {
        bail!("--sizes: {bad} is not a positive multiple of 4 (buffers are f32)");
    }
    let algorithm: Algorithm = args.algorithm.parse()?;
    let data_path: DataPath = args.data_path.parse()?;
    let compression: Compression = args.compression.parse()?;
    let spin: Spin = args.spin.parse()?;
    let options = ReduceOptions {
        algorithm,
        compression,
    };
    match (args.rank, args.master_port) {
        (Some(rank), Some(port)) => run_rank(&args, rank, port, options, data_path, spin),
        (None, None) => run_parent(&args),
        _ => bail!("--rank and --master-port go together"),
    }
}

/// glibc malloc settings for the rank processes unless `--default-malloc` or GLIBC_TUNABLES is
/// already set: keep chunk-sized buffers on the heap and do not trim it, so the transport's
/// 1 MiB buffers are recycled instead of being mapped, page-faulted and unmapped per message
/// (measured 10-25% less CPU per 16 MiB all-reduce). Worker pods can set the same variable.
const MALLOC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=1073741824";

/// Measures the TCP baseline, runs the ranks, measures the baseline again (the machine's load drifts), then
/// prints rank 0's lines with `busbw_vs_tcp` (busbw over the mean of the two baselines) and the baseline line.
fn run_parent(args: &Args) -> Result<()> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let before = (!args.no_baseline)
        .then(|| tcp_baseline(&exe, args.baseline_bytes))
        .transpose()?;
    let lines = run_ranks(args, &exe)?;
    let mpi = if args.compare_mpi {
        compare_mpi(args)?
    } else {
        Vec::new()
    };
    let after = (!args.no_baseline)
        .then(|| tcp_baseline(&exe, args.baseline_bytes))
        .transpose()?;
    let pingpongs = if args.no_baseline {
        Vec::new()
    } else {
        pingpong::measure(&exe, &args.sizes)?
    };
    let baseline = before.zip(after).map(|(b, a)| (b + a) / 2.0);
    for line in lines {
        let mut value: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("rank 0 printed a line that is not JSON: {line}"))?;
        if let (Some(tcp), Some(busbw)) = (baseline, value["busbw_gbps"].as_f64()) {
            value["busbw_vs_tcp"] = serde_json::json!(round3(busbw / tcp));
        }
        let rtt = pingpongs
            .iter()
            .find(|(bytes, _)| Some(*bytes as u64) == value["bytes"].as_u64())
            .map(|(_, rtt)| *rtt);
        if let (Some(rtt), Some(time)) = (rtt, value["time_us"].as_f64()) {
            value["time_vs_pingpong"] = serde_json::json!(round3(time / rtt));
        }
        for (baseline, results) in &mpi {
            let theirs = results
                .iter()
                .find(|r| Some(r.bytes) == value["bytes"].as_u64());
            if let (Some(theirs), Some(time)) = (theirs, value["time_us"].as_f64()) {
                value[format!("time_vs_{baseline}")] =
                    serde_json::json!(round3(time / theirs.time_us));
            }
        }
        println!("{value}");
    }
    for (baseline, results) in &mpi {
        for r in results {
            let n = f64::from(args.ranks);
            let busbw = r.bytes as f64 / (r.time_us * 1e-6) / 1e9 * 2.0 * (n - 1.0) / n;
            println!(
                "{}",
                serde_json::json!({"baseline": baseline, "ranks": args.ranks, "bytes": r.bytes,
                                   "iters": r.iters, "time_us": round3(r.time_us),
                                   "busbw_gbps": round3(busbw)})
            );
        }
    }
    if let (Some(gbps), Some(before), Some(after)) = (baseline, before, after) {
        println!(
            "{}",
            serde_json::json!({
                "baseline": "tcp_stream",
                "bytes": args.baseline_bytes,
                "gbps": round3(gbps),
                "gbps_before": round3(before),
                "gbps_after": round3(after),
            })
        );
    }
    for (bytes, rtt) in &pingpongs {
        println!(
            "{}",
            serde_json::json!({"baseline": "tcp_pingpong", "bytes": bytes, "rtt_us": round3(*rtt)})
        );
    }
    Ok(())
}

/// Open MPI's results for the same sizes, iterations and warm-up, per transport (`--compare-mpi`).
fn compare_mpi(args: &Args) -> Result<Vec<(&'static str, Vec<mpi::MpiResult>)>> {
    let program = mpi::MpiProgram::build()?;
    let sizes: Vec<(u64, u64, u32)> = args
        .sizes
        .iter()
        .map(|&bytes| (bytes as u64, u64::from(iters_for(args, bytes)), args.warmup))
        .collect();
    mpi::TRANSPORTS
        .iter()
        .map(|&(name, btl)| {
            Ok((
                name,
                program.run(args.ranks, btl, args.bind_to_core, &sizes)?,
            ))
        })
        .collect()
}

/// Timed iterations for `bytes`: `--iters`, or about 256 MiB of traffic, between 5 and 2000.
fn iters_for(args: &Args, bytes: usize) -> u32 {
    args.iters
        .unwrap_or_else(|| ((256usize << 20) / bytes).clamp(5, 2000) as u32)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Spawns one process per rank and returns the JSON lines rank 0 printed.
fn run_ranks(args: &Args, exe: &std::path::Path) -> Result<Vec<String>> {
    let master_port = free_port()?;
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..args.ranks {
        let mut cmd = Command::new(exe);
        cmd.arg("--ranks")
            .arg(args.ranks.to_string())
            .arg("--sizes")
            .arg(
                args.sizes
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .arg("--algorithm")
            .arg(&args.algorithm)
            .arg("--data-path")
            .arg(&args.data_path)
            .arg("--warmup")
            .arg(args.warmup.to_string())
            .arg("--warmup-seconds")
            .arg(args.warmup_seconds.to_string())
            .arg("--chunk-bytes")
            .arg(args.chunk_bytes.to_string())
            .arg("--ranks-per-node")
            .arg(args.ranks_per_node.to_string())
            .arg("--worker-threads")
            .arg(args.worker_threads.to_string())
            .arg("--spin")
            .arg(&args.spin)
            .arg("--compression")
            .arg(&args.compression);
        if args.multi_thread {
            cmd.arg("--multi-thread");
        }
        if args.breakdown {
            cmd.arg("--breakdown");
        }
        if args.bind_to_core {
            cmd.arg("--bind-to-core");
        }
        cmd.arg("--rank")
            .arg(rank.to_string())
            .arg("--master-port")
            .arg(master_port.to_string());
        if let Some(iters) = args.iters {
            cmd.arg("--iters").arg(iters.to_string());
        }
        let tune_malloc = !args.default_malloc && std::env::var_os("GLIBC_TUNABLES").is_none();
        if tune_malloc {
            cmd.env("GLIBC_TUNABLES", MALLOC_TUNABLES);
        }
        cmd.stdout(if rank == 0 {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        children.push(
            cmd.spawn()
                .with_context(|| format!("spawning rank {rank}"))?,
        );
    }
    // Rank 0's few lines are read in full before waiting, so a full pipe never blocks it.
    let mut out = String::new();
    if let Some(stdout) = children.first_mut().and_then(|c| c.stdout.as_mut()) {
        stdout
            .read_to_string(&mut out)
            .context("reading rank 0's output")?;
    }
    let mut failed = Vec::new();
    for (rank, child) in children.iter_mut().enumerate() {
        let status = child
            .wait()
            .with_context(|| format!("waiting for rank {rank}"))?;
        if !status.success() {
            failed.push(rank);
        }
    }
    if !failed.is_empty() {
        bail!("ranks {failed:?} failed");
    }
    Ok(out.lines().map(str::to_string).collect())
}

/// How this rank process's malloc is configured, for the JSON lines.
fn malloc_label() -> &'static str {
    match std::env::var("GLIBC_TUNABLES") {
        Ok(v) if v == MALLOC_TUNABLES => "tuned",
        Ok(_) => "custom",
        Err(_) => "default",
    }
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(l.local_addr()?.port())
}

/// One raw TCP stream from a child process to this one; GB/s (1e9 bytes) at the receiver.
fn tcp_baseline(exe: &std::path::Path, bytes: u64) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding baseline listener")?;
    let addr = listener.local_addr()?.to_string();
    let mut child = Command::new(exe)
        .arg("--tcp-send-to")
        .arg(&addr)
        .arg("--baseline-bytes")
        .arg(bytes.to_string())
        .spawn()
        .context("spawning the baseline sender")?;
    let (mut stream, _) = listener.accept().context("accepting the baseline sender")?;
    let mut buf = vec![0u8; 4 << 20];
    let mut got = 0u64;
    // Clock starts at the first byte so process start-up is not counted.
    let n = stream.read(&mut buf)?;
    let start = Instant::now();
    got += n as u64;
    while got < bytes {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            bail!("baseline sender stopped after {got} of {bytes} bytes");
        }
        got += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    child.wait()?;
    Ok((got - n as u64) as f64 / secs / 1e9)
}

fn tcp_send(addr: &str, bytes: u64) -> Result<()> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let buf = vec![1u8; 4 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        stream.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Pins this process to core `rank` mod the cores it may use.
fn bind_to_core(rank: u32) -> Result<()> {
    let allowed =
        rustix::thread::sched_getaffinity(None).context("reading this process's CPU set")?;
    let cores: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    let Some(&core) = cores.get(rank as usize % cores.len().max(1)) else {
        bail!("--bind-to-core: this process may run on no core");
    };
    let mut only = rustix::thread::CpuSet::new();
    only.set(core);
    rustix::thread::sched_setaffinity(None, &only)
        .with_context(|| format!("pinning rank {rank} to core {core}"))?;
    Ok(())
}

/// `--ranks-per-node`, with 0 meaning all ranks.
fn ranks_per_node(args: &Args) -> u32 {
    match args.ranks_per_node {
        0 => args.ranks.max(1),
        n => n,
    }
}

fn run_rank(
    args: &Args,
    rank: u32,
    master_port: u16,
    reduce: ReduceOptions,
    data_path: DataPath,
    spin: Spin,
) -> Result<()> {
    if args.bind_to_core {
        bind_to_core(rank)?;
    }
    let runtime = if !args.multi_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if args.worker_threads > 0 {
            builder.worker_threads(args.worker_threads);
        }
        builder.enable_all().build()
    }
    .context("starting tokio")?;
    runtime.block_on(async {
        let cfg = CommConfig {
            identity: JobIdentity {
                job_uid: "allreduce-bench".into(),
                token: "bench".into(),
                generation: 0,
            },
            rank,
            world_size: args.ranks,
            master_addr: "127.0.0.1".into(),
            master_port,
            advertise_host: "127.0.0.1".into(),
            collective_port: 0,
            node: format!("node{}", rank / ranks_per_node(args)),
            timeout: Duration::from_secs(120),
            chunk_bytes: args.chunk_bytes,
        };
        let options = ConnectOptions {
            data_path,
            spin,
            ..ConnectOptions::default()
        };
        let connecting = Instant::now();
        let comm = Communicator::connect_with(cfg, options).await?;
        let connect = connecting.elapsed();
        let warm_len = rdu_collective::warm_len(args.sizes.iter().map(|&b| b as u64));
        let warm_for = Duration::from_secs_f64(args.warmup_seconds);
        let warmup_rounds = rdu_collective::warm_up(&comm, reduce, warm_len, warm_for, || false).await?;
        for &bytes in &args.sizes {
            let elems = bytes / 4;
            let mut buf = vec![(rank + 1) as f32; elems];
            let iters = iters_for(args, bytes);
            for _ in 0..args.warmup {
                comm.all_reduce_sum(&mut buf, reduce).await?;
            }
            comm.barrier().await?;
            let start = Instant::now();
            for _ in 0..iters {
                comm.all_reduce_sum(&mut buf, reduce).await?;
            }
            let secs = start.elapsed().as_secs_f64() / f64::from(iters);
            comm.barrier().await?;
            let (linked_peers, shared_memory_peers) =
                (comm.linked_peers().len(), comm.shared_memory_peers().len());
            let fixed_us = if args.breakdown {
                let mut one = [rank as f32];
                comm.barrier().await?;
                let start = Instant::now();
                for _ in 0..iters {
                    comm.all_reduce_sum(&mut one, reduce).await?;
                }
                let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
                comm.barrier().await?;
                Some(us)
            } else {
                None
            };
            let footprints = RankFootprints::gather(&comm, reduce.algorithm, bytes, connect).await?;
            if rank == 0 {
                let n = f64::from(args.ranks);
                let algbw = bytes as f64 / secs / 1e9;
                let busbw = algbw * 2.0 * (n - 1.0) / n;
                let mut line = serde_json::json!({
                        "ranks": args.ranks,
                        "bytes": bytes,
                        "algorithm": reduce.algorithm.to_string(),
                        "compression": reduce.compression.to_string(),
                        "spin": spin.to_string(),
                        "data_path": data_path.to_string(),
                        "linked_peers": linked_peers,
                        "shared_memory_peers": shared_memory_peers,
                        "ranks_per_node": ranks_per_node(args),
                        "iters": iters,
                        "warmup_rounds": warmup_rounds,
                        "malloc": malloc_label(),
                        "runtime": if args.multi_thread { "multi_thread" } else { "current_thread" },
                        "time_us": (secs * 1e6 * 10.0).round() / 10.0,
                        "algbw_gbps": (algbw * 1000.0).round() / 1000.0,
                        "busbw_gbps": (busbw * 1000.0).round() / 1000.0,
                });
                if let (Some(line), serde_json::Value::Object(more)) =
                    (line.as_object_mut(), footprints.json())
                {
                    line.extend(more);
                }
                if let Some(fixed_us) = fixed_us {
                    let copies_us = breakdown::copies_us(bytes, iters);
                    line["breakdown"] =
                        breakdown::Breakdown::of(secs * 1e6, fixed_us, copies_us).json();
                }
                println!("{line}");
            }
        }
        comm.barrier().await?;
        comm.shutdown().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gather_is_as_long_as_the_timed_buffer_or_its_slots() {
        // 4 ranks × 5 values after 1 MiB: `auto` must see 1 MiB, as the timed runs did.
        assert_eq!(gather_len(20, 1 << 20) * 4, 1 << 20);
        assert_eq!(gather_len(20, 4), 20);
        assert_eq!(gather_len(20, 6) * 4, 80);
        assert_eq!(gather_len(1, 6), 2);
    }

    #[test]
    fn a_bound_rank_runs_on_one_core_of_those_allowed() {
        // On a thread of its own: the binding is the calling thread's.
        std::thread::spawn(|| {
            let allowed = rustix::thread::sched_getaffinity(None).expect("affinity");
            let cores: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&c| allowed.is_set(c))
                .collect();
            let rank = 3;
            bind_to_core(rank).expect("bound");
            let now = rustix::thread::sched_getaffinity(None).expect("affinity");
            let set: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&c| now.is_set(c))
                .collect();
            assert_eq!(set, [cores[rank as usize % cores.len()]]);
        })
        .join()
        .expect("the bound thread");
    }
}
