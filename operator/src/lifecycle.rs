//! The job lifecycle of DESIGN 5 as a pure function: (job, observed pods, now) -> (actions, new status, events).
//!
//! Nothing here talks to the API server. Status is derived only from what was observed: a rank counts as
//! created once its pod was seen, as vanished once a pod seen before is gone or being deleted by someone else.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rdu_crds::policy::{self, RankExit, Verdict};
use rdu_crds::{
    CleanPodPolicy, JobPhase, JobResult, RankStatus, RduJob, RduJobStatus, WorkerCounts, consts,
};

use rdu_crds::consts::WORKER_CONTAINER;

mod blocked;
use blocked::Blocked;
mod refusal;
pub use refusal::{Refusal, refuse};

/// Something the reconcile must do to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ensure the Service, Secret (and PodGroup) exist, and create the pods of these ranks at this generation.
    CreatePods { generation: u32, ranks: Vec<u32> },
    /// Delete these pods (by name).
    DeletePods { names: Vec<String> },
    /// Delete the RduJob itself (ttlSecondsAfterFinished passed); children go with it by owner reference.
    DeleteJob,
}

/// A Kubernetes event to record on the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// What the reconcile must do and the status it must write.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub status: RduJobStatus,
    pub events: Vec<JobEvent>,
    /// When a timer (deadline, TTL) needs the job looked at again.
    pub requeue_after: Option<Duration>,
}

/// Condition types of DESIGN 5.
pub mod condition {
    pub const CREATED: &str = "Created";
    pub const RUNNING: &str = "Running";
    pub const RESTARTING: &str = "Restarting";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
    pub const SUSPENDED: &str = "Suspended";
    /// True while a pod of the current generation cannot start (an image that cannot be pulled, a container that
    /// cannot be created, no node that fits); the reason is the kubelet's or scheduler's. The job stays Pending:
    /// the image may appear, a node may join.
    pub const PODS_BLOCKED: &str = "PodsBlocked";
}

/// What one pod of the job is doing, read from its labels and status.
#[derive(Clone, Debug)]
struct PodView {
    name: String,
    rank: u32,
    generation: u32,
    node: Option<String>,
    /// The tiles the device plugin published on the pod (`rdu.dev/tiles`), empty until it has.
    tiles: Vec<String>,
    terminating: bool,
    state: PodState,
    /// What keeps the pod from starting, if anything.
    blocked: Option<Blocked>,
}

#[derive(Clone, Debug, PartialEq)]
enum PodState {
    Pending,
    Running { ready: bool },
    Succeeded { message: Option<String> },
    Failed(Failure),
}

/// Why a rank stopped: its exit code (lost when it had none), and the pod's or container's reason.
#[derive(Clone, Debug, PartialEq)]
struct Failure {
    exit: RankExit,
    reason: String,
}

impl PodView {
    fn from_pod(pod: &Pod) -> Option<PodView> {
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
        let state = if pod_reason.as_deref() == Some("NodeLost") {
            PodState::Failed(Failure {
                exit: RankExit::Lost,
                reason: "NodeLost".into(),
            })
        } else {
            match phase {
                "Running" => PodState::Running { ready },
                "Succeeded" => PodState::Succeeded {
                    message: terminated.and_then(|t| t.message.clone()),
                },
                "Failed" | "Unknown" => PodState::Failed(Failure {
                    exit: terminated.map_or(RankExit::Lost, |t| RankExit::Code(t.exit_code)),
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
                }),
                _ => PodState::Pending,
            }
        };
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
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            state,
            blocked: blocked::blocked(pod),
        })
    }

    fn is_active(&self) -> bool {
        matches!(self.state, PodState::Pending | PodState::Running { .. })
    }
}

/// A rank's failure as the lifecycle sees it.
#[derive(Clone, Debug)]
struct RankFailure {
    rank: u32,
    failure: Failure,
}

impl RankFailure {
    fn describe(&self) -> String {
        match self.failure.exit {
            RankExit::Code(code) => format!(
                "rank {} exited with code {code} ({})",
                self.rank, self.failure.reason
            ),
            RankExit::Signal(signal) => format!(
                "rank {} was killed by signal {signal} ({})",
                self.rank, self.failure.reason
            ),
            RankExit::Lost => format!("rank {} was lost ({})", self.rank, self.failure.reason),
        }
    }
}

/// The lifecycle step: everything the reconcile does follows from this. `pods` are the job's own (controlled by
/// it).
pub fn decide(job: &RduJob, pods: &[Pod], now: Timestamp) -> Decision {
    decide_from(job, pods, now)
}

/// [`decide`] over pods borrowed from wherever they are kept (the controller's cache shares them), none copied.
pub fn decide_from<'a>(
    job: &RduJob,
    pods: impl IntoIterator<Item = &'a Pod>,
    now: Timestamp,
) -> Decision {
    let mut step = Step {
        job,
        pods: pods.into_iter().filter_map(PodView::from_pod).collect(),
        now,
        status: job.status.clone().unwrap_or_default(),
        actions: Vec::new(),
        events: Vec::new(),
        requeue_after: None,
    };
    step.status.observed_generation = job.metadata.generation;
    step.run();
    step.status.workers = step.counts();
    step.status.ready = Some(format!(
        "{}/{}",
        step.status.workers.ready, job.spec.workers
    ));
    Decision {
        actions: step.actions,
        status: step.status,
        events: step.events,
        requeue_after: step.requeue_after,
    }
}

struct Step<'a> {
    job: &'a RduJob,
    pods: Vec<PodView>,
    now: Timestamp,
    status: RduJobStatus,
    actions: Vec<Action>,
    events: Vec<JobEvent>,
    requeue_after: Option<Duration>,
}

impl Step<'_> {
    fn run(&mut self) {
        if self.status.phase.is_some_and(JobPhase::is_finished) {
            return self.after_finish();
        }
        if self.job.spec.run_policy.suspend {
            return self.suspend();
        }
        if self.status.phase == Some(JobPhase::Suspended) {
            self.set_condition(
                condition::SUSPENDED,
                false,
                "Resumed",
                "spec.runPolicy.suspend is false: recreating the pods".into(),
            );
            self.event(false, "Resumed", "job resumed: recreating the pods".into());
            self.status.phase = Some(JobPhase::Pending);
        }
        if self.status.phase.is_none() {
            self.status.phase = Some(JobPhase::Pending);
        }
        if self.deadline_passed() {
            let limit = self
                .job
                .spec
                .run_policy
                .active_deadline_seconds
                .unwrap_or_default();
            return self.finish(
                JobPhase::Failed,
                "DeadlineExceeded",
                format!("the job ran longer than spec.runPolicy.activeDeadlineSeconds ({limit}s)"),
            );
        }
        self.delete_other_generations();
        if let Some(failure) = self.first_failure() {
            return self.handle_failure(failure);
        }
        if self.all_succeeded() {
            return self.succeed();
        }
        self.create_missing_ranks();
        self.record_ranks();
        self.update_running_phase();
        self.report_blocked_pods();
    }

    fn generation(&self) -> u32 {
        self.status.restarts
    }

    fn current(&self) -> impl Iterator<Item = &PodView> {
        let generation = self.generation();
        let workers = self.job.spec.workers;
        self.pods
            .iter()
            .filter(move |p| p.generation == generation && p.rank < workers)
    }

    fn current_rank(&self, rank: u32) -> Option<&PodView> {
        self.current().find(|p| p.rank == rank && !p.terminating)
    }

    fn counts(&self) -> WorkerCounts {
        let mut counts = WorkerCounts::default();
        for pod in self.current().filter(|p| !p.terminating) {
            match &pod.state {
                PodState::Pending => counts.active += 1,
                PodState::Running { ready } => {
                    counts.active += 1;
                    counts.ready += u32::from(*ready);
                }
                PodState::Succeeded { .. } => counts.succeeded += 1,
                PodState::Failed(_) => counts.failed += 1,
            }
        }
        counts
    }

    fn event(&mut self, warning: bool, reason: &'static str, note: String) {
        self.events.push(JobEvent {
            warning,
            reason,
            note,
        });
    }

    fn set_condition(&mut self, type_: &str, on: bool, reason: &str, message: String) {
        let status = if on { "True" } else { "False" };
        let conditions = &mut self.status.conditions;
        let now = Time(self.now);
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(existing) => {
                if existing.status != status {
                    existing.last_transition_time = now;
                }
                existing.status = status.to_string();
                existing.reason = reason.to_string();
                existing.message = message;
                existing.observed_generation = self.job.metadata.generation;
            }
            None => conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message,
                last_transition_time: now,
                observed_generation: self.job.metadata.generation,
            }),
        }
    }

    fn clear_condition(&mut self, type_: &str, reason: &str, message: &str) {
        if self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
        {
            self.set_condition(type_, false, reason, message.to_string());
        }
    }

    fn requeue_in(&mut self, seconds: i64) {
        let after = Duration::from_secs(seconds.max(1).unsigned_abs());
        self.requeue_after = Some(self.requeue_after.map_or(after, |r| r.min(after)));
    }

    fn delete(&mut self, names: Vec<String>) {
        if !names.is_empty() {
            self.actions.push(Action::DeletePods { names });
        }
    }

    /// Pods to delete under cleanPodPolicy once the job finished.
    fn clean_up_pods(&mut self) {
        let policy = self.job.spec.run_policy.clean_pod_policy;
        let names = self
            .pods
            .iter()
            .filter(|p| !p.terminating)
            .filter(|p| match policy {
                CleanPodPolicy::All => true,
                CleanPodPolicy::Running => p.is_active(),
                CleanPodPolicy::None => false,
            })
            .map(|p| p.name.clone())
            .collect();
        self.delete(names);
    }

    fn after_finish(&mut self) {
        self.clean_up_pods();
        let Some(ttl) = self.job.spec.run_policy.ttl_seconds_after_finished else {
            return;
        };
        let finished = self
            .status
            .completion_time
            .as_ref()
            .map_or(self.now, |t| t.0);
        let remaining = finished.as_second() + ttl as i64 - self.now.as_second();
        if remaining <= 0 {
            self.actions.push(Action::DeleteJob);
            self.event(
                false,
                "Deleted",
                format!("deleting the job: ttlSecondsAfterFinished ({ttl}s) passed"),
            );
        } else {
            self.requeue_in(remaining);
        }
    }

    fn suspend(&mut self) {
        let names = self
            .pods
            .iter()
            .filter(|p| !p.terminating)
            .map(|p| p.name.clone())
            .collect();
        self.delete(names);
        if self.status.phase != Some(JobPhase::Suspended) {
            self.status.phase = Some(JobPhase::Suspended);
            self.set_condition(
                condition::SUSPENDED,
                true,
                "Suspended",
                "spec.runPolicy.suspend is true: the pods are deleted".into(),
            );
            self.clear_condition(condition::RUNNING, "Suspended", "the job is suspended");
            self.clear_condition(condition::RESTARTING, "Suspended", "the job is suspended");
            self.clear_condition(condition::CREATED, "Suspended", "the job is suspended");
            self.clear_condition(condition::PODS_BLOCKED, "Suspended", "the job is suspended");
            self.event(
                false,
                "Suspended",
                "job suspended: deleting its pods".into(),
            );
        }
        self.status.start_time = None;
        self.status.ranks.clear();
    }

    fn deadline_passed(&mut self) -> bool {
        let start = self.status.start_time.get_or_insert(Time(self.now)).0;
        let Some(limit) = self.job.spec.run_policy.active_deadline_seconds else {
            return false;
        };
        let remaining = start.as_second() + limit as i64 - self.now.as_second();
        if remaining > 0 {
            self.requeue_in(remaining);
        }
        remaining <= 0
    }

    fn delete_other_generations(&mut self) {
        let generation = self.generation();
        let workers = self.job.spec.workers;
        let names = self
            .pods
            .iter()
            .filter(|p| !p.terminating && (p.generation != generation || p.rank >= workers))
            .map(|p| p.name.clone())
            .collect();
        self.delete(names);
    }

    /// The rank the failure of the current generation is blamed on (`policy::culprit`), among the ranks that
    /// failed, were lost, or vanished after they had been seen.
    fn first_failure(&self) -> Option<RankFailure> {
        let seen_before = |rank: u32| self.status.ranks.iter().any(|r| r.rank == rank);
        let failures: Vec<RankFailure> = (0..self.job.spec.workers)
            .filter_map(|rank| {
                let failed = self.current().find_map(|p| match &p.state {
                    PodState::Failed(f) if p.rank == rank => Some(f.clone()),
                    _ => None,
                });
                if let Some(failure) = failed {
                    return Some(RankFailure { rank, failure });
                }
                let pod = self.current().find(|p| p.rank == rank);
                let vanished = match pod {
                    None => seen_before(rank),
                    Some(p) => p.terminating && seen_before(rank),
                };
                vanished.then(|| RankFailure {
                    rank,
                    failure: Failure {
                        exit: RankExit::Lost,
                        reason: "PodVanished".into(),
                    },
                })
            })
            .collect();
        let (rank, _) = policy::culprit(failures.iter().map(|f| (f.rank, f.failure.exit)))?;
        failures.into_iter().find(|f| f.rank == rank)
    }

    fn handle_failure(&mut self, failed: RankFailure) {
        let policy = self.job.spec.run_policy.restart_policy;
        let limit = self.job.spec.run_policy.backoff_limit;
        let what = failed.describe();
        let restarts = self.status.restarts;
        if let Verdict::Fail(reason) =
            policy::after_failure(policy, limit, restarts, failed.failure.exit)
        {
            let message = match reason {
                policy::FailureReason::BackoffLimitExceeded => format!(
                    "{what}; the gang was already restarted {restarts} times (backoffLimit {limit})"
                ),
                _ => format!("{what}; restartPolicy {policy:?} does not restart it"),
            };
            return self.finish(JobPhase::Failed, reason.as_str(), message);
        }
        let names = self
            .current()
            .filter(|p| !p.terminating)
            .map(|p| p.name.clone())
            .collect();
        self.delete(names);
        self.status.restarts += 1;
        self.status.ranks.clear();
        self.status.phase = Some(JobPhase::Restarting);
        let message = format!(
            "{what}; restarting the gang as generation {}",
            self.status.restarts
        );
        self.set_condition(condition::RESTARTING, true, "GangRestart", message.clone());
        self.clear_condition(condition::RUNNING, "GangRestart", &message);
        self.clear_condition(condition::CREATED, "GangRestart", &message);
        self.clear_condition(condition::PODS_BLOCKED, "GangRestart", &message);
        self.event(true, "Restarting", message);
    }

    fn all_succeeded(&self) -> bool {
        (0..self.job.spec.workers).all(|rank| {
            self.current_rank(rank)
                .is_some_and(|p| matches!(p.state, PodState::Succeeded { .. }))
        })
    }

    fn succeed(&mut self) {
        let message = self.current_rank(0).and_then(|p| match &p.state {
            PodState::Succeeded { message } => message.clone(),
            _ => None,
        });
        let note = match message.as_deref().map(serde_json::from_str::<JobResult>) {
            Some(Ok(result)) => {
                let note = format!(
                    "every rank exited 0; final loss {:.4}, test accuracy {:.4}, {:.1} samples/s",
                    result.final_loss, result.test_accuracy, result.samples_per_second
                );
                self.status.result = Some(result);
                note
            }
            Some(Err(e)) => {
                format!("every rank exited 0; rank 0's termination message is not a result: {e}")
            }
            None => {
                "every rank exited 0; rank 0 left no result in its termination message".to_string()
            }
        };
        self.record_ranks();
        self.finish(JobPhase::Succeeded, "AllRanksSucceeded", note);
    }

    fn finish(&mut self, phase: JobPhase, reason: &'static str, message: String) {
        self.status.phase = Some(phase);
        self.status.completion_time = Some(Time(self.now));
        let type_ = if phase == JobPhase::Succeeded {
            condition::SUCCEEDED
        } else {
            condition::FAILED
        };
        self.set_condition(type_, true, reason, message.clone());
        self.clear_condition(condition::RUNNING, reason, &message);
        self.clear_condition(condition::RESTARTING, reason, &message);
        self.event(
            phase == JobPhase::Failed,
            if phase == JobPhase::Succeeded {
                "Succeeded"
            } else {
                "Failed"
            },
            format!("{reason}: {message}"),
        );
        self.clean_up_pods();
        if let Some(ttl) = self.job.spec.run_policy.ttl_seconds_after_finished {
            self.requeue_in(ttl as i64);
        }
    }

    fn create_missing_ranks(&mut self) {
        let occupied = |rank: u32| {
            let name = consts::pod_name(rdu_crds::job_name(self.job), rank);
            self.pods.iter().any(|p| p.name == name)
        };
        let ranks: Vec<u32> = (0..self.job.spec.workers)
            .filter(|r| !occupied(*r))
            .collect();
        if !ranks.is_empty() {
            let generation = self.generation();
            self.actions.push(Action::CreatePods { generation, ranks });
        }
    }

    /// Ranks seen running at the current generation: pod and node.
    fn record_ranks(&mut self) {
        let mut ranks: Vec<RankStatus> = self
            .current()
            .filter(|p| !p.terminating)
            .map(|p| RankStatus {
                rank: p.rank,
                pod: p.name.clone(),
                node: p.node.clone(),
                tiles: p.tiles.clone(),
            })
            .collect();
        ranks.sort_by_key(|r| r.rank);
        self.status.ranks = ranks;
    }

    fn update_running_phase(&mut self) {
        let workers = self.job.spec.workers;
        let generation = self.generation();
        let present = (0..workers)
            .filter(|r| self.current_rank(*r).is_some())
            .count() as u32;
        if present == workers && !self.condition_is(condition::CREATED) {
            self.set_condition(
                condition::CREATED,
                true,
                "PodsCreated",
                format!("all {workers} pods of generation {generation} exist"),
            );
            self.event(
                false,
                "Created",
                format!("all {workers} pods of generation {generation} exist"),
            );
        }
        let running = (0..workers).all(|r| {
            self.current_rank(r).is_some_and(|p| {
                matches!(
                    p.state,
                    PodState::Running { .. } | PodState::Succeeded { .. }
                )
            })
        });
        if running && self.status.phase != Some(JobPhase::Running) {
            self.status.phase = Some(JobPhase::Running);
            let message = format!("all {workers} ranks of generation {generation} are running");
            self.set_condition(condition::RUNNING, true, "AllRanksRunning", message.clone());
            self.clear_condition(condition::RESTARTING, "AllRanksRunning", &message);
            self.event(false, "Running", message);
        }
    }

    /// PodsBlocked from the lowest blocked rank of the current generation; a Warning event when a problem appears
    /// or changes, not on every reconcile, and a Normal one when it clears.
    fn report_blocked_pods(&mut self) {
        let mut blocked: Vec<(u32, String, Blocked)> = self
            .current()
            .filter(|p| !p.terminating && p.is_active())
            .filter_map(|p| p.blocked.clone().map(|b| (p.rank, p.name.clone(), b)))
            .collect();
        blocked.sort_by_key(|b| b.0);
        let Some((rank, pod, first)) = blocked.first() else {
            if self.condition_is(condition::PODS_BLOCKED) {
                let message = format!(
                    "no pod of generation {} is blocked any more",
                    self.generation()
                );
                self.clear_condition(condition::PODS_BLOCKED, "PodsUnblocked", &message);
                self.event(false, "PodsUnblocked", message);
            }
            return;
        };
        let container = first
            .container
            .as_ref()
            .map(|c| format!(", container {c}"))
            .unwrap_or_default();
        let mut message = format!("rank {rank}, pod {pod}{container}: {}", first.message);
        if blocked.len() > 1 {
            message.push_str(&format!(" ({} more rank(s) blocked)", blocked.len() - 1));
        }
        let reason = first.reason;
        let before = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::PODS_BLOCKED && c.status == "True")
            .map(|c| c.reason.clone());
        let news = before.is_none_or(|b| blocked::is_new_problem(&b, reason));
        self.set_condition(condition::PODS_BLOCKED, true, reason, message.clone());
        if news {
            self.event(true, reason, message);
        }
    }

    fn condition_is(&self, type_: &str) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    }
}

#[cfg(test)]
mod tests;
