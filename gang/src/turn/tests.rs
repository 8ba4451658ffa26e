//! The turn's table: every branch, and the blame between what a look sees and what was recorded.

use super::*;
use crate::RankExit::{Code, Lost, Signal};
use crate::{Hang, Next};
use rdu_crds::EndCause::{Disruption, Failure};
use rdu_crds::RestartPolicy;

fn failed(rank: u32, exit: RankExit) -> Culprit {
    Culprit::from_exit(rank, exit, Failure)
}

fn disrupted(rank: u32) -> Culprit {
    Culprit::from_exit(rank, Lost, Disruption)
}

/// Four ranks, all started and present.
fn running() -> RankTally {
    RankTally {
        workers: 4,
        started: 4,
        succeeded: 0,
        present: 4,
    }
}

/// A generation of which nothing is left.
fn gone() -> RankTally {
    RankTally {
        present: 0,
        ..running()
    }
}

/// A turn in short: its kind, the rank blamed and what follows.
fn short(turn: &Turn<Culprit>) -> String {
    match turn {
        Turn::DeadlineExceeded { limit } => format!("deadline {limit}"),
        Turn::Fail {
            culprit, reason, ..
        } => format!("fail now: rank {} {}", culprit.rank, reason.as_str()),
        Turn::Stop { culprit, news } => format!("stop: rank {} news {news}", culprit.rank),
        Turn::Ended {
            culprit,
            settlement,
            ..
        } => match &settlement.next {
            Next::Restart { .. } => format!(
                "restart: rank {} ({} counted, {} not)",
                culprit.rank, settlement.restarts.counted, settlement.restarts.not_counted
            ),
            Next::Fail(reason) => format!("fail: rank {} {}", culprit.rank, reason.as_str()),
        },
        Turn::Succeeded => "succeeded".into(),
        Turn::Create => "create".into(),
        Turn::Run => "run".into(),
    }
}

struct Row {
    policy: RunPolicy,
    restarts: Restarts,
    deadline: Deadline,
    stopping: Option<Culprit>,
    evidence: Vec<Culprit>,
    ranks: RankTally,
}

impl Default for Row {
    fn default() -> Self {
        Row {
            policy: RunPolicy {
                backoff_limit: 1,
                ..RunPolicy::default()
            },
            restarts: Restarts::default(),
            deadline: Deadline::None,
            stopping: None,
            evidence: Vec::new(),
            ranks: running(),
        }
    }
}

fn turn_of(row: Row) -> String {
    short(&turn(Look {
        policy: &row.policy,
        restarts: row.restarts,
        deadline: row.deadline,
        stopping: row.stopping,
        evidence: row.evidence,
        ranks: row.ranks,
    }))
}

#[test]
fn a_look_fails_stops_settles_succeeds_creates_or_runs() {
    let spent = Restarts {
        counted: 1,
        not_counted: 0,
    };
    let hang = Hang {
        step: Some(3),
        still_seconds: 30,
        deadline_seconds: 30,
    };
    let table: Vec<(Row, &str)> = vec![
        (Row::default(), "run"),
        (
            Row {
                ranks: RankTally {
                    started: 1,
                    ..running()
                },
                ..Row::default()
            },
            "create",
        ),
        (
            Row {
                ranks: RankTally {
                    succeeded: 4,
                    ..running()
                },
                ..Row::default()
            },
            "succeeded",
        ),
        // Some ranks succeeded and one is missing (a reconcile cut short): the missing one is created.
        (
            Row {
                ranks: RankTally {
                    started: 3,
                    succeeded: 3,
                    ..running()
                },
                ..Row::default()
            },
            "create",
        ),
        // The deadline comes before everything else.
        (
            Row {
                deadline: Deadline::Passed { limit: 60 },
                evidence: vec![failed(1, Code(1))],
                ..Row::default()
            },
            "deadline 60",
        ),
        (
            Row {
                deadline: Deadline::Left(5),
                ..Row::default()
            },
            "run",
        ),
        // A retryable failure stops the generation while some of it is left, then restarts it, counted.
        (
            Row {
                evidence: vec![failed(2, Code(75)), failed(1, Signal(9))],
                ..Row::default()
            },
            "stop: rank 1 news true",
        ),
        (
            Row {
                stopping: Some(failed(1, Signal(9))),
                evidence: vec![failed(2, Code(75))],
                ranks: gone(),
                ..Row::default()
            },
            "restart: rank 1 (1 counted, 0 not)",
        ),
        // A disruption restarts without counting.
        (
            Row {
                evidence: vec![disrupted(3)],
                ranks: gone(),
                ..Row::default()
            },
            "restart: rank 3 (0 counted, 1 not)",
        ),
        // A spent budget waits for the generation's end: more evidence may still come.
        (
            Row {
                restarts: spent,
                evidence: vec![failed(1, Signal(9))],
                ..Row::default()
            },
            "stop: rank 1 news true",
        ),
        (
            Row {
                restarts: spent,
                stopping: Some(failed(1, Signal(9))),
                ranks: gone(),
                ..Row::default()
            },
            "fail: rank 1 BackoffLimitExceeded",
        ),
        // A permanent failure fails at once, with ranks still present, and blames the surest end.
        (
            Row {
                evidence: vec![failed(3, Code(75)), failed(2, Code(1))],
                ..Row::default()
            },
            "fail now: rank 2 PermanentFailure",
        ),
        // Evidence that arrives while stopping may blame a surer rank: news.
        (
            Row {
                stopping: Some(failed(2, Code(75))),
                evidence: vec![failed(1, Code(1))],
                ..Row::default()
            },
            "fail now: rank 1 PermanentFailure",
        ),
        (
            Row {
                stopping: Some(failed(2, Code(75))),
                evidence: vec![failed(3, Signal(9))],
                ..Row::default()
            },
            "stop: rank 3 news true",
        ),
        // The recorded culprit stays when what is seen is less sure, or is the same end seen again.
        (
            Row {
                stopping: Some(failed(1, Signal(9))),
                evidence: vec![failed(0, Code(75))],
                ..Row::default()
            },
            "stop: rank 1 news false",
        ),
        (
            Row {
                stopping: Some(failed(1, Signal(9))),
                evidence: vec![failed(1, Signal(9))],
                ..Row::default()
            },
            "stop: rank 1 news false",
        ),
        // Success is no evidence.
        (
            Row {
                evidence: vec![failed(0, Code(0))],
                ranks: RankTally {
                    succeeded: 1,
                    ..running()
                },
                ..Row::default()
            },
            "run",
        ),
        // A hang blames rank 0 and is restarted as a failure of the job's own.
        (
            Row {
                evidence: vec![hang.culprit()],
                ..Row::default()
            },
            "stop: rank 0 news true",
        ),
        // restartPolicy Never fails on anything, a disruption too.
        (
            Row {
                policy: RunPolicy {
                    restart_policy: RestartPolicy::Never,
                    ..RunPolicy::default()
                },
                evidence: vec![disrupted(2)],
                ..Row::default()
            },
            "fail now: rank 2 RestartPolicyNever",
        ),
    ];
    for (i, (row, want)) in table.into_iter().enumerate() {
        assert_eq!(turn_of(row), want, "row {i}");
    }
}
