//! What one pod of the job is doing, read from its labels and status: its rank and generation, where it runs,
//! whether it runs, how it ended, and whether the cluster disrupted it (its `DisruptionTarget` condition).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use rdu_crds::PodConditionMatcher;
use rdu_crds::consts::{self, WORKER_CONTAINER};
use rdu_crds::failure_policy::LostReason;
use rdu_gang::RankExit;

use super::blocked::{self, Blocked};

/// The pod condition the control plane and the kubelet set on a pod they are about to take away (drain, eviction,
/// preemption, taint manager, pod garbage collection, node-pressure eviction).
pub(super) use rdu_crds::failure_policy::DISRUPTION_TARGET;

/// One pod of the job.
#[derive(Clone, Debug)]
pub(super) struct PodView {
    pub name: String,
    pub rank: u32,
    pub generation: u32,
    pub node: Option<String>,
    /// The tiles the device plugin published on the pod (`rdu.dev/tiles`), empty until it has.
    pub tiles: Vec<String>,
    pub terminating: bool,
    pub state: PodState,
    /// The reason of a true `DisruptionTarget` condition (`EvictionByEvictionAPI`, `PreemptionByScheduler`…).
    pub disruption: Option<String>,
    /// Every condition True on the pod, with its reason (what failure rules' `onPodConditions` match).
    pub conditions: Vec<PodConditionMatcher>,
    /// What keeps the pod from starting, if anything.
    pub blocked: Option<Blocked>,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum PodState {
    Pending,
    Running { ready: bool },
    Succeeded { message: Option<String> },
    Failed(Failure),
}

/// Why a rank stopped: its exit code (lost when it had none), the pod's or container's short reason (`Error`,
/// `OOMKilled`, `NodeLost`), what explains it (the worker's termination message, else that reason), and when the
/// worker container ended (when the kubelet said).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Failure {
    pub exit: RankExit,
    pub kind: String,
    pub reason: String,
    pub finished: Option<Timestamp>,
    /// The worker container's own reason for its end (`OOMKilled`, `Error`…), when it ended.
    pub container_reason: Option<String>,
}

impl PodView {
    pub(super) fn from_pod(pod: &Pod) -> Option<PodView> {
        let labels = pod.metadata.labels.as_ref()?;
        let rank = labels.get(consts::LABEL_RANK)?.parse().ok()?;
        let generation = labels.get(consts::LABEL_GENERATION)?.parse().ok()?;
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        let pod_reason = status.and_then(|s| s.reason.clone());
        let worker = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == WORKER_CONTAINER));
        let terminated = worker
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref());
        let ready = worker.is_some_and(|c| c.ready);
        let finished = terminated.and_then(|t| t.finished_at.as_ref()).map(|t| t.0);
        let node_lost = LostReason::NodeLost.as_str();
        let state = if pod_reason.as_deref() == Some(node_lost) {
            PodState::Failed(Failure {
                exit: RankExit::Lost,
                kind: node_lost.into(),
                reason: node_lost.into(),
                finished,
                container_reason: terminated.and_then(|t| t.reason.clone()),
            })
        } else {
            match phase {
                "Running" => PodState::Running { ready },
                "Succeeded" => PodState::Succeeded {
                    message: terminated.and_then(|t| t.message.clone()),
                },
                "Failed" | "Unknown" => PodState::Failed(Failure {
                    exit: terminated.map_or(RankExit::Lost, exit_of),
                    kind: pod_reason
                        .clone()
                        .or_else(|| terminated.and_then(|t| t.reason.clone()))
                        .unwrap_or_else(|| phase.to_string()),
                    // The worker writes why it failed to its termination message; the kubelet's reason
                    // (`Error`, `OOMKilled`) otherwise.
                    reason: pod_reason
                        .or_else(|| {
                            terminated
                                .and_then(|t| t.message.as_deref())
                                .map(str::trim)
                                .filter(|m| !m.is_empty())
                                .map(|m| m.chars().take(512).collect())
                        })
                        .or_else(|| terminated.and_then(|t| t.reason.clone()))
                        .unwrap_or_else(|| phase.to_string()),
                    finished,
                    container_reason: terminated.and_then(|t| t.reason.clone()),
                }),
                _ => PodState::Pending,
            }
        };
        let conditions: Vec<PodConditionMatcher> = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.status == "True")
            .map(|c| PodConditionMatcher {
                type_: c.type_.clone(),
                reason: c.reason.clone(),
            })
            .collect();
        let disruption = conditions
            .iter()
            .find(|c| c.type_ == DISRUPTION_TARGET)
            .map(|c| {
                c.reason
                    .clone()
                    .unwrap_or_else(|| DISRUPTION_TARGET.to_string())
            });
        Some(PodView {
            name: pod.metadata.name.clone()?,
            rank,
            generation,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            tiles: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(consts::TILES_ANNOTATION))
                .map(|v| tiles_of(v.as_str()))
                .unwrap_or_default(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            state,
            disruption,
            conditions,
            blocked: blocked::blocked(pod),
        })
    }

    pub(super) fn is_active(&self) -> bool {
        matches!(self.state, PodState::Pending | PodState::Running { .. })
    }

    /// The worker's exit code, if its container ended.
    pub(super) fn exit_code(&self) -> Option<i32> {
        match &self.state {
            PodState::Failed(Failure {
                exit: RankExit::Code(code),
                ..
            }) => Some(*code),
            _ => None,
        }
    }
}

/// Container reasons of a worker that never ran: the runtime could not start it (containerd's `StartError`, say
/// when containerd restarts under a starting container; Docker's `ContainerCannotRun`). Its exit code, 128, is the
/// runtime's, not the program's.
const NEVER_STARTED: [&str; 2] = ["StartError", "ContainerCannotRun"];

/// How a terminated worker ended: its exit code, or no code at all when it never started, so that
/// `restartPolicy: ExitCode` restarts it (`no-exit-code`) rather than taking the runtime's 128 for a permanent
/// exit of the program's; a rule may still match its `onContainerReasons`.
fn exit_of(terminated: &ContainerStateTerminated) -> RankExit {
    let never_started = terminated
        .reason
        .as_deref()
        .is_some_and(|r| NEVER_STARTED.contains(&r));
    if never_started {
        RankExit::Lost
    } else {
        RankExit::Code(terminated.exit_code)
    }
}

/// The tiles of a `rdu.dev/tiles` annotation: at most a rank's largest share (8), each id at most 64 bytes.
/// Anyone who may patch pods in the namespace may write it, and it is copied into the job's status.
fn tiles_of(annotation: &str) -> Vec<String> {
    const MAX_TILES: usize = 8;
    const MAX_ID_BYTES: usize = 64;
    annotation
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= MAX_ID_BYTES)
        .take(MAX_TILES)
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::tiles_of;

    #[test]
    fn a_written_tiles_annotation_is_bounded() {
        assert_eq!(tiles_of(" rdu0-t0, rdu0-t1 ,"), ["rdu0-t0", "rdu0-t1"]);
        let flood = vec!["t"; 100_000].join(",");
        assert_eq!(tiles_of(&flood).len(), 8);
        let long = "x".repeat(65);
        assert_eq!(tiles_of(&format!("{long},rdu0-t0")), ["rdu0-t0"]);
    }
}
