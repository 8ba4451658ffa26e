//! `rdujob run` refuses a job whose ranks do not fit this machine before starting any of them
//! (exit 64, naming the flag, the estimate and the limit): by open files, and by memory.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{RDUJOB, write_job};

/// How long a refusal may take: it reads a few files and starts nothing.
const QUICK: Duration = Duration::from_secs(30);

/// Runs `rdujob` under `sh` with the open-file limit set to `open_files`.
fn rdujob_limited(open_files: u32, args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {open_files} && exec \"$0\" \"$@\""))
        .arg(RDUJOB)
        .args(args)
        .output()
        .expect("sh runs rdujob");
    (out, started.elapsed())
}

#[test]
fn five_hundred_ranks_over_the_open_file_limit_are_refused_before_any_starts() {
    let digits = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/digits.yaml");
    let (out, took) = rdujob_limited(256, &["run", digits, "--workers", "500"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(took < QUICK, "refusing took {took:?}");
    assert!(
        stderr
            .contains("--workers 500 does not fit this machine; refused before starting any rank"),
        "{stderr}"
    );
    assert!(
        stderr.contains("open files: rank 0 needs about 1561 descriptors and the launcher 1564, over the limit of 256"),
        "{stderr}"
    );
    assert!(stderr.contains("or fewer fits"), "{stderr}");
    assert!(
        !stderr.contains("generation 0"),
        "a rank was started: {stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn ranks_whose_data_cannot_fit_in_memory_are_refused_naming_spec_workers() {
    // 4e9 samples of 4096 features: 128 TiB of data per rank.
    let dir = tempfile::tempdir().unwrap();
    let job = write_job(
        dir.path(),
        "  workers: 3
  model: {name: ffn-logreg, hiddenSizes: [8], inputSize: 4096, classes: 2}
  data: {source: synthetic, samples: 4000000000}
  training: {epochs: 1, batchSize: 8, learningRate: 0.1}
",
    );
    let (out, took) = rdujob_limited(4096, &["run", job.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(took < QUICK, "refusing took {took:?}");
    assert!(
        stderr.contains("spec.workers 3 does not fit this machine"),
        "{stderr}"
    );
    assert!(
        stderr.contains("memory: 3 ranks need about ")
            && stderr.contains("this machine can give (MemAvailable"),
        "{stderr}"
    );
    assert!(stderr.contains("not even 1 rank fits"), "{stderr}");
    assert!(
        !stderr.contains("generation 0"),
        "a rank was started: {stderr}"
    );
}
