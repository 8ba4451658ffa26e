//! What the soak checks beside the jobs: the operator's reconcile errors, each explained by a fault that took
//! the API server away or by a watch that expired and was listed again (or listed as unexplained), and nothing of the jobs left once they are deleted: no
//! object in their namespace, no PersistentVolume of theirs, no worker process and no shared memory on a node.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::testbed::{OPERATOR_DEPLOYMENT, SYSTEM_NAMESPACE, Testbed};
use serde_json::Value;

/// How long after the API server is back its errors still count as the fault's (the operator's requeue is 5 s,
/// its watches re-list on reconnect).
const AFTERMATH: Duration = Duration::from_secs(60);

/// The operator's log lines, gathered from the nodes' pod logs (kept on the host, so a replica killed, crashed
/// or cut off still has its lines read), and when the API server was away.
pub(crate) struct Audit {
    /// Lines logged before this are not the soak's (the three-node test's own faults come first).
    since: SystemTime,
    lines: BTreeSet<String>,
    api_away: Vec<(SystemTime, SystemTime)>,
}

/// A reconcile error and whether a fault explains it.
#[derive(Debug, Clone)]
pub(crate) struct ReconcileError {
    pub(crate) line: String,
    pub(crate) explained: bool,
}

impl Audit {
    /// An audit of the lines logged from `since` on.
    pub(crate) fn since(since: SystemTime) -> Audit {
        Audit {
            since,
            lines: BTreeSet::new(),
            api_away: Vec::new(),
        }
    }

    /// Reads every operator container's log on every node into the set (lines already seen are kept once).
    pub(crate) fn gather(&mut self, bed: &Testbed) {
        let prefix = format!("{SYSTEM_NAMESPACE}_{OPERATOR_DEPLOYMENT}-");
        for node in &bed.nodes {
            let Ok(pods) = std::fs::read_dir(node.pod_logs()) else {
                continue;
            };
            for pod in pods.flatten() {
                if pod.file_name().to_string_lossy().starts_with(&prefix) {
                    read_logs(&pod.path(), &mut self.lines);
                }
            }
        }
    }

    /// The API server was away (or could be) from `from` to `to`.
    pub(crate) fn api_away(&mut self, from: SystemTime, to: SystemTime) {
        self.api_away.push((from, to));
    }

    /// The operator's reconcile errors logged since the soak began, each with whether a fault explains it (a
    /// line without a time counts as the soak's).
    pub(crate) fn reconcile_errors(&self) -> Vec<ReconcileError> {
        self.lines
            .iter()
            .filter(|l| l.contains("reconcile failed") || l.contains("reconcile loop error"))
            .map(|line| (line, line_time(line)))
            .filter(|(_, at)| at.is_none_or(|at| at >= self.since))
            .map(|(line, at)| {
                let api_away = at.is_some_and(|at| {
                    self.api_away
                        .iter()
                        .any(|(from, to)| at >= *from && at <= *to + AFTERMATH)
                });
                // A watch whose resource version the API server compacted away ends with 410 Gone; kube's
                // watcher lists again and goes on (the controller still logs the watch's error).
                let relisted = line.contains("too old resource version");
                let explained = api_away || relisted;
                ReconcileError {
                    line: line.clone(),
                    explained,
                }
            })
            .collect()
    }

    /// How many reconciles since the soak began found a write's object changed since it was read (409
    /// `Conflict`) and ran again: logged as information, not as a failure.
    pub(crate) fn conflicts_retried(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.contains(rdu_operator::CONFLICT_RETRIED))
            .filter(|l| line_time(l).is_none_or(|at| at >= self.since))
            .count()
    }
}

/// The time a log line starts with (the node's log format: RFC 3339 first).
fn line_time(line: &str) -> Option<SystemTime> {
    line.split_whitespace()
        .next()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(SystemTime::from)
}

/// Every line of the files below `dir` into `lines`.
fn read_logs(dir: &Path, lines: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            read_logs(&path, lines);
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            lines.extend(text.lines().map(str::to_string));
        }
    }
}

/// What the soak's jobs left behind: objects in `default` (pods, services but the API server's, secrets,
/// network policies, claims, Kueue workloads), PersistentVolumes named for soak jobs, worker processes and
/// shared memory on the nodes. Empty when all is gone.
pub(crate) fn leftovers(bed: &Testbed) -> Vec<String> {
    let mut left: Vec<String> = bed
        .kubectl(&[
            "get",
            "pods,services,secrets,networkpolicies,persistentvolumeclaims,workloads.kueue.x-k8s.io",
            "-n",
            "default",
            "-o",
            "name",
        ])
        .lines()
        .filter(|l| *l != "service/kubernetes")
        .map(str::to_string)
        .collect();
    let volumes: Value = serde_json::from_str(&bed.kubectl(&["get", "pv", "-o", "json"]))
        .expect("PersistentVolumes as JSON");
    left.extend(
        volumes["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["metadata"]["name"].as_str())
            .filter(|n| n.starts_with("soak-"))
            .map(|n| format!("persistentvolume/{n}")),
    );
    for node in &bed.nodes {
        left.extend(
            bed.worker_processes(node.index)
                .into_iter()
                .map(|p| format!("{}: process {p}", node.name)),
        );
        left.extend(
            bed.shm_leftovers(node.index)
                .into_iter()
                .map(|s| format!("{}: shared memory {s}", node.name)),
        );
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        SystemTime::from(text.parse::<jiff::Timestamp>().expect("a time"))
    }

    #[test]
    fn errors_are_the_soaks_and_explained_only_by_the_api_away_or_a_relist() {
        let mut audit = Audit::since(at("2026-11-28T10:00:00Z"));
        audit.api_away(at("2026-11-28T10:05:00Z"), at("2026-11-28T10:05:30Z"));
        let lines = [
            // Before the soak: the three-node test's own faults.
            "2026-11-28T09:59:59.0Z stderr F ERROR reconcile failed: connection refused",
            // While the API server was away, and within the aftermath.
            "2026-11-28T10:05:10.0Z stderr F ERROR reconcile failed: connection refused",
            "2026-11-28T10:06:29.0Z stderr F ERROR reconcile failed: 503",
            // After the aftermath.
            "2026-11-28T10:06:31.0Z stderr F ERROR reconcile failed: 500",
            // A watch that expired.
            "2026-11-28T10:20:00.0Z stderr F ERROR reconcile loop error: too old resource version: 1 (2)",
            // No time: the soak's, unexplained.
            "ERROR reconcile failed: ?",
            "2026-11-28T10:30:00.0Z stderr F INFO reconciled",
        ];
        audit.lines.extend(lines.iter().map(|l| l.to_string()));
        let mut got: Vec<(String, bool)> = audit
            .reconcile_errors()
            .into_iter()
            .map(|e| (e.line, e.explained))
            .collect();
        got.sort();
        let mut want: Vec<(String, bool)> = vec![
            (lines[1].to_string(), true),
            (lines[2].to_string(), true),
            (lines[3].to_string(), false),
            (lines[4].to_string(), true),
            (lines[5].to_string(), false),
        ];
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn conflicts_retried_are_counted_apart_from_errors_and_only_the_soaks() {
        let mut audit = Audit::since(at("2026-11-28T10:00:00Z"));
        let retried = |time: &str| {
            format!(
                "{time} stdout F {{\"level\":\"INFO\",\"fields\":{{\"message\":\"{}\"}}}}",
                rdu_operator::CONFLICT_RETRIED
            )
        };
        audit.lines.extend([
            retried("2026-11-28T09:59:59.0Z"),
            retried("2026-11-28T10:01:00.0Z"),
            retried("2026-11-28T10:02:00.0Z"),
        ]);
        assert_eq!(audit.conflicts_retried(), 2);
        assert!(audit.reconcile_errors().is_empty());
    }
}
