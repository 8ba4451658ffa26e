//! `rdujob run`: local mode (DESIGN 6). The job file, tiles from a simulated node, one process per
//! rank on 127.0.0.1, and the operator's lifecycle: the failed generation's culprit goes through the same failure
//! rules (`rdu_gang::settle`), which restart the gang within `backoffLimit` or `maxInfrastructureRestarts`, or end the
//! run with the failing rank's code. The result JSON is the last stdout line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdu_collective::RingMemory;
use rdu_crds::consts::exit_code;
use rdu_crds::rank_env::SuppliedValues;
use rdu_crds::token::new_token;
use rdu_crds::{AllReduceResult, JobResult, RduJob, RduJobSpec, RunMode};
use rdu_gang::{Backoff, Culprit, FailureReason, Next, Restarts, Ruling, Settlement, Turn};
use rdu_tiles::simulated::SimulatedNode;

use std::sync::Arc;

use crate::capacity::{self, Machine};
use crate::console::Console;
use crate::error::CliError;
use crate::gang::{self, GangOptions, GenerationOutcome};
use crate::launch::{LOCALHOST, LocalContext, rank_launches};
use crate::manifest::{self, LocalJob};
use crate::ports::free_port;

/// Tiles per simulated RDU (an SN10-8's RDU has 4).
const TILES_PER_RDU: u32 = 4;
/// The simulated node has at least this many RDUs, more when the job needs them.
const MIN_RDUS: u32 = 8;
/// Grace after the first failed rank for the others to notice and exit on their own.
const FAILURE_GRACE_EXTRA: Duration = Duration::from_secs(5);
/// Grace after a forwarded Ctrl-C/SIGTERM before the ranks are killed. A rank stops at its next step boundary
/// (a collective in flight is aborted) and rank 0 saves a checkpoint of its last step: milliseconds for the
/// examples (SIGTERM to the rank's exit took 4 ms in `local_stop`'s job), seconds for a step or a model far
/// larger than theirs.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// What the command line adds to the job file.
#[derive(Debug, Default)]
pub(crate) struct RunOptions {
    /// Override spec.workers.
    pub workers: Option<u32>,
    /// Override spec.mode.
    pub mode: Option<rdu_crds::RunMode>,
    /// Checkpoints here instead of the scratch directory.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// Every rank's every line.
    pub verbose: bool,
}

/// Runs the job in `path` to its end; returns the process exit code.
pub(crate) async fn run(path: &Path, options: RunOptions) -> Result<i32, CliError> {
    let mut run = LocalRun::prepare(path, options)?;
    let mut restarts = Restarts::default();
    // When each restart happened, in seconds from the start, for the backoff.
    let started = std::time::Instant::now();
    let mut restarted_at: Vec<i64> = Vec::new();
    for generation in 0u32.. {
        match run.generation(generation, restarts).await? {
            Then::Exit(code) => return Ok(code),
            Then::Restart(after) => {
                restarts = after;
                // A loop of restarts backs off as the operator's does (`rdu_gang::backoff`).
                let now = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
                if let Some(Backoff {
                    delay,
                    left_seconds,
                }) = rdu_gang::backoff(&restarted_at, now, now)
                {
                    run.console.note(&delay.message(generation + 1));
                    tokio::time::sleep(Duration::from_secs(left_seconds.unsigned_abs())).await;
                }
                restarted_at.push(now);
            }
        }
    }
    unreachable_generation()
}

/// What follows a generation in local mode.
enum Then {
    /// The run ends with this exit code.
    Exit(i32),
    /// The gang restarts, with these restarts counted.
    Restart(Restarts),
}

/// A local run: the job, where its files go, and the simulated node its ranks take tiles from.
struct LocalRun {
    job: RduJob,
    name: String,
    console: Arc<Console>,
    scratch: Scratch,
    checkpoint_dir: Option<PathBuf>,
    /// The checkpoints outlive the run (`--checkpoint-dir`).
    kept_checkpoints: bool,
    tensorboard_dir: Option<PathBuf>,
    node_name: String,
    node: SimulatedNode,
    opts: GangOptions,
}

impl LocalRun {
    /// Loads and checks the job, makes its scratch directory and prints the run's header.
    fn prepare(path: &Path, options: RunOptions) -> Result<Self, CliError> {
        let LocalJob { mut job, dir } = manifest::load(path, options.workers, options.mode)?;
        check_capacity(&job, &dir, options.workers.is_some())?;
        let console = Arc::new(Console::new(options.verbose));
        let name = job.metadata.name.clone().unwrap_or_default();
        if job.metadata.uid.is_none() {
            job.metadata.uid = Some(format!("local-{}", &new_token()?[..16]));
        }
        let scratch = tempfile::Builder::new()
            .prefix(&format!("rdujob-{name}-"))
            .tempdir()
            .map_err(|source| CliError::Io {
                what: "creating a scratch directory".into(),
                source,
            })?;
        let kept_checkpoints = options.checkpoint_dir.is_some();
        let checkpoint_dir = checkpoint_dir(&job, options.checkpoint_dir, scratch.path())?;
        // TensorBoard's files must outlive the run: the scratch directory is then kept.
        let tensorboard_dir = job
            .spec
            .tensorboard
            .as_ref()
            .map(|_| scratch.path().join("tensorboard"));
        let scratch = Scratch::new(scratch, tensorboard_dir.is_some());
        let opts = gang_options(&job, console.clone(), dir)?;
        for line in header(&job, scratch.path()) {
            console.note(&line);
        }
        if job
            .spec
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.volume_claim_template.is_some())
        {
            console.note(
                "spec.checkpoint.volumeClaimTemplate is for clusters; locally checkpoints go to the scratch \
                 directory, which survives gang restarts",
            );
        }
        let node = simulated_node(&job)?;
        Ok(LocalRun {
            job,
            name,
            console,
            scratch,
            checkpoint_dir,
            kept_checkpoints,
            tensorboard_dir,
            node_name: hostname(),
            node,
            opts,
        })
    }

    /// Runs generation `generation` of the gang to its end, after `restarts`, and says what follows.
    async fn generation(&mut self, generation: u32, restarts: Restarts) -> Result<Then, CliError> {
        let result_path = self
            .scratch
            .path()
            .join(format!("result-{generation}.json"));
        let (tiles, device_ids) = allocate(&mut self.node, &self.job)?;
        let ctx = LocalContext {
            // A token per generation, as on a cluster: a rank of an earlier generation cannot join this one.
            supplied: SuppliedValues {
                token: new_token()?,
                node_name: self.node_name.clone(),
                pod_ip: LOCALHOST.into(),
            },
            master_port: free_port()?,
            tiles: &tiles,
            result_path: &result_path,
            checkpoint_dir: self.checkpoint_dir.as_deref(),
            tensorboard_dir: self.tensorboard_dir.as_deref(),
            // Hang detection reads rank 0's progress lines, also with -v.
            progress_lines: !self.console.verbose()
                || self.opts.policy.progress_deadline_seconds.is_some(),
        };
        let launches = rank_launches(&self.job, generation, &ctx);
        self.console.note(&format!(
            "generation {generation}: starting {} rank(s)",
            launches.len()
        ));
        let outcome = gang::run(&launches, &self.opts, restarts).await;
        self.node.release(&device_ids);
        match outcome? {
            GenerationOutcome::Stopped { signal } => {
                self.console.note(&format!("stopped by signal {signal}"));
                if let Some(dir) = &self.checkpoint_dir {
                    self.console
                        .note(&where_checkpoints_went(dir, self.kept_checkpoints));
                }
                Ok(Then::Exit(exit_code::SIGNAL_BASE + signal))
            }
            GenerationOutcome::Turned(turn) => self.after(generation, turn, &result_path),
        }
    }

    /// What follows the generation's last turn: the job's end (with its result, or why it failed) or a restart.
    fn after(
        &self,
        generation: u32,
        turn: Turn<Culprit>,
        result_path: &Path,
    ) -> Result<Then, CliError> {
        let (console, name) = (&self.console, &self.name);
        match turn {
            Turn::DeadlineExceeded { limit } => {
                console.note(&format!(
                    "job {name} failed: {}: {}",
                    rdu_gang::DEADLINE_EXCEEDED,
                    rdu_gang::deadline_message(limit)
                ));
                Ok(Then::Exit(exit_code::DEADLINE_EXCEEDED))
            }
            Turn::Succeeded => {
                let result = read_result(result_path)?;
                console.finish();
                console.note(&format!(
                    "job {name} succeeded after {generation} restart(s)"
                ));
                print_result(console, &result, self.tensorboard_dir.as_deref()).map(Then::Exit)
            }
            Turn::Fail {
                culprit,
                ruling,
                reason,
            } => Ok(Then::Exit(failed(
                console, name, generation, &culprit, reason, &ruling,
            ))),
            Turn::Ended {
                culprit,
                settlement:
                    Settlement {
                        ruling,
                        restarts,
                        next,
                    },
                ..
            } => Ok(match next {
                Next::Restart { budget } => {
                    console.note(&format!(
                        "{}: rule {}: {:?}: restarting the gang: generation {} ({budget})",
                        gang::describe(&culprit),
                        ruling.rule,
                        ruling.action,
                        generation + 1,
                    ));
                    Then::Restart(restarts)
                }
                Next::Fail(reason) => {
                    Then::Exit(failed(console, name, generation, &culprit, reason, &ruling))
                }
            }),
            // Every rank ended, none failed and not all succeeded: a rank ended that nobody blamed (its exit was
            // the stop's doing) while no rule was broken. Nothing decides that; say so rather than loop.
            Turn::Stop { .. } | Turn::Create | Turn::Run => Err(CliError::NoVerdict {
                generation,
                turn: format!("{turn:?}"),
            }),
        }
    }
}

/// Says the job failed, blamed on `culprit` by `ruling` for `reason`; returns the run's exit code, the culprit's.
fn failed(
    console: &Console,
    name: &str,
    generation: u32,
    culprit: &Culprit,
    reason: FailureReason,
    ruling: &Ruling,
) -> i32 {
    console.finish();
    console.note(&format!(
        "job {name} failed: {} after {generation} restart(s) ({}; rule {}: {:?})",
        gang::describe(culprit),
        reason.as_str(),
        ruling.rule,
        ruling.action
    ));
    culprit.exit.as_exit_code()
}

/// Where checkpoints go: `--checkpoint-dir` (created), else the scratch directory; none when the job has no
/// `spec.checkpoint`.
fn checkpoint_dir(
    job: &RduJob,
    from_flag: Option<PathBuf>,
    scratch: &Path,
) -> Result<Option<PathBuf>, CliError> {
    Ok(match (&job.spec.checkpoint, from_flag) {
        (None, _) => None,
        (Some(_), Some(dir)) => {
            std::fs::create_dir_all(&dir).map_err(|source| CliError::Io {
                what: format!("creating --checkpoint-dir {}", dir.display()),
                source,
            })?;
            Some(dir)
        }
        (Some(_), None) => Some(scratch.join("checkpoints")),
    })
}

/// How the gang runs: this executable as every rank, in the job file's directory, with the job's graces and
/// deadlines.
fn gang_options(
    job: &RduJob,
    console: Arc<Console>,
    cwd: PathBuf,
) -> Result<GangOptions, CliError> {
    let policy = &job.spec.run_policy;
    Ok(GangOptions {
        console,
        exe: std::env::current_exe().map_err(|source| CliError::Io {
            what: "finding this executable".into(),
            source,
        })?,
        cwd,
        failure_grace: Duration::from_secs(u64::from(job.spec.data_parallel.timeout_seconds))
            + FAILURE_GRACE_EXTRA,
        stop_grace: STOP_GRACE,
        job_deadline: policy
            .active_deadline_seconds
            .map(|s| tokio::time::Instant::now() + Duration::from_secs(s)),
        progress_deadline: policy.progress_deadline_seconds.map(Duration::from_secs),
        policy: policy.clone(),
    })
}

/// What a stopped run says about its checkpoints in `dir` (`kept`: given with `--checkpoint-dir`).
fn where_checkpoints_went(dir: &Path, kept: bool) -> String {
    if kept {
        format!(
            "checkpoints are in {}: the same command resumes from the last one",
            dir.display()
        )
    } else {
        "the checkpoints went with the scratch directory: with --checkpoint-dir DIR a stopped run resumes where \
         it stopped"
            .to_string()
    }
}

/// A succeeded run's result: its summary (and where TensorBoard's files are) on the console, the benchmark's
/// lines and the result JSON as the last stdout line.
fn print_result(
    console: &Console,
    result: &JobResult,
    tensorboard_dir: Option<&Path>,
) -> Result<i32, CliError> {
    let json = serde_json::to_string(result).map_err(|source| CliError::Json {
        what: "encoding the result".into(),
        source,
    })?;
    console.note(&result_text(result));
    if let Some(dir) = tensorboard_dir {
        console.note(&format!(
            "TensorBoard event files in {}: tensorboard --logdir {}",
            dir.display(),
            dir.display()
        ));
    }
    if let Some(bench) = &result.all_reduce {
        for line in rdu_worker::benchmark_json_lines(bench) {
            println!("{line}");
        }
    }
    println!("{json}");
    Ok(exit_code::SUCCESS)
}

/// Refuses a job whose ranks do not fit this machine, before anything is started (see
/// `capacity`); `from_flag`: the world size came from `--workers`.
fn check_capacity(job: &RduJob, dir: &Path, from_flag: bool) -> Result<(), CliError> {
    let Some(machine) = Machine::read() else {
        return Ok(());
    };
    // The ranks inherit this process's environment: the same ring cap, the same data path.
    let rings_off = std::env::var(rdu_crds::consts::env::DATA_PATH)
        .is_ok_and(|path| !path.trim().eq_ignore_ascii_case("auto"));
    let ring_cap = if rings_off {
        0
    } else {
        RingMemory::FromEnv.resolve()?
    };
    let need_of = |ranks| capacity::need(&job.spec, ranks, dir, ring_cap);
    let flag = if from_flag {
        "--workers"
    } else {
        "spec.workers"
    };
    let workers = job.spec.workers;
    if capacity::refusal(&need_of(workers), &machine, flag, None).is_none() {
        return Ok(());
    }
    let fits = capacity::most_that_fit(workers, &machine, need_of);
    let text = capacity::refusal(&need_of(workers), &machine, flag, fits).unwrap_or_default();
    Err(CliError::Capacity(text))
}

/// The run's scratch directory: removed at the end, unless it holds files the user reads afterwards.
enum Scratch {
    Removed(tempfile::TempDir),
    Kept(std::path::PathBuf),
}

impl Scratch {
    fn new(dir: tempfile::TempDir, keep: bool) -> Self {
        if keep {
            Scratch::Kept(dir.keep())
        } else {
            Scratch::Removed(dir)
        }
    }

    fn path(&self) -> &Path {
        match self {
            Scratch::Removed(dir) => dir.path(),
            Scratch::Kept(path) => path,
        }
    }
}

/// The header of a local run: the job, its ranks and tiles, what the mode runs, and the scratch directory.
fn header(job: &RduJob, scratch: &Path) -> Vec<String> {
    let spec = &job.spec;
    let name = job.metadata.name.as_deref().unwrap_or_default();
    vec![
        format!(
            "job {name} ({}): {} rank(s) × {} tile(s) on 127.0.0.1",
            spec.mode.as_str(),
            spec.workers,
            spec.tiles_per_worker
        ),
        match spec.mode {
            RunMode::AllReduceBenchmark => benchmark_line(spec),
            _ => model_line(spec),
        },
        format!("scratch {} (rank logs: -v)", scratch.display()),
    ]
}

/// `all-reduce of [4Ki, 64Mi] after a 250 ms warm-up, 5 untimed and 20 timed each, algorithm auto, compression none`.
fn benchmark_line(spec: &RduJobSpec) -> String {
    let bench = spec.all_reduce_benchmark.clone().unwrap_or_default();
    let dp = &spec.data_parallel;
    format!(
        "all-reduce of [{}] after a {} ms warm-up, {} untimed and {} timed each, algorithm {}, compression {}",
        bench.sizes.join(", "),
        bench.warmup_milliseconds,
        bench.warmup_iterations,
        bench.iterations,
        if dp.reduce_on_rdu {
            dp.algorithm.as_str()
        } else {
            "star"
        },
        dp.compression.as_str()
    )
}

/// `model ffn-logreg [64], data csv data/digits.csv.gz, 30 epochs of batch 16 per rank`.
fn model_line(spec: &RduJobSpec) -> String {
    let data = match &spec.data.path {
        Some(path) => format!("{} {path}", spelled(&spec.data.source)),
        None => spelled(&spec.data.source),
    };
    let length = match (spec.training.steps, spec.training.epochs) {
        (Some(steps), _) => format!("{steps} steps"),
        (None, Some(epochs)) => format!("{epochs} epochs"),
        (None, None) => String::new(),
    };
    format!(
        "model {} {:?}, data {data}, {length} of batch {} per rank",
        spelled(&spec.model.name),
        spec.model.hidden_sizes,
        spec.training.batch_size
    )
}

/// A spec value as the YAML spells it (`csv`, `ffn-logreg`).
fn spelled(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// The result as a person reads it.
fn result_text(r: &JobResult) -> String {
    if let Some(bench) = &r.all_reduce {
        return benchmark_text(bench);
    }
    let mut text = match r.mode.unwrap_or_default() {
        RunMode::MeasurePerformance => format!(
            "{} timed steps in {:.2} s: {:.1} samples/s",
            r.global_steps, r.train_seconds, r.samples_per_second
        ),
        _ => format!(
            "test accuracy {:.4}, loss {:.4}, {:.1} samples/s, {} steps in {:.2} s",
            r.test_accuracy, r.final_loss, r.samples_per_second, r.global_steps, r.train_seconds
        ),
    };
    if let (Some(p50), Some(p99)) = (r.step_latency_p50_seconds, r.step_latency_p99_seconds) {
        text.push_str(&format!(
            ", latency p50 {:.3} ms p99 {:.3} ms",
            p50 * 1e3,
            p99 * 1e3
        ));
    }
    text
}

/// `all-reduce across 4 rank(s) on 1 node(s): busbw 1.234 GB/s at 64Mi (median 54.3 us at 4Ki)`.
fn benchmark_text(bench: &AllReduceResult) -> String {
    let mut text = format!(
        "all-reduce across {} rank(s) on {} node(s), data path {}",
        bench.ranks, bench.nodes, bench.data_path
    );
    if let (Some(small), Some(large)) = (bench.sizes.first(), bench.sizes.last()) {
        text.push_str(&format!(
            ": busbw {:.3} GB/s at {}, median {:.1} us at {}",
            large.busbw_gbps,
            rdu_crds::byte_size::format(large.bytes),
            small.median_seconds * 1e6,
            rdu_crds::byte_size::format(small.bytes)
        ));
    }
    let wrong: u64 = bench.sizes.iter().map(|s| s.wrong_values).sum();
    if wrong > 0 {
        text.push_str(&format!(", {wrong} wrong value(s)"));
    }
    text
}

/// The generation counter is unbounded in form but bounded by `backoffLimit` (a u32) in practice.
fn unreachable_generation() -> Result<i32, CliError> {
    Err(CliError::OutOfGenerations)
}

fn simulated_node(job: &RduJob) -> Result<SimulatedNode, CliError> {
    let needed = job.spec.workers.saturating_mul(job.spec.tiles_per_worker);
    let rdus = needed.div_ceil(TILES_PER_RDU).max(MIN_RDUS);
    SimulatedNode::new(rdus, TILES_PER_RDU).map_err(|source| CliError::SimulatedNode {
        rdus,
        tiles_per_rdu: TILES_PER_RDU,
        source,
    })
}

/// One rank's tile env (SF_RNT_TILE_AFFINITY, RDU_VISIBLE_TILES).
type TileEnv = BTreeMap<String, String>;

/// Every rank's tile env, and all device IDs to release after the generation.
fn allocate(
    node: &mut SimulatedNode,
    job: &RduJob,
) -> Result<(Vec<TileEnv>, Vec<String>), CliError> {
    let mut envs = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..job.spec.workers {
        match node.allocate(job.spec.tiles_per_worker) {
            Ok(a) => {
                ids.extend(a.device_ids);
                envs.push(a.env);
            }
            Err(e) => {
                node.release(&ids);
                return Err(CliError::Tiles(e));
            }
        }
    }
    Ok((envs, ids))
}

fn read_result(path: &Path) -> Result<JobResult, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
        what: format!("reading rank 0's result {}", path.display()),
        source,
    })?;
    serde_json::from_str(text.trim()).map_err(|source| CliError::Json {
        what: format!("decoding rank 0's result {}", path.display()),
        source,
    })
}

/// The machine's name, as NODE_NAME would be in a cluster.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_big_enough_for_the_job() {
        let yaml = "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {name: t}\nspec:\n  workers: 12\n  tilesPerWorker: 8\n  model: {name: ffn-logreg}\n  data: {source: synthetic}\n  training: {epochs: 1, batchSize: 8, learningRate: 0.1}\n";
        let job = rdu_crds::parse_manifest(yaml).unwrap();
        let mut node = simulated_node(&job).unwrap();
        let (envs, ids) = allocate(&mut node, &job).unwrap();
        assert_eq!(envs.len(), 12);
        assert_eq!(ids.len(), 96);
        assert!(envs.iter().all(|e| e.contains_key("SF_RNT_TILE_AFFINITY")));
    }
}
