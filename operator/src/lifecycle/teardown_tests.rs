//! Table-like cases of what nodes do to a running gang: a node lost after its ranks' peers gave up, a drain, a
//! node out of service, pods the operator itself stopped, and a cluster without room for the next generation.

use super::tests::{after, at, condition, decide, decide_with, lost, names, p, pods, with_status};
use super::*;
use crate::nodes::{Loss, Room};
use crate::test_fixtures::job;
use rdu_crds::{EndAction, EndCause, GenerationEnd};
use rdu_gang::RankExit;
use std::collections::BTreeMap;

fn room(ranks: &[(&str, u64)]) -> ClusterView {
    ClusterView {
        lost: BTreeMap::new(),
        room: Some(Room {
            by_node: ranks.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
            excluded: BTreeMap::from([("node-9".to_string(), "unreachable".to_string())]),
            largest: 4,
            offered: true,
        }),
    }
}

#[test]
fn a_crashed_node_found_after_its_peers_timed_out_is_blamed_and_not_counted() {
    // Ranks 0 and 1 ran on the node that crashed; ranks 2 and 3 timed out waiting for them.
    let mut j = with_status(job("mnist", None, 4), JobPhase::Running, 0, &[0, 1, 2, 3]);
    j.spec.run_policy.backoff_limit = 0;
    let observed = [
        p(0, 0, "Running"),
        p(1, 0, "Running"),
        p(2, 0, "Failed").exit(75).finished(29),
        p(3, 0, "Failed").exit(75).finished(30),
    ];
    let d = decide(&j, &pods(&observed), at(30));
    let stopping = d.status.stopping.clone().expect("stopping");
    assert_eq!((stopping.rank, stopping.cause), (2, EndCause::Failure));
    assert_eq!(
        d.changes,
        vec![Change::DeletePods {
            names: names(&[0, 1, 2, 3])
        }]
    );
    // The survivors' pods are gone; the crashed node's stay Terminating until it is declared unreachable.
    let j = after(j, &d);
    let stuck = [
        p(0, 0, "Running").terminating(),
        p(1, 0, "Running").terminating(),
    ];
    let d = decide(&j, &pods(&stuck), at(40));
    assert!(
        d.changes.is_empty(),
        "nothing to do but wait: {:?}",
        d.changes
    );
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
    let j = after(j, &d);
    // The node controller marks node-0 and node-1 unreachable: their ranks were lost with them, a disruption,
    // and their pods are deleted at once.
    let cluster = ClusterView {
        lost: BTreeMap::from([
            ("node-0".to_string(), Loss::Unreachable),
            ("node-1".to_string(), Loss::Unreachable),
        ]),
        room: None,
    };
    let d = decide_with(&j, &pods(&stuck), &cluster, at(50));
    assert_eq!(
        d.changes,
        vec![Change::ForceDeletePods {
            names: names(&[0, 1])
        }]
    );
    let stopping = d.status.stopping.clone().expect("stopping");
    assert_eq!((stopping.rank, stopping.cause), (0, EndCause::Disruption));
    assert_eq!(stopping.reason, "NodeLost");
    assert!(
        stopping.message.contains("node node-0 is unreachable"),
        "{}",
        stopping.message
    );
    assert_eq!(
        stopping.time,
        Time(at(30)),
        "stopping began at the first sign"
    );
    // Gone: the next generation starts whole, and backoffLimit 0 was not spent.
    let d = decide_with(&after(j, &d), &[], &cluster, at(51));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 1,
            ranks: vec![0, 1, 2, 3]
        }]
    );
    assert_eq!(
        (
            d.status.restarts,
            d.status.failure_restarts,
            d.status.disruption_restarts
        ),
        (1, 0, 1)
    );
    let end = d.status.history.last().expect("history");
    assert_eq!(end.action, Some(EndAction::RestartJobNotCounted));
    assert_eq!(end.time, Time(at(30)));
    assert!(
        condition(&d, condition::RESTARTING)
            .expect("c")
            .message
            .contains("a disruption: not counted against backoffLimit")
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == "Restarted" && !e.warning),
        "{:?}",
        d.events
    );
}

#[test]
fn a_rank_the_operator_stopped_is_a_consequence_not_a_cause() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let d = decide(
        &j,
        &pods(&[p(0, 0, "Running"), p(1, 0, "Failed").exit(75).finished(10)]),
        at(10),
    );
    let j = after(j, &d);
    // Rank 0, told to stop (SIGTERM), exits 143 after the stopping began: still rank 1's failure.
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Failed").exit(143).finished(11).terminating(),
            p(1, 0, "Failed").exit(75).finished(10).terminating(),
        ]),
        at(11),
    );
    assert_eq!(d.status.stopping.as_ref().map(|s| s.rank), Some(1));
    // Times are whole seconds: an exit in the very second the stopping began is the stop's doing too.
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Failed").exit(143).finished(10).terminating(),
            p(1, 0, "Failed").exit(75).finished(10).terminating(),
        ]),
        at(11),
    );
    assert_eq!(d.status.stopping.as_ref().map(|s| s.rank), Some(1));
    // A permanent failure that happened before the stop is still evidence, even on a terminating pod.
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Failed").exit(64).finished(9).terminating(),
            p(1, 0, "Failed").exit(75).finished(10).terminating(),
        ]),
        at(11),
    );
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    assert_eq!(
        condition(&d, condition::FAILED).expect("failed").reason,
        "PermanentFailure"
    );
}

#[test]
fn a_drained_rank_is_a_disruption_and_its_peers_are_stopped() {
    let mut j = with_status(job("mnist", None, 3), JobPhase::Running, 0, &[0, 1, 2]);
    j.spec.run_policy.backoff_limit = 0;
    // kubectl drain evicted rank 1 (its pod is terminating with DisruptionTarget).
    let observed = [
        p(0, 0, "Running"),
        p(1, 0, "Running")
            .terminating()
            .disrupted("EvictionByEvictionAPI"),
        p(2, 0, "Failed").exit(75).finished(3),
    ];
    let d = decide(&j, &pods(&observed), at(3));
    let stopping = d.status.stopping.clone().expect("stopping");
    assert_eq!(
        (stopping.rank, stopping.cause, stopping.reason.as_str()),
        (1, EndCause::Disruption, "EvictionByEvictionAPI")
    );
    assert_eq!(
        d.changes,
        vec![Change::DeletePods {
            names: names(&[0, 2])
        }]
    );
    let d = decide(&after(j, &d), &[], at(5));
    assert_eq!(
        (
            d.status.restarts,
            d.status.failure_restarts,
            d.status.disruption_restarts
        ),
        (1, 0, 1)
    );
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
}

#[test]
fn an_out_of_service_node_is_lost_at_once_and_old_generations_there_are_forced_out() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 1, &[0, 1]);
    let cluster = lost(&[1], Loss::OutOfService);
    // A pod of the running generation on the node, and a leftover of generation 0 stuck there.
    let mut leftover = p(1, 0, "Running").terminating().build("mnist");
    leftover.metadata.name = Some("mnist-worker-1-old".into());
    let mut observed = pods(&[p(0, 1, "Running"), p(1, 1, "Running")]);
    observed.push(leftover);
    let d = decide_with(&j, &observed, &cluster, at(3));
    assert_eq!(
        d.changes,
        vec![
            Change::ForceDeletePods {
                names: vec!["mnist-worker-1-old".into()]
            },
            Change::DeletePods { names: names(&[0]) },
            Change::ForceDeletePods { names: names(&[1]) },
        ]
    );
    assert!(
        d.status
            .stopping
            .as_ref()
            .is_some_and(|s| s.message.contains("out-of-service"))
    );
}

#[test]
fn restart_policy_never_fails_even_on_a_disruption() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    j.spec.run_policy.restart_policy = rdu_crds::RestartPolicy::Never;
    let d = decide_with(
        &j,
        &pods(&[p(0, 0, "Running")]),
        &lost(&[0], Loss::Unreachable),
        at(3),
    );
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    assert_eq!(
        d.status.history.last().and_then(|e| e.action),
        Some(EndAction::FailJob)
    );
    assert!(d.status.stopping.is_none());
}

#[test]
fn a_gang_without_room_waits_whole_and_starts_when_room_returns() {
    let j = with_status(job("mnist", None, 4), JobPhase::Restarting, 1, &[]);
    let d = decide_with(&j, &[], &room(&[("node-2", 2), ("node-3", 0)]), at(0));
    assert!(
        d.changes.is_empty(),
        "no half-started gang: {:?}",
        d.changes
    );
    let blocked = condition(&d, condition::PODS_BLOCKED).expect("blocked");
    assert_eq!(blocked.reason, condition::INSUFFICIENT_CAPACITY);
    assert_eq!(
        blocked.message,
        "the gang needs 4 rank(s) of 2 rdu.dev/tile each; the schedulable nodes have room for 2 rank(s): \
         node-2 room for 2, node-3 room for 0 (node-9 unreachable)"
    );
    assert_eq!(
        d.events
            .iter()
            .filter(|e| e.reason == condition::INSUFFICIENT_CAPACITY)
            .count(),
        1
    );
    assert_eq!(d.requeue_after, Some(Duration::from_secs(10)));
    // Still no room: no second event.
    let j = after(j, &d);
    let d = decide_with(&j, &[], &room(&[("node-2", 2)]), at(5));
    assert!(d.events.is_empty(), "{:?}", d.events);
    assert!(condition(&d, condition::PODS_BLOCKED).is_some());
    // A node comes back: the whole gang is created, and the condition clears once its pods run.
    let j = after(j, &d);
    let d = decide_with(&j, &[], &room(&[("node-1", 4), ("node-2", 2)]), at(9));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 1,
            ranks: vec![0, 1, 2, 3]
        }]
    );
    let j = after(j, &d);
    let running = pods(&[
        p(0, 1, "Running"),
        p(1, 1, "Running"),
        p(2, 1, "Running"),
        p(3, 1, "Running"),
    ]);
    let d = decide(&j, &running, at(12));
    assert!(condition(&d, condition::PODS_BLOCKED).is_none());
    assert_eq!(d.status.phase, Some(JobPhase::Running));
}

#[test]
fn the_history_keeps_the_last_generations() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    j.spec.run_policy.backoff_limit = 100;
    for generation in 0..(GenerationEnd::KEPT as u32 + 3) {
        let d = decide(
            &j,
            &pods(&[p(0, generation, "Failed").exit(75)]),
            at(i64::from(generation)),
        );
        let d = decide(&after(j.clone(), &d), &[], at(i64::from(generation)));
        j = after(j, &d);
        let mut status = j.status.take().expect("status");
        status.ranks = vec![rdu_crds::RankStatus {
            rank: 0,
            pod: consts::pod_name("mnist", 0),
            ..Default::default()
        }];
        j.status = Some(status);
    }
    let history = &j.status.as_ref().expect("status").history;
    assert_eq!(history.len(), GenerationEnd::KEPT);
    assert_eq!(history.first().map(|e| e.generation), Some(3));
    assert_eq!(
        history.last().map(|e| e.generation),
        Some(GenerationEnd::KEPT as u32 + 2)
    );
}

#[test]
fn a_pod_the_kubelet_rejected_before_its_worker_ran_is_the_nodes_trouble() {
    let cases = [
        (RankExit::Lost, "UnexpectedAdmissionError", true),
        (RankExit::Lost, "OutOfcpu", true),
        (RankExit::Lost, "NodeAffinity", true),
        (RankExit::Lost, "NodeShutdown", true),
        (RankExit::Lost, "Evicted", true),
        (RankExit::Lost, "Error", false),
        // A worker that ran and failed is the job's, whatever the pod says.
        (RankExit::Code(1), "UnexpectedAdmissionError", false),
    ];
    for (exit, reason, disruption) in cases {
        assert_eq!(
            super::teardown::rejected_by_kubelet(exit, reason),
            disruption,
            "{exit:?} {reason}"
        );
    }
    let mut j = with_status(job("mnist", None, 2), JobPhase::Pending, 0, &[0, 1]);
    j.spec.run_policy.backoff_limit = 0;
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Failed").reason("UnexpectedAdmissionError"),
            p(1, 0, "Running"),
        ]),
        at(2),
    );
    let stopping = d.status.stopping.clone().expect("stopping");
    assert_eq!(
        (stopping.cause, stopping.reason.as_str()),
        (EndCause::Disruption, "UnexpectedAdmissionError")
    );
    let d = decide(&after(j, &d), &[], at(3));
    assert_eq!((d.status.restarts, d.status.failure_restarts), (1, 0));
}

#[test]
fn a_rank_larger_than_any_node_says_so() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Pending, 0, &[]);
    j.spec.tiles_per_worker = 8;
    let d = decide_with(&j, &[], &room(&[("node-2", 0)]), at(0));
    let blocked = condition(&d, condition::PODS_BLOCKED).expect("blocked");
    assert!(
        blocked.message.ends_with(
            "; no schedulable node has 8 rdu.dev/tile in all (the largest has 4): lower spec.tilesPerWorker or add larger nodes"
        ),
        "{}",
        blocked.message
    );
}

#[test]
fn a_gang_that_keeps_failing_backs_off_from_its_second_restart() {
    // Both ranks exit 75 soon after they start, generation after generation.
    let mut j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    j.spec.run_policy.backoff_limit = 5;
    let mut now = 10;
    for generation in 0..3u32 {
        let failed = [
            p(0, generation, "Failed").exit(75).finished(now),
            p(1, generation, "Failed").exit(75).finished(now),
        ];
        let d = decide(&j, &pods(&failed), at(now));
        assert_eq!(
            d.changes,
            vec![Change::DeletePods {
                names: names(&[0, 1])
            }],
            "generation {generation}"
        );
        j = after(j, &d);
        // The pods are gone a second later: the next generation, at once the first time, then after 10 s, 20 s.
        let wait = [0, 10, 20][generation as usize];
        let d = decide(&j, &[], at(now + 1));
        if wait == 0 {
            assert_eq!(
                d.changes,
                vec![Change::CreatePods {
                    generation: generation + 1,
                    ranks: vec![0, 1]
                }]
            );
        } else {
            assert!(d.changes.is_empty(), "{:?}", d.changes);
            let c = condition(&d, condition::RESTARTING).expect("restarting");
            assert_eq!(c.reason, "BackOff");
            assert!(
                c.message.starts_with(&format!(
                    "backing off {wait} s before generation {}: restart {} within 10 minutes",
                    generation + 1,
                    generation + 1
                )),
                "{}",
                c.message
            );
            assert_eq!(
                d.requeue_after,
                Some(std::time::Duration::from_secs(wait - 1))
            );
            j = after(j, &d);
            let early = decide(&j, &[], at(now + i64::try_from(wait).expect("wait") - 1));
            assert!(early.changes.is_empty(), "not before the backoff ends");
            let d = decide(&j, &[], at(now + i64::try_from(wait).expect("wait")));
            assert_eq!(
                d.changes,
                vec![Change::CreatePods {
                    generation: generation + 1,
                    ranks: vec![0, 1]
                }]
            );
            j = after(j, &d);
            now += i64::try_from(wait).expect("wait");
            continue;
        }
        j = after(j, &d);
        now += 1;
    }
    assert_eq!(j.status.as_ref().map(|s| s.failure_restarts), Some(3));
}
