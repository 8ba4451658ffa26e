//! `rdujob bench FILE`: the job's training throughput at several world sizes, as JSON lines, against
//! a 1-rank baseline measured in the same run (scaling efficiency = samples/s ÷ (ranks × baseline)), and each
//! world size of N beside N independent 1-rank jobs run at once, round by round: on a machine whose cores the ranks
//! share, those jobs are the most N ranks can do (they share the caches and the memory bus, and nothing else), so
//! `vs_independent_jobs` is the fraction of that limit the gang reaches.

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

/// Runs the job at 1 rank and at each of `ranks` (`repeat` times each, keeping the fastest; each time of N > 1
/// ranks followed by N 1-rank runs at once) and prints one JSON line per world size; returns the exit code.
pub(crate) async fn run(path: &Path, ranks: &[u32], repeat: u32) -> Result<i32, CliError> {
    let mut sizes = vec![1u32];
    sizes.extend(ranks.iter().copied().filter(|&r| r != 1));
    let mut baseline: Option<f64> = None;
    for n in sizes {
        let mut best: Option<Measured> = None;
        // Rounds interleave the gang and the independent jobs, so both see the machine in the same state.
        let mut rounds = Vec::new();
        for _ in 0..repeat.max(1) {
            let m = run_once(path, n).await?;
            if n > 1 {
                let independent = run_independent(path, n).await?;
                rounds.push(Round {
                    gang: m.result.samples_per_second,
                    independent,
                });
            }
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
        let mut line = json!({
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
        if !rounds.is_empty() {
            line["vs_independent_jobs"] = versus_independent(&rounds);
        }
        println!("{line}");
    }
    Ok(0)
}

/// One round of a world size N: the gang's samples/s and the sum of N independent 1-rank jobs' run at once.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Round {
    gang: f64,
    independent: f64,
}

/// The rounds as JSON: each round's figures and ratio, and the median ratio.
fn versus_independent(rounds: &[Round]) -> serde_json::Value {
    let mut ratios: Vec<f64> = rounds.iter().map(|r| r.gang / r.independent).collect();
    let listed: Vec<serde_json::Value> = rounds
        .iter()
        .zip(&ratios)
        .map(|(r, ratio)| {
            json!({"gang_samples_per_sec": r.gang, "independent_samples_per_sec": r.independent,
                   "ratio": ratio})
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    json!({"rounds": listed, "median_ratio": ratios[ratios.len() / 2]})
}

/// `n` 1-rank runs of the job at once: the sum of their samples/s.
async fn run_independent(path: &Path, n: u32) -> Result<f64, CliError> {
    let runs = futures::future::try_join_all((0..n).map(|_| run_once(path, 1))).await?;
    Ok(runs.iter().map(|m| m.result.samples_per_second).sum())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_is_the_gang_over_the_independent_jobs_and_the_median_is_the_middle_round() {
        let rounds = [
            Round {
                gang: 90.0,
                independent: 100.0,
            },
            Round {
                gang: 60.0,
                independent: 100.0,
            },
            Round {
                gang: 80.0,
                independent: 100.0,
            },
        ];
        let v = versus_independent(&rounds);
        assert_eq!(v["median_ratio"], 0.8);
        assert_eq!(v["rounds"][1]["ratio"], 0.6);
        assert_eq!(v["rounds"][0]["independent_samples_per_sec"], 100.0);
    }
}
