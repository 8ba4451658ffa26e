use super::*;
use crate::{ExitCodeMatcher, ExitCodeRange, FailurePolicy, PodConditionMatcher, validate_spec};

fn spec(rules: &str) -> RduJobSpec {
    let yaml = format!(
        "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {{name: t}}\nspec:\n  workers: 4\n  model: {{name: ffn-logreg}}\n  data: {{source: synthetic}}\n  training: {{epochs: 1, batchSize: 8, learningRate: 0.1}}\n  runPolicy:\n    failurePolicy:\n      rules: {rules}\n"
    );
    crate::parse_manifest(&yaml).expect("fixture").spec
}

fn errors(spec: &RduJobSpec) -> Vec<(String, String)> {
    validate_spec(spec)
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.field, e.message))
        .collect()
}

#[test]
fn the_readmes_rules_are_valid() {
    let s = spec(
        r#"
        - {name: oom-is-fatal, action: FailJob, onContainerReasons: [OOMKilled]}
        - {name: bad-input, action: FailJob, onExitCodes: {operator: In, values: [64, 65]}}
        - {name: node-trouble, action: RestartJobNotCounted,
           onPodConditions: [{type: DisruptionTarget}]}
        - {name: deleted, action: RestartJobNotCounted, onReasons: [PodDeleted, NodeLost]}
        - {name: hang-once, action: RestartJob, onReasons: [Hung], onRanks: [0]}"#,
    );
    assert_eq!(errors(&s), vec![]);
    // More of what rules may say.
    let s = spec(
        r#"
        - {action: FailJob, onExitCodes: {operator: In, values: [1], ranges: [{from: 64, to: 74}]}, onRanks: [0]}
        - {action: RestartJob, onSignals: [9, 15], onExitCodes: {operator: NotIn, values: [1]}}
        - {action: RestartJob, onPodConditions: [{type: DisruptionTarget, reason: EvictionByEvictionAPI}]}
        - {action: RestartJob}"#,
    );
    assert_eq!(errors(&s), vec![]);
}

#[test]
fn a_rule_that_can_never_match_is_refused_naming_it() {
    // (rules, the field, the CEL message the error carries)
    let table: Vec<(&str, String, &str)> = vec![
        (
            "[{action: FailJob, onExitCodes: {operator: In}}]",
            "rules[0].onExitCodes".into(),
            fp::EMPTY_EXIT_CODES,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, values: [256]}}]",
            "rules[0].onExitCodes".into(),
            fp::EXIT_CODE_RANGE,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, ranges: [{from: 9, to: 3}]}}]",
            "rules[0].onExitCodes".into(),
            fp::EXIT_CODE_RANGE,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, values: [0, 1]}}]",
            "rules[0].onExitCodes".into(),
            fp::EXIT_CODE_ZERO,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, ranges: [{from: 0, to: 3}]}}]",
            "rules[0].onExitCodes".into(),
            fp::EXIT_CODE_ZERO,
        ),
        (
            "[{action: FailJob, onSignals: []}]",
            "rules[0].onSignals".into(),
            fp::EMPTY_SIGNALS,
        ),
        (
            "[{action: FailJob, onSignals: [65]}]",
            "rules[0].onSignals".into(),
            fp::EMPTY_SIGNALS,
        ),
        (
            "[{action: FailJob, onReasons: []}]",
            "rules[0].onReasons".into(),
            fp::EMPTY_REASONS,
        ),
        (
            "[{action: FailJob, onContainerReasons: ['']}]",
            "rules[0].onContainerReasons".into(),
            fp::EMPTY_REASONS,
        ),
        (
            "[{action: FailJob, onPodConditions: [{type: ''}]}]",
            "rules[0].onPodConditions".into(),
            fp::EMPTY_POD_CONDITIONS,
        ),
        (
            "[{action: FailJob, onRanks: []}]",
            "rules[0].onRanks".into(),
            fp::EMPTY_RANKS,
        ),
        (
            "[{action: FailJob, onRanks: [4]}]",
            "rules[0].onRanks".into(),
            fp::RANK_BEYOND_WORKERS,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, values: [1]}, onSignals: [9]}]",
            "rules[0]".into(),
            fp::CODES_AND_SIGNALS_DISJOINT,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: NotIn, values: [137]}, onSignals: [9]}]",
            "rules[0]".into(),
            fp::CODES_AND_SIGNALS_DISJOINT,
        ),
        (
            "[{action: FailJob, onSignals: [9], onReasons: [Hung, PodDeleted]}]",
            "rules[0]".into(),
            fp::REASONS_WITHOUT_CODES,
        ),
        (
            "[{action: FailJob, onCause: Disruption, onReasons: [Hung]}]",
            "rules[0]".into(),
            fp::REASONS_AGAINST_CAUSE,
        ),
        (
            "[{action: FailJob, onCause: Failure, onReasons: [NodeLost]}]",
            "rules[0]".into(),
            fp::REASONS_AGAINST_CAUSE,
        ),
        (
            "[{action: FailJob, onCause: Failure, onPodConditions: [{type: DisruptionTarget}]}]",
            "rules[0]".into(),
            fp::CONDITIONS_AGAINST_CAUSE,
        ),
        (
            "[{action: FailJob}, {action: RestartJob, onReasons: [Hung]}]",
            "rules[0]".into(),
            fp::CATCH_ALL_NOT_LAST,
        ),
        (
            "[{name: a, action: FailJob, onReasons: [Hung]}, {name: a, action: FailJob, onReasons: [Error]}]",
            "rules[1].name".into(),
            fp::DUPLICATE_NAMES,
        ),
    ];
    for (i, (rules, field, message)) in table.into_iter().enumerate() {
        let found = errors(&spec(rules));
        let field = format!("{RULES}{}", field.trim_start_matches("rules"));
        assert!(
            found
                .iter()
                .any(|(f, m)| *f == field && m.contains(message) && m.starts_with(&field)),
            "row {i}: {rules}: want {field}: {message}, got {found:?}"
        );
    }
}

#[test]
fn actions_that_could_only_fail_are_refused() {
    let mut s = spec(
        "[{action: RestartJob, onReasons: [Hung]}, {action: RestartJobNotCounted, onReasons: [PodDeleted]}]",
    );
    s.run_policy.backoff_limit = 0;
    s.run_policy.max_infrastructure_restarts = Some(0);
    let found = errors(&s);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].1.ends_with(fp::RESTART_WITHOUT_BACKOFF),
        "{found:?}"
    );
    assert!(
        found[1].1.ends_with(fp::NOT_COUNTED_WITHOUT_BUDGET),
        "{found:?}"
    );
    // The budgets alone are fine: the defaults then fail at the first restart of their kind.
    s.run_policy.failure_policy = None;
    assert_eq!(errors(&s), vec![]);
}

#[test]
fn a_rule_an_earlier_one_covers_is_refused_and_one_it_does_not_is_kept() {
    // (rules, shadowed rule's index and its shadow's, or none)
    let table: Vec<(&str, Option<(usize, usize)>)> = vec![
        (
            "[{action: FailJob, onReasons: [Hung]}, {action: RestartJob, onReasons: [Hung]}]",
            Some((1, 0)),
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, ranges: [{from: 1, to: 100}]}}, {action: RestartJob, onExitCodes: {operator: In, values: [64, 65]}}]",
            Some((1, 0)),
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: NotIn, values: [75]}}, {action: RestartJob, onSignals: [9]}]",
            Some((1, 0)),
        ),
        (
            "[{action: FailJob, onSignals: [9]}, {action: RestartJob, onExitCodes: {operator: In, values: [137]}, onRanks: [0]}]",
            Some((1, 0)),
        ),
        (
            "[{action: FailJob, onCause: Disruption}, {action: RestartJob, onCause: Disruption, onReasons: [NodeLost]}]",
            Some((1, 0)),
        ),
        (
            "[{action: FailJob, onPodConditions: [{type: DisruptionTarget}]}, {action: RestartJob, onPodConditions: [{type: DisruptionTarget, reason: X}]}]",
            Some((1, 0)),
        ),
        (
            "[{action: FailJob, onRanks: [0, 1]}, {action: RestartJob, onReasons: [Hung]}, {action: RestartJob, onRanks: [1]}]",
            Some((2, 0)),
        ),
        (
            "[{action: FailJob, onReasons: [Hung]}, {action: FailJob}]",
            None,
        ),
        (
            "[{action: FailJob, onRanks: [0]}, {action: RestartJob, onRanks: [0, 1]}]",
            None,
        ),
        (
            "[{action: FailJob, onPodConditions: [{type: DisruptionTarget, reason: X}]}, {action: RestartJob, onPodConditions: [{type: DisruptionTarget}]}]",
            None,
        ),
        (
            "[{action: FailJob, onExitCodes: {operator: In, values: [137]}}, {action: RestartJob, onSignals: [9, 15]}]",
            None,
        ),
        (
            "[{action: FailJob, onSignals: [9]}, {action: RestartJob, onReasons: [OOMKilled]}]",
            None,
        ),
    ];
    for (i, (rules, shadowed)) in table.into_iter().enumerate() {
        let found = errors(&spec(rules));
        match shadowed {
            Some((later, earlier)) => {
                assert_eq!(found.len(), 1, "row {i}: {found:?}");
                assert_eq!(found[0].0, format!("{RULES}[{later}]"), "row {i}");
                assert!(
                    found[0].1.contains("does not already match")
                        && found[0].1.contains(&format!("{RULES}[{earlier}]")),
                    "row {i}: {found:?}"
                );
            }
            None => assert_eq!(found, vec![], "row {i}"),
        }
    }
}

#[test]
fn shadowing_is_judged_on_the_matchers_meaning() {
    let signals = |s: &[i32]| FailureRule {
        on_signals: Some(s.to_vec()),
        ..FailureRule::new(EndAction::FailJob)
    };
    let codes = |operator, values: &[i32], ranges: &[(i32, i32)]| FailureRule {
        on_exit_codes: Some(ExitCodeMatcher {
            operator,
            values: values.to_vec(),
            ranges: ranges
                .iter()
                .map(|&(from, to)| ExitCodeRange { from, to })
                .collect(),
        }),
        ..FailureRule::new(EndAction::FailJob)
    };
    assert!(shadows(
        &codes(ExitCodeOperator::In, &[], &[(129, 192)]),
        &signals(&[1, 64])
    ));
    assert!(!shadows(
        &codes(ExitCodeOperator::In, &[], &[(129, 191)]),
        &signals(&[1, 64])
    ));
    assert!(shadows(
        &signals(&[9]),
        &codes(ExitCodeOperator::In, &[137], &[])
    ));
    assert!(!shadows(
        &signals(&[9]),
        &FailureRule::new(EndAction::FailJob)
    ));
    let disruption = FailureRule {
        on_pod_conditions: Some(vec![PodConditionMatcher {
            type_: "DisruptionTarget".into(),
            reason: None,
        }]),
        ..FailureRule::new(EndAction::FailJob)
    };
    assert!(shadows(&FailureRule::new(EndAction::FailJob), &disruption));
    assert!(!shadows(&disruption, &FailureRule::new(EndAction::FailJob)));
    let _ = FailurePolicy::default();
}

#[test]
fn the_progress_deadline_has_a_floor() {
    let mut s = spec("[]");
    s.run_policy.progress_deadline_seconds = Some(19);
    assert_eq!(
        errors(&s),
        vec![(
            "spec.runPolicy.progressDeadlineSeconds".to_string(),
            fp::PROGRESS_DEADLINE_MINIMUM.to_string()
        )]
    );
    s.run_policy.progress_deadline_seconds = Some(20);
    assert_eq!(errors(&s), vec![]);
}
