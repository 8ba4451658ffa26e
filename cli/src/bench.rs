//! `rdujob bench FILE`: the job's training throughput at several world sizes, as JSON lines, against
//! a 1-rank baseline measured in the same run (scaling efficiency = samples/s ÷ (ranks × baseline)).

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use rdu_crds::JobResult;
use serde_json::json;
use tokio::process::Command;

use crate::error::CliError;

/// One measured world size: the best of the repeats.
#[derive(Debug, Clone)]
struct Measured {
    ranks: u32,
    result: JobResult,
    wall_seconds: f64,
}

/// Runs the job at 1 rank and at each of `ranks` (`repeat` times each, keeping the fastest) and
/// prints one JSON line per world size; returns the exit code.
pub async fn run(path: &Path, ranks: &[u32], repeat: u32) -> Result<i32, CliError> {
    let mut sizes = vec![1u32];
    sizes.extend(ranks.iter().copied().filter(|&r| r != 1));
    let mut baseline: Option<f64> = None;
    for n in sizes {
        let mut best: Option<Measured> = None;
        for _ in 0..repeat.max(1) {
            let m = run_once(path, n).await?;
            if best
                .as_ref()
                .is_none_or(|b| m.result.samples_per_second > b.result.samples_per_second)
            {
                best = Some(m);
            }
        }
        let Some(m) = best else { continue };
        let sps = m.result.samples_per_second;
        let base = *baseline.get_or_insert(sps);
        let line = json!({
            "bench": "train",
            "file": path.display().to_string(),
            "ranks": m.ranks,
            "samples_per_sec": sps,
            "train_seconds": m.result.train_seconds,
            "wall_seconds": m.wall_seconds,
            "global_steps": m.result.global_steps,
            "test_accuracy": m.result.test_accuracy,
            "scaling_efficiency": sps / (f64::from(m.ranks) * base),
            "step_phases": m.result.step_phases,
        });
        println!("{line}");
    }
    Ok(0)
}

/// `rdujob run FILE --workers n` with its logs discarded; its last stdout line is the result.
async fn run_once(path: &Path, n: u32) -> Result<Measured, CliError> {
    let exe = std::env::current_exe().map_err(|source| CliError::Io {
        what: "finding this executable".into(),
        source,
    })?;
    let started = Instant::now();
    let out = Command::new(exe)
        .arg("run")
        .arg(path)
        .arg("--workers")
        .arg(n.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .map_err(|source| CliError::Io {
            what: format!("running the job with {n} rank(s)"),
            source,
        })?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    match serde_json::from_str::<JobResult>(last) {
        Ok(result) if out.status.success() => Ok(Measured {
            ranks: n,
            result,
            wall_seconds,
        }),
        _ => Err(CliError::BenchRun {
            ranks: n,
            status: out.status,
            path: path.to_path_buf(),
        }),
    }
}
