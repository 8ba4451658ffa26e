//! The job lifecycle of DESIGN 5 as a pure function: (the validated job, observed pods, what is known of the nodes,
//! now) -> (changes, new status, events).
//!
//! Nothing here talks to the API server. Status is derived only from what was observed: a rank counts as
//! created once its pod was seen, as vanished once a pod seen before is gone or being deleted by someone else.
//! A failed generation is stopped and ended in `teardown`; a new generation is created whole, once every pod
//! name is free and (when the operator knows the nodes) the schedulable nodes have room for every rank.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use rdu_crds::{
    CleanPodPolicy, JobPhase, JobResult, RankStatus, RduJobStatus, TrainingProgress, WorkerCounts,
    consts,
};

use rdu_gang::{Deadline, RankTally, Turn};

use crate::nodes::ClusterView;
use crate::validate::ValidJob;

mod blocked;
mod hang;
mod pod_view;
mod refusal;
mod teardown;
use blocked::Blocked;
use pod_view::{PodState, PodView};
pub(crate) use refusal::{Refusal, refuse};
use teardown::RankFailure;

/// Something the reconcile must do to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Ensure the Service, Secret (and PodGroup) exist, and create the pods of these ranks at this generation.
    CreatePods { generation: u32, ranks: Vec<u32> },
    /// Delete these pods (by name).
    DeletePods { names: Vec<String> },
    /// Delete these pods with no grace period: their node is lost, so no kubelet will ever confirm a graceful
    /// deletion, and their names are needed for the next generation.
    ForceDeletePods { names: Vec<String> },
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
    pub changes: Vec<Change>,
    pub status: RduJobStatus,
    pub events: Vec<JobEvent>,
    /// When a timer (deadline, TTL) needs the job looked at again.
    pub requeue_after: Option<Duration>,
}

/// How often a job that waits for room on the nodes looks again (node changes wake it at once).
const WAIT_FOR_ROOM_SECONDS: i64 = 10;

/// Condition types of DESIGN 5.
pub(crate) mod condition {
    pub(crate) const CREATED: &str = "Created";
    pub(crate) const RUNNING: &str = "Running";
    pub(crate) const RESTARTING: &str = "Restarting";
    pub(crate) const SUCCEEDED: &str = "Succeeded";
    pub(crate) const FAILED: &str = "Failed";
    pub(crate) const SUSPENDED: &str = "Suspended";
    /// True while a pod of the current generation cannot start (an image that cannot be pulled, a container that
    /// cannot be created, no node that fits), with the kubelet's or scheduler's reason, or while the gang is not
    /// created because the schedulable nodes lack room for it (`InsufficientCapacity`). The job stays Pending:
    /// the image may appear, a node may join or come back.
    pub(crate) const PODS_BLOCKED: &str = "PodsBlocked";
    /// True while rank 0's step stood still past `progressDeadlineSeconds` but no progress report was taken since
    /// to say so (DESIGN 5.3): no hang is judged, the gang runs on.
    pub(crate) const PROGRESS_UNREPORTED: &str = "ProgressUnreported";
    /// The reason of PodsBlocked while the nodes cannot hold the whole gang.
    pub(crate) const INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
}

/// Why a job that its spec lets run must not have pods for now (a queue has not admitted it, or evicted it): the
/// job is held as suspended, its `Suspended` condition giving this reason and message.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    pub reason: &'static str,
    pub message: String,
    /// The hold is an eviction (a preemption, a timeout): counted in `status.evictions`, never as a failure.
    pub eviction: bool,
}

/// The lifecycle step: everything the reconcile does follows from this. `job` is the job as validation passed it
/// on (the lifecycle reads no raw spec field); `pods` are the job's own (controlled by
/// it), borrowed from wherever they are kept (the controller's cache shares them, none copied); `cluster` is what
/// the node cache says of their nodes and of the room for a new generation; `hold`, when given, keeps the job
/// from having pods (a queue has not admitted it).
pub fn decide<'a>(
    job: &ValidJob<'_>,
    pods: impl IntoIterator<Item = &'a Pod>,
    cluster: &ClusterView,
    now: Timestamp,
    hold: Option<&Hold>,
) -> Decision {
    let mut look = Look {
        job,
        pods: pods.into_iter().filter_map(PodView::from_pod).collect(),
        cluster,
        hold,
        now,
        status: job.status.cloned().unwrap_or_default(),
        changes: Vec::new(),
        events: Vec::new(),
        requeue_after: None,
    };
    look.status.observed_generation = job.generation;
    look.run();
    look.status.workers = look.counts();
    look.status.ready = Some(format!("{}/{}", look.status.workers.ready, job.workers));
    Decision {
        changes: look.changes,
        status: look.status,
        events: look.events,
        requeue_after: look.requeue_after,
    }
}

/// One look at a job: what it is and has now, and what the look decides (the reconcile pipeline's steps are
/// `crate::step::Step`; this is the lifecycle's one).
struct Look<'a> {
    job: &'a ValidJob<'a>,
    pods: Vec<PodView>,
    cluster: &'a ClusterView,
    hold: Option<&'a Hold>,
    now: Timestamp,
    status: RduJobStatus,
    changes: Vec<Change>,
    events: Vec<JobEvent>,
    requeue_after: Option<Duration>,
}

impl Look<'_> {
    fn run(&mut self) {
        if self.status.phase.is_some_and(JobPhase::is_finished) {
            return self.after_finish();
        }
        if self.job.run_policy.suspend {
            return self.suspend(
                "Suspended",
                "spec.runPolicy.suspend is true: the pods are deleted".into(),
            );
        }
        if let Some(hold) = self.hold {
            if hold.eviction && self.status.phase != Some(JobPhase::Suspended) {
                self.status.evictions += 1;
            }
            return self.suspend(hold.reason, hold.message.clone());
        }
        if self.status.phase == Some(JobPhase::Suspended) {
            self.set_condition(
                condition::SUSPENDED,
                false,
                "Resumed",
                "the job may run (spec.runPolicy.suspend is false, and a queued job is admitted): recreating \
                 the pods"
                    .into(),
            );
            self.event(false, "Resumed", "job resumed: recreating the pods".into());
            self.status.phase = Some(JobPhase::Pending);
        }
        if self.status.phase.is_none() {
            self.status.phase = Some(JobPhase::Pending);
        }
        let turn = self.look_at_generation();
        if !matches!(turn, Turn::DeadlineExceeded { .. }) {
            self.delete_other_generations();
        }
        match turn {
            Turn::DeadlineExceeded { limit } => self.finish(
                JobPhase::Failed,
                rdu_gang::DEADLINE_EXCEEDED,
                rdu_gang::deadline_message(limit),
            ),
            Turn::Fail {
                culprit,
                ruling,
                reason,
            } => self.fail_now(&culprit, &ruling, reason),
            Turn::Stop { culprit, news } => self.stop_generation(&culprit, news),
            Turn::Ended {
                culprit,
                news,
                settlement,
            } => {
                self.stop_generation(&culprit, news);
                if self.settle(culprit, settlement) {
                    self.run_generation(true);
                }
            }
            Turn::Succeeded => self.succeed(),
            Turn::Create => self.run_generation(true),
            Turn::Run => self.run_generation(false),
        }
    }

    /// The gang's turn (`rdu_gang::turn`, local mode's too) from what this look sees: the deadline, the evidence
    /// against the current generation (with rank 0's hang) and what `status.stopping` already blames, and the
    /// ranks' states. Past the deadline nothing else is looked at.
    fn look_at_generation(&mut self) -> Turn<RankFailure> {
        let deadline = self.deadline();
        let evidence = if matches!(deadline, Deadline::Passed { .. }) {
            Vec::new()
        } else {
            let mut evidence = self.evidence();
            evidence.extend(self.hang());
            evidence
        };
        let live = self.live_by_rank();
        let ranks = RankTally {
            workers: self.job.workers,
            started: live.iter().flatten().count() as u32,
            succeeded: live
                .iter()
                .flatten()
                .filter(|p| matches!(p.state, PodState::Succeeded { .. }))
                .count() as u32,
            present: self.pods.len() as u32,
        };
        rdu_gang::turn(rdu_gang::Look {
            policy: self.job.run_policy,
            restarts: self.restarts(),
            deadline,
            stopping: self.status.stopping.as_ref().map(RankFailure::from_record),
            evidence,
            ranks,
        })
    }

    /// The current generation runs (or is being made): its missing ranks are created when `create`, and its ranks,
    /// phase and blocked pods recorded.
    fn run_generation(&mut self, create: bool) {
        let waiting_for_room = create && self.create_missing_ranks();
        self.record_ranks();
        self.update_running_phase();
        if !waiting_for_room {
            self.report_blocked_pods();
        }
    }

    fn generation(&self) -> u32 {
        self.status.restarts
    }

    fn current(&self) -> impl Iterator<Item = &PodView> {
        let generation = self.generation();
        let workers = self.job.workers;
        self.pods
            .iter()
            .filter(move |p| p.generation == generation && p.rank < workers)
    }

    fn current_rank(&self, rank: u32) -> Option<&PodView> {
        self.current().find(|p| p.rank == rank && !p.terminating)
    }

    /// [`Look::current_rank`] of every rank at once, indexed by rank: one pass over the pods, where a loop over
    /// the ranks calling `current_rank` would make a reconcile of a 4,096-rank job quadratic (16.7 million
    /// comparisons for one pod's change).
    fn live_by_rank(&self) -> Vec<Option<&PodView>> {
        self.by_rank(|p| !p.terminating)
    }

    /// The first current pod of each rank that `keep` accepts, indexed by rank.
    fn by_rank(&self, keep: impl Fn(&PodView) -> bool) -> Vec<Option<&PodView>> {
        let mut slots = vec![None; self.job.workers as usize];
        for pod in self.current().filter(|p| keep(p)) {
            let slot = &mut slots[pod.rank as usize];
            if slot.is_none() {
                *slot = Some(pod);
            }
        }
        slots
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
                existing.observed_generation = self.job.generation;
            }
            None => conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message,
                last_transition_time: now,
                observed_generation: self.job.generation,
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
            self.changes.push(Change::DeletePods { names });
        }
    }

    /// Pods to delete under cleanPodPolicy once the job finished.
    fn clean_up_pods(&mut self) {
        let policy = self.job.run_policy.clean_pod_policy;
        self.delete_pods_where(|p| match policy {
            CleanPodPolicy::All => true,
            CleanPodPolicy::Running => p.is_active(),
            CleanPodPolicy::None => false,
        });
    }

    /// Deletes the pods `doomed` picks: at once where their node is lost, gracefully otherwise (once; a pod
    /// already terminating is left to finish).
    fn delete_pods_where(&mut self, doomed: impl Fn(&PodView) -> bool) {
        let (mut graceful, mut forced) = (Vec::new(), Vec::new());
        for pod in self.pods.iter().filter(|p| doomed(p)) {
            let lost = pod
                .node
                .as_ref()
                .is_some_and(|n| self.cluster.lost.contains_key(n));
            if lost {
                forced.push(pod.name.clone());
            } else if !pod.terminating {
                graceful.push(pod.name.clone());
            }
        }
        self.delete(graceful);
        self.force_delete(forced);
    }

    fn after_finish(&mut self) {
        self.clean_up_pods();
        let Some(ttl) = self.job.run_policy.ttl_seconds_after_finished else {
            return;
        };
        let finished = self
            .status
            .completion_time
            .as_ref()
            .map_or(self.now, |t| t.0);
        let remaining = finished.as_second() + ttl as i64 - self.now.as_second();
        if remaining <= 0 {
            self.changes.push(Change::DeleteJob);
            self.event(
                false,
                "Deleted",
                format!("deleting the job: ttlSecondsAfterFinished ({ttl}s) passed"),
            );
        } else {
            self.requeue_in(remaining);
        }
    }

    /// Deletes every pod and holds the job as Suspended, the condition saying `reason` and `message`.
    fn suspend(&mut self, reason: &'static str, message: String) {
        self.status.stopping = None;
        self.status.last_progress = None;
        let names = self
            .pods
            .iter()
            .filter(|p| !p.terminating)
            .map(|p| p.name.clone())
            .collect();
        self.delete(names);
        let said =
            self.status.conditions.iter().any(|c| {
                c.type_ == condition::SUSPENDED && c.status == "True" && c.message == message
            });
        if self.status.phase == Some(JobPhase::Suspended) && !said {
            self.set_condition(condition::SUSPENDED, true, reason, message.clone());
            self.event(false, reason, message.clone());
        }
        if self.status.phase != Some(JobPhase::Suspended) {
            self.status.phase = Some(JobPhase::Suspended);
            self.set_condition(condition::SUSPENDED, true, reason, message.clone());
            self.clear_condition(condition::RUNNING, "Suspended", "the job is suspended");
            self.clear_condition(condition::RESTARTING, "Suspended", "the job is suspended");
            self.clear_condition(condition::CREATED, "Suspended", "the job is suspended");
            self.clear_condition(condition::PODS_BLOCKED, "Suspended", "the job is suspended");
            let note = if reason == "Suspended" {
                "job suspended: deleting its pods".to_string()
            } else {
                message
            };
            self.event(false, reason, note);
        }
        self.status.start_time = None;
        self.status.ranks.clear();
    }

    /// `activeDeadlineSeconds` from `status.startTime` (`rdu_gang::Deadline`); the job is looked at again when it
    /// falls.
    fn deadline(&mut self) -> Deadline {
        let start = self.status.start_time.get_or_insert(Time(self.now)).0;
        let limit = self.job.run_policy.active_deadline_seconds;
        let deadline = Deadline::at(limit, start.as_second(), self.now.as_second());
        if let Deadline::Left(seconds) = deadline {
            self.requeue_in(seconds);
        }
        deadline
    }

    /// Pods of another generation (or a rank beyond the world size) go; at once where their node is lost.
    fn delete_other_generations(&mut self) {
        let generation = self.generation();
        let workers = self.job.workers;
        self.delete_pods_where(|p| p.generation != generation || p.rank >= workers);
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
                let mut done = TrainingProgress::completed(self.status.progress.as_ref(), &result);
                done.update_time = Some(Time(self.now));
                self.status.progress = Some(done);
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
        self.status.stopping = None;
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
        if let Some(ttl) = self.job.run_policy.ttl_seconds_after_finished {
            self.requeue_in(ttl as i64);
        }
    }

    /// Creates the ranks the current generation lacks. A generation is started whole: only once no pod of the
    /// job is left (every name free) and, when the node cache is known, the schedulable nodes have room for every
    /// rank; until then PodsBlocked says why (`InsufficientCapacity`) and the job waits. A restarted gang first
    /// waits out its backoff (`backing_off`). A generation that was started and lacks some ranks (a reconcile cut
    /// short) gets them without either check. Returns whether the job waits.
    fn create_missing_ranks(&mut self) -> bool {
        let generation = self.generation();
        let started = self
            .pods
            .iter()
            .any(|p| p.generation == generation && !p.terminating);
        if !started {
            if !self.pods.is_empty() {
                return false;
            }
            if self.backing_off() {
                return true;
            }
            if let Some(room) = &self.cluster.room {
                let workers = u64::from(self.job.workers);
                if room.ranks() < workers {
                    let tiles = self.job.tiles.count();
                    let mut message = format!(
                        "the gang needs {workers} rank(s) of {tiles} {} each; the schedulable nodes have room for {} rank(s): {}",
                        consts::TILE_RESOURCE,
                        room.ranks(),
                        room.describe()
                    );
                    if u64::from(tiles) > room.largest {
                        message.push_str(&format!(
                            "; no schedulable node has {tiles} {} in all (the largest has {}): lower spec.tilesPerWorker or add larger nodes",
                            consts::TILE_RESOURCE,
                            room.largest
                        ));
                    }
                    let news = !self.status.conditions.iter().any(|c| {
                        c.type_ == condition::PODS_BLOCKED
                            && c.status == "True"
                            && c.reason == condition::INSUFFICIENT_CAPACITY
                    });
                    self.set_condition(
                        condition::PODS_BLOCKED,
                        true,
                        condition::INSUFFICIENT_CAPACITY,
                        message.clone(),
                    );
                    if news {
                        self.event(true, condition::INSUFFICIENT_CAPACITY, message);
                    }
                    // Nodes coming back wake the job; pods of other jobs ending do not, so look again soon.
                    self.requeue_in(WAIT_FOR_ROOM_SECONDS);
                    return true;
                }
            }
        }
        // A set, not a scan of the pods per rank: quadratic in a 4,096-rank job.
        let taken: std::collections::HashSet<&str> =
            self.pods.iter().map(|p| p.name.as_str()).collect();
        let occupied = |rank: u32| taken.contains(consts::pod_name(self.job.name, rank).as_str());
        let ranks: Vec<u32> = (0..self.job.workers).filter(|r| !occupied(*r)).collect();
        if !ranks.is_empty() {
            self.changes.push(Change::CreatePods { generation, ranks });
        }
        false
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
        let workers = self.job.workers;
        let generation = self.generation();
        let (present, running) = {
            let live = self.live_by_rank();
            let running = live.iter().all(|p| {
                p.is_some_and(|p| {
                    matches!(
                        p.state,
                        PodState::Running { .. } | PodState::Succeeded { .. }
                    )
                })
            });
            (live.iter().flatten().count() as u32, running)
        };
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
mod hang_tests;
#[cfg(test)]
mod rules_tests;
#[cfg(test)]
mod scenario_tests;
#[cfg(test)]
mod teardown_tests;
#[cfg(test)]
mod tests;
