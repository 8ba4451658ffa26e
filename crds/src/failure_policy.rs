//! `spec.runPolicy.failurePolicy`: ordered rules, first match wins, each matching what the operator (or local
//! mode) knows of a failed generation's culprit and naming what follows (DESIGN 5.3). The rules' schema and CEL
//! live here with the messages `validation::rules` repeats; matching them is `policy::rules`.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::{EndAction, EndCause};

/// Most rules a job may have (a CEL cost bound too).
pub const MAX_RULES: usize = 32;

/// The ends the operator records that never carry an exit code, by the reason they are recorded with
/// (`status.history[].reason`, matched by `onReasons`), each with the cause it always has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// Hang detection (`progressDeadlineSeconds`) stopped the generation, blamed on rank 0: the job's own failure.
    Hung,
    /// Someone deleted the rank's pod: the job's own failure (a person or a controller of the job's owner).
    PodDeleted,
    /// The rank's pod is gone without a trace of why: the job's own failure.
    PodVanished,
    /// The rank's node is lost (unreachable, out of service, gone): a disruption.
    NodeLost,
}

impl LostReason {
    pub const ALL: [Self; 4] = [
        Self::Hung,
        Self::PodDeleted,
        Self::PodVanished,
        Self::NodeLost,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Hung => "Hung",
            Self::PodDeleted => "PodDeleted",
            Self::PodVanished => "PodVanished",
            Self::NodeLost => "NodeLost",
        }
    }

    pub const fn cause(self) -> EndCause {
        match self {
            Self::NodeLost => EndCause::Disruption,
            Self::Hung | Self::PodDeleted | Self::PodVanished => EndCause::Failure,
        }
    }

    /// The reason recorded as `reason`, if it is one of these.
    pub fn of(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

/// The reason of a generation stopped by hang detection (`progressDeadlineSeconds`), blamed on rank 0.
pub const HUNG: &str = LostReason::Hung.as_str();

/// The pod condition the control plane and the kubelet set on a pod they take away; a culprit whose pod carries it
/// is always a disruption.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

// The messages of the CEL rules below; `validation::rules` prefixes each with the rule's path.
pub const EMPTY_EXIT_CODES: &str =
    "onExitCodes lists no exit code, so the rule never matches: add values or ranges";
pub const EXIT_CODE_RANGE: &str =
    "onExitCodes values and ranges must be exit codes from 0 to 255, each range with from <= to";
pub const EXIT_CODE_ZERO: &str = "onExitCodes with operator In cannot hold 0: a rank that exited 0 succeeded and is never blamed; remove 0";
pub const EMPTY_SIGNALS: &str =
    "onSignals must list signals from 1 to 64 (e.g. 9 for SIGKILL); an empty list never matches";
pub const EMPTY_REASONS: &str = "onReasons and onContainerReasons must list at least one non-empty reason; an empty list never matches";
pub const EMPTY_POD_CONDITIONS: &str =
    "onPodConditions must list at least one condition, each with a non-empty type";
pub const EMPTY_RANKS: &str = "onRanks must list at least one rank; an empty list never matches";
pub const CODES_AND_SIGNALS_DISJOINT: &str = "onExitCodes and onSignals have no exit code in common (signal N is exit code 128+N), so the rule never matches: drop one or make them overlap";
pub const REASONS_WITHOUT_CODES: &str = "onReasons names only ends without an exit code (Hung, PodDeleted, PodVanished, NodeLost) while onExitCodes or onSignals asks for one, so the rule never matches: drop one of them";
pub const REASONS_AGAINST_CAUSE: &str = "onReasons names only ends of the other cause (Hung, PodDeleted and PodVanished are Failures, NodeLost a Disruption), so the rule never matches with this onCause: fix onCause or onReasons";
pub const CONDITIONS_AGAINST_CAUSE: &str = "onPodConditions asks for DisruptionTarget, which makes the end a Disruption, while onCause is Failure, so the rule never matches: drop one of them";
pub const CATCH_ALL_NOT_LAST: &str = "a rule with no matcher (no onExitCodes, onSignals, onReasons, onContainerReasons, onPodConditions, onCause or onRanks) matches every failure, so it must be the last rule and the only one: move it to the end or add a matcher";
pub const DUPLICATE_NAMES: &str = "spec.runPolicy.failurePolicy.rules names must be unique";
pub const RANK_BEYOND_WORKERS: &str = "onRanks names a rank that is not below spec.workers, so it never matches: ranks are 0 to workers-1";
pub const RESTART_WITHOUT_BACKOFF: &str = "a rule with action RestartJob can only fail the job while spec.runPolicy.backoffLimit is 0: use action FailJob, or raise backoffLimit";
pub const NOT_COUNTED_WITHOUT_BUDGET: &str = "a rule with action RestartJobNotCounted can only fail the job while spec.runPolicy.maxInfrastructureRestarts is 0: use action FailJob, or raise maxInfrastructureRestarts (omit it for no limit)";
/// The least `progressDeadlineSeconds`: rank 0 reports at most every 5 s and the operator writes progress at most
/// every 5 s, so a healthy gang's step can stand still in status for 10 s plus a step.
pub const MIN_PROGRESS_DEADLINE_SECONDS: u64 = 20;
pub const PROGRESS_DEADLINE_MINIMUM: &str = "spec.runPolicy.progressDeadlineSeconds must be at least 20: rank 0's progress reaches the operator only every 5 to 10 s; choose more than your longest step plus checkpoint loading";

/// The CEL of "this rule has no matcher", used by the catch-all rule of [`FailurePolicy`].
macro_rules! no_matcher {
    ($r:literal) => {
        concat!(
            "(!has(",
            $r,
            ".onExitCodes) && !has(",
            $r,
            ".onSignals) && !has(",
            $r,
            ".onReasons) && !has(",
            $r,
            ".onContainerReasons) && !has(",
            $r,
            ".onPodConditions) && !has(",
            $r,
            ".onCause) && !has(",
            $r,
            ".onRanks))"
        )
    };
}

/// Ordered failure rules: the first rule that matches a failed generation's culprit decides what follows. When
/// none matches, the defaults of `restartPolicy` apply (DESIGN 5.3).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(concat!("size(self.rules.filter(r, ", no_matcher!("r"), ")) == 0 || (size(self.rules.filter(r, ", no_matcher!("r"), ")) == 1 && ", no_matcher!("self.rules[size(self.rules) - 1]"), ")")).message(CATCH_ALL_NOT_LAST))]
#[x_kube(validation = Rule::new("self.rules.all(r, !has(r.name) || size(self.rules.filter(s, has(s.name) && s.name == r.name)) == 1)").message(DUPLICATE_NAMES))]
pub struct FailurePolicy {
    /// The rules, first match wins (at most 32).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub rules: Vec<FailureRule>,
}

/// One rule: every matcher it sets must hold (a rule with none matches everything and must be the last).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.onExitCodes) || !has(self.onSignals) || self.onSignals.exists(s, (self.onExitCodes.operator == 'In') == ((has(self.onExitCodes.values) && (128 + s) in self.onExitCodes.values) || (has(self.onExitCodes.ranges) && self.onExitCodes.ranges.exists(r, r.from <= 128 + s && 128 + s <= r.to))))").message(CODES_AND_SIGNALS_DISJOINT))]
#[x_kube(validation = Rule::new("!(has(self.onExitCodes) || has(self.onSignals)) || !has(self.onReasons) || self.onReasons.exists(r, !(r in ['Hung', 'PodDeleted', 'PodVanished', 'NodeLost']))").message(REASONS_WITHOUT_CODES))]
#[x_kube(validation = Rule::new("!has(self.onCause) || !has(self.onReasons) || self.onReasons.exists(r, !(r in (self.onCause == 'Failure' ? ['NodeLost'] : ['Hung', 'PodDeleted', 'PodVanished'])))").message(REASONS_AGAINST_CAUSE))]
#[x_kube(validation = Rule::new("!has(self.onCause) || self.onCause != 'Failure' || !has(self.onPodConditions) || self.onPodConditions.exists(c, c.type != 'DisruptionTarget')").message(CONDITIONS_AGAINST_CAUSE))]
pub struct FailureRule {
    /// A name shown in `status.history` and events (unique among the rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    /// What follows a matching failure: `FailJob`, `RestartJob` (counted against `backoffLimit`) or
    /// `RestartJobNotCounted` (counted against `maxInfrastructureRestarts`).
    pub action: EndAction,
    /// The culprit's exit code (signal N counts as 128+N; a rank without an exit code never matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit_codes: Option<ExitCodeMatcher>,
    /// The signal that killed the culprit (exit code 128+N in a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("size(self) >= 1 && self.all(s, s >= 1 && s <= 64)").message(EMPTY_SIGNALS))]
    pub on_signals: Option<Vec<i32>>,
    /// The reason the end is recorded with (`status.history[].reason`): the pod's (`NodeLost`, `Evicted`,
    /// `UnexpectedAdmissionError`, `OutOfcpu`…), a disruption's (`EvictionByEvictionAPI`,
    /// `PreemptionByScheduler`, `DeletionByTaintManager`…), the operator's (`PodDeleted`, `PodVanished`,
    /// `NodeLost`, `Hung`), else the container's (`Error`, `OOMKilled`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("size(self) >= 1 && self.all(r, size(r) >= 1)").message(EMPTY_REASONS))]
    pub on_reasons: Option<Vec<String>>,
    /// The worker container's own reason for its end (`OOMKilled`, `Error`, `ContainerCannotRun`, `StartError`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("size(self) >= 1 && self.all(r, size(r) >= 1)").message(EMPTY_REASONS))]
    pub on_container_reasons: Option<Vec<String>>,
    /// A condition that is True on the culprit's pod (any of them), e.g. `DisruptionTarget`, optionally with its
    /// reason (`EvictionByEvictionAPI`, `PreemptionByScheduler`, `DeletionByTaintManager`,
    /// `TerminationByKubelet`, `DeletionByPodGC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("size(self) >= 1 && self.all(c, size(c.type) >= 1)").message(EMPTY_POD_CONDITIONS))]
    pub on_pod_conditions: Option<Vec<PodConditionMatcher>>,
    /// Whose doing the end was: `Failure` (the job's own) or `Disruption` (from outside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_cause: Option<EndCause>,
    /// The culprit's rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("size(self) >= 1").message(EMPTY_RANKS))]
    pub on_ranks: Option<Vec<u32>>,
}

impl FailureRule {
    /// A rule with `action` and no matcher yet.
    pub fn new(action: EndAction) -> Self {
        FailureRule {
            name: None,
            action,
            on_exit_codes: None,
            on_signals: None,
            on_reasons: None,
            on_container_reasons: None,
            on_pod_conditions: None,
            on_cause: None,
            on_ranks: None,
        }
    }

    /// Whether the rule sets no matcher, and so matches every failure.
    pub fn is_catch_all(&self) -> bool {
        self.on_exit_codes.is_none()
            && self.on_signals.is_none()
            && self.on_reasons.is_none()
            && self.on_container_reasons.is_none()
            && self.on_pod_conditions.is_none()
            && self.on_cause.is_none()
            && self.on_ranks.is_none()
    }
}

/// Exit codes as the Job API's `onExitCodes`: `In` matches a code of the set, `NotIn` one outside it; the set is
/// `values` and the inclusive `ranges` together.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.values) ? size(self.values) : 0) + (has(self.ranges) ? size(self.ranges) : 0) >= 1").message(EMPTY_EXIT_CODES))]
#[x_kube(validation = Rule::new("self.operator != 'In' || ((!has(self.values) || !(0 in self.values)) && (!has(self.ranges) || self.ranges.all(r, r.from != 0)))").message(EXIT_CODE_ZERO))]
pub struct ExitCodeMatcher {
    pub operator: ExitCodeOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 255))]
    #[x_kube(validation = Rule::new("self.all(v, v >= 0 && v <= 255)").message(EXIT_CODE_RANGE))]
    pub values: Vec<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ranges: Vec<ExitCodeRange>,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum ExitCodeOperator {
    #[default]
    In,
    NotIn,
}

/// Exit codes `from` to `to`, both included.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.from >= 0 && self.from <= self.to && self.to <= 255").message(EXIT_CODE_RANGE))]
pub struct ExitCodeRange {
    pub from: i32,
    pub to: i32,
}

/// A pod condition that is True, with this reason when given.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodConditionMatcher {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_without_an_exit_code_is_read_back_from_its_reason_with_its_cause() {
        let table = [
            ("Hung", EndCause::Failure),
            ("PodDeleted", EndCause::Failure),
            ("PodVanished", EndCause::Failure),
            ("NodeLost", EndCause::Disruption),
        ];
        for (reason, cause) in table {
            let known = LostReason::of(reason).unwrap_or_else(|| panic!("{reason} unknown"));
            assert_eq!((known.as_str(), known.cause()), (reason, cause));
        }
        assert_eq!(LostReason::ALL.len(), table.len());
        assert_eq!(LostReason::of("OOMKilled"), None);
        assert_eq!(HUNG, "Hung");
        // The validation messages name them as they are recorded.
        for known in LostReason::ALL {
            assert!(REASONS_WITHOUT_CODES.contains(known.as_str()), "{known:?}");
            assert!(REASONS_AGAINST_CAUSE.contains(known.as_str()), "{known:?}");
        }
    }
}
