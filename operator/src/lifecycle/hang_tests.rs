//! Hang detection over a 2-rank job with `progressDeadlineSeconds: 60`: the window, its resets, the requeue at
//! the deadline, the `Hung` end and the rules that judge it.

use super::tests::{after, at, condition, decide, names, p, pods, with_status};
use super::*;
use crate::test_fixtures::job;
use rdu_crds::{
    EndAction, EndCause, FailurePolicy, FailureRule, MatchedRule, RduJob, RuleSource,
    TrainingProgress,
};

fn watched(deadline: Option<u64>) -> RduJob {
    let mut j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    j.spec.run_policy.progress_deadline_seconds = deadline;
    j
}

/// `j` as the next reconcile sees it, with rank 0 having reported `step`.
fn reported(mut j: RduJob, step: Option<u64>) -> RduJob {
    if let Some(s) = j.status.as_mut() {
        s.progress = step.map(|step| TrainingProgress {
            step,
            ..Default::default()
        });
    }
    j
}

/// [`reported`], the report taken by the operator at `second`.
fn reported_at(j: RduJob, step: Option<u64>, second: i64) -> RduJob {
    let mut j = reported(j, step);
    if let Some(progress) = j.status.as_mut().and_then(|s| s.progress.as_mut()) {
        progress.update_time = Some(Time(at(second)));
    }
    j
}

fn running() -> Vec<k8s_openapi::api::core::v1::Pod> {
    pods(&[p(0, 0, "Running"), p(1, 0, "Running")])
}

#[test]
fn a_step_that_stands_still_for_the_deadline_stops_the_gang_as_hung() {
    // (second, step rank 0 reported) -> the requeue, or the hang.
    let j = reported(watched(Some(60)), Some(10));
    let d = decide(&j, &running(), at(5));
    let mark = d.status.last_progress.clone().expect("mark");
    assert_eq!(
        (mark.generation, mark.step, mark.since),
        (0, Some(10), Time(at(5)))
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
    // The step advanced: the window starts again.
    let j = reported(after(j, &d), Some(20));
    let d = decide(&j, &running(), at(40));
    assert_eq!(
        d.status.last_progress.as_ref().map(|m| m.since.clone()),
        Some(Time(at(40)))
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
    // Still at 20 a little later: requeued for what is left of the window, no earlier and no later.
    let j = after(j, &d);
    let d = decide(&j, &running(), at(70));
    assert_eq!(d.requeue_after, Some(Duration::from_secs(30)));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    // At the deadline, a report taken then still says 20: rank 0 is blamed with Hung, and the generation stops.
    let j = reported_at(after(j, &d), Some(20), 100);
    let d = decide(&j, &running(), at(100));
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
    let stopping = d.status.stopping.clone().expect("stopping");
    assert_eq!(
        (
            stopping.rank,
            stopping.reason.as_str(),
            stopping.cause,
            stopping.exit_code
        ),
        (0, "Hung", EndCause::Failure, None)
    );
    let c = condition(&d, condition::RESTARTING).expect("restarting");
    assert!(
        c.message
            .contains("rank 0 hung: its step stayed at 20 for 60 s while every rank ran"),
        "{}",
        c.message
    );
    assert_eq!(
        d.changes,
        vec![Change::DeletePods {
            names: names(&[0, 1])
        }]
    );
    assert!(d.status.last_progress.is_none(), "no window while stopping");
    // The pods the operator deleted exit on its signal: a consequence, not evidence; the hang stays the culprit.
    let j = after(j, &d);
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Failed").exit(143).finished(100).terminating(),
            p(1, 0, "Running").terminating(),
        ]),
        at(101),
    );
    assert_eq!(
        d.status.stopping.as_ref().map(|s| s.reason.as_str()),
        Some("Hung")
    );
    // Gone: by default a hang is the job's own failure, counted against backoffLimit.
    let d = decide(&after(j, &d), &[], at(102));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 1,
            ranks: vec![0, 1]
        }]
    );
    assert_eq!(
        (d.status.failure_restarts, d.status.disruption_restarts),
        (1, 0)
    );
    let end = d.status.history.last().expect("history");
    assert_eq!(end.action, Some(EndAction::RestartJob));
    assert_eq!(
        end.rule,
        Some(MatchedRule {
            source: RuleSource::RestartPolicy,
            index: 3,
            name: Some("no-exit-code".into())
        })
    );
}

#[test]
fn a_rule_on_the_hung_reason_decides_what_follows() {
    let mut j = reported(watched(Some(60)), Some(7));
    j.spec.run_policy.failure_policy = Some(FailurePolicy {
        rules: vec![FailureRule {
            on_reasons: Some(vec!["Hung".into()]),
            ..FailureRule::new(EndAction::FailJob)
        }],
    });
    let d = decide(&j, &running(), at(0));
    let d = decide(&reported_at(after(j, &d), Some(7), 60), &running(), at(60));
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    let c = condition(&d, condition::FAILED).expect("failed");
    assert_eq!(c.reason, "FailurePolicy");
    assert!(c.message.contains("its step stayed at 7"), "{}", c.message);
}

#[test]
fn no_window_unless_every_rank_runs_and_a_deadline_is_set() {
    // (deadline, rank 1's pod) -> no mark, no hang, however long the step stands still.
    let table = [
        (None, p(1, 0, "Running")),
        (Some(60), p(1, 0, "Pending")),
        (Some(60), p(1, 0, "Succeeded").exit(0)),
    ];
    for (i, (deadline, rank1)) in table.into_iter().enumerate() {
        let j = reported(watched(deadline), Some(3));
        let observed = pods(&[p(0, 0, "Running"), rank1]);
        let d = decide(&j, &observed, at(0));
        let d = decide(&after(j, &d), &observed, at(1000));
        assert!(d.status.last_progress.is_none(), "row {i}");
        assert!(d.status.stopping.is_none(), "row {i}");
        assert_ne!(d.status.phase, Some(JobPhase::Restarting), "row {i}");
    }
}

#[test]
fn a_new_generation_and_a_resumed_job_start_a_new_window() {
    // The mark of generation 0 does not count against generation 1, even at the same step.
    let mut j = reported(watched(Some(60)), Some(5));
    if let Some(s) = j.status.as_mut() {
        s.restarts = 1;
        s.last_progress = Some(rdu_crds::ProgressMark {
            generation: 0,
            step: Some(5),
            since: Time(at(0)),
        });
    }
    let d = decide(
        &j,
        &pods(&[p(0, 1, "Running"), p(1, 1, "Running")]),
        at(500),
    );
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert_eq!(
        d.status.last_progress.map(|m| (m.generation, m.since)),
        Some((1, Time(at(500))))
    );
    // Suspending forgets the window.
    let mut j = reported(watched(Some(60)), Some(5));
    j.spec.run_policy.suspend = true;
    let d = decide(&j, &running(), at(0));
    assert!(d.status.last_progress.is_none());
}

#[test]
fn at_the_deadline_a_report_on_its_way_is_waited_for_without_saying_reports_stopped() {
    // The step stood at 20 from 40; at the deadline (100) the newest report was taken at 96, one heartbeat ago.
    let j = reported_at(watched(Some(60)), Some(20), 40);
    let d = decide(&j, &running(), at(40));
    let j = reported_at(after(j, &d), Some(20), 96);
    let d = decide(&j, &running(), at(100));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    assert!(
        condition(&d, condition::PROGRESS_UNREPORTED).is_none(),
        "a report 4 s old is no silence"
    );
    assert!(d.events.iter().all(|e| e.reason != "ProgressUnreported"));
    assert_eq!(d.requeue_after, Some(Duration::from_secs(11)));
    // The next heartbeat says 20 still: hung, 61 s after the step stood still.
    let j = reported_at(after(j, &d), Some(20), 101);
    let d = decide(&j, &running(), at(101));
    let stopping = d.status.stopping.clone().expect("stopping");
    assert_eq!((stopping.rank, stopping.reason.as_str()), (0, "Hung"));
    assert!(condition(&d, condition::PROGRESS_UNREPORTED).is_none());
}

#[test]
fn missing_reports_never_restart_the_gang_and_say_so_until_reports_come_back() {
    let j = reported_at(watched(Some(60)), Some(10), 0);
    let d = decide(&j, &running(), at(0));
    // The deadline passes with no report taken since the one at 0 (a flooded progress port): no hang.
    let j = after(j, &d);
    let d = decide(&j, &running(), at(60));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert!(
        d.status.stopping.is_none() && d.changes.is_empty(),
        "{:?}",
        d.changes
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(5)));
    let c = condition(&d, condition::PROGRESS_UNREPORTED).expect("unreported");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NoReportTaken")
    );
    assert!(
        c.message.starts_with(
            "no progress report from rank 0 taken for 60 s (the last one taken said step 10)"
        ),
        "{}",
        c.message
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.warning && e.reason == "ProgressUnreported")
    );
    // Still none: said once, not again.
    let j = after(j, &d);
    let d = decide(&j, &running(), at(65));
    assert!(d.events.iter().all(|e| e.reason != "ProgressUnreported"));
    // A report comes: the step moved, so the job runs on, never restarted for the silence.
    let j = reported_at(after(j, &d), Some(11), 66);
    let d = decide(&j, &running(), at(66));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    let c = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::PROGRESS_UNREPORTED)
        .expect("kept, false");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "ReportsTaken")
    );
    assert_eq!(d.status.failure_restarts, 0);
}
