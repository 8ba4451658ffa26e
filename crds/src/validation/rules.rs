//! The rules on `spec.runPolicy.failurePolicy` and the fields beside it: every check of the CRD's CEL with the
//! same message (prefixed with the rule's path), and one CEL cannot afford, a rule fully shadowed by an earlier one
//! (decided by comparing the two rules' matchers, so it refuses only rules that can really never apply).

use super::Checks;
use crate::failure_policy::{self as fp, DISRUPTION_TARGET, LostReason, MAX_RULES};
use crate::{EndAction, EndCause, ExitCodeOperator, FailureRule, RduJobSpec};

const RULES: &str = "spec.runPolicy.failurePolicy.rules";

/// Every rule on the failure policy, the budgets its actions need, and the progress deadline.
pub(super) fn check_failure_policy(c: &mut Checks, spec: &RduJobSpec) {
    let run = &spec.run_policy;
    c.check(
        run.progress_deadline_seconds
            .is_none_or(|s| s >= fp::MIN_PROGRESS_DEADLINE_SECONDS),
        "spec.runPolicy.progressDeadlineSeconds",
        || fp::PROGRESS_DEADLINE_MINIMUM.into(),
    );
    let Some(policy) = &run.failure_policy else {
        return;
    };
    let rules = &policy.rules;
    c.check(rules.len() <= MAX_RULES, RULES, || {
        format!(
            "{RULES} has {} rules, at most {MAX_RULES} are allowed",
            rules.len()
        )
    });
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("{RULES}[{i}]");
        let before = c.len();
        check_rule(c, &path, rule, spec);
        let sound = c.len() == before;
        c.check(!rule.is_catch_all() || i + 1 == rules.len(), &path, || {
            format!("{path}: {}", fp::CATCH_ALL_NOT_LAST)
        });
        if sound && (!rule.is_catch_all() || i + 1 == rules.len()) {
            let earlier = rules[..i].iter().position(|e| shadows(e, rule));
            c.check(earlier.is_none(), &path, || {
                let e = earlier.unwrap_or_default();
                format!(
                    "{path} matches nothing that {RULES}[{e}] does not already match (first match wins), so it \
                     never applies: remove it, or move it before rules[{e}]"
                )
            });
        }
        if let Some(name) = &rule.name {
            let twice = rules[..i].iter().any(|e| e.name.as_ref() == Some(name));
            c.check(!twice, &format!("{path}.name"), || {
                format!("{path}.name: {} ({name:?} is taken)", fp::DUPLICATE_NAMES)
            });
            c.check(
                !name.is_empty() && name.len() <= 63,
                &format!("{path}.name"),
                || format!("{path}.name must be 1 to 63 characters"),
            );
        }
    }
}

/// The checks of one rule, each one of the CRD's CEL rules.
fn check_rule(c: &mut Checks, path: &str, rule: &FailureRule, spec: &RduJobSpec) {
    let run = &spec.run_policy;
    let at = |c: &mut Checks, ok: bool, field: &str, message: &str| {
        let field = format!("{path}{field}");
        c.check(ok, &field, || format!("{field}: {message}"));
    };
    if let Some(codes) = &rule.on_exit_codes {
        at(
            c,
            !codes.values.is_empty() || !codes.ranges.is_empty(),
            ".onExitCodes",
            fp::EMPTY_EXIT_CODES,
        );
        let in_range = codes.values.iter().all(|v| (0..=255).contains(v))
            && codes
                .ranges
                .iter()
                .all(|r| 0 <= r.from && r.from <= r.to && r.to <= 255);
        at(c, in_range, ".onExitCodes", fp::EXIT_CODE_RANGE);
        let zero = codes.values.contains(&0) || codes.ranges.iter().any(|r| r.from == 0);
        at(
            c,
            codes.operator != ExitCodeOperator::In || !zero,
            ".onExitCodes",
            fp::EXIT_CODE_ZERO,
        );
    }
    if let Some(signals) = &rule.on_signals {
        let ok = !signals.is_empty() && signals.iter().all(|s| (1..=64).contains(s));
        at(c, ok, ".onSignals", fp::EMPTY_SIGNALS);
    }
    for (list, field) in [
        (&rule.on_reasons, ".onReasons"),
        (&rule.on_container_reasons, ".onContainerReasons"),
    ] {
        if let Some(list) = list {
            let ok = !list.is_empty() && list.iter().all(|r| !r.is_empty());
            at(c, ok, field, fp::EMPTY_REASONS);
        }
    }
    if let Some(conditions) = &rule.on_pod_conditions {
        let ok = !conditions.is_empty() && conditions.iter().all(|k| !k.type_.is_empty());
        at(c, ok, ".onPodConditions", fp::EMPTY_POD_CONDITIONS);
    }
    if let Some(ranks) = &rule.on_ranks {
        at(c, !ranks.is_empty(), ".onRanks", fp::EMPTY_RANKS);
        let ok = ranks.iter().all(|r| *r < spec.workers);
        at(c, ok, ".onRanks", fp::RANK_BEYOND_WORKERS);
    }
    if rule.on_exit_codes.is_some() && rule.on_signals.is_some() {
        let overlap = rule.exit_codes().is_some_and(|set| !set.is_empty());
        at(c, overlap, "", fp::CODES_AND_SIGNALS_DISJOINT);
    }
    let wants_code = rule.on_exit_codes.is_some() || rule.on_signals.is_some();
    if let (true, Some(reasons)) = (wants_code, &rule.on_reasons) {
        let some_with_code = reasons.iter().any(|r| LostReason::of(r).is_none());
        at(c, some_with_code, "", fp::REASONS_WITHOUT_CODES);
    }
    if let (Some(cause), Some(reasons)) = (rule.on_cause, &rule.on_reasons) {
        let possible = reasons
            .iter()
            .any(|r| LostReason::of(r).is_none_or(|known| known.cause() == cause));
        at(c, possible, "", fp::REASONS_AGAINST_CAUSE);
    }
    if let (Some(EndCause::Failure), Some(conditions)) = (rule.on_cause, &rule.on_pod_conditions) {
        let possible = conditions.iter().any(|k| k.type_ != DISRUPTION_TARGET);
        at(c, possible, "", fp::CONDITIONS_AGAINST_CAUSE);
    }
    at(
        c,
        rule.action != EndAction::RestartJob || run.backoff_limit > 0,
        ".action",
        fp::RESTART_WITHOUT_BACKOFF,
    );
    at(
        c,
        rule.action != EndAction::RestartJobNotCounted
            || run.max_infrastructure_restarts != Some(0),
        ".action",
        fp::NOT_COUNTED_WITHOUT_BUDGET,
    );
}

/// Whether every failure `later` matches is matched by `earlier` too: each matcher `earlier` sets, `later` sets
/// as well, to no more than `earlier` accepts. Sound (it never calls a rule shadowed that could apply) and exact
/// for matchers of the same kind; a shadowing only the meaning of reasons implies (`OOMKilled` always has exit
/// code 137) is not found.
pub fn shadows(earlier: &FailureRule, later: &FailureRule) -> bool {
    let within = |e: &Option<Vec<String>>, l: &Option<Vec<String>>| match (e, l) {
        (None, _) => true,
        (Some(e), Some(l)) => l.iter().all(|x| e.contains(x)),
        (Some(_), None) => false,
    };
    let codes = match (earlier.exit_codes(), later.exit_codes()) {
        (None, _) => true,
        (Some(e), Some(l)) => l.is_subset(&e),
        (Some(_), None) => false,
    };
    let conditions = match (&earlier.on_pod_conditions, &later.on_pod_conditions) {
        (None, _) => true,
        (Some(e), Some(l)) => l.iter().all(|l| {
            e.iter()
                .any(|e| e.type_ == l.type_ && (e.reason.is_none() || e.reason == l.reason))
        }),
        (Some(_), None) => false,
    };
    let cause = earlier.on_cause.is_none() || earlier.on_cause == later.on_cause;
    let ranks = match (&earlier.on_ranks, &later.on_ranks) {
        (None, _) => true,
        (Some(e), Some(l)) => l.iter().all(|r| e.contains(r)),
        (Some(_), None) => false,
    };
    codes
        && within(&earlier.on_reasons, &later.on_reasons)
        && within(&earlier.on_container_reasons, &later.on_container_reasons)
        && conditions
        && cause
        && ranks
}

#[cfg(test)]
mod tests;
