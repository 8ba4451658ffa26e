//! Table cases of the failure rules in the lifecycle: each action of a `failurePolicy` rule, both budgets, and
//! what `status.history` and the events record of the rule that decided.

use super::tests::{P, after, at, condition, decide, p, pods, with_status};
use super::*;
use crate::test_fixtures::job;
use rdu_crds::{
    EndAction, EndCause, ExitCodeMatcher, ExitCodeOperator, FailurePolicy, FailureRule,
    MatchedRule, PodConditionMatcher, RuleSource,
};

fn rule(action: EndAction, set: impl FnOnce(&mut FailureRule)) -> FailureRule {
    let mut rule = FailureRule::new(action);
    set(&mut rule);
    rule
}

fn user(index: u32, name: Option<&str>) -> Option<MatchedRule> {
    Some(MatchedRule {
        source: RuleSource::FailurePolicy,
        index,
        name: name.map(str::to_string),
    })
}

fn default_rule(index: u32, name: &str) -> Option<MatchedRule> {
    Some(MatchedRule {
        source: RuleSource::RestartPolicy,
        index,
        name: Some(name.to_string()),
    })
}

/// One case: a two-rank job under `rules` with these budgets and counters; rank 1 as `observed` (rank 0 runs).
struct Case {
    name: &'static str,
    rules: Vec<FailureRule>,
    backoff_limit: u32,
    max_infrastructure_restarts: Option<u32>,
    /// (failureRestarts, disruptionRestarts) before.
    before: (u32, u32),
    rank1: P,
    /// What the generation's end comes to.
    phase: JobPhase,
    /// The Failed condition's reason when the job fails.
    failed_reason: Option<&'static str>,
    /// (failureRestarts, disruptionRestarts) after.
    counters: (u32, u32),
    action: EndAction,
    rule: Option<MatchedRule>,
}

/// Runs the case to the generation's end: the first sign, then (when the job is not failed at once) no pod left.
fn run(case: &Case) -> Decision {
    let mut j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let policy = &mut j.spec.run_policy;
    policy.backoff_limit = case.backoff_limit;
    policy.max_infrastructure_restarts = case.max_infrastructure_restarts;
    policy.failure_policy = (!case.rules.is_empty()).then(|| FailurePolicy {
        rules: case.rules.clone(),
    });
    if let Some(s) = j.status.as_mut() {
        (s.failure_restarts, s.disruption_restarts) = case.before;
    }
    let d = decide(&j, &pods(&[p(0, 0, "Running"), case.rank1.clone()]), at(5));
    if d.status.phase != Some(JobPhase::Restarting) {
        return d;
    }
    decide(&after(j, &d), &[], at(6))
}

#[test]
fn every_action_and_both_budgets() {
    let oom_fails = rule(EndAction::FailJob, |r| {
        r.name = Some("oom".into());
        r.on_container_reasons = Some(vec!["OOMKilled".into()]);
    });
    let code_1_restarts = rule(EndAction::RestartJob, |r| {
        r.on_exit_codes = Some(ExitCodeMatcher {
            operator: ExitCodeOperator::In,
            values: vec![1],
            ranges: vec![],
        })
    });
    let deleted_not_counted = rule(EndAction::RestartJobNotCounted, |r| {
        r.on_reasons = Some(vec!["PodDeleted".into()]);
    });
    let eviction_not_counted = rule(EndAction::RestartJobNotCounted, |r| {
        r.on_pod_conditions = Some(vec![PodConditionMatcher {
            type_: "DisruptionTarget".into(),
            reason: Some("EvictionByEvictionAPI".into()),
        }]);
    });
    let preemption_fails = rule(EndAction::FailJob, |r| {
        r.on_cause = Some(EndCause::Disruption);
        r.on_ranks = Some(vec![1]);
    });
    let oom = p(1, 0, "Failed").exit(137).container_reason("OOMKilled");
    let cases = [
        Case {
            name: "FailJob on OOMKilled fails at once what the defaults would restart",
            rules: vec![oom_fails.clone()],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: oom.clone(),
            phase: JobPhase::Failed,
            failed_reason: Some("FailurePolicy"),
            counters: (0, 0),
            action: EndAction::FailJob,
            rule: user(0, Some("oom")),
        },
        Case {
            name: "without the rule the default restarts the OOM kill, counted",
            rules: vec![],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: oom.clone(),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (1, 0),
            action: EndAction::RestartJob,
            rule: default_rule(1, "retryable-exit-code"),
        },
        Case {
            name: "a container the runtime never started has no exit code of its own: restarted, counted",
            rules: vec![oom_fails.clone()],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Failed").exit(128).container_reason("StartError"),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (1, 0),
            action: EndAction::RestartJob,
            rule: default_rule(3, "no-exit-code"),
        },
        Case {
            name: "a rule that does not match leaves the defaults: exit 65 is permanent",
            rules: vec![oom_fails.clone()],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Failed").exit(65),
            phase: JobPhase::Failed,
            failed_reason: Some("PermanentFailure"),
            counters: (0, 0),
            action: EndAction::FailJob,
            rule: default_rule(2, "permanent-exit-code"),
        },
        Case {
            name: "RestartJob on exit 1 restarts what the defaults would fail, counted",
            rules: vec![code_1_restarts.clone()],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (1, 0),
            rank1: p(1, 0, "Failed").exit(1),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (2, 0),
            action: EndAction::RestartJob,
            rule: user(0, None),
        },
        Case {
            name: "RestartJob past backoffLimit fails the job",
            rules: vec![code_1_restarts],
            backoff_limit: 2,
            max_infrastructure_restarts: None,
            before: (2, 0),
            rank1: p(1, 0, "Failed").exit(1),
            phase: JobPhase::Failed,
            failed_reason: Some("BackoffLimitExceeded"),
            counters: (2, 0),
            action: EndAction::FailJob,
            rule: user(0, None),
        },
        Case {
            name: "RestartJobNotCounted on a deleted pod spends no backoffLimit",
            rules: vec![deleted_not_counted.clone()],
            backoff_limit: 0,
            max_infrastructure_restarts: Some(3),
            before: (0, 2),
            rank1: p(1, 0, "Running").terminating(),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (0, 3),
            action: EndAction::RestartJobNotCounted,
            rule: user(0, None),
        },
        Case {
            name: "a deleted pod whose rank already stopped on SIGTERM is PodDeleted too",
            rules: vec![deleted_not_counted.clone()],
            backoff_limit: 0,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Failed").exit(143).terminating(),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (0, 1),
            action: EndAction::RestartJobNotCounted,
            rule: user(0, None),
        },
        Case {
            name: "a pod not deleted that exited 143 is not PodDeleted: the defaults count it",
            rules: vec![deleted_not_counted.clone()],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Failed").exit(143),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (1, 0),
            action: EndAction::RestartJob,
            rule: default_rule(1, "retryable-exit-code"),
        },
        Case {
            name: "a deleted pod without the rule is the job's failure, counted",
            rules: vec![],
            backoff_limit: 3,
            max_infrastructure_restarts: Some(3),
            before: (0, 0),
            rank1: p(1, 0, "Running").terminating(),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (1, 0),
            action: EndAction::RestartJob,
            rule: default_rule(3, "no-exit-code"),
        },
        Case {
            name: "RestartJobNotCounted past maxInfrastructureRestarts fails the job",
            rules: vec![deleted_not_counted],
            backoff_limit: 3,
            max_infrastructure_restarts: Some(3),
            before: (0, 3),
            rank1: p(1, 0, "Running").terminating(),
            phase: JobPhase::Failed,
            failed_reason: Some("MaxInfrastructureRestartsExceeded"),
            counters: (0, 3),
            action: EndAction::FailJob,
            rule: user(0, None),
        },
        Case {
            name: "the default disruption rule spends maxInfrastructureRestarts too",
            rules: vec![],
            backoff_limit: 3,
            max_infrastructure_restarts: Some(1),
            before: (0, 1),
            rank1: p(1, 0, "Running").disrupted("PreemptionByScheduler"),
            phase: JobPhase::Failed,
            failed_reason: Some("MaxInfrastructureRestartsExceeded"),
            counters: (0, 1),
            action: EndAction::FailJob,
            rule: default_rule(0, "disruption"),
        },
        Case {
            name: "onPodConditions with a reason matches the eviction",
            rules: vec![preemption_fails.clone(), eviction_not_counted.clone()],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Running").disrupted("EvictionByEvictionAPI"),
            phase: JobPhase::Failed,
            failed_reason: Some("FailurePolicy"),
            counters: (0, 0),
            action: EndAction::FailJob,
            rule: user(0, None),
        },
        Case {
            name: "first match wins: the eviction rule after a rule that does not match",
            rules: vec![oom_fails, eviction_not_counted],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Running").disrupted("EvictionByEvictionAPI"),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (0, 1),
            action: EndAction::RestartJobNotCounted,
            rule: user(1, None),
        },
    ];
    for case in &cases {
        let d = run(case);
        let name = case.name;
        assert_eq!(d.status.phase, Some(case.phase), "{name}");
        assert_eq!(
            condition(&d, condition::FAILED).map(|c| c.reason.as_str()),
            case.failed_reason,
            "{name}"
        );
        assert_eq!(
            (d.status.failure_restarts, d.status.disruption_restarts),
            case.counters,
            "{name}"
        );
        let end = d.status.history.last().expect("history");
        assert_eq!(end.action, Some(case.action), "{name}");
        assert_eq!(end.rule, case.rule, "{name}");
        assert_eq!(
            (end.failure_restarts, end.disruption_restarts),
            (Some(case.counters.0), Some(case.counters.1)),
            "{name}"
        );
        // One line says it all: the rule, the action and both counters.
        let rule = case.rule.as_ref().expect("rule").to_string();
        let said = format!(
            "rule {rule}: {:?}; failureRestarts {}, disruptionRestarts {}",
            case.action, case.counters.0, case.counters.1
        );
        let event = d
            .events
            .iter()
            .find(|e| e.reason == "Restarted" || e.reason == "Failed")
            .expect("event");
        assert!(event.note.contains(&said), "{name}: {}", event.note);
        assert!(!event.note.contains('\n'), "{name}");
    }
}

#[test]
fn the_container_reason_and_pod_conditions_are_recorded_for_the_rules() {
    let d = run(&Case {
        name: "",
        rules: vec![],
        backoff_limit: 3,
        max_infrastructure_restarts: None,
        before: (0, 0),
        rank1: p(1, 0, "Failed").exit(137).container_reason("OOMKilled"),
        phase: JobPhase::Restarting,
        failed_reason: None,
        counters: (1, 0),
        action: EndAction::RestartJob,
        rule: None,
    });
    let end = d.status.history.last().expect("history");
    assert_eq!(end.container_reason.as_deref(), Some("OOMKilled"));
    let d = run(&Case {
        rank1: p(1, 0, "Running").disrupted("EvictionByEvictionAPI"),
        ..Case {
            name: "",
            rules: vec![],
            backoff_limit: 3,
            max_infrastructure_restarts: None,
            before: (0, 0),
            rank1: p(1, 0, "Running"),
            phase: JobPhase::Restarting,
            failed_reason: None,
            counters: (0, 1),
            action: EndAction::RestartJobNotCounted,
            rule: None,
        }
    });
    let end = d.status.history.last().expect("history");
    assert_eq!(
        end.pod_conditions,
        vec![PodConditionMatcher {
            type_: "DisruptionTarget".into(),
            reason: Some("EvictionByEvictionAPI".into())
        }]
    );
}
