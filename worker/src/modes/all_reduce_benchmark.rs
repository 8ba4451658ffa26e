//! `spec.mode: allReduceBenchmark`, nccl-tests' all_reduce_perf across a job's ranks. Every rank joins the job as
//! in training (the same rendezvous, `spec.dataParallel`'s algorithm and compression, the same data path), warms the
//! machine up (`warmupMilliseconds` of the largest size, `rdu_collective::warm_up`), then for each size of
//! `spec.allReduceBenchmark` all-reduces a buffer once to check the sum (every rank's ones add up to
//! the world size everywhere; values that do not are counted, as nccl-tests' `#wrong`), `warmupIterations` times
//! untimed, and `iterations` times each timed on its own. Rank 0 reports per size the median time and nccl-tests'
//! bandwidths (algbw = bytes / time, busbw = algbw × 2(n−1)/n, GB/s of 1e9 bytes): a JSON line in its log as each
//! size ends, with `allreduce-bench`'s keys, and all of them in `status.result.allReduce`. The model, the data and
//! the training settings are not read.

use std::time::{Duration, Instant};

use rdu_collective::{Communicator, Compression, ReduceOptions};
use rdu_crds::{AllReduceResult, AllReduceTiming, JobResult, RunMode, byte_size};

use crate::env::WorkerEnv;
use crate::error::WorkerError;
use crate::latency::percentile;
use crate::reduce::reduce_options;
use crate::session::{Mode, RankOutcome, RankSession};
use crate::stop::StopRequest;

/// The benchmark's sizes (bytes) and iterations, read from the spec before the rank joins.
#[derive(Debug)]
pub(crate) struct AllReduceBenchmark {
    sizes: Vec<u64>,
    warmup: Duration,
    warmup_iterations: u32,
    iterations: u32,
}

impl Mode for AllReduceBenchmark {
    fn prepare(env: &WorkerEnv) -> Result<Self, WorkerError> {
        let bench = env
            .contract
            .spec
            .all_reduce_benchmark
            .clone()
            .unwrap_or_default();
        let sizes = bench
            .sizes
            .iter()
            .map(|s| byte_size::parse(s))
            .collect::<Result<Vec<u64>, String>>()
            .map_err(|reason| WorkerError::config("spec.allReduceBenchmark.sizes", reason))?;
        Ok(AllReduceBenchmark {
            sizes,
            warmup: Duration::from_millis(u64::from(bench.warmup_milliseconds)),
            warmup_iterations: bench.warmup_iterations,
            iterations: bench.iterations.max(1),
        })
    }

    async fn run(self, session: RankSession<'_>) -> Result<RankOutcome, WorkerError> {
        let RankSession {
            env, comm, stop, ..
        } = session;
        let options = reduce_options(&env.contract.spec.data_parallel);
        let mut result = AllReduceResult {
            ranks: comm.world_size(),
            nodes: node_count(comm),
            algorithm: options.algorithm.to_string(),
            compression: options.compression.to_string(),
            data_path: env.data_path.to_string(),
            // Links open at first use: counted once the sizes ran.
            shared_memory_peers: 0,
            warmup_rounds: 0,
            warmup_iterations: self.warmup_iterations,
            iterations: self.iterations,
            sizes: Vec::with_capacity(self.sizes.len()),
        };
        tracing::info!(
            ranks = result.ranks,
            nodes = result.nodes,
            algorithm = %result.algorithm,
            compression = %result.compression,
            data_path = %result.data_path,
            sizes = ?self.sizes,
            "all-reduce benchmark starts"
        );
        let started = Instant::now();
        let warm_len = rdu_collective::warm_len(self.sizes.iter().copied());
        let stopping = || stop.requested().is_some();
        result.warmup_rounds =
            rdu_collective::warm_up(comm, options, warm_len, self.warmup, stopping).await?;
        stopped(stop)?;
        for &bytes in &self.sizes {
            let timing = self.time_size(comm, stop, options, bytes).await?;
            result.shared_memory_peers = comm.shared_memory_peers().len() as u32;
            if timing.wrong_values > 0 {
                tracing::warn!(
                    bytes,
                    wrong_values = timing.wrong_values,
                    "the all-reduce's sum is wrong"
                );
            }
            if env.contract.rank == 0 {
                println!("{}", json_line(&result, &timing));
            }
            result.sizes.push(timing);
        }
        let seconds = started.elapsed().as_secs_f64();
        Ok(RankOutcome {
            result: JobResult {
                train_seconds: seconds,
                global_steps: u64::from(self.iterations) * self.sizes.len() as u64,
                mode: Some(RunMode::AllReduceBenchmark),
                all_reduce: Some(result),
                ..Default::default()
            },
            checksum: None,
        })
    }
}

impl AllReduceBenchmark {
    /// One size: the checked all-reduce, the warm-up, then the timed all-reduces; their median and bandwidths.
    async fn time_size(
        &self,
        comm: &Communicator,
        stop: &StopRequest,
        options: ReduceOptions,
        bytes: u64,
    ) -> Result<AllReduceTiming, WorkerError> {
        let mut buf = vec![1.0f32; (bytes / 4) as usize];
        comm.all_reduce_sum(&mut buf, options).await?;
        let wrong_values = wrong_sums(&buf, comm.world_size(), options.compression);
        // Zeros stay zeros however often they are summed: the same work as any values, and no overflow.
        buf.fill(0.0);
        for _ in 0..self.warmup_iterations {
            stopped(stop)?;
            comm.all_reduce_sum(&mut buf, options).await?;
        }
        comm.barrier().await?;
        let mut times = Vec::with_capacity(self.iterations as usize);
        for _ in 0..self.iterations {
            stopped(stop)?;
            let started = Instant::now();
            comm.all_reduce_sum(&mut buf, options).await?;
            times.push(started.elapsed());
        }
        let median = percentile(&times, 0.5).unwrap_or_default();
        let (algbw, busbw) = bandwidths(bytes, median, comm.world_size());
        Ok(AllReduceTiming {
            bytes,
            median_seconds: significant(median),
            algbw_gbps: significant(algbw),
            busbw_gbps: significant(busbw),
            wrong_values,
        })
    }
}

fn stopped(stop: &StopRequest) -> Result<(), WorkerError> {
    match stop.requested() {
        Some(signal) => Err(WorkerError::Stopped { signal }),
        None => Ok(()),
    }
}

/// nccl-tests' bandwidths, in GB/s (1e9 bytes), of an all-reduce of `bytes` that took `seconds` on `ranks` ranks:
/// the algorithm bandwidth bytes / seconds, and the bus bandwidth algbw × 2(n−1)/n, what each rank's link carried
/// (0 for one rank, which sends nothing).
pub(crate) fn bandwidths(bytes: u64, seconds: f64, ranks: u32) -> (f64, f64) {
    let algbw = bytes as f64 / seconds.max(1e-12) / 1e9;
    let n = f64::from(ranks.max(1));
    (algbw, algbw * 2.0 * (n - 1.0) / n)
}

/// Values of `buf` (every rank's ones, summed over `ranks` ranks) that are not `ranks`: exactly, or within what
/// the wire's 16-bit values round away.
pub(crate) fn wrong_sums(buf: &[f32], ranks: u32, compression: Compression) -> u64 {
    let expected = ranks as f32;
    let tolerance = match compression {
        Compression::None => 0.0,
        _ => expected / 64.0,
    };
    buf.iter()
        .filter(|&&v| (v - expected).abs() > tolerance || v.is_nan())
        .count() as u64
}

/// Distinct nodes among the job's ranks.
fn node_count(comm: &Communicator) -> u32 {
    let mut nodes: Vec<&str> = comm.peers().iter().map(|p| p.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.len() as u32
}

/// `x` to 4 significant digits: a result that fits the termination message for every size a spec may list.
fn significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// One size's line in rank 0's log and on `rdujob run`'s stdout, with `allreduce-bench`'s keys (and its
/// `time_us`) so that the three outputs compare line by line.
#[derive(serde::Serialize)]
struct Line<'a> {
    bench: &'static str,
    ranks: u32,
    nodes: u32,
    bytes: u64,
    size: String,
    algorithm: &'a str,
    compression: &'a str,
    data_path: &'a str,
    shared_memory_peers: u32,
    warmup_rounds: u32,
    iters: u32,
    time_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    wrong: u64,
}

/// [`Line`] of `timing` in `run`, as one line of JSON.
pub(crate) fn json_line(run: &AllReduceResult, timing: &AllReduceTiming) -> String {
    let line = Line {
        bench: "all_reduce",
        ranks: run.ranks,
        nodes: run.nodes,
        bytes: timing.bytes,
        size: byte_size::format(timing.bytes),
        algorithm: &run.algorithm,
        compression: &run.compression,
        data_path: &run.data_path,
        shared_memory_peers: run.shared_memory_peers,
        warmup_rounds: run.warmup_rounds,
        iters: run.iterations,
        time_us: significant(timing.median_seconds * 1e6),
        algbw_gbps: timing.algbw_gbps,
        busbw_gbps: timing.busbw_gbps,
        wrong: timing.wrong_values,
    };
    // A struct of numbers and strings always serializes.
    serde_json::to_string(&line).unwrap_or_default()
}

/// Whether `line` is one of [`json_line`]'s.
pub fn is_json_line(line: &str) -> bool {
    line.starts_with(r#"{"bench":"all_reduce","#)
}

/// Every size's line of a result, in order.
pub fn json_lines(run: &AllReduceResult) -> Vec<String> {
    run.sizes.iter().map(|t| json_line(run, t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_is_nccl_tests_definition() {
        // 1 GB in 0.5 s: algbw 2 GB/s; busbw 2 × 2(n−1)/n.
        let table = [(1, 0.0), (2, 2.0), (4, 3.0), (8, 3.5)];
        for (ranks, busbw) in table {
            let (algbw, bus) = bandwidths(1_000_000_000, 0.5, ranks);
            assert_eq!(algbw, 2.0, "{ranks} ranks");
            assert!((bus - busbw).abs() < 1e-12, "{ranks} ranks: {bus}");
        }
        let (algbw, busbw) = bandwidths(4096, 20e-6, 2);
        assert!((algbw - 0.2048).abs() < 1e-12 && (busbw - 0.2048).abs() < 1e-12);
        let (algbw, busbw) = bandwidths(4096, 0.0, 4);
        assert!(
            algbw.is_finite() && busbw.is_finite(),
            "a zero time stays finite"
        );
    }

    #[test]
    fn a_wrong_sum_is_counted_and_compression_rounding_is_not() {
        assert_eq!(wrong_sums(&[4.0; 8], 4, Compression::None), 0);
        assert_eq!(
            wrong_sums(&[4.0, 4.0, 3.0, f32::NAN], 4, Compression::None),
            2
        );
        // 300 is not a bf16 value: the sum of 300 ones arrives as 300 rounded.
        assert_eq!(wrong_sums(&[300.0, 302.0], 300, Compression::Bf16), 0);
        assert_eq!(wrong_sums(&[2.0], 3, Compression::Fp16), 1);
    }

    #[test]
    fn values_keep_four_significant_digits() {
        assert_eq!(significant(0.000_123_456_7), 0.000_123_5);
        assert_eq!(significant(12.345_67), 12.35);
        assert_eq!(significant(0.0), 0.0);
        assert_eq!(significant(98_765.4), 98_770.0);
    }

    fn largest_result() -> AllReduceResult {
        AllReduceResult {
            ranks: 4096,
            nodes: 4096,
            algorithm: "hierarchical".into(),
            compression: "bf16".into(),
            data_path: "auto".into(),
            shared_memory_peers: 4095,
            warmup_rounds: u32::MAX,
            warmup_iterations: 1000,
            iterations: 10_000,
            sizes: (0..rdu_crds::validation::MAX_BENCHMARK_SIZES)
                .map(|_| AllReduceTiming {
                    bytes: byte_size::MAX_BYTES,
                    median_seconds: significant(0.012_345_678_9),
                    algbw_gbps: significant(21.743_219_8),
                    busbw_gbps: significant(43.475_123_4),
                    wrong_values: 67_108_864,
                })
                .collect(),
        }
    }

    #[test]
    fn the_largest_result_fits_the_termination_message() {
        let result = JobResult {
            train_seconds: 12_345.678_9,
            global_steps: 320_000,
            mode: Some(RunMode::AllReduceBenchmark),
            all_reduce: Some(largest_result()),
            ..Default::default()
        };
        let json = serde_json::to_string(&result).unwrap();
        assert!(json.len() < 4096, "{} bytes: {json}", json.len());
    }

    #[test]
    fn each_size_is_one_json_line_with_allreduce_bench_keys() {
        let run = largest_result();
        let lines = json_lines(&run);
        assert_eq!(lines.len(), run.sizes.len());
        let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        for key in [
            "ranks",
            "bytes",
            "algorithm",
            "compression",
            "data_path",
            "shared_memory_peers",
            "iters",
            "time_us",
            "algbw_gbps",
            "busbw_gbps",
        ] {
            assert!(line.get(key).is_some(), "{key} in {line}");
        }
        assert_eq!(line["bench"], "all_reduce");
        assert!(lines.iter().all(|l| is_json_line(l)), "{lines:?}");
        assert!(!is_json_line(r#"{"progress":{"step":1}}"#));
        assert_eq!(line["size"], "256Mi");
        assert_eq!(line["time_us"], 12_350.0);
    }
}
