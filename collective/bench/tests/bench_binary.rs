//! `allreduce-bench` runs its ranks as processes and prints the JSON lines its README and notes rely on:
//! one per size with nccl-tests' fields and the ratios to the TCP baselines, then the stream baseline, then a
//! ping-pong round trip per size.

use std::process::Command;

#[test]
fn the_bench_prints_a_line_per_size_and_the_tcp_baseline() {
    let out = Command::new(env!("CARGO_BIN_EXE_allreduce-bench"))
        .args(["--ranks", "3", "--sizes", "4096,65540", "--iters", "2"])
        .args(["--warmup", "1", "--baseline-bytes", "4194304"])
        .args(["--warmup-seconds", "0.05"])
        .output()
        .expect("running allreduce-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    for (line, bytes) in lines.iter().zip([4096, 65540]) {
        assert_eq!(line["ranks"], 3);
        assert_eq!(line["bytes"], bytes);
        // Rank processes on one host share memory rings with the peers they sent to: rank 0
        // with both (its ring neighbour, and both for the dissemination barrier).
        assert_eq!(line["data_path"], "auto");
        assert_eq!(line["linked_peers"], 2, "{line}");
        assert_eq!(line["shared_memory_peers"], 2, "{line}");
        // Each rank's own rings: the barrier of 3 has every rank tell the ranks 1 and 2 after it
        // (the ring's neighbour is the first of them), so every rank holds rings to both peers.
        let ring = rdu_collective::RING_SEGMENT_BYTES as u64;
        let peaks: Vec<u64> = line["ring_memory_peak_bytes"]
            .as_array()
            .expect("one per rank")
            .iter()
            .map(|v| v.as_u64().expect("bytes"))
            .collect();
        assert_eq!(peaks, [2 * ring, 2 * ring, 2 * ring], "{line}");
        assert!(line["time_us"].as_f64().is_some_and(|v| v > 0.0), "{line}");
        // The machine's warm-up ran before the first size, and all three ranks left it together.
        assert!(
            line["warmup_rounds"].as_u64().is_some_and(|r| r >= 1),
            "{line}"
        );
        // What each rank holds as the world grows: 2 links each here, and descriptors and memory.
        assert_eq!(line["links_per_rank"]["max"], 2, "{line}");
        assert!(
            line["fds_per_rank"]["max"].as_u64().is_some_and(|v| v >= 2),
            "{line}"
        );
        assert!(
            line["peak_rss_mib_per_rank"]["max"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{line}"
        );
        assert!(line["rendezvous_seconds"].as_f64().is_some(), "{line}");
        for field in [
            "algbw_gbps",
            "busbw_gbps",
            "busbw_vs_tcp",
            "time_vs_pingpong",
        ] {
            assert!(
                line[field].as_f64().is_some_and(|v| v >= 0.0),
                "{field}: {line}"
            );
        }
        // nccl-tests: busbw = algbw * 2 (n - 1) / n.
        let (alg, bus) = (
            line["algbw_gbps"].as_f64().unwrap(),
            line["busbw_gbps"].as_f64().unwrap(),
        );
        assert!(
            (bus - alg * 4.0 / 3.0).abs() <= 0.002 + bus * 0.01,
            "{line}"
        );
    }
    let baseline = &lines[2];
    assert_eq!(baseline["baseline"], "tcp_stream");
    for field in ["gbps", "gbps_before", "gbps_after"] {
        assert!(
            baseline[field].as_f64().is_some_and(|v| v > 0.0),
            "{baseline}"
        );
    }
    // The ping-pong baseline: one line per size, and each size's time is given against it.
    for (line, (size, bytes)) in lines[3..]
        .iter()
        .zip([(&lines[0], 4096), (&lines[1], 65540)])
    {
        assert_eq!(line["baseline"], "tcp_pingpong", "{line}");
        assert_eq!(line["bytes"], bytes);
        let rtt = line["rtt_us"].as_f64().expect("rtt_us");
        assert!(rtt > 0.0, "{line}");
        let ratio = size["time_vs_pingpong"].as_f64().expect("time_vs_pingpong");
        let time = size["time_us"].as_f64().expect("time_us");
        assert!(
            (ratio - time / rtt).abs() <= 0.001 + ratio * 0.01,
            "{size} vs {line}"
        );
    }
}

#[test]
fn frames_stay_on_tcp_when_asked() {
    let out = Command::new(env!("CARGO_BIN_EXE_allreduce-bench"))
        .args([
            "--ranks",
            "2",
            "--sizes",
            "4096",
            "--iters",
            "2",
            "--no-baseline",
        ])
        .args(["--data-path", "tcp"])
        .output()
        .expect("running allreduce-bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(line["data_path"], "tcp");
    assert_eq!(line["linked_peers"], 1, "{line}");
    assert_eq!(line["shared_memory_peers"], 0, "{line}");
    assert_eq!(line["ring_memory_peak_bytes"], serde_json::json!([0, 0]));
}

#[test]
fn a_size_that_is_not_whole_floats_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_allreduce-bench"))
        .args(["--ranks", "2", "--sizes", "4097"])
        .output()
        .expect("running allreduce-bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--sizes: 4097"), "{stderr}");
}

#[test]
fn a_warm_up_time_that_is_no_duration_is_refused_by_name() {
    for bad in ["-1", "NaN", "1e9"] {
        let out = Command::new(env!("CARGO_BIN_EXE_allreduce-bench"))
            .args(["--ranks", "2", "--sizes", "4096"])
            .arg(format!("--warmup-seconds={bad}"))
            .output()
            .expect("running allreduce-bench");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--warmup-seconds"), "{bad}: {stderr}");
    }
}

#[test]
fn a_breakdown_splits_each_lines_time_per_call() {
    let out = Command::new(env!("CARGO_BIN_EXE_allreduce-bench"))
        .args(["--ranks", "2", "--sizes", "4096", "--iters", "3"])
        .args(["--warmup", "1", "--no-baseline", "--breakdown"])
        .args(["--warmup-seconds", "0"])
        .output()
        .expect("running allreduce-bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line: serde_json::Value =
        serde_json::from_str(stdout.lines().next().expect("a line")).expect("JSON");
    let part = |name: &str| line["breakdown"][name].as_f64();
    // Every rank measured its fixed cost (a one-value call), rank 0 its copies.
    assert!(part("fixed_us").is_some_and(|v| v > 0.0), "{line}");
    assert!(part("copies_us").is_some_and(|v| v > 0.0), "{line}");
    assert!(part("rest_us").is_some_and(|v| v >= 0.0), "{line}");
    // `--warmup-seconds 0` reached the ranks: no warm-up round.
    assert_eq!(line["warmup_rounds"], 0, "{line}");
}
