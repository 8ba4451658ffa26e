use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition as JobCondition;

fn cond(status: bool, reason: &str) -> Option<Condition> {
    Some(Condition {
        status,
        reason: reason.into(),
        message: format!("{reason} message"),
    })
}

fn admitted() -> WorkloadView {
    WorkloadView {
        name: "rdujob-a-00000".into(),
        active: true,
        quota_reserved: true,
        admitted: true,
        ..Default::default()
    }
}

fn evicted(reason: &str) -> WorkloadView {
    WorkloadView {
        evicted: cond(true, reason),
        admitted: false,
        ..admitted()
    }
}

fn status(phase: JobPhase) -> RduJobStatus {
    RduJobStatus {
        phase: Some(phase),
        ..Default::default()
    }
}

#[test]
fn the_gate_opens_only_on_admission() {
    let queued = WorkloadView {
        admitted: false,
        quota_reserved: false,
        ..admitted()
    };
    let finished = WorkloadView {
        finished: true,
        ..admitted()
    };
    let cases: [(Option<&WorkloadView>, Option<&str>); 5] = [
        (None, Some(QUEUED)),
        (Some(&queued), Some(QUEUED)),
        (Some(&admitted()), None),
        (Some(&evicted("Preempted")), Some(EVICTED)),
        (Some(&finished), Some(QUEUED)),
    ];
    for (workload, held) in cases {
        let gate = gate(workload, "lq");
        match (held, &gate) {
            (None, Gate::Admitted) => {}
            (Some(want), Gate::Held { reason, message }) => {
                assert_eq!(reason, &want, "{workload:?}");
                assert!(message.contains("Kueue"), "{message}");
            }
            _ => panic!("{workload:?}: {gate:?}"),
        }
    }
    let Gate::Held { message, .. } = gate(Some(&evicted("Preempted")), "lq") else {
        panic!()
    };
    assert!(
        message.contains("Preempted: Preempted message"),
        "{message}"
    );
}

#[test]
fn the_queue_status_names_the_queue_and_the_workloads_state() {
    let queued = WorkloadView {
        admitted: false,
        quota_reserved: false,
        ..admitted()
    };
    let finished = WorkloadView {
        finished: true,
        ..admitted()
    };
    let finished_after_eviction = WorkloadView {
        finished: true,
        ..evicted("Preempted")
    };
    let cases: [(Option<&WorkloadView>, QueueState); 6] = [
        (None, QueueState::Queued),
        (Some(&queued), QueueState::Queued),
        (Some(&admitted()), QueueState::Admitted),
        (Some(&evicted("Preempted")), QueueState::Evicted),
        (Some(&finished), QueueState::Finished),
        (Some(&finished_after_eviction), QueueState::Finished),
    ];
    for (workload, state) in cases {
        let status = queue_status(workload, "lq");
        assert_eq!(
            (status.name.as_str(), status.state),
            ("lq", state),
            "{workload:?}"
        );
    }
}

#[test]
fn pods_ready_follows_kueues_reasons() {
    let with = |ready: Option<Condition>| WorkloadView {
        pods_ready: ready,
        ..admitted()
    };
    let cases = [
        // (current PodsReady, job phase, wanted (status, reason))
        (None, JobPhase::Pending, (false, "WaitForStart")),
        (None, JobPhase::Running, (true, "Started")),
        (
            cond(true, "Started"),
            JobPhase::Restarting,
            (false, "WaitForRecovery"),
        ),
        (
            cond(false, "WaitForRecovery"),
            JobPhase::Running,
            (true, "Recovered"),
        ),
        (
            cond(false, "WaitForStart"),
            JobPhase::Running,
            (true, "Started"),
        ),
    ];
    for (current, phase, (ready, reason)) in cases {
        let w = with(current.clone());
        let out = writes(&w, false, &status(phase), 4, true);
        let expected = Write::PodsReady {
            ready,
            reason,
            message: match (ready, reason) {
                (true, _) => "All pods reached readiness and the workload is running",
                (false, "WaitForRecovery") => "At least one pod has failed, waiting for recovery",
                _ => "Not all pods are ready or succeeded",
            },
        };
        assert_eq!(out, vec![expected], "{current:?} {phase:?}");
    }
    // Unchanged: nothing written.
    let w = with(cond(true, "Started"));
    assert!(writes(&w, false, &status(JobPhase::Running), 4, true).is_empty());
    let w = with(cond(false, "WaitForRecovery"));
    assert!(writes(&w, false, &status(JobPhase::Pending), 4, true).is_empty());
}

#[test]
fn the_quota_is_released_only_once_the_evicted_gang_is_gone() {
    let w = evicted("Preempted");
    assert!(
        writes(&w, false, &status(JobPhase::Suspended), 3, true).is_empty(),
        "pods still there: the quota stays"
    );
    assert_eq!(
        writes(&w, false, &status(JobPhase::Suspended), 0, true),
        vec![Write::ReleaseQuota {
            requeued: true,
            reason: "Preempted".into(),
            message: "Preempted message".into(),
        }]
    );
    let timeout = evicted("PodsReadyTimeout");
    assert!(matches!(
        writes(&timeout, false, &status(JobPhase::Suspended), 0, true)[..],
        [Write::ReleaseQuota {
            requeued: false,
            ..
        }]
    ));
    let released = WorkloadView {
        quota_reserved: false,
        ..evicted("Preempted")
    };
    assert!(writes(&released, false, &status(JobPhase::Suspended), 0, true).is_empty());
}

#[test]
fn suspend_deactivates_and_the_end_finishes() {
    assert_eq!(
        writes(&admitted(), true, &status(JobPhase::Suspended), 0, true)[0],
        Write::SetActive(false)
    );
    let inactive = WorkloadView {
        active: false,
        ..admitted()
    };
    assert_eq!(
        writes(&inactive, false, &status(JobPhase::Pending), 0, true)[0],
        Write::SetActive(true)
    );
    let mut done = status(JobPhase::Failed);
    done.conditions.push(JobCondition {
        type_: "Failed".into(),
        status: "True".into(),
        reason: "PermanentFailure".into(),
        message: "rank 1 exited with code 64".into(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ),
        observed_generation: None,
    });
    assert_eq!(
        writes(&admitted(), false, &done, 0, true),
        vec![Write::Finish {
            succeeded: false,
            message: "rank 1 exited with code 64".into()
        }]
    );
    let finished = WorkloadView {
        finished: true,
        ..admitted()
    };
    assert!(writes(&finished, false, &done, 0, true).is_empty());
}

#[test]
fn the_workload_is_finished_only_once_the_jobs_own_status_records_the_end() {
    for phase in [JobPhase::Succeeded, JobPhase::Failed] {
        assert!(
            writes(&admitted(), false, &status(phase), 0, false).is_empty(),
            "{phase:?} not yet in the job's status: the Workload waits"
        );
        assert!(matches!(
            writes(&admitted(), false, &status(phase), 0, true)[..],
            [Write::Finish { succeeded, .. }] if succeeded == (phase == JobPhase::Succeeded)
        ));
    }
    // A job still running is told to Kueue as before, whatever its stored status.
    let starting = WorkloadView {
        pods_ready: cond(false, "WaitForStart"),
        ..admitted()
    };
    assert_eq!(
        writes(&starting, false, &status(JobPhase::Running), 4, false).len(),
        1
    );
}

#[test]
fn finishing_the_workload_shows_in_the_same_status_write() {
    let admitted_status = queue_status(Some(&admitted()), "lq");
    let finish = Write::Finish {
        succeeded: true,
        message: "done".into(),
    };
    let cases: [(&[Write], QueueState); 3] = [
        (&[], QueueState::Admitted),
        (&[Write::SetActive(true)], QueueState::Admitted),
        (&[finish], QueueState::Finished),
    ];
    for (writes, state) in cases {
        let after = queue_status_after(&admitted_status, writes);
        assert_eq!(
            (after.name.as_str(), after.state),
            ("lq", state),
            "{writes:?}"
        );
    }
    // What the lifecycle's end produces for an admitted Workload is exactly such a write.
    let writes = writes(&admitted(), false, &status(JobPhase::Succeeded), 0, true);
    assert_eq!(
        queue_status_after(&admitted_status, &writes).state,
        QueueState::Finished
    );
}

#[test]
fn a_workload_stands_for_the_job_only_if_the_job_controls_it_and_asks_what_it_was_queued_for() {
    let ask = |count: u64, tiles: &str| {
        let pod_set = serde_json::from_value(serde_json::json!({
            "name": "main",
            "count": count,
            "template": {"spec": {"containers": [{"name": "worker",
                "resources": {"requests": {"rdu.dev/tile": tiles, "cpu": "1"}}}]}}
        }))
        .expect("a pod set");
        crate::kueue::view::PodSetAsk::of(&pod_set)
    };
    let ours = WorkloadView {
        controller_uid: Some("u-1".into()),
        asked: ask(2, "1"),
        ..admitted()
    };
    assert_eq!(vet(&ours, "u-1", &ask(2, "1")), None);
    // Admitted for 2 x 1 tile, the job now asks 8 tiles per rank, or 4 ranks: held, saying what changed.
    for (now, says) in [
        (ask(2, "8"), "worker: rdu.dev/tile 8"),
        (ask(4, "1"), "asks for 4 pod(s)"),
    ] {
        match vet(&ours, "u-1", &now) {
            Some(Gate::Held { reason, message }) => {
                assert_eq!(reason, WORKLOAD_OUTDATED);
                assert!(message.contains(says), "{message}");
                assert!(message.contains("was queued for 2 with"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Another controller, or none: never the job's.
    for controller in [Some("u-other"), None] {
        let foreign = WorkloadView {
            controller_uid: controller.map(str::to_string),
            ..ours.clone()
        };
        assert!(matches!(
            vet(&foreign, "u-1", &ask(2, "1")),
            Some(Gate::Held {
                reason: WORKLOAD_CONFLICT,
                ..
            })
        ));
    }
}
