//! `rdujob run` end to end: real rank processes on loopback, results, bad specs, bad data, a killed rank.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// Every rank's final parameter checksum, from the merged log.
fn checksums(stderr: &str) -> Vec<(String, String)> {
    stderr
        .lines()
        .filter(|l| l.contains("parameter checksum"))
        .map(|l| {
            let rank = l.split(']').next().unwrap_or_default().to_string();
            let sum = l.split("checksum=").nth(1).unwrap_or_default().to_string();
            (rank, sum)
        })
        .collect()
}

/// `rdujob run FILE` as a person runs it (no RUST_LOG), with `extra` arguments; stderr is not a terminal.
fn run_quiet(spec: &str, extra: &[&str]) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), spec);
    let child = Command::new(RDUJOB)
        .arg("run")
        .arg(&path)
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish_streaming(child)
}

#[test]
fn without_v_a_run_shows_a_header_progress_lines_warnings_and_the_result_only() {
    // No held-out samples: every rank warns, and the warning must show.
    let spec = SMALL.replace("seed: 3}", "seed: 3, testFraction: 0.0}");
    let f = run_quiet(&spec, &[]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let lines: Vec<&str> = f.stderr.lines().collect();
    assert!(
        lines[0].starts_with("[rdujob] job t (train): 3 rank(s) × 2 tile(s)"),
        "{}",
        f.stderr
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[rdujob] model ffn-logreg [16], data synthetic")),
        "{}",
        f.stderr
    );
    let progress: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with("[rdujob] step "))
        .collect();
    assert!(
        progress.iter().any(|l| l.contains("step 39/39 (100%)")),
        "{}",
        f.stderr
    );
    assert!(
        !lines.iter().any(|l| l.contains("epoch done")),
        "no INFO lines without -v:\n{}",
        f.stderr
    );
    for rank in 0..3 {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("[rank {rank}]"))
                    && l.contains("WARN")
                    && l.contains("no held-out samples")),
            "rank {rank}'s warning:\n{}",
            f.stderr
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[rdujob] test accuracy ")),
        "{}",
        f.stderr
    );
    assert_eq!(
        result_json(&f)["globalSteps"],
        39,
        "600 samples over 3 ranks, 13 batches of 16 each, 3 epochs"
    );

    let verbose = run_quiet(SMALL, &["-v"]);
    assert_eq!(verbose.code, Some(0), "{}", verbose.stderr);
    let epoch_lines = verbose
        .stderr
        .lines()
        .filter(|l| l.contains("epoch done"))
        .count();
    assert_eq!(
        epoch_lines, 9,
        "3 ranks x 3 epochs with -v:\n{}",
        verbose.stderr
    );
    assert!(
        !verbose.stderr.contains("[rdujob] step "),
        "no progress line with -v"
    );
}

#[test]
fn a_two_rank_synthetic_job_succeeds_with_the_result_json() {
    let f = run_job(SMALL, &["--workers", "2"]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let result = result_json(&f);
    for key in [
        "finalLoss",
        "testAccuracy",
        "samplesPerSecond",
        "trainSeconds",
        "globalSteps",
    ] {
        assert!(result.get(key).is_some(), "{key} missing: {result}");
    }
    assert!(result["testAccuracy"].as_f64().unwrap() > 0.9, "{result}");
    // 480 training samples / 2 ranks / 16 per batch = 15 steps per epoch.
    assert_eq!(result["globalSteps"], 45);
    assert!(f.stderr.contains("[rank 0] ") && f.stderr.contains("[rank 1] "));
    assert!(
        !f.stderr.contains("[rank 2] "),
        "--workers 2 must override workers: 3"
    );
    assert!(
        f.stderr.contains("inner train loop time : "),
        "{}",
        f.stderr
    );
    let sums = checksums(&f.stderr);
    assert_eq!(sums.len(), 2, "{}", f.stderr);
    assert_eq!(sums[0].1, sums[1].1, "replicas diverged: {sums:?}");
}

#[test]
fn reduce_through_the_host_trains_too() {
    let spec = SMALL.replace(
        "{timeoutSeconds: 20}",
        "{timeoutSeconds: 20, reduceOnRdu: false}",
    );
    let f = run_job(&spec, &[]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert!(f.stderr.contains("algorithm=star"), "{}", f.stderr);
    assert!(result_json(&f)["testAccuracy"].as_f64().unwrap() > 0.9);
    let sums = checksums(&f.stderr);
    assert_eq!(sums.len(), 3);
    assert!(sums.iter().all(|s| s.1 == sums[0].1), "{sums:?}");
}

/// examples/digits.yaml with its data path made absolute and `dataParallel.compression` set.
fn digits_with_compression(dir: &Path, compression: &str) -> std::path::PathBuf {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let text = std::fs::read_to_string(examples.join("digits.yaml")).unwrap();
    let data = examples.join("data/digits.csv.gz");
    let text = text
        .replace(
            "path: data/digits.csv.gz",
            &format!("path: {}", data.display()),
        )
        .replace(
            "  dataParallel:\n",
            &format!("  dataParallel:\n    compression: {compression}\n"),
        );
    assert!(
        text.contains("compression: "),
        "digits.yaml has no dataParallel"
    );
    let path = dir.join(format!("digits-{compression}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn compressed_gradients_keep_the_digits_accuracy_and_every_replica_identical() {
    let dir = tempfile::tempdir().unwrap();
    let mut accuracy = Vec::new();
    for compression in ["none", "bf16", "fp16"] {
        let path = digits_with_compression(dir.path(), compression);
        let f = run(&["run", path.to_str().unwrap()]);
        assert_eq!(f.code, Some(0), "{compression}: {}", f.stderr);
        assert!(
            f.stderr.contains(&format!("compression={compression}")),
            "{}",
            f.stderr
        );
        let sums = checksums(&f.stderr);
        assert_eq!(sums.len(), 4, "{}", f.stderr);
        assert!(
            sums.iter().all(|s| s.1 == sums[0].1),
            "{compression}: replicas diverged: {sums:?}"
        );
        accuracy.push(result_json(&f)["testAccuracy"].as_f64().unwrap());
    }
    for (compression, a) in ["bf16", "fp16"].iter().zip(&accuracy[1..]) {
        assert!(
            (a - accuracy[0]).abs() <= 0.005,
            "{compression}: accuracy {a} is more than 0.5 points from {}",
            accuracy[0]
        );
    }
}

#[test]
fn a_checkpoint_claim_template_is_ignored_locally_and_said_so() {
    let spec = format!(
        "{SMALL}  checkpoint: {{intervalSteps: 10, keep: 2, volumeClaimTemplate: \
         {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}}}\n"
    );
    let f = run_job(&spec, &[]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert!(
        f.stderr
            .contains("spec.checkpoint.volumeClaimTemplate is for clusters"),
        "{}",
        f.stderr
    );
    assert_eq!(result_json(&f)["globalSteps"], 30);
}

#[test]
fn bad_specs_exit_64_naming_the_field() {
    let cases = [
        (SMALL.replace("workers: 3", "workers: 0"), "spec.workers"),
        (
            SMALL.replace("tilesPerWorker: 2", "tilesPerWorker: 3"),
            "spec.tilesPerWorker",
        ),
        (
            SMALL.replace(
                "{source: synthetic, samples: 600, seed: 3}",
                "{source: csv}",
            ),
            "spec.data.path",
        ),
        (
            SMALL.replace("optimizer: adam", "optimizer: rmsprop"),
            "optimizer",
        ),
        (
            SMALL.replace("learningRate: 0.01", "learningRate: 0"),
            "spec.training.learningRate",
        ),
        (
            SMALL.replace(
                "{timeoutSeconds: 20}",
                "{timeoutSeconds: 20, compression: int8}",
            ),
            "spec.dataParallel.compression",
        ),
        (
            format!(
                "{SMALL}  mode: allReduceBenchmark\n  allReduceBenchmark: {{sizes: [4Ki, '3']}}\n"
            ),
            "spec.allReduceBenchmark.sizes entries must be a number of bytes",
        ),
        (
            SMALL.replace("optimizer: adam", "optimizer: adam, minThroughput: 10")
                + "  mode: allReduceBenchmark\n",
            "spec.training.minThroughput is a training throughput",
        ),
    ];
    for (spec, field) in cases {
        let f = run_job(&spec, &[]);
        assert_eq!(f.code, Some(64), "{field}: {}", f.stderr);
        assert!(
            f.stderr.contains(field),
            "{field} not named in: {}",
            f.stderr
        );
        assert!(
            !f.stderr.contains("[rank "),
            "no rank may start for a bad spec"
        );
    }
}

#[test]
fn a_missing_data_file_exits_65_naming_the_file() {
    let spec = SMALL.replace(
        "{source: synthetic, samples: 600, seed: 3}",
        "{source: csv, path: data/nope.csv.gz}",
    );
    let f = run_job(&spec, &[]);
    assert_eq!(f.code, Some(65), "{}", f.stderr);
    assert!(f.stderr.contains("nope.csv.gz"), "{}", f.stderr);
}

#[test]
fn a_missing_job_file_exits_64() {
    let f = run(&["run", "/nonexistent/job.yaml"]);
    assert_eq!(f.code, Some(64), "{}", f.stderr);
    assert!(f.stderr.contains("/nonexistent/job.yaml"));
}

/// Starts the long job, SIGKILLs rank 1 once it logged its first epoch, and returns the end.
fn run_and_kill_rank_1(backoff_limit: u32) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), &long_job(backoff_limit));
    let mut child = spawn(&["run", path.to_str().unwrap()]);
    let lines = stream_lines(&mut child);
    let seen = wait_for_first_epoch(&lines);
    let pid = rank_pid(child.id(), 1).expect("rank 1's process");
    // SAFETY: kill(2) on a pid that is our grandchild and still running.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    finish(child, lines, seen)
}

#[test]
fn a_killed_rank_makes_the_others_exit_75_and_the_gang_restarts_from_the_checkpoint() {
    let f = run_and_kill_rank_1(1);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    assert!(
        f.stderr.contains("rank 1 ended with signal 9"),
        "{}",
        f.stderr
    );
    for rank in [0, 2] {
        assert!(
            f.stderr
                .contains(&format!("rank {rank} ended with exit code 75")),
            "rank {rank} must exit 75 on its own: {}",
            f.stderr
        );
    }
    assert!(
        f.stderr.contains("restarting the gang: generation 1"),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains("resumed from checkpoint"), "{}", f.stderr);
    let result = result_json(&f);
    assert_eq!(result["globalSteps"], 40 * 1600u64.div_ceil(8));
}

#[test]
fn past_the_backoff_limit_a_killed_rank_fails_the_job() {
    let f = run_and_kill_rank_1(0);
    assert_eq!(f.code, Some(128 + 9), "{}", f.stderr);
    assert!(
        f.stderr
            .contains("job t failed: rank 1 ended with signal 9"),
        "{}",
        f.stderr
    );
    assert!(!f.stderr.contains("restarting the gang"), "{}", f.stderr);
}

#[test]
fn sigterm_is_forwarded_to_every_rank_and_nothing_is_left_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), &long_job(3));
    let mut child = spawn(&["run", path.to_str().unwrap()]);
    let lines = stream_lines(&mut child);
    let seen = wait_for_first_epoch(&lines);
    let parent = child.id();
    let ranks: Vec<i32> = (0..3).filter_map(|r| rank_pid(parent, r)).collect();
    assert_eq!(ranks.len(), 3);
    // SAFETY: kill(2) on our own child, still running.
    assert_eq!(unsafe { libc::kill(parent as i32, libc::SIGTERM) }, 0);
    let f = finish(child, lines, seen);
    assert_eq!(f.code, Some(128 + 15), "{}", f.stderr);
    assert!(f.stderr.contains("stopped by signal 15"), "{}", f.stderr);
    assert!(!f.stderr.contains("restarting the gang"), "{}", f.stderr);
    for pid in ranks {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
        });
        assert!(!alive, "rank process {pid} outlived rdujob");
    }
}

#[test]
fn tilestat_without_a_device_plugin_fails_clearly() {
    let f = run(&["tilestat", "http://127.0.0.1:1/status"]);
    assert_eq!(f.code, Some(1), "{}", f.stderr);
    assert!(f.stderr.contains("127.0.0.1:1"), "{}", f.stderr);
}

#[test]
fn a_hung_rank_makes_the_others_exit_75_after_the_timeout_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), &long_job_with_timeout(0, 4));
    let mut child = spawn(&["run", path.to_str().unwrap()]);
    let lines = stream_lines(&mut child);
    let seen = wait_for_first_epoch(&lines);
    let pid = rank_pid(child.id(), 1).expect("rank 1's process");
    // SAFETY: kill(2) on our grandchild, still running.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let f = finish(child, lines, seen);
    // The hung rank is the cause, not its peers that gave up on it: local mode kills it after the failure grace
    // and blames that kill, the surest end (the operator deletes the generation at once, so a pod that ends on
    // its deletion is never evidence there). The job ends with its SIGKILL, 128 + 9.
    assert_eq!(f.code, Some(137), "{}", f.stderr);
    assert!(
        f.stderr
            .contains("job t failed: rank 1 ended with signal 9"),
        "{}",
        f.stderr
    );
    for rank in [0, 2] {
        assert!(
            f.stderr
                .contains(&format!("rank {rank} ended with exit code 75")),
            "rank {rank} must give up on its own: {}",
            f.stderr
        );
    }
    assert!(
        f.stderr
            .contains("rank 1 still running after the grace period: killing it"),
        "{}",
        f.stderr
    );
}

/// The last epoch's `loss=` of each rank, from the merged log.
fn last_epoch_losses(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains("epoch done") && l.contains("epoch=3 "))
        .map(|l| {
            l.split("loss=")
                .nth(1)
                .unwrap_or_default()
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[test]
fn loss_on_host_logs_the_global_loss_on_every_rank_and_device_the_local_one() {
    let host = run_job(
        &SMALL.replace("optimizer: adam", "optimizer: adam, lossOn: host"),
        &[],
    );
    assert_eq!(host.code, Some(0), "{}", host.stderr);
    let losses = last_epoch_losses(&host.stderr);
    assert_eq!(losses.len(), 3, "{}", host.stderr);
    assert!(losses.iter().all(|l| *l == losses[0]), "{losses:?}");
    let device = run_job(
        &SMALL.replace("optimizer: adam", "optimizer: adam, lossOn: device"),
        &[],
    );
    assert_eq!(device.code, Some(0), "{}", device.stderr);
    let losses = last_epoch_losses(&device.stderr);
    assert_eq!(losses.len(), 3);
    assert!(
        losses.iter().any(|l| *l != losses[0]),
        "each rank logs its own shard: {losses:?}"
    );
}

#[test]
fn active_deadline_seconds_stops_the_job() {
    let spec = long_job(3).replace(
        "restartPolicy: ExitCode",
        "activeDeadlineSeconds: 1, restartPolicy: ExitCode",
    );
    let spec = spec.replace("epochs: 40", "epochs: 100000");
    let f = run_job(&spec, &[]);
    assert_eq!(f.code, Some(124), "{}", f.stderr);
    assert!(f.stderr.contains("DeadlineExceeded"), "{}", f.stderr);
    assert!(!f.stderr.contains("restarting the gang"), "{}", f.stderr);
}

#[test]
fn bench_prints_one_json_line_per_world_size_against_the_one_rank_baseline_and_independent_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_job(dir.path(), SMALL);
    let f = run(&[
        "bench",
        path.to_str().unwrap(),
        "--ranks",
        "2",
        "--repeat",
        "1",
    ]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let lines: Vec<serde_json::Value> = f
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", f.stdout);
    assert_eq!(lines[0]["ranks"], 1);
    assert_eq!(lines[0]["scaling_efficiency"], 1.0);
    assert_eq!(lines[1]["ranks"], 2);
    assert!(lines[1]["samples_per_sec"].as_f64().unwrap() > 0.0);
    assert!(lines[1]["scaling_efficiency"].as_f64().unwrap() > 0.0);
    // Beside two 1-rank jobs run at once, once per repeat.
    let versus = &lines[1]["vs_independent_jobs"];
    assert_eq!(
        versus["rounds"].as_array().map(Vec::len),
        Some(1),
        "{versus}"
    );
    let round = &versus["rounds"][0];
    assert!(
        round["independent_samples_per_sec"].as_f64().unwrap() > 0.0,
        "{round}"
    );
    assert_eq!(versus["median_ratio"], round["ratio"]);
    assert!(
        lines[0].get("vs_independent_jobs").is_none(),
        "1 rank has nothing to compare"
    );
}

#[test]
fn a_compiled_pef_runs_and_a_mismatching_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SMALL.replace("workers: 3", "workers: 2\n  compile: {minWorldSize: 2}");
    let path = write_job(dir.path(), &spec);
    let pef = dir.path().join("small.pef");
    let f = run(&[
        "compile",
        path.to_str().unwrap(),
        "--out",
        pef.to_str().unwrap(),
    ]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    std::fs::write(&path, job_yaml(&format!("{spec}  pef: small.pef\n"))).unwrap();
    let ok = run(&["run", path.to_str().unwrap()]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(
        ok.stderr.contains("running the compiled PEF"),
        "{}",
        ok.stderr
    );
    let other_tiles = spec.replace("tilesPerWorker: 2", "tilesPerWorker: 4");
    std::fs::write(&path, job_yaml(&format!("{other_tiles}  pef: small.pef\n"))).unwrap();
    let refused = run(&["run", path.to_str().unwrap()]);
    assert_eq!(refused.code, Some(64), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("spec.tilesPerWorker"),
        "{}",
        refused.stderr
    );
}

#[test]
fn the_seeds_run_modes_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let ckpt_arg = checkpoints.to_str().unwrap();
    // 480 training samples over 3 ranks: 10 steps per epoch, 30 in all; the newest checkpoint is the end.
    let spec = format!("{SMALL}  checkpoint: {{intervalSteps: 10, keep: 1}}\n");
    let trained = run_quiet(&spec, &["--checkpoint-dir", ckpt_arg]);
    assert_eq!(trained.code, Some(0), "{}", trained.stderr);
    assert!(
        std::fs::read_dir(&checkpoints).unwrap().count() > 0,
        "checkpoints kept"
    );

    let inferred = run_quiet(
        &spec,
        &["--mode", "inference", "--checkpoint-dir", ckpt_arg],
    );
    assert_eq!(inferred.code, Some(0), "{}", inferred.stderr);
    let (t, i) = (result_json(&trained), result_json(&inferred));
    assert_eq!(i["mode"], "inference");
    assert_eq!(i["testAccuracy"], t["testAccuracy"], "{t} vs {i}");
    assert!(
        inferred.stderr.contains("latency p50"),
        "{}",
        inferred.stderr
    );

    // Without the kept checkpoints, inference has nothing to load.
    let nothing = run_quiet(&spec, &["--mode", "inference"]);
    assert_eq!(nothing.code, Some(64), "{}", nothing.stderr);
    assert!(
        nothing.stderr.contains("inference found no checkpoint"),
        "{}",
        nothing.stderr
    );

    let measured = run_quiet(SMALL, &["--mode", "measure-performance"]);
    assert_eq!(measured.code, Some(0), "{}", measured.stderr);
    let m = result_json(&measured);
    // training.steps unset: the default 50 timed steps.
    assert_eq!(
        (m["mode"].as_str(), m["globalSteps"].as_u64()),
        (Some("measurePerformance"), Some(50)),
        "{m}"
    );
}

#[test]
fn tensorboard_files_outlive_a_local_run_and_their_directory_is_printed() {
    let f = run_quiet(&format!("{SMALL}  tensorboard: {{}}\n"), &[]);
    assert_eq!(f.code, Some(0), "{}", f.stderr);
    let line = f
        .stderr
        .lines()
        .find(|l| l.starts_with("[rdujob] TensorBoard event files in "))
        .unwrap_or_else(|| panic!("no TensorBoard line:\n{}", f.stderr));
    let dir = line
        .trim_start_matches("[rdujob] TensorBoard event files in ")
        .split(':')
        .next()
        .unwrap_or_default();
    let dir = Path::new(dir);
    let files: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files.len() == 1 && files[0].starts_with("events.out.tfevents."),
        "{files:?}"
    );
    // The kept scratch directory is the test's to remove.
    if let Some(scratch) = dir.parent() {
        std::fs::remove_dir_all(scratch).unwrap();
    }
}

/// A spec that names a data file that does not exist: the benchmark reads no data.
const BENCHMARK: &str = "  workers: 2
  model: {name: ffn-logreg}
  data: {source: csv, path: no/such/file.csv}
  training: {epochs: 1, batchSize: 8, learningRate: 0.1}
  allReduceBenchmark: {sizes: [4Ki, 256Ki], warmupMilliseconds: 0, warmupIterations: 2, iterations: 5}
  dataParallel: {algorithm: ring}
";

#[test]
fn the_all_reduce_benchmark_prints_a_line_per_size_then_the_result_of_the_same_shape() {
    for ranks in ["2", "4"] {
        let f = run_quiet(
            BENCHMARK,
            &["--mode", "all-reduce-benchmark", "--workers", ranks],
        );
        assert_eq!(f.code, Some(0), "{ranks} ranks: {}", f.stderr);
        let result = result_json(&f);
        assert_eq!(result["mode"], "allReduceBenchmark", "{result}");
        let bench = &result["allReduce"];
        assert_eq!(bench["ranks"].as_u64(), ranks.parse().ok(), "{bench}");
        assert_eq!(
            (bench["algorithm"].as_str(), bench["iterations"].as_u64()),
            (Some("ring"), Some(5))
        );
        assert_eq!(
            bench["warmupRounds"], 0,
            "warmupMilliseconds 0 reached the ranks"
        );
        let sizes = bench["sizes"].as_array().expect("sizes");
        let lines: Vec<serde_json::Value> = f
            .stdout
            .lines()
            .filter(|l| l.starts_with(r#"{"bench""#))
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 2, "{}", f.stdout);
        for (size, line) in sizes.iter().zip(&lines) {
            let busbw = size["busbwGbps"].as_f64().expect("busbw");
            assert!(busbw > 0.0 && busbw.is_finite(), "{size}");
            assert_eq!(size["wrongValues"], 0, "{size}");
            assert_eq!(line["bytes"], size["bytes"]);
            assert_eq!(
                line["busbw_gbps"], size["busbwGbps"],
                "the line says what the result says"
            );
            assert_eq!(line["ranks"].as_u64(), ranks.parse().ok());
            assert_eq!(line["warmup_rounds"], 0);
        }
        assert_eq!(
            (sizes[0]["bytes"].as_u64(), sizes[1]["bytes"].as_u64()),
            (Some(4096), Some(256 << 10))
        );
        assert!(
            f.stderr.contains("[rdujob] all-reduce across"),
            "{}",
            f.stderr
        );
        assert!(
            !f.stderr.contains("[rank 0] {"),
            "the lines go to stdout once, not to stderr as well: {}",
            f.stderr
        );
    }
}
