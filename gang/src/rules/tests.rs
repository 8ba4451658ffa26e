use super::*;
use EndAction::{FailJob, RestartJob, RestartJobNotCounted};
use EndCause::{Disruption, Failure};
use RankExit::{Code, Lost, Signal};
use rdu_crds::FailurePolicy;

fn culprit(rank: u32, exit: RankExit, reason: &str, cause: EndCause) -> Culprit {
    Culprit {
        rank,
        exit,
        reason: reason.to_string(),
        container_reason: matches!(exit, Code(_)).then(|| reason.to_string()),
        pod_conditions: Vec::new(),
        cause,
    }
}

fn evicted(reason: &str) -> Culprit {
    Culprit {
        pod_conditions: vec![
            PodConditionMatcher {
                type_: "Ready".into(),
                reason: None,
            },
            PodConditionMatcher {
                type_: rdu_crds::failure_policy::DISRUPTION_TARGET.into(),
                reason: Some(reason.into()),
            },
        ],
        container_reason: Some("Error".into()),
        ..culprit(2, Code(143), reason, Disruption)
    }
}

fn codes(operator: ExitCodeOperator, values: &[i32], ranges: &[(i32, i32)]) -> FailureRule {
    FailureRule {
        on_exit_codes: Some(ExitCodeMatcher {
            operator,
            values: values.to_vec(),
            ranges: ranges
                .iter()
                .map(|&(from, to)| ExitCodeRange { from, to })
                .collect(),
        }),
        ..FailureRule::new(FailJob)
    }
}

fn strings(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|s| s.to_string()).collect())
}

#[test]
fn every_matcher_matches_what_it_names_and_nothing_else() {
    use ExitCodeOperator::{In, NotIn};
    let oom = culprit(1, Code(137), "OOMKilled", Failure);
    let error = culprit(0, Code(1), "Error", Failure);
    let killed_locally = culprit(3, Signal(9), "Error", Failure);
    let deleted = culprit(2, Lost, "PodDeleted", Failure);
    let hung = culprit(0, Lost, "Hung", Failure);
    let lost_node = culprit(1, Lost, "NodeLost", Disruption);
    let drained = evicted("EvictionByEvictionAPI");
    let signals = |s: &[i32]| FailureRule {
        on_signals: Some(s.to_vec()),
        ..FailureRule::new(FailJob)
    };
    let conditions = |list: &[(&str, Option<&str>)]| FailureRule {
        on_pod_conditions: Some(
            list.iter()
                .map(|(t, r)| PodConditionMatcher {
                    type_: t.to_string(),
                    reason: r.map(str::to_string),
                })
                .collect(),
        ),
        ..FailureRule::new(FailJob)
    };
    // (what, rule, culprit, matches)
    let table: Vec<(&str, FailureRule, &Culprit, bool)> = vec![
        ("In a value", codes(In, &[137], &[]), &oom, true),
        ("In a range", codes(In, &[], &[(129, 160)]), &oom, true),
        ("In, not listed", codes(In, &[1, 2], &[(3, 9)]), &oom, false),
        ("In a value", codes(In, &[1], &[]), &error, true),
        (
            "In: a local signal is 128+N",
            codes(In, &[137], &[]),
            &killed_locally,
            true,
        ),
        (
            "In: no exit code never matches",
            codes(In, &[137], &[(1, 255)]),
            &deleted,
            false,
        ),
        (
            "NotIn a listed code",
            codes(NotIn, &[137], &[]),
            &oom,
            false,
        ),
        (
            "NotIn another code",
            codes(NotIn, &[75], &[(129, 255)]),
            &error,
            true,
        ),
        (
            "NotIn: no exit code never matches",
            codes(NotIn, &[75], &[]),
            &hung,
            false,
        ),
        ("a signal", signals(&[9]), &oom, true),
        ("a signal, locally", signals(&[9]), &killed_locally, true),
        ("another signal", signals(&[15]), &oom, false),
        (
            "signals need an exit code",
            signals(&[9]),
            &lost_node,
            false,
        ),
        (
            "signals and codes together",
            FailureRule {
                on_signals: Some(vec![9]),
                ..codes(In, &[137], &[])
            },
            &oom,
            true,
        ),
        (
            "reason",
            FailureRule {
                on_reasons: strings(&["PodDeleted", "Hung"]),
                ..FailureRule::new(RestartJobNotCounted)
            },
            &deleted,
            true,
        ),
        (
            "reason Hung",
            FailureRule {
                on_reasons: strings(&["Hung"]),
                ..FailureRule::new(FailJob)
            },
            &hung,
            true,
        ),
        (
            "another reason",
            FailureRule {
                on_reasons: strings(&["Hung"]),
                ..FailureRule::new(FailJob)
            },
            &deleted,
            false,
        ),
        (
            "a disruption's reason",
            FailureRule {
                on_reasons: strings(&["EvictionByEvictionAPI"]),
                ..FailureRule::new(FailJob)
            },
            &drained,
            true,
        ),
        (
            "container reason",
            FailureRule {
                on_container_reasons: strings(&["OOMKilled"]),
                ..FailureRule::new(FailJob)
            },
            &oom,
            true,
        ),
        (
            "container reason of another",
            FailureRule {
                on_container_reasons: strings(&["OOMKilled"]),
                ..FailureRule::new(FailJob)
            },
            &error,
            false,
        ),
        (
            "no container, no container reason",
            FailureRule {
                on_container_reasons: strings(&["Error"]),
                ..FailureRule::new(FailJob)
            },
            &deleted,
            false,
        ),
        (
            "condition type",
            conditions(&[("DisruptionTarget", None)]),
            &drained,
            true,
        ),
        (
            "condition type and reason",
            conditions(&[("DisruptionTarget", Some("EvictionByEvictionAPI"))]),
            &drained,
            true,
        ),
        (
            "condition, another reason",
            conditions(&[("DisruptionTarget", Some("PreemptionByScheduler"))]),
            &drained,
            false,
        ),
        (
            "any of the conditions",
            conditions(&[("Foo", None), ("Ready", None)]),
            &drained,
            true,
        ),
        (
            "a condition the pod lacks",
            conditions(&[("DisruptionTarget", None)]),
            &oom,
            false,
        ),
        (
            "cause Disruption",
            FailureRule {
                on_cause: Some(Disruption),
                ..FailureRule::new(FailJob)
            },
            &lost_node,
            true,
        ),
        (
            "cause Failure",
            FailureRule {
                on_cause: Some(Failure),
                ..FailureRule::new(FailJob)
            },
            &lost_node,
            false,
        ),
        (
            "rank",
            FailureRule {
                on_ranks: Some(vec![0, 1]),
                ..FailureRule::new(FailJob)
            },
            &oom,
            true,
        ),
        (
            "another rank",
            FailureRule {
                on_ranks: Some(vec![0]),
                ..FailureRule::new(FailJob)
            },
            &oom,
            false,
        ),
        (
            "every matcher must hold",
            FailureRule {
                on_ranks: Some(vec![1]),
                on_cause: Some(Failure),
                ..codes(In, &[1], &[])
            },
            &oom,
            false,
        ),
        (
            "a rule without matchers matches all",
            FailureRule::new(RestartJob),
            &lost_node,
            true,
        ),
    ];
    for (what, rule, c, expected) in table {
        assert_eq!(matches(&rule, c), expected, "{what}: {rule:?} on {c:?}");
    }
}

fn run(policy: RestartPolicy, rules: Vec<FailureRule>) -> RunPolicy {
    RunPolicy {
        restart_policy: policy,
        failure_policy: (!rules.is_empty()).then_some(FailurePolicy { rules }),
        ..RunPolicy::default()
    }
}

fn rule_ref(source: RuleSource, index: u32, name: Option<&str>) -> MatchedRule {
    MatchedRule {
        source,
        index,
        name: name.map(str::to_string),
    }
}

#[test]
fn the_defaults_are_todays_restart_policies() {
    use RestartPolicy::{ExitCode, Never, OnFailure};
    use RuleSource::RestartPolicy as Default;
    let none = Restarts::default();
    // (restartPolicy, culprit) -> (default rule index and name, verdict): what after_end decided before rules.
    let table: Vec<(RestartPolicy, Culprit, u32, &str, Verdict)> = vec![
        (
            ExitCode,
            culprit(1, Lost, "NodeLost", Disruption),
            0,
            "disruption",
            Verdict::Restart { counted: false },
        ),
        (
            ExitCode,
            evicted("EvictionByEvictionAPI"),
            0,
            "disruption",
            Verdict::Restart { counted: false },
        ),
        (
            ExitCode,
            culprit(0, Code(75), "Error", Failure),
            1,
            "retryable-exit-code",
            Verdict::Restart { counted: true },
        ),
        (
            ExitCode,
            culprit(0, Code(137), "OOMKilled", Failure),
            1,
            "retryable-exit-code",
            Verdict::Restart { counted: true },
        ),
        (
            ExitCode,
            culprit(0, Signal(15), "Error", Failure),
            1,
            "retryable-exit-code",
            Verdict::Restart { counted: true },
        ),
        (
            ExitCode,
            culprit(0, Code(255), "Error", Failure),
            1,
            "retryable-exit-code",
            Verdict::Restart { counted: true },
        ),
        (
            ExitCode,
            culprit(0, Code(1), "Error", Failure),
            2,
            "permanent-exit-code",
            Verdict::Fail(FailureReason::PermanentFailure),
        ),
        (
            ExitCode,
            culprit(0, Code(64), "Error", Failure),
            2,
            "permanent-exit-code",
            Verdict::Fail(FailureReason::PermanentFailure),
        ),
        (
            ExitCode,
            culprit(0, Code(128), "Error", Failure),
            2,
            "permanent-exit-code",
            Verdict::Fail(FailureReason::PermanentFailure),
        ),
        (
            ExitCode,
            culprit(0, Lost, "PodDeleted", Failure),
            3,
            "no-exit-code",
            Verdict::Restart { counted: true },
        ),
        (
            ExitCode,
            culprit(0, Lost, "Hung", Failure),
            3,
            "no-exit-code",
            Verdict::Restart { counted: true },
        ),
        (
            OnFailure,
            culprit(0, Lost, "NodeLost", Disruption),
            0,
            "disruption",
            Verdict::Restart { counted: false },
        ),
        (
            OnFailure,
            culprit(0, Code(65), "Error", Failure),
            1,
            "any-failure",
            Verdict::Restart { counted: true },
        ),
        (
            OnFailure,
            culprit(0, Lost, "Hung", Failure),
            1,
            "any-failure",
            Verdict::Restart { counted: true },
        ),
        (
            Never,
            culprit(0, Code(75), "Error", Failure),
            0,
            "never",
            Verdict::Fail(FailureReason::RestartPolicyNever),
        ),
        (
            Never,
            culprit(0, Lost, "NodeLost", Disruption),
            0,
            "never",
            Verdict::Fail(FailureReason::RestartPolicyNever),
        ),
        (
            Never,
            culprit(0, Lost, "Hung", Failure),
            0,
            "never",
            Verdict::Fail(FailureReason::RestartPolicyNever),
        ),
    ];
    for (i, (policy, c, index, name, verdict)) in table.into_iter().enumerate() {
        let ruling = judge(&run(policy, vec![]), none, &c);
        assert_eq!(ruling.rule, rule_ref(Default, index, Some(name)), "row {i}");
        assert_eq!(ruling.verdict, verdict, "row {i}");
        if c.exit != Lost && c.reason != "Hung" {
            assert_eq!(
                super::super::after_end(policy, 3, 0, c.exit, c.cause),
                verdict,
                "row {i}: after_end agrees"
            );
        }
    }
}

#[test]
fn the_first_matching_rule_decides_and_the_defaults_take_the_rest() {
    let oom = FailureRule {
        name: Some("oom-is-fatal".into()),
        on_container_reasons: strings(&["OOMKilled"]),
        ..FailureRule::new(FailJob)
    };
    let deleted = FailureRule {
        on_reasons: strings(&["PodDeleted"]),
        ..FailureRule::new(RestartJobNotCounted)
    };
    let rank0_permanent = FailureRule {
        on_ranks: Some(vec![0]),
        ..codes(ExitCodeOperator::In, &[1], &[])
    };
    let drain_counts = FailureRule {
        on_pod_conditions: Some(vec![PodConditionMatcher {
            type_: "DisruptionTarget".into(),
            reason: Some("EvictionByEvictionAPI".into()),
        }]),
        ..FailureRule::new(RestartJob)
    };
    let policy = run(
        RestartPolicy::OnFailure,
        vec![oom, deleted, rank0_permanent, drain_counts],
    );
    use RuleSource::{FailurePolicy as Own, RestartPolicy as Default};
    let none = Restarts::default();
    // (culprit) -> (rule, action, verdict)
    let table: Vec<(Culprit, MatchedRule, EndAction, Verdict)> = vec![
        (
            culprit(3, Code(137), "OOMKilled", Failure),
            rule_ref(Own, 0, Some("oom-is-fatal")),
            FailJob,
            Verdict::Fail(FailureReason::FailurePolicy),
        ),
        (
            culprit(3, Lost, "PodDeleted", Failure),
            rule_ref(Own, 1, None),
            RestartJobNotCounted,
            Verdict::Restart { counted: false },
        ),
        (
            culprit(0, Code(1), "Error", Failure),
            rule_ref(Own, 2, None),
            FailJob,
            Verdict::Fail(FailureReason::FailurePolicy),
        ),
        (
            evicted("EvictionByEvictionAPI"),
            rule_ref(Own, 3, None),
            RestartJob,
            Verdict::Restart { counted: true },
        ),
        // Left to OnFailure's defaults.
        (
            culprit(1, Code(1), "Error", Failure),
            rule_ref(Default, 1, Some("any-failure")),
            RestartJob,
            Verdict::Restart { counted: true },
        ),
        (
            evicted("PreemptionByScheduler"),
            rule_ref(Default, 0, Some("disruption")),
            RestartJobNotCounted,
            Verdict::Restart { counted: false },
        ),
    ];
    for (i, (c, rule, action, verdict)) in table.into_iter().enumerate() {
        let ruling = judge(&policy, none, &c);
        assert_eq!(
            (ruling.rule, ruling.action, ruling.verdict),
            (rule, action, verdict),
            "row {i}"
        );
    }
}

#[test]
fn each_action_spends_its_own_budget() {
    let mut policy = run(RestartPolicy::ExitCode, vec![]);
    policy.backoff_limit = 2;
    policy.max_infrastructure_restarts = Some(1);
    let failure = culprit(0, Code(75), "Error", Failure);
    let disruption = culprit(0, Lost, "NodeLost", Disruption);
    let at = |counted, not_counted| Restarts {
        counted,
        not_counted,
    };
    // (culprit, restarts so far) -> verdict
    let table = [
        (&failure, at(1, 5), Verdict::Restart { counted: true }),
        (
            &failure,
            at(2, 0),
            Verdict::Fail(FailureReason::BackoffLimitExceeded),
        ),
        (&disruption, at(9, 0), Verdict::Restart { counted: false }),
        (
            &disruption,
            at(0, 1),
            Verdict::Fail(FailureReason::MaxInfrastructureRestartsExceeded),
        ),
    ];
    for (i, (c, restarts, verdict)) in table.into_iter().enumerate() {
        let ruling = judge(&policy, restarts, c);
        assert_eq!(ruling.verdict, verdict, "row {i}");
        let followed = match verdict {
            Verdict::Fail(_) => FailJob,
            Verdict::Restart { counted: true } => RestartJob,
            Verdict::Restart { counted: false } => RestartJobNotCounted,
        };
        assert_eq!(ruling.end_action(), followed, "row {i}");
    }
    // No cap: uncounted restarts go on.
    policy.max_infrastructure_restarts = None;
    assert_eq!(
        judge(&policy, at(0, 1000), &disruption).verdict,
        Verdict::Restart { counted: false }
    );
    assert!(FailureReason::MaxInfrastructureRestartsExceeded.is_spent_budget());
    assert!(!FailureReason::FailurePolicy.is_spent_budget());
}
