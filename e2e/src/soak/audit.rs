//! What the soak checks beside the jobs: the operator's reconcile errors, each explained by a fault that took
//! the API server away or by a watch that expired and was listed again (or listed as unexplained), and nothing of the jobs left once they are deleted: no
//! object in their namespace, no PersistentVolume of theirs, no worker process and no shared memory on a node.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rdu_e2e::testbed::{OPERATOR_DEPLOYMENT, SYSTEM_NAMESPACE, Testbed};
use serde_json::Value;

/// How long after the API server is back its errors still count as the fault's (the operator's requeue is 5 s,
/// its watches re-list on reconnect).
const AFTERMATH: Duration = Duration::from_secs(60);

/// The operator's log lines, gathered from the nodes' pod logs (kept on the host, so a replica killed, crashed
/// or cut off still has its lines read), and when the API server was away.
#[derive(Default)]
pub(crate) struct Audit {
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

    /// The operator's reconcile errors seen so far, each with whether a fault explains it.
    pub(crate) fn reconcile_errors(&self) -> Vec<ReconcileError> {
        self.lines
            .iter()
            .filter(|l| l.contains("reconcile failed") || l.contains("reconcile loop error"))
            .map(|line| {
                let at = line
                    .split_whitespace()
                    .next()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map(SystemTime::from);
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
