//! Whether a local job's ranks fit this machine, checked before any is started: memory for N
//! worker processes and their shared-memory rings, and open files for the connections rank 0
//! and the launcher need. A job that does not fit is refused (exit 64) with the flag, the
//! estimate and the limit, instead of letting the kernel's OOM killer (which took the launcher
//! and other programs at `--workers 500`) or a lack of descriptors decide mid-run.

use std::fmt::Write as _;
use std::path::Path;

use rdu_collective::RING_SEGMENT_BYTES;
use rdu_crds::{DataSource, RduJobSpec};

const MIB: u64 = 1 << 20;

/// Memory of one worker process before its data and model: measured with `rdujob run
/// examples/digits.yaml` at 4 and 8 ranks (release build), sampling each rank's
/// `/proc/PID/smaps_rollup` every 10 ms: private memory (Private_Clean + Private_Dirty) peaked
/// at 1.3-3.8 MiB per rank (its RSS, 18-22 MiB, is mostly the binary's text and the rings,
/// both shared). Rounded up to 8 MiB for what a process costs the kernel outside its pages
/// (page tables, thread stacks, socket buffers).
const PROCESS_BYTES: u64 = 8 * MIB;
/// Bytes per parameter: weights, gradients, two optimizer moments and the all-reduce buckets.
const BYTES_PER_PARAMETER: u64 = 5 * 4;
/// Inputs and classes assumed when the spec leaves them to the data (an MNIST image).
const UNKNOWN_INPUTS: u64 = 784;
const UNKNOWN_CLASSES: u64 = 10;
/// The synthetic source's defaults (`rdu-worker`'s data module).
const SYNTHETIC_SAMPLES: u64 = 2048;
const SYNTHETIC_INPUTS: u64 = 32;
/// Descriptors a process holds whatever the world size: the runtime, listeners, standard
/// streams, log pipes, data and checkpoint files.
const BASE_FILES: u64 = 64;
/// Descriptors rank 0 holds per peer at most: the peer's join at the rendezvous, its data
/// stream to rank 0 and rank 0's to it (barriers and broadcasts reach every rank).
const RANK0_FILES_PER_PEER: u64 = 3;
/// Descriptors the launcher holds per rank: its stdout and stderr pipes and its process.
const LAUNCHER_FILES_PER_RANK: u64 = 3;

/// What the machine can give, read when the job starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Machine {
    /// `MemAvailable` less the quarter of `MemTotal` that rings, too, always leave.
    pub memory: u64,
    /// `MemAvailable` and `MemTotal`, to say where `memory` comes from.
    pub available: u64,
    pub total: u64,
    /// The open-file limit (RLIMIT_NOFILE, soft) the launcher and its ranks run under.
    pub open_files: u64,
}

impl Machine {
    /// Reads `/proc/meminfo` and the open-file limit; `None` where they cannot be read (then
    /// nothing is checked).
    pub(crate) fn read() -> Option<Machine> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = meminfo.lines().find(|l| l.starts_with(name))?;
            let kb = line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
            Some(kb * 1024)
        };
        let (available, total) = (field("MemAvailable:")?, field("MemTotal:")?);
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        Some(Machine {
            memory: available.saturating_sub(total / 4),
            available,
            total,
            open_files: limit.current.unwrap_or(u64::MAX),
        })
    }
}

/// What N ranks of a job need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Need {
    pub ranks: u32,
    /// One rank's process, data and model.
    pub per_rank: u64,
    pub data: u64,
    pub model: u64,
    /// Every rank's rings together.
    pub rings: u64,
    /// Rank 0's descriptors (the rank that needs most).
    pub rank0_files: u64,
    pub launcher_files: u64,
}

impl Need {
    /// Memory of all ranks and their rings.
    pub(crate) fn memory(&self) -> u64 {
        u64::from(self.ranks) * self.per_rank + self.rings
    }
}

/// What `ranks` ranks of `spec` need; data files are sized relative to `dir`, and each rank's
/// rings may hold `ring_cap` bytes.
pub(crate) fn need(spec: &RduJobSpec, ranks: u32, dir: &Path, ring_cap: u64) -> Need {
    let data = data_bytes(spec, dir);
    let model = parameters(spec) * BYTES_PER_PARAMETER;
    let n = u64::from(ranks);
    Need {
        ranks,
        per_rank: PROCESS_BYTES + data + model,
        data,
        model,
        rings: ring_bytes(n, ring_cap),
        rank0_files: BASE_FILES + RANK0_FILES_PER_PEER * n.saturating_sub(1),
        launcher_files: BASE_FILES + LAUNCHER_FILES_PER_RANK * n,
    }
}

/// The rings of `n` ranks on one host, each rank's under `cap`: rank 0 rings every peer
/// (barriers and broadcasts), every other rank its ring neighbour, rank 0 and, on 2^k ranks,
/// its log2(n) recursive-doubling partners.
fn ring_bytes(n: u64, cap: u64) -> u64 {
    if n < 2 {
        return 0;
    }
    let ring = RING_SEGMENT_BYTES as u64;
    let partners = if n.is_power_of_two() {
        u64::from(n.trailing_zeros())
    } else {
        0
    };
    let rank0 = ((n - 1) * ring).min(cap);
    let others = ((2 + partners).min(n - 1) * ring).min(cap);
    rank0 + (n - 1) * others
}

/// Memory of a rank's data: the whole set as f32, twice (loaded, then split into training and
/// test copies).
fn data_bytes(spec: &RduJobSpec, dir: &Path) -> u64 {
    let data = &spec.data;
    let file = |p: &Option<String>| p.as_deref().map_or(0, |p| unpacked_size(&dir.join(p)));
    match data.source {
        DataSource::Synthetic => {
            let samples = data.samples.map_or(SYNTHETIC_SAMPLES, u64::from);
            let inputs = spec.model.input_size.map_or(SYNTHETIC_INPUTS, u64::from);
            samples * inputs * 4 * 2
        }
        // Text: at least 2 bytes ("7,") per value, which becomes 4.
        DataSource::Csv => (file(&data.path) + file(&data.test_path)) * 2 * 2,
        // One byte per pixel, which becomes 4.
        DataSource::Idx => (file(&data.path) + file(&data.test_path)) * 4 * 2,
    }
}

/// Bytes of a file once gunzipped: a `.gz`'s size field (its last 4 bytes, the size modulo
/// 2^32), else its size; 0 if it cannot be read (the rank then says what is wrong with it).
fn unpacked_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::metadata(path) else {
        return 0;
    };
    if path.extension().is_none_or(|e| e != "gz") || meta.len() < 18 {
        return meta.len();
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut trailer = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::End(-4))?;
        f.read_exact(&mut trailer)
    });
    match read {
        Ok(()) => u64::from(u32::from_le_bytes(trailer)),
        Err(_) => meta.len(),
    }
}

/// Parameters of the model: each layer's weights and biases.
fn parameters(spec: &RduJobSpec) -> u64 {
    let model = &spec.model;
    let synthetic = spec.data.source == DataSource::Synthetic;
    let inputs = model.input_size.map_or(
        if synthetic {
            SYNTHETIC_INPUTS
        } else {
            UNKNOWN_INPUTS
        },
        u64::from,
    );
    let classes = model.classes.map_or(UNKNOWN_CLASSES, u64::from);
    let mut widths = vec![inputs];
    widths.extend(model.hidden_sizes.iter().map(|&h| u64::from(h)));
    widths.push(classes);
    widths.windows(2).map(|w| (w[0] + 1) * w[1]).sum()
}

/// Why the ranks do not fit, in one message naming `flag` (how the world size was given), the
/// estimate and the limit; `None` when they fit. `fits` is the most ranks that would fit, to
/// suggest (`None`: not even one).
pub(crate) fn refusal(
    need: &Need,
    machine: &Machine,
    flag: &str,
    fits: Option<u32>,
) -> Option<String> {
    let memory = need.memory() > machine.memory;
    let files = need.rank0_files.max(need.launcher_files) > machine.open_files;
    if !memory && !files {
        return None;
    }
    let mut text = format!(
        "{flag} {} does not fit this machine; refused before starting any rank:",
        need.ranks
    );
    if memory {
        let _ = write!(
            text,
            "\n  memory: {} ranks need about {} ({} per rank: {} for the process, {} of data, \
             {} for the model; {} of shared-memory rings), more than the {} this machine can \
             give (MemAvailable {} less a quarter of MemTotal {})",
            need.ranks,
            gib(need.memory()),
            gib(need.per_rank),
            gib(PROCESS_BYTES),
            gib(need.data),
            gib(need.model),
            gib(need.rings),
            gib(machine.memory),
            gib(machine.available),
            gib(machine.total),
        );
    }
    if files {
        let _ = write!(
            text,
            "\n  open files: rank 0 needs about {} descriptors and the launcher {}, over the \
             limit of {} (RLIMIT_NOFILE; raise it with `ulimit -n`)",
            need.rank0_files, need.launcher_files, machine.open_files
        );
    }
    match fits {
        Some(n) => {
            let _ = write!(text, "\n  {flag} {n} or fewer fits");
        }
        None => text.push_str("\n  not even 1 rank fits"),
    }
    Some(text)
}

/// The most ranks, up to `ranks`, that `need_of` says fit `machine`.
pub(crate) fn most_that_fit(
    ranks: u32,
    machine: &Machine,
    need_of: impl Fn(u32) -> Need,
) -> Option<u32> {
    let fits = |n: u32| {
        let need = need_of(n);
        need.memory() <= machine.memory
            && need.rank0_files.max(need.launcher_files) <= machine.open_files
    };
    if !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1, ranks);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / f64::from(1 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn spec(yaml_spec: &str) -> RduJobSpec {
        let yaml = format!(
            "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {{name: t}}\nspec:\n{yaml_spec}"
        );
        rdu_crds::parse_manifest(&yaml).unwrap().spec
    }

    fn mlp_bench() -> RduJobSpec {
        spec(
            "  workers: 2\n  model: {name: ffn-logreg, hiddenSizes: [512, 512], inputSize: 784, classes: 10}\n  data: {source: synthetic, samples: 66000}\n  training: {epochs: 1, batchSize: 64, learningRate: 0.01}\n",
        )
    }

    /// This machine when the numbers were measured: 24 GiB, 22 GiB available, 20000 files.
    const MACHINE: Machine = Machine {
        memory: 16 * GIB,
        available: 22 * GIB,
        total: 24 * GIB,
        open_files: 20_000,
    };

    #[test]
    fn the_estimate_counts_process_data_model_and_rings() {
        let need = need(&mlp_bench(), 2, Path::new("."), 64 * MIB);
        // 66000 samples of 784 f32, loaded then split: 414 MB; measured 390 MB private per rank.
        assert_eq!(need.data, 66_000 * 784 * 4 * 2);
        let parameters = 785 * 512 + 513 * 512 + 513 * 10;
        assert_eq!(need.model, parameters * 20);
        assert_eq!(need.per_rank, 8 * MIB + need.data + need.model);
        // Two ranks: each rings the other.
        assert_eq!(need.rings, 2 * RING_SEGMENT_BYTES as u64);
        assert_eq!((need.rank0_files, need.launcher_files), (67, 70));
    }

    #[test]
    fn rings_follow_the_algorithms_and_each_ranks_cap() {
        let ring = RING_SEGMENT_BYTES as u64;
        assert_eq!(ring_bytes(1, 64 * MIB), 0);
        // 4 ranks: rank 0 rings 3; the others a neighbour, rank 0 and 2 partners: all 3.
        assert_eq!(ring_bytes(4, 64 * MIB), 4 * 3 * ring);
        // 5 ranks (no doubling): rank 0 rings 4, the others 2 each.
        assert_eq!(ring_bytes(5, 64 * MIB), 4 * ring + 4 * 2 * ring);
        // 500 ranks: rank 0 stops at its cap.
        assert_eq!(ring_bytes(500, 64 * MIB), 64 * MIB + 499 * 2 * ring);
        assert_eq!(ring_bytes(500, 0), 0);
    }

    #[test]
    fn a_job_that_fits_passes_and_one_that_does_not_is_refused_naming_flag_estimate_and_limit() {
        let digits = need(&mlp_bench(), 2, Path::new("."), 64 * MIB);
        assert_eq!(refusal(&digits, &MACHINE, "--workers", None), None);
        // 64 ranks of the MLP bench: 64 x 416 MiB and 1 GiB of rings, 27 GiB, over 16 GiB.
        let big = need(&mlp_bench(), 64, Path::new("."), 64 * MIB);
        assert_eq!(gib(big.memory()), "27.0 GiB");
        let fits = most_that_fit(64, &MACHINE, |n| {
            need(&mlp_bench(), n, Path::new("."), 64 * MIB)
        });
        let text = refusal(&big, &MACHINE, "--workers", fits).expect("refused");
        assert!(
            text.starts_with("--workers 64 does not fit this machine"),
            "{text}"
        );
        assert!(
            text.contains("memory: 64 ranks need about 27.0 GiB (415.5 MiB per rank"),
            "{text}"
        );
        assert!(
            text.contains("more than the 16.0 GiB this machine can give"),
            "{text}"
        );
        assert!(!text.contains("open files"), "{text}");
        let n = fits.expect("some fit");
        assert!(
            text.contains(&format!("--workers {n} or fewer fits")),
            "{text}"
        );
        assert!(need(&mlp_bench(), n, Path::new("."), 64 * MIB).memory() <= MACHINE.memory);
        assert!(need(&mlp_bench(), n + 1, Path::new("."), 64 * MIB).memory() > MACHINE.memory);
    }

    #[test]
    fn five_hundred_ranks_are_refused_by_the_open_file_limit_they_would_need() {
        let small = spec(
            "  workers: 4\n  model: {name: ffn-logreg, hiddenSizes: [8]}\n  data: {source: synthetic, samples: 100}\n  training: {epochs: 1, batchSize: 8, learningRate: 0.1}\n",
        );
        let machine = Machine {
            open_files: 1024,
            ..MACHINE
        };
        let need500 = need(&small, 500, Path::new("."), 64 * MIB);
        assert_eq!(need500.rank0_files, 64 + 3 * 499);
        let fits = most_that_fit(500, &machine, |n| need(&small, n, Path::new("."), 64 * MIB));
        assert_eq!(fits, Some(320), "launcher: 64 + 3 x 320 = 1024");
        let text = refusal(&need500, &machine, "spec.workers", fits).expect("refused");
        assert!(
            text.contains("open files: rank 0 needs about 1561 descriptors and the launcher 1564, over the limit of 1024"),
            "{text}"
        );
        assert!(text.contains("spec.workers 320 or fewer fits"), "{text}");
        assert!(!text.contains("memory:"), "{text}");
        // With this machine's real limit they fit: memory is what 500 ranks of this job need.
        assert_eq!(refusal(&need500, &MACHINE, "spec.workers", None), None);
    }

    #[test]
    fn data_files_count_unpacked_and_a_gzip_by_its_size_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain.csv"), vec![b'1'; 1000]).unwrap();
        // A gzip whose trailer says 264712 bytes (the digits file's).
        let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
        gz.extend([0u8; 20]);
        gz.extend(264_712u32.to_le_bytes());
        std::fs::write(dir.path().join("digits.csv.gz"), gz).unwrap();
        assert_eq!(unpacked_size(&dir.path().join("plain.csv")), 1000);
        assert_eq!(unpacked_size(&dir.path().join("digits.csv.gz")), 264_712);
        assert_eq!(unpacked_size(&dir.path().join("missing")), 0);
        let csv = spec(
            "  workers: 2\n  model: {name: ffn-logreg, hiddenSizes: [64]}\n  data: {source: csv, path: digits.csv.gz}\n  training: {epochs: 1, batchSize: 8, learningRate: 0.1}\n",
        );
        // Measured: 1797 x 64 values, 460 KB as f32, twice: 920 KB; estimated 1.06 MB.
        assert_eq!(data_bytes(&csv, dir.path()), 264_712 * 4);
    }
}
