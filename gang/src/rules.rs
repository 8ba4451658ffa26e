//! Failure rules (DESIGN 5.3): what is known of a failed generation's culprit, the rule that matches it (the
//! failure policy's first, then the defaults of `restartPolicy`), and the verdict the two budgets allow.

use crate::{FailureReason, RankExit, Verdict};
use rdu_crds::consts::exit_code;
use rdu_crds::{
    EndAction, EndCause, ExitCodeMatcher, ExitCodeOperator, ExitCodeRange, FailureRule,
    MatchedRule, PodConditionMatcher, RestartPolicy, RuleSource, RunPolicy,
};

/// What the rules can match of the rank a failed generation is blamed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Culprit {
    pub rank: u32,
    pub exit: RankExit,
    /// The reason its end is recorded with (`status.history[].reason`): `Error`, `OOMKilled`, `NodeLost`,
    /// `EvictionByEvictionAPI`, `PodDeleted`, `Hung`…
    pub reason: String,
    /// The worker container's own reason, when it ended (`OOMKilled`, `Error`, `ContainerCannotRun`…).
    pub container_reason: Option<String>,
    /// The conditions True on its pod, with their reasons.
    pub pod_conditions: Vec<PodConditionMatcher>,
    pub cause: EndCause,
}

impl Culprit {
    /// A culprit known only by its exit and cause (local mode; the defaults need no more). Its reason is the
    /// kubelet's for a worker that exited on its own (`Error`), or `Lost`.
    pub fn from_exit(rank: u32, exit: RankExit, cause: EndCause) -> Self {
        let reason = match exit {
            RankExit::Lost => "Lost",
            _ => "Error",
        };
        Culprit {
            rank,
            exit,
            reason: reason.to_string(),
            container_reason: (exit != RankExit::Lost).then(|| "Error".to_string()),
            pod_conditions: Vec::new(),
            cause,
        }
    }

    /// The exit code the rules match: the code, 128+N for signal N, none for a rank without one.
    pub fn exit_code(&self) -> Option<i32> {
        match self.exit {
            RankExit::Lost => None,
            exit => Some(exit.as_exit_code()),
        }
    }
}

/// Whether every matcher `rule` sets holds for `culprit`.
fn matches(rule: &FailureRule, culprit: &Culprit) -> bool {
    let listed = |list: &Option<Vec<String>>, value: Option<&str>| {
        list.as_ref()
            .is_none_or(|l| value.is_some_and(|v| l.iter().any(|x| x == v)))
    };
    rule.exit_codes()
        .is_none_or(|set| culprit.exit_code().is_some_and(|c| set.contains(c)))
        && listed(&rule.on_reasons, Some(&culprit.reason))
        && listed(
            &rule.on_container_reasons,
            culprit.container_reason.as_deref(),
        )
        && rule.on_pod_conditions.as_ref().is_none_or(|wanted| {
            wanted.iter().any(|w| {
                culprit
                    .pod_conditions
                    .iter()
                    .any(|c| c.type_ == w.type_ && (w.reason.is_none() || w.reason == c.reason))
            })
        })
        && rule.on_cause.is_none_or(|c| c == culprit.cause)
        && rule
            .on_ranks
            .as_ref()
            .is_none_or(|ranks| ranks.contains(&culprit.rank))
}

/// The codes `restartPolicy: ExitCode` restarts on: 75 (transient) and above 128 (a signal).
fn retryable_codes(operator: ExitCodeOperator) -> ExitCodeMatcher {
    ExitCodeMatcher {
        operator,
        values: vec![exit_code::RETRYABLE],
        ranges: vec![ExitCodeRange {
            from: exit_code::SIGNAL_BASE + 1,
            to: 255,
        }],
    }
}

fn named(name: &str, rule: FailureRule) -> FailureRule {
    FailureRule {
        name: Some(name.to_string()),
        ..rule
    }
}

/// The rules `restartPolicy` stands for, applied to whatever the failure policy's own rules do not match. Each
/// list ends with a rule that matches everything.
pub fn default_rules(policy: RestartPolicy) -> Vec<FailureRule> {
    let disruption = named(
        "disruption",
        FailureRule {
            on_cause: Some(EndCause::Disruption),
            ..FailureRule::new(EndAction::RestartJobNotCounted)
        },
    );
    match policy {
        RestartPolicy::Never => vec![named("never", FailureRule::new(EndAction::FailJob))],
        RestartPolicy::OnFailure => vec![
            disruption,
            named("any-failure", FailureRule::new(EndAction::RestartJob)),
        ],
        RestartPolicy::ExitCode => vec![
            disruption,
            named(
                "retryable-exit-code",
                FailureRule {
                    on_exit_codes: Some(retryable_codes(ExitCodeOperator::In)),
                    ..FailureRule::new(EndAction::RestartJob)
                },
            ),
            named(
                "permanent-exit-code",
                FailureRule {
                    on_exit_codes: Some(retryable_codes(ExitCodeOperator::NotIn)),
                    ..FailureRule::new(EndAction::FailJob)
                },
            ),
            named("no-exit-code", FailureRule::new(EndAction::RestartJob)),
        ],
    }
}

/// The gang restarts so far, by budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restarts {
    /// Counted against `backoffLimit` (`status.failureRestarts`).
    pub counted: u32,
    /// Counted against `maxInfrastructureRestarts` (`status.disruptionRestarts`).
    pub not_counted: u32,
}

/// What the rules decide for a culprit: the rule that matched, its action, and what the budgets make of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruling {
    pub rule: MatchedRule,
    /// The matched rule's action.
    pub action: EndAction,
    pub verdict: Verdict,
}

impl Ruling {
    /// What followed: the action, or `FailJob` when a budget was spent.
    pub fn end_action(&self) -> EndAction {
        match self.verdict {
            Verdict::Restart { counted: true } => EndAction::RestartJob,
            Verdict::Restart { counted: false } => EndAction::RestartJobNotCounted,
            Verdict::Fail(_) => EndAction::FailJob,
        }
    }
}

/// The first rule of `run`'s failure policy that matches `culprit`, else the first of `restartPolicy`'s
/// defaults, and the verdict: its action, unless that restart's budget is spent.
pub fn judge(run: &RunPolicy, restarts: Restarts, culprit: &Culprit) -> Ruling {
    let own = run
        .failure_policy
        .as_ref()
        .map_or(&[][..], |p| p.rules.as_slice());
    let defaults = default_rules(run.restart_policy);
    let (source, index, rule) = own
        .iter()
        .enumerate()
        .map(|(i, r)| (RuleSource::FailurePolicy, i, r))
        .chain(
            defaults
                .iter()
                .enumerate()
                .map(|(i, r)| (RuleSource::RestartPolicy, i, r)),
        )
        .find(|(_, _, rule)| matches(rule, culprit))
        .unwrap_or((RuleSource::RestartPolicy, 0, &defaults[defaults.len() - 1]));
    let verdict = match rule.action {
        EndAction::FailJob => Verdict::Fail(match (source, rule.name.as_deref()) {
            (RuleSource::FailurePolicy, _) => FailureReason::FailurePolicy,
            (RuleSource::RestartPolicy, Some("never")) => FailureReason::RestartPolicyNever,
            (RuleSource::RestartPolicy, _) => FailureReason::PermanentFailure,
        }),
        EndAction::RestartJob if restarts.counted >= run.backoff_limit => {
            Verdict::Fail(FailureReason::BackoffLimitExceeded)
        }
        EndAction::RestartJob => Verdict::Restart { counted: true },
        EndAction::RestartJobNotCounted
            if run
                .max_infrastructure_restarts
                .is_some_and(|max| restarts.not_counted >= max) =>
        {
            Verdict::Fail(FailureReason::MaxInfrastructureRestartsExceeded)
        }
        EndAction::RestartJobNotCounted => Verdict::Restart { counted: false },
    };
    Ruling {
        rule: MatchedRule {
            source,
            index: index as u32,
            name: rule.name.clone(),
        },
        action: rule.action,
        verdict,
    }
}

#[cfg(test)]
mod tests;
