//! The `status` view, a pure function of the job and its pods: a header (phase, generation and its restarts by
//! cause, age, progress, conditions that are true), a table of ranks (pod, node, tiles, phase, restarts), how the
//! earlier generations ended, and the result.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use rdu_crds::{
    AllReduceResult, EndAction, GenerationEnd, JobResult, RduJob, TrainingProgress, byte_size,
    consts,
};

/// The whole status text.
pub fn render(job: &RduJob, pods: &[Pod], now: Timestamp) -> String {
    let status = job.status.clone().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let namespace = job.metadata.namespace.as_deref().unwrap_or("default");
    let phase = status
        .phase
        .map_or("Pending".to_string(), |p| format!("{p:?}"));
    let age = job
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or("?".to_string(), |t| {
            age_text(now.duration_since(t.0).as_secs())
        });
    let mut out = format!(
        "Job:        {namespace}/{name}\nPhase:      {phase}\nGeneration: {} (gang restarts: {} counted against backoffLimit, {} not counted)\nAge:        {age}\n",
        status.restarts, status.failure_restarts, status.disruption_restarts
    );
    if let Some(p) = &status.progress {
        out.push_str(&format!("Progress:   {}\n", progress_text(p, now)));
    }
    for c in status.conditions.iter().filter(|c| c.status == "True") {
        out.push_str(&format!(
            "Condition:  {} ({}): {}\n",
            c.type_, c.reason, c.message
        ));
    }
    out.push('\n');
    out.push_str(&rank_table(job, pods));
    let ended: Vec<&GenerationEnd> = status.history.iter().chain(&status.stopping).collect();
    if !ended.is_empty() {
        out.push_str("\nGenerations:\n");
        out.push_str(&history_table(&ended));
    }
    match status.result.as_ref().map(|r| (r, &r.all_reduce)) {
        Some((_, Some(bench))) => {
            out.push_str(&format!("\nResult:     {}", all_reduce_text(bench)));
        }
        Some((result, None)) => {
            out.push_str(&format!("\nResult:     {}\n", result_text(result)));
        }
        None => {}
    }
    out
}

/// One row per ended (or stopping) generation: when, the rank it is blamed on, its node, cause, the failure rule
/// that matched, what followed, both restart counters after it, why.
pub fn history_table(ended: &[&GenerationEnd]) -> String {
    let mut rows = vec![[
        "GEN".to_string(),
        "TIME".into(),
        "RANK".into(),
        "NODE".into(),
        "CAUSE".into(),
        "RULE".into(),
        "ACTION".into(),
        "COUNTED".into(),
        "NOT-COUNTED".into(),
        "MESSAGE".into(),
    ]];
    let or_dash = |n: Option<u32>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    for end in ended {
        let action = match end.action {
            Some(EndAction::RestartJob) => "RestartJob",
            Some(EndAction::RestartJobNotCounted) => "RestartJobNotCounted",
            Some(EndAction::FailJob) => "FailJob",
            None => "(stopping)",
        };
        rows.push([
            end.generation.to_string(),
            end.time.0.to_string(),
            end.rank.to_string(),
            end.node.clone().unwrap_or_else(|| "-".into()),
            format!("{:?}", end.cause),
            end.rule
                .as_ref()
                .map_or_else(|| "-".to_string(), ToString::to_string),
            action.to_string(),
            or_dash(end.failure_restarts),
            or_dash(end.disruption_restarts),
            end.message.clone(),
        ]);
    }
    columns(&rows)
}

/// Rows as left-aligned columns two spaces apart (the last column unpadded).
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One row per rank of the current generation: rank, pod, node, tiles, phase, restarts.
pub fn rank_table(job: &RduJob, pods: &[Pod]) -> String {
    let status = job.status.clone().unwrap_or_default();
    let generation = status.restarts.to_string();
    let mut rows = vec![[
        "RANK".to_string(),
        "POD".into(),
        "NODE".into(),
        "TILES".into(),
        "PHASE".into(),
        "RESTARTS".into(),
    ]];
    for rank in 0..job.spec.workers {
        let pod = pods.iter().find(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            labels.get(consts::LABEL_RANK) == Some(&rank.to_string())
                && labels.get(consts::LABEL_GENERATION) == Some(&generation)
        });
        let tiles = status
            .ranks
            .iter()
            .find(|r| r.rank == rank)
            .map(|r| r.tiles.join(","))
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "-".into());
        let row = match pod {
            Some(pod) => {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".into());
                let phase = match &pod.metadata.deletion_timestamp {
                    Some(_) => "Terminating".to_string(),
                    None => phase,
                };
                let restarts: i32 = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
                [
                    rank.to_string(),
                    pod.metadata.name.clone().unwrap_or_default(),
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_else(|| "-".into()),
                    tiles,
                    phase,
                    restarts.to_string(),
                ]
            }
            None => [
                rank.to_string(),
                consts::pod_name(job.metadata.name.as_deref().unwrap_or_default(), rank),
                "-".into(),
                tiles,
                "(no pod)".into(),
                "-".into(),
            ],
        };
        rows.push(row);
    }
    columns(&rows)
}

/// What `mode: allReduceBenchmark` measured: the run, then one row per size (nccl-tests' columns).
fn all_reduce_text(bench: &AllReduceResult) -> String {
    let mut rows = vec![[
        "SIZE".to_string(),
        "BYTES".into(),
        "MEDIAN(us)".into(),
        "ALGBW(GB/s)".into(),
        "BUSBW(GB/s)".into(),
        "WRONG".into(),
    ]];
    rows.extend(bench.sizes.iter().map(|t| {
        [
            byte_size::format(t.bytes),
            t.bytes.to_string(),
            format!("{:.1}", t.median_seconds * 1e6),
            format!("{:.3}", t.algbw_gbps),
            format!("{:.3}", t.busbw_gbps),
            t.wrong_values.to_string(),
        ]
    }));
    format!(
        "all-reduce across {} rank(s) on {} node(s), algorithm {}, compression {}, data path {}, {} timed \
         (median) after {} untimed\n\n{}",
        bench.ranks,
        bench.nodes,
        bench.algorithm,
        bench.compression,
        bench.data_path,
        bench.iterations,
        bench.warmup_iterations,
        columns(&rows)
    )
}

fn progress_text(p: &TrainingProgress, now: Timestamp) -> String {
    let mut text = format!(
        "{}% (step {}/{}, epoch {}/{})",
        p.percent, p.step, p.total_steps, p.epoch, p.epochs
    );
    if let Some(eta) = p.estimated_remaining_seconds {
        text.push_str(&format!(
            ", ETA {}",
            age_text(i64::try_from(eta).unwrap_or(i64::MAX))
        ));
    }
    if let Some(loss) = p.loss {
        text.push_str(&format!(", loss {loss:.4}"));
    }
    if let Some(rate) = p.samples_per_second {
        text.push_str(&format!(", {rate:.1} samples/s"));
    }
    if let Some(t) = &p.update_time {
        text.push_str(&format!(
            ", reported {} ago",
            age_text(now.duration_since(t.0).as_secs())
        ));
    }
    text
}

fn result_text(r: &JobResult) -> String {
    let mut text = format!(
        "test accuracy {:.4}, loss {:.4}, {:.1} samples/s, {} steps in {:.2} s",
        r.test_accuracy, r.final_loss, r.samples_per_second, r.global_steps, r.train_seconds
    );
    if let Some(mode) = r.mode {
        text.push_str(&format!(" ({})", mode.as_str()));
    }
    if let (Some(p50), Some(p99)) = (r.step_latency_p50_seconds, r.step_latency_p99_seconds) {
        text.push_str(&format!(
            ", latency p50 {:.3} ms p99 {:.3} ms",
            p50 * 1e3,
            p99 * 1e3
        ));
    }
    text
}

/// `42s`, `3m07s`, `2h05m`, `3d4h`.
pub fn age_text(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        s if s >= 86_400 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests;
