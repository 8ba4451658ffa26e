//! `rdu_gang::scenarios` through the operator: each case's ends seen as failed or succeeded pods in one look, the
//! pods the look deleted gone before the next, and the lifecycle's outcome read from `status`.

use super::tests::{after, at, decide, p, pods, with_status};
use super::*;
use crate::test_fixtures::job;
use rdu_gang::scenarios::{self, Scenario, Want};

/// Plays `s` on pods: one look sees every listed end (the others run), then every pod is gone.
fn play(s: &Scenario) -> Want {
    let ranks: Vec<u32> = (0..s.workers).collect();
    let mut j = with_status(job("mnist", None, s.workers), JobPhase::Running, 0, &ranks);
    j.spec.run_policy = s.policy.clone();
    if let Some(status) = j.status.as_mut() {
        status.failure_restarts = s.restarts.counted;
        status.disruption_restarts = s.restarts.not_counted;
    }
    let observed: Vec<_> = ranks
        .iter()
        .map(|&rank| match s.ends.iter().find(|(r, _)| *r == rank) {
            Some((_, 0)) => p(rank, 0, "Succeeded").exit(0),
            Some((_, code)) => p(rank, 0, "Failed").exit(*code).finished(5),
            None => p(rank, 0, "Running"),
        })
        .collect();
    let mut d = decide(&j, &pods(&observed), at(5));
    if d.status.phase == Some(JobPhase::Restarting) {
        j = after(j, &d);
        d = decide(&j, &[], at(6));
    }
    let blamed = || d.status.history.last().expect("an end in the history").rank;
    match d.status.phase {
        Some(JobPhase::Succeeded) => Want::Succeeded,
        Some(JobPhase::Failed) => {
            let reason = condition_reason(&d);
            let reason = [
                rdu_gang::FailureReason::RestartPolicyNever,
                rdu_gang::FailureReason::PermanentFailure,
                rdu_gang::FailureReason::BackoffLimitExceeded,
                rdu_gang::FailureReason::MaxInfrastructureRestartsExceeded,
                rdu_gang::FailureReason::FailurePolicy,
            ]
            .into_iter()
            .find(|r| r.as_str() == reason)
            .unwrap_or_else(|| panic!("{}: failed for {reason}", s.name));
            Want::Fail {
                rank: blamed(),
                reason,
            }
        }
        _ if d.status.restarts == 1 => Want::Restart {
            rank: blamed(),
            counted: d.status.failure_restarts > s.restarts.counted,
        },
        phase => panic!("{}: neither ended nor restarted: {phase:?}", s.name),
    }
}

fn condition_reason(d: &Decision) -> String {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::FAILED && c.status == "True")
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

#[test]
fn the_gangs_cases_come_out_on_pods_as_in_local_mode() {
    for s in scenarios::all() {
        assert_eq!(play(&s), s.want, "{}", s.name);
    }
}
