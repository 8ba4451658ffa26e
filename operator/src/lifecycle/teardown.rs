//! Ending a failed generation: what it is blamed on, stopping it, and what follows. A gang is restarted in two
//! steps. When the first sign of trouble appears (a rank that failed, a pod deleted or evicted, a rank whose node
//! is lost), the generation starts *stopping*: `status.stopping` records its culprit so far, every pod of it is
//! deleted (at once, with no grace, where its node is lost: its kubelet will never confirm). Evidence keeps
//! arriving while the pods go (a node declared unreachable after its ranks' peers timed out, a pod the drain
//! evicted) and may blame another rank. Only when no pod of the job is left does the generation *end*: its cause
//! (the job's own failure, or a disruption from outside it) and what else is known of the culprit go through the
//! failure rules (`rdu_gang::judge`: the job's `failurePolicy`, then the defaults of its `restartPolicy`), whose
//! action and budgets decide between failing the job and the next generation, counted against `backoffLimit` or
//! against `maxInfrastructureRestarts`; the next generation is created whole, with every pod name free. Which of
//! these a look does is `rdu_gang::turn`'s decision (local mode's too); this module gathers its evidence from
//! pods and applies it to `status` and the pods.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rdu_crds::consts::exit_code;
use rdu_crds::failure_policy::LostReason;
use rdu_crds::{EndCause, GenerationEnd, JobPhase, PodConditionMatcher, RankStatus, RuleSource};
use rdu_gang::{
    self as policy, Backoff, Culprit, FailureReason, Next, RankExit, Restarts, Ruling, Settlement,
};

use super::pod_view::{PodState, PodView};
use super::{Change, Look, condition};

/// The signal the kubelet stops a container with; a worker it stops exits 128 + it (DESIGN 4.6).
const SIGTERM: i32 = 15;

/// A rank's end as the lifecycle sees it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RankFailure {
    pub rank: u32,
    pub exit: RankExit,
    /// Short: `Error`, `OOMKilled`, `NodeLost`, `EvictionByEvictionAPI`, `PodDeleted`, `PodVanished`…
    pub kind: String,
    /// One sentence: the rank, how it ended, and what explains it (the worker's termination message, the node's
    /// loss…).
    pub message: String,
    pub cause: EndCause,
    pub node: Option<String>,
    /// The worker container's own reason for its end (`OOMKilled`, `Error`…), when it ended.
    pub container_reason: Option<String>,
    /// The conditions True on the rank's pod.
    pub pod_conditions: Vec<PodConditionMatcher>,
}

impl RankFailure {
    /// `reason` explains the end (the worker's termination message, the node's loss…); the node is the pod's
    /// (`seen_on`) or the one recorded (`on`).
    pub(super) fn new(
        rank: u32,
        exit: RankExit,
        kind: &str,
        reason: &str,
        cause: EndCause,
    ) -> Self {
        let message = match exit {
            RankExit::Code(code) => format!("rank {rank} exited with code {code} ({reason})"),
            RankExit::Signal(signal) => {
                format!("rank {rank} was killed by signal {signal} ({reason})")
            }
            RankExit::Lost => format!("rank {rank} was lost ({reason})"),
        };
        Self {
            rank,
            exit,
            kind: kind.to_string(),
            message,
            cause,
            node: None,
            container_reason: None,
            pod_conditions: Vec::new(),
        }
    }

    /// On node `node` (where the rank's pod, now gone, was seen).
    pub(super) fn on(mut self, node: Option<String>) -> Self {
        self.node = node;
        self
    }

    /// A rank gone without an exit code, for `reason`; `detail` says more (the node's loss…).
    pub(super) fn lost(rank: u32, reason: LostReason, detail: Option<&str>) -> Self {
        let text = match detail {
            Some(detail) => format!("{}: {detail}", reason.as_str()),
            None => reason.as_str().to_string(),
        };
        Self::new(rank, RankExit::Lost, reason.as_str(), &text, reason.cause())
    }

    /// With what `pod` says of the end: its node, its container's reason and its true conditions.
    fn seen_on(mut self, pod: &PodView) -> Self {
        self.node = pod.node.clone();
        self.container_reason = match &pod.state {
            PodState::Failed(f) => f.container_reason.clone(),
            _ => None,
        };
        self.pod_conditions = pod.conditions.clone();
        self
    }

    /// What the failure rules match of this end.
    fn as_culprit(&self) -> Culprit {
        Culprit {
            rank: self.rank,
            exit: self.exit,
            reason: self.kind.clone(),
            container_reason: self.container_reason.clone(),
            pod_conditions: self.pod_conditions.clone(),
            cause: self.cause,
        }
    }

    pub(super) fn describe(&self) -> &str {
        &self.message
    }

    /// Whether two records are of the same end (a record's message may have been written by an older operator).
    fn same_end(&self, other: &RankFailure) -> bool {
        (self.rank, self.exit, &self.kind, self.cause)
            == (other.rank, other.exit, &other.kind, other.cause)
    }

    pub(super) fn from_record(end: &GenerationEnd) -> Self {
        Self {
            rank: end.rank,
            exit: end.exit_code.map_or(RankExit::Lost, RankExit::Code),
            kind: end.reason.clone(),
            message: end.message.clone(),
            cause: end.cause,
            node: end.node.clone(),
            container_reason: end.container_reason.clone(),
            pod_conditions: end.pod_conditions.clone(),
        }
    }

    fn record(&self, generation: u32, time: Time) -> GenerationEnd {
        GenerationEnd {
            generation,
            rank: self.rank,
            exit_code: match self.exit {
                RankExit::Lost => None,
                exit => Some(exit.as_exit_code()),
            },
            reason: self.kind.clone(),
            message: self.message.clone(),
            node: self.node.clone(),
            container_reason: self.container_reason.clone(),
            pod_conditions: self.pod_conditions.clone(),
            cause: self.cause,
            action: None,
            rule: None,
            failure_restarts: None,
            disruption_restarts: None,
            time,
        }
    }
}

impl rdu_gang::Evidence for RankFailure {
    fn end(&self) -> (u32, RankExit, EndCause) {
        (self.rank, self.exit, self.cause)
    }

    fn culprit(&self) -> Culprit {
        self.as_culprit()
    }

    fn same_end(&self, other: &Self) -> bool {
        RankFailure::same_end(self, other)
    }
}

/// Whether a pod failed because its node's kubelet refused or removed it before its worker ran (no exit code, and
/// the kubelet's reason for a pod it rejects at admission or shuts down): `UnexpectedAdmissionError` (the device
/// plugin was not registered, or its devices unhealthy, when the pod arrived), `OutOf<resource>`, `NodeAffinity`,
/// `NodeShutdown`, `Terminated` (graceful node shutdown), `Evicted`. The node's trouble, not the job's.
pub(super) fn rejected_by_kubelet(exit: RankExit, reason: &str) -> bool {
    exit == RankExit::Lost
        && (matches!(
            reason,
            "UnexpectedAdmissionError" | "NodeAffinity" | "NodeShutdown" | "Terminated" | "Evicted"
        ) || reason.starts_with("OutOf"))
}

impl Look<'_> {
    /// The evidence against the current generation: every rank that failed, was lost with its node, disrupted by
    /// the cluster, or (before stopping began) deleted or vanished. While stopping, pods the operator itself
    /// deleted are not evidence: a rank that exits because it was told to stop is a consequence.
    pub(super) fn evidence(&self) -> Vec<RankFailure> {
        let stopping_since = self.status.stopping.as_ref().map(|s| s.time.0);
        let seen: std::collections::BTreeMap<u32, &RankStatus> = self
            .status
            .ranks
            .iter()
            .rev()
            .map(|r| (r.rank, r))
            .collect();
        let seen_before = |rank: u32| seen.get(&rank).copied();
        let pods = self.by_rank(|_| true);
        (0..self.job.workers)
            .filter_map(|rank| {
                let pod = pods[rank as usize];
                let Some(pod) = pod else {
                    let seen = seen_before(rank)?;
                    if stopping_since.is_some() {
                        return None;
                    }
                    let lost = match self.lost(seen.node.as_deref()) {
                        Some(loss) => RankFailure::lost(rank, LostReason::NodeLost, Some(&loss)),
                        None => RankFailure::lost(rank, LostReason::PodVanished, None),
                    };
                    return Some(lost.on(seen.node.clone()));
                };
                if let Some(loss) = self.lost(pod.node.as_deref()) {
                    return Some(
                        RankFailure::lost(rank, LostReason::NodeLost, Some(&loss)).seen_on(pod),
                    );
                }
                if let Some(kind) = &pod.disruption {
                    return Some(
                        RankFailure::new(
                            rank,
                            pod.exit_code().map_or(RankExit::Lost, RankExit::Code),
                            kind,
                            &format!("{kind}: the cluster took its pod away"),
                            EndCause::Disruption,
                        )
                        .seen_on(pod),
                    );
                }
                if let PodState::Failed(f) = &pod.state {
                    // Times are whole seconds: an end in the second the stopping began may be the stop's doing.
                    let ours = pod.terminating
                        && stopping_since
                            .is_some_and(|since| f.finished.is_none_or(|end| end >= since));
                    if ours {
                        return None;
                    }
                    // Someone else deleted the pod and its rank stopped on the kubelet's SIGTERM before this look:
                    // the deletion is the cause, as when the pod is seen terminating first.
                    let deleted = pod.terminating
                        && stopping_since.is_none()
                        && seen_before(rank).is_some()
                        && f.exit == RankExit::Code(exit_code::SIGNAL_BASE + SIGTERM);
                    if deleted {
                        return Some(
                            RankFailure::lost(
                                rank,
                                LostReason::PodDeleted,
                                Some("it stopped on SIGTERM"),
                            )
                            .seen_on(pod),
                        );
                    }
                    let node_lost = LostReason::of(&f.kind) == Some(LostReason::NodeLost);
                    let cause = if node_lost || rejected_by_kubelet(f.exit, &f.kind) {
                        EndCause::Disruption
                    } else {
                        EndCause::Failure
                    };
                    return Some(
                        RankFailure::new(rank, f.exit, &f.kind, &f.reason, cause).seen_on(pod),
                    );
                }
                (pod.terminating && stopping_since.is_none() && seen_before(rank).is_some())
                    .then(|| RankFailure::lost(rank, LostReason::PodDeleted, None).seen_on(pod))
            })
            .collect()
    }

    /// Why node `node`'s pods are lost, if they are.
    fn lost(&self, node: Option<&str>) -> Option<String> {
        let node = node?;
        self.cluster.lost.get(node).map(|loss| loss.describe(node))
    }

    /// The restarts so far, from `status`.
    pub(super) fn restarts(&self) -> Restarts {
        Restarts {
            counted: self.status.failure_restarts,
            not_counted: self.status.disruption_restarts,
        }
    }

    /// `rule failurePolicy.rules[0] (oom): FailJob; failureRestarts 0, disruptionRestarts 0`: the rule, what
    /// followed and both counters, for conditions and events.
    fn ruling_note(&self, ruling: &Ruling) -> String {
        format!(
            "rule {}: {:?}; failureRestarts {}, disruptionRestarts {}",
            ruling.rule,
            ruling.end_action(),
            self.status.failure_restarts,
            self.status.disruption_restarts
        )
    }

    /// Why a job fails at once, before its generation ended: a rule that says so.
    fn fail_at_once_message(&self, culprit: &RankFailure, ruling: &Ruling) -> String {
        match ruling.rule.source {
            RuleSource::RestartPolicy => format!(
                "{}; restartPolicy {:?} does not restart it; {}",
                culprit.describe(),
                self.job.run_policy.restart_policy,
                self.ruling_note(ruling)
            ),
            RuleSource::FailurePolicy => {
                format!("{}; {}", culprit.describe(), self.ruling_note(ruling))
            }
        }
    }

    /// A rule failed the job at once (`Turn::Fail`): the generation's end goes into the history and the job fails.
    pub(super) fn fail_now(
        &mut self,
        culprit: &RankFailure,
        ruling: &Ruling,
        reason: FailureReason,
    ) {
        self.end_generation(culprit, ruling);
        let message = self.fail_at_once_message(culprit, ruling);
        self.finish(JobPhase::Failed, reason.as_str(), message);
    }

    /// The generation failed (`Turn::Stop`, or `Turn::Ended` before it is settled): the first sign of it makes the
    /// job Restarting; `status.stopping` records the culprit when it is `news`; every pod of the generation not
    /// yet deleted is deleted.
    pub(super) fn stop_generation(&mut self, culprit: &RankFailure, news: bool) {
        let generation = self.generation();
        let since = self
            .status
            .stopping
            .as_ref()
            .map_or(Time(self.now), |s| s.time.clone());
        if self.status.stopping.is_none() {
            let message = format!("{}; stopping generation {generation}", culprit.describe());
            self.status.phase = Some(JobPhase::Restarting);
            self.set_condition(condition::RESTARTING, true, "GangRestart", message.clone());
            self.clear_condition(condition::RUNNING, "GangRestart", &message);
            self.clear_condition(condition::CREATED, "GangRestart", &message);
            self.clear_condition(condition::PODS_BLOCKED, "GangRestart", &message);
            self.event(true, "Restarting", message);
        } else if news {
            self.set_condition(
                condition::RESTARTING,
                true,
                "GangRestart",
                format!("{}; stopping generation {generation}", culprit.describe()),
            );
        }
        if news {
            self.status.stopping = Some(culprit.record(generation, since));
        }
        self.delete_generation();
    }

    /// Deletes every pod of the current generation not yet deleted, at once (no grace) where its node is lost.
    fn delete_generation(&mut self) {
        let generation = self.generation();
        let (mut graceful, mut forced) = (Vec::new(), Vec::new());
        for pod in self.pods.iter().filter(|p| p.generation == generation) {
            if self.lost(pod.node.as_deref()).is_some() {
                forced.push(pod.name.clone());
            } else if !pod.terminating {
                graceful.push(pod.name.clone());
            }
        }
        self.delete(graceful);
        self.force_delete(forced);
    }

    /// The generation is over (`Turn::Ended`): restart the gang as the next one (counted or not) or fail the job,
    /// as the rules' `settlement` says. Returns whether the next generation starts.
    pub(super) fn settle(&mut self, culprit: RankFailure, settlement: Settlement) -> bool {
        let policy = self.job.run_policy;
        let (limit, max_uncounted) = (policy.backoff_limit, policy.max_infrastructure_restarts);
        let Settlement {
            ruling,
            restarts,
            next,
        } = settlement;
        match next {
            Next::Fail(reason) => {
                self.end_generation(&culprit, &ruling);
                let message = match reason {
                    FailureReason::BackoffLimitExceeded => format!(
                        "{}; the gang was already restarted {} times for failures (backoffLimit {limit}); {}",
                        culprit.describe(),
                        self.status.failure_restarts,
                        self.ruling_note(&ruling)
                    ),
                    FailureReason::MaxInfrastructureRestartsExceeded => format!(
                        "{}; the gang was already restarted {} times without counting (maxInfrastructureRestarts {}); {}",
                        culprit.describe(),
                        self.status.disruption_restarts,
                        max_uncounted.unwrap_or_default(),
                        self.ruling_note(&ruling)
                    ),
                    _ => self.fail_at_once_message(&culprit, &ruling),
                };
                self.finish(JobPhase::Failed, reason.as_str(), message);
                false
            }
            Next::Restart { budget: why } => {
                self.status.failure_restarts = restarts.counted;
                self.status.disruption_restarts = restarts.not_counted;
                self.end_generation(&culprit, &ruling);
                self.status.restarts += 1;
                self.status.ranks.clear();
                let message = format!(
                    "{}; restarting the gang as generation {} ({why}); {}",
                    culprit.describe(),
                    self.status.restarts,
                    self.ruling_note(&ruling)
                );
                self.set_condition(condition::RESTARTING, true, "GangRestart", message.clone());
                self.event(culprit.cause == EndCause::Failure, "Restarted", message);
                true
            }
        }
    }

    /// Whether the current generation waits before its pods are made: a restart of a loop backs off
    /// (`rdu_gang::backoff`, over the restarts in `status.history`); the Restarting condition says
    /// how long, and the job is looked at again then.
    pub(super) fn backing_off(&mut self) -> bool {
        let generation = self.generation();
        let history = &self.status.history;
        let Some((last, earlier)) = history.split_last() else {
            return false;
        };
        if last.generation + 1 != generation || last.action == Some(rdu_crds::EndAction::FailJob) {
            return false;
        }
        let times: Vec<i64> = earlier.iter().map(|end| end.time.0.as_second()).collect();
        let restarted_at = last.time.0.as_second();
        let Some(Backoff {
            delay,
            left_seconds: left,
        }) = policy::backoff(&times, restarted_at, self.now.as_second())
        else {
            return false;
        };
        self.set_condition(
            condition::RESTARTING,
            true,
            "BackOff",
            format!("{} ({left} s left)", delay.message(generation)),
        );
        self.requeue_in(left);
        true
    }

    /// Moves the stopping record (or a fresh one) into the history with what followed.
    fn end_generation(&mut self, culprit: &RankFailure, ruling: &Ruling) {
        let generation = self.generation();
        let mut end = self
            .status
            .stopping
            .take()
            .unwrap_or_else(|| culprit.record(generation, Time(self.now)));
        if !RankFailure::from_record(&end).same_end(culprit) {
            end = culprit.record(generation, end.time);
        }
        end.action = Some(ruling.end_action());
        end.rule = Some(ruling.rule.clone());
        end.failure_restarts = Some(self.status.failure_restarts);
        end.disruption_restarts = Some(self.status.disruption_restarts);
        self.status.history.push(end);
        let excess = self
            .status
            .history
            .len()
            .saturating_sub(GenerationEnd::KEPT);
        self.status.history.drain(..excess);
    }

    /// Pods to delete with no grace period: their node is lost, no kubelet will confirm a graceful deletion.
    pub(super) fn force_delete(&mut self, names: Vec<String>) {
        if !names.is_empty() {
            self.changes.push(Change::ForceDeletePods { names });
        }
    }
}
