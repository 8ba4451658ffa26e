//! Table of (observed pods -> changes, status) cases, one per lifecycle rule.

use super::*;
use crate::nodes::Loss;
use crate::test_fixtures::job;
use crate::validate::valid;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, PodCondition,
    PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rdu_crds::RestartPolicy;
use rdu_crds::consts::WORKER_CONTAINER;
use rdu_crds::{EndAction, EndCause, RduJob};

const T0: i64 = 1_800_000_000;

pub(super) fn at(second: i64) -> Timestamp {
    Timestamp::from_second(T0 + second).expect("time")
}

/// A pod of rank `rank` at `generation` in `phase`, with the worker's exit code and termination message.
#[derive(Clone)]
pub(super) struct P {
    rank: u32,
    generation: u32,
    phase: &'static str,
    exit: Option<i32>,
    message: Option<&'static str>,
    reason: Option<&'static str>,
    terminating: bool,
    /// The worker container waits with this (reason, message).
    waiting: Option<(&'static str, &'static str)>,
    /// PodScheduled is False, Unschedulable, with this message.
    unschedulable: Option<&'static str>,
    /// A true DisruptionTarget condition with this reason.
    disruption: Option<&'static str>,
    /// The worker container ended at this second.
    finished: Option<i64>,
    /// The kubelet's reason for the worker container's end (`OOMKilled`, `Error`).
    container_reason: Option<&'static str>,
}

pub(super) fn p(rank: u32, generation: u32, phase: &'static str) -> P {
    P {
        rank,
        generation,
        phase,
        exit: None,
        message: None,
        reason: None,
        terminating: false,
        waiting: None,
        unschedulable: None,
        disruption: None,
        finished: None,
        container_reason: None,
    }
}

impl P {
    pub(super) fn exit(mut self, code: i32) -> P {
        self.exit = Some(code);
        self
    }
    pub(super) fn message(mut self, m: &'static str) -> P {
        self.message = Some(m);
        self
    }
    pub(super) fn reason(mut self, r: &'static str) -> P {
        self.reason = Some(r);
        self
    }
    pub(super) fn terminating(mut self) -> P {
        self.terminating = true;
        self
    }
    pub(super) fn waiting(mut self, reason: &'static str, message: &'static str) -> P {
        self.waiting = Some((reason, message));
        self
    }
    pub(super) fn unschedulable(mut self, message: &'static str) -> P {
        self.unschedulable = Some(message);
        self
    }
    pub(super) fn disrupted(mut self, reason: &'static str) -> P {
        self.disruption = Some(reason);
        self
    }
    pub(super) fn container_reason(mut self, reason: &'static str) -> P {
        self.container_reason = Some(reason);
        self
    }
    pub(super) fn finished(mut self, second: i64) -> P {
        self.finished = Some(second);
        self
    }
    pub(super) fn build(&self, job: &str) -> Pod {
        let terminated = self.exit.map(|code| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                message: self.message.map(str::to_string),
                reason: self.container_reason.map(str::to_string),
                finished_at: self.finished.map(|s| Time(at(s))),
                ..Default::default()
            }),
            ..Default::default()
        });
        let waiting = self.waiting.map(|(reason, message)| ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_string()),
                message: Some(message.to_string()),
            }),
            ..Default::default()
        });
        let mut conditions: Vec<PodCondition> = self
            .unschedulable
            .map(|message| PodCondition {
                type_: "PodScheduled".to_string(),
                status: "False".to_string(),
                reason: Some("Unschedulable".to_string()),
                message: Some(message.to_string()),
                ..Default::default()
            })
            .into_iter()
            .collect();
        conditions.extend(self.disruption.map(|reason| PodCondition {
            type_: "DisruptionTarget".to_string(),
            status: "True".to_string(),
            reason: Some(reason.to_string()),
            ..Default::default()
        }));
        let conditions = (!conditions.is_empty()).then_some(conditions);
        Pod {
            metadata: ObjectMeta {
                name: Some(consts::pod_name(job, self.rank)),
                labels: Some(
                    [
                        (consts::LABEL_JOB_NAME.to_string(), job.to_string()),
                        (consts::LABEL_RANK.to_string(), self.rank.to_string()),
                        (
                            consts::LABEL_GENERATION.to_string(),
                            self.generation.to_string(),
                        ),
                    ]
                    .into(),
                ),
                deletion_timestamp: self.terminating.then(|| Time(at(0))),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(format!("node-{}", self.rank)),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(self.phase.to_string()),
                reason: self.reason.map(str::to_string),
                container_statuses: Some(vec![ContainerStatus {
                    name: WORKER_CONTAINER.to_string(),
                    ready: self.phase == "Running",
                    state: terminated.or(waiting),
                    ..Default::default()
                }]),
                conditions,
                ..Default::default()
            }),
        }
    }
}

/// The lifecycle with nothing known of the nodes (no node cache).
pub(super) fn decide(job: &RduJob, pods: &[Pod], now: Timestamp) -> Decision {
    super::decide(&valid(job), pods, &ClusterView::default(), now, None)
}

/// The lifecycle with node `node-<rank>` of each of `lost` ranks lost as `loss`.
pub(super) fn decide_with(
    job: &RduJob,
    pods: &[Pod],
    cluster: &ClusterView,
    now: Timestamp,
) -> Decision {
    super::decide(&valid(job), pods, cluster, now, None)
}

pub(super) fn lost(ranks: &[u32], loss: Loss) -> ClusterView {
    ClusterView {
        lost: ranks
            .iter()
            .map(|r| (format!("node-{r}"), loss.clone()))
            .collect(),
        room: None,
    }
}

pub(super) fn pods(list: &[P]) -> Vec<Pod> {
    list.iter().map(|p| p.build("mnist")).collect()
}

pub(super) fn with_status(mut job: RduJob, phase: JobPhase, restarts: u32, seen: &[u32]) -> RduJob {
    job.status = Some(RduJobStatus {
        phase: Some(phase),
        restarts,
        start_time: Some(Time(at(0))),
        ranks: seen
            .iter()
            .map(|r| RankStatus {
                rank: *r,
                pod: consts::pod_name("mnist", *r),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    job
}

pub(super) fn condition<'a>(d: &'a Decision, type_: &str) -> Option<&'a Condition> {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

pub(super) fn names(ranks: &[u32]) -> Vec<String> {
    ranks
        .iter()
        .map(|r| consts::pod_name("mnist", *r))
        .collect()
}

#[test]
fn new_job_creates_every_rank_and_is_pending() {
    let d = decide(&job("mnist", None, 3), &[], at(0));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 0,
            ranks: vec![0, 1, 2]
        }]
    );
    assert_eq!(d.status.phase, Some(JobPhase::Pending));
    assert_eq!(d.status.start_time, Some(Time(at(0))));
    assert_eq!(d.status.ready.as_deref(), Some("0/3"));
}

#[test]
fn only_missing_ranks_are_created_and_created_condition_waits_for_all() {
    let j = with_status(job("mnist", None, 3), JobPhase::Pending, 0, &[]);
    let d = decide(&j, &pods(&[p(0, 0, "Pending")]), at(1));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 0,
            ranks: vec![1, 2]
        }]
    );
    assert!(condition(&d, condition::CREATED).is_none());
    let all = pods(&[p(0, 0, "Pending"), p(1, 0, "Pending"), p(2, 0, "Pending")]);
    let d = decide(&j, &all, at(1));
    assert!(d.changes.is_empty());
    assert!(condition(&d, condition::CREATED).is_some());
    assert_eq!(d.events[0].reason, "Created");
    assert_eq!(d.status.ranks.len(), 3);
    assert_eq!(d.status.ranks[2].node.as_deref(), Some("node-2"));
}

#[test]
fn ranks_report_the_tiles_the_device_plugin_published_on_their_pods() {
    let j = with_status(job("mnist", None, 2), JobPhase::Pending, 0, &[0, 1]);
    let mut observed = pods(&[p(0, 0, "Running"), p(1, 0, "Running")]);
    observed[1].metadata.annotations = Some(
        [(
            consts::TILES_ANNOTATION.to_string(),
            "rdu6-tile0, rdu6-tile1,".to_string(),
        )]
        .into(),
    );
    let d = decide(&j, &observed, at(2));
    assert!(d.status.ranks[0].tiles.is_empty(), "not yet published");
    assert_eq!(d.status.ranks[1].tiles, vec!["rdu6-tile0", "rdu6-tile1"]);
}

#[test]
fn all_ranks_running_moves_to_running_with_counts() {
    let j = with_status(job("mnist", None, 2), JobPhase::Pending, 0, &[0, 1]);
    let d = decide(&j, &pods(&[p(0, 0, "Running"), p(1, 0, "Running")]), at(2));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert_eq!(d.status.ready.as_deref(), Some("2/2"));
    assert_eq!(
        d.status.workers,
        WorkerCounts {
            active: 2,
            ready: 2,
            succeeded: 0,
            failed: 0
        }
    );
    assert!(condition(&d, condition::RUNNING).is_some());
    assert!(d.events.iter().any(|e| e.reason == "Running"));
}

#[test]
fn every_rank_exiting_zero_succeeds_with_rank0_result() {
    let result = r#"{"finalLoss":0.25,"testAccuracy":0.93,"samplesPerSecond":640.5,"trainSeconds":3.5,"globalSteps":40}"#;
    let mut j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    j.status.as_mut().expect("status").progress = Some(rdu_crds::TrainingProgress {
        step: 10,
        total_steps: 40,
        epoch: 1,
        epochs: 2,
        percent: 25,
        estimated_remaining_seconds: Some(30),
        ..rdu_crds::TrainingProgress::default()
    });
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Succeeded").exit(0).message(result),
            p(1, 0, "Succeeded").exit(0),
        ]),
        at(9),
    );
    assert_eq!(d.status.phase, Some(JobPhase::Succeeded));
    assert_eq!(d.status.completion_time, Some(Time(at(9))));
    let r = d.status.result.as_ref().expect("result");
    assert_eq!(
        (r.final_loss, r.global_steps, r.samples_per_second),
        (0.25, 40, 640.5)
    );
    assert!(condition(&d, condition::SUCCEEDED).is_some());
    // The last report to reach the endpoint said 10 of 40: the job ends at its last step.
    let progress = d.status.progress.as_ref().expect("progress");
    assert_eq!(
        (progress.step, progress.percent, progress.epochs),
        (40, 100, 2)
    );
    assert_eq!(progress.estimated_remaining_seconds, None);
    assert_eq!(progress.update_time, Some(Time(at(9))));
    // cleanPodPolicy Running (the default) keeps finished pods.
    assert!(d.changes.is_empty());
}

#[test]
fn a_bad_termination_message_still_succeeds_and_says_why() {
    let j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    let d = decide(
        &j,
        &pods(&[p(0, 0, "Succeeded").exit(0).message("not json")]),
        at(9),
    );
    assert_eq!(d.status.phase, Some(JobPhase::Succeeded));
    assert!(d.status.result.is_none());
    assert!(
        condition(&d, condition::SUCCEEDED)
            .expect("cond")
            .message
            .contains("not a result")
    );
}

#[test]
fn exit_75_restarts_the_gang_with_next_generation() {
    let j = with_status(job("mnist", None, 3), JobPhase::Running, 0, &[0, 1, 2]);
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Running"),
            p(1, 0, "Failed").exit(75),
            p(2, 0, "Running"),
        ]),
        at(5),
    );
    // The generation is stopped first: every pod of it deleted, the culprit recorded.
    assert_eq!(
        d.changes,
        vec![Change::DeletePods {
            names: names(&[0, 1, 2])
        }]
    );
    assert_eq!(d.status.restarts, 0);
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
    let stopping = d.status.stopping.as_ref().expect("stopping");
    assert_eq!(
        (stopping.generation, stopping.rank, stopping.exit_code),
        (0, 1, Some(75))
    );
    assert_eq!(stopping.cause, EndCause::Failure);
    let c = condition(&d, condition::RESTARTING).expect("restarting");
    assert!(
        c.message.contains("rank 1 exited with code 75"),
        "{}",
        c.message
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.warning && e.reason == "Restarting")
    );
    // Once no pod of it is left, the generation ends: the next one is created whole, the restart counted.
    let j = after(j, &d);
    let d = decide(&j, &[], at(6));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 1,
            ranks: vec![0, 1, 2]
        }]
    );
    assert_eq!(
        (
            d.status.restarts,
            d.status.failure_restarts,
            d.status.disruption_restarts
        ),
        (1, 1, 0)
    );
    assert!(d.status.stopping.is_none());
    assert!(d.status.ranks.is_empty());
    let end = d.status.history.last().expect("history");
    assert_eq!((end.generation, end.rank), (0, 1));
    assert_eq!(end.action, Some(EndAction::RestartJob));
    assert!(
        condition(&d, condition::RESTARTING)
            .expect("restarting")
            .message
            .contains("restarting the gang as generation 1 (counted against backoffLimit: 1 of 3)")
    );
}

#[test]
fn new_generation_waits_for_old_pods_then_recreates() {
    let j = with_status(job("mnist", None, 2), JobPhase::Restarting, 1, &[]);
    // Old pods still terminating: names are taken, nothing is created, nothing is re-deleted.
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Running").terminating(),
            p(1, 0, "Failed").exit(75).terminating(),
        ]),
        at(6),
    );
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    // Old pods gone: the new generation is created.
    let d = decide(&j, &[], at(7));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 1,
            ranks: vec![0, 1]
        }]
    );
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
    // Running again clears Restarting.
    let d = decide(&j, &pods(&[p(0, 1, "Running"), p(1, 1, "Running")]), at(8));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert!(condition(&d, condition::RESTARTING).is_none());
}

#[test]
fn stale_pods_of_an_old_generation_are_deleted() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 2, &[0]);
    let d = decide(&j, &pods(&[p(0, 2, "Running"), p(1, 1, "Running")]), at(3));
    assert_eq!(d.changes, vec![Change::DeletePods { names: names(&[1]) }]);
}

#[test]
fn a_vanished_pod_is_a_retryable_failure() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let d = decide(&j, &pods(&[p(0, 0, "Running")]), at(3));
    assert_eq!(d.changes, vec![Change::DeletePods { names: names(&[0]) }]);
    assert!(
        condition(&d, condition::RESTARTING)
            .expect("c")
            .message
            .contains("rank 1 was lost (PodVanished)")
    );
    let d = decide(&after(j, &d), &[], at(4));
    assert_eq!((d.status.restarts, d.status.failure_restarts), (1, 1));
}

#[test]
fn a_pod_deleted_by_someone_else_is_a_retryable_failure() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let d = decide(
        &j,
        &pods(&[p(0, 0, "Running").terminating(), p(1, 0, "Running")]),
        at(3),
    );
    assert_eq!(
        d.status.stopping.as_ref().map(|s| s.reason.as_str()),
        Some("PodDeleted")
    );
    assert_eq!(d.changes, vec![Change::DeletePods { names: names(&[1]) }]);
}

#[test]
fn node_lost_is_a_retryable_failure() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let d = decide(
        &j,
        &pods(&[p(0, 0, "Running"), p(1, 0, "Unknown").reason("NodeLost")]),
        at(3),
    );
    assert!(
        condition(&d, condition::RESTARTING)
            .expect("c")
            .message
            .contains("NodeLost")
    );
    let d = decide(&after(j, &d), &[], at(4));
    assert_eq!(
        (
            d.status.restarts,
            d.status.failure_restarts,
            d.status.disruption_restarts
        ),
        (1, 0, 1),
        "a node lost is not the job's failure"
    );
}

#[test]
fn permanent_exit_code_fails_under_exit_code_policy() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let d = decide(
        &j,
        &pods(&[p(0, 0, "Running"), p(1, 0, "Failed").exit(65)]),
        at(3),
    );
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    let c = condition(&d, condition::FAILED).expect("failed");
    assert_eq!(c.reason, "PermanentFailure");
    assert!(
        c.message.contains("rank 1 exited with code 65"),
        "{}",
        c.message
    );
    // cleanPodPolicy Running deletes the still-running rank 0.
    assert_eq!(d.changes, vec![Change::DeletePods { names: names(&[0]) }]);
}

#[test]
fn signal_exit_is_retryable_under_exit_code_policy() {
    let j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    let d = decide(&j, &pods(&[p(0, 0, "Failed").exit(137)]), at(3));
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
}

#[test]
fn on_failure_restarts_even_permanent_codes() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    j.spec.run_policy.restart_policy = RestartPolicy::OnFailure;
    let d = decide(&j, &pods(&[p(0, 0, "Failed").exit(1)]), at(3));
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
}

#[test]
fn never_fails_even_on_retryable_codes() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    j.spec.run_policy.restart_policy = RestartPolicy::Never;
    let d = decide(&j, &pods(&[p(0, 0, "Failed").exit(75)]), at(3));
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    assert_eq!(
        condition(&d, condition::FAILED).expect("c").reason,
        "RestartPolicyNever"
    );
}

#[test]
fn backoff_limit_exhausted_fails() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Running, 2, &[0]);
    j.spec.run_policy.backoff_limit = 2;
    if let Some(s) = j.status.as_mut() {
        s.failure_restarts = 2;
    }
    let d = decide(&j, &pods(&[p(0, 2, "Failed").exit(75)]), at(3));
    // Not at once: a disruption found while the generation stops would not count.
    assert_eq!(d.status.phase, Some(JobPhase::Restarting));
    let d = decide(&after(j, &d), &[], at(4));
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    let c = condition(&d, condition::FAILED).expect("c");
    assert_eq!(c.reason, "BackoffLimitExceeded");
    assert!(c.message.contains("backoffLimit 2"));
    assert_eq!(d.status.restarts, 2);
}

#[test]
fn deadline_fails_the_job_and_requeues_before_it() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Running, 0, &[0]);
    j.spec.run_policy.active_deadline_seconds = Some(100);
    let d = decide(&j, &pods(&[p(0, 0, "Running")]), at(40));
    assert_eq!(d.status.phase, Some(JobPhase::Running));
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
    let d = decide(&j, &pods(&[p(0, 0, "Running")]), at(100));
    assert_eq!(d.status.phase, Some(JobPhase::Failed));
    assert_eq!(
        condition(&d, condition::FAILED).expect("c").reason,
        "DeadlineExceeded"
    );
    assert_eq!(d.changes, vec![Change::DeletePods { names: names(&[0]) }]);
}

#[test]
fn clean_pod_policy_all_and_none() {
    let mut j = with_status(job("mnist", None, 2), JobPhase::Succeeded, 0, &[0, 1]);
    let finished = pods(&[p(0, 0, "Succeeded").exit(0), p(1, 0, "Running")]);
    j.spec.run_policy.clean_pod_policy = CleanPodPolicy::All;
    assert_eq!(
        decide(&j, &finished, at(1)).changes,
        vec![Change::DeletePods {
            names: names(&[0, 1])
        }]
    );
    j.spec.run_policy.clean_pod_policy = CleanPodPolicy::None;
    assert!(decide(&j, &finished, at(1)).changes.is_empty());
    j.spec.run_policy.clean_pod_policy = CleanPodPolicy::Running;
    assert_eq!(
        decide(&j, &finished, at(1)).changes,
        vec![Change::DeletePods { names: names(&[1]) }]
    );
}

#[test]
fn ttl_deletes_the_job_after_it_finished() {
    let mut j = with_status(job("mnist", None, 1), JobPhase::Succeeded, 0, &[0]);
    j.spec.run_policy.ttl_seconds_after_finished = Some(30);
    if let Some(s) = j.status.as_mut() {
        s.completion_time = Some(Time(at(10)));
    }
    let d = decide(&j, &[], at(20));
    assert!(d.changes.is_empty());
    assert_eq!(d.requeue_after, Some(Duration::from_secs(20)));
    let d = decide(&j, &[], at(40));
    assert_eq!(d.changes, vec![Change::DeleteJob]);
}

#[test]
fn suspend_deletes_pods_and_resume_recreates_them() {
    let mut j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    j.spec.run_policy.suspend = true;
    let d = decide(&j, &pods(&[p(0, 0, "Running"), p(1, 0, "Running")]), at(3));
    assert_eq!(
        d.changes,
        vec![Change::DeletePods {
            names: names(&[0, 1])
        }]
    );
    assert_eq!(d.status.phase, Some(JobPhase::Suspended));
    assert!(condition(&d, condition::SUSPENDED).is_some());
    assert!(d.status.start_time.is_none());
    assert_eq!(d.status.restarts, 0);

    j.status = Some(d.status);
    j.spec.run_policy.suspend = false;
    // Pods still terminating from the suspension are not failures: resume waits for their names, and then creates
    // the gang whole.
    let d = decide(&j, &pods(&[p(0, 0, "Running").terminating()]), at(4));
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    assert_eq!(d.status.phase, Some(JobPhase::Pending));
    let d = decide(&j, &[], at(5));
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 0,
            ranks: vec![0, 1]
        }]
    );
    assert!(condition(&d, condition::SUSPENDED).is_none());
    assert!(d.events.iter().any(|e| e.reason == "Resumed"));
}

#[test]
fn conditions_keep_transition_time_while_status_holds() {
    let j = with_status(job("mnist", None, 1), JobPhase::Pending, 0, &[0]);
    let first = decide(&j, &pods(&[p(0, 0, "Running")]), at(2));
    let mut j2 = j.clone();
    j2.status = Some(first.status.clone());
    let again = decide(&j2, &pods(&[p(0, 0, "Running")]), at(50));
    let t = |d: &Decision| {
        condition(d, condition::RUNNING)
            .expect("running")
            .last_transition_time
            .clone()
    };
    assert_eq!(t(&first), t(&again));
    assert!(
        again.events.is_empty(),
        "no transition, no event: {:?}",
        again.events
    );
}

/// The job as the next reconcile sees it: with the status `d` wrote.
pub(super) fn after(mut job: RduJob, d: &Decision) -> RduJob {
    job.status = Some(d.status.clone());
    job
}

/// The events of `d` other than the Created one the first look at a full gang records.
fn events_but_created(d: &Decision) -> Vec<(bool, &'static str, &str)> {
    d.events
        .iter()
        .filter(|e| e.reason != "Created")
        .map(|e| (e.warning, e.reason, e.note.as_str()))
        .collect()
}

fn blocked_condition(d: &Decision) -> Option<&Condition> {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::PODS_BLOCKED)
}

#[test]
fn a_pod_that_cannot_start_blocks_the_job_with_the_kubelets_reason_and_one_warning() {
    const MESSAGE: &str = "the kubelet's own words";
    let mut cases: Vec<(P, &'static str, String)> = blocked::CONTAINER_REASONS
        .into_iter()
        .map(|reason| {
            (
                p(1, 0, "Pending").waiting(reason, MESSAGE),
                reason,
                format!("rank 1, pod mnist-worker-1, container worker: {MESSAGE}"),
            )
        })
        .collect();
    cases.push((
        p(1, 0, "Pending").unschedulable("0/1 nodes are available: 1 Insufficient rdu.dev/tile."),
        "Unschedulable",
        "rank 1, pod mnist-worker-1: 0/1 nodes are available: 1 Insufficient rdu.dev/tile.".into(),
    ));
    for (pod, reason, message) in cases {
        let j = with_status(job("mnist", None, 2), JobPhase::Pending, 0, &[0, 1]);
        let observed = pods(&[p(0, 0, "Pending"), pod]);
        let d = decide(&j, &observed, at(5));
        assert_eq!(d.status.phase, Some(JobPhase::Pending), "{reason}");
        let c = condition(&d, condition::PODS_BLOCKED).expect(reason);
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            (reason, message.as_str())
        );
        assert_eq!(
            events_but_created(&d),
            vec![(true, reason, message.as_str())]
        );

        // The next reconcile sees the same problem: the condition stays, no second event.
        let again = decide(&after(j, &d), &observed, at(10));
        assert!(
            condition(&again, condition::PODS_BLOCKED).is_some(),
            "{reason}"
        );
        assert!(again.events.is_empty(), "{reason}: {:?}", again.events);
    }
}

#[test]
fn waiting_for_ordinary_reasons_blocks_nothing() {
    let j = with_status(job("mnist", None, 2), JobPhase::Pending, 0, &[0, 1]);
    let observed = pods(&[
        p(0, 0, "Pending").waiting("ContainerCreating", ""),
        p(1, 0, "Pending"),
    ]);
    let d = decide(&j, &observed, at(5));
    assert_eq!(blocked_condition(&d), None);
    assert_eq!(events_but_created(&d), vec![]);
}

#[test]
fn pull_retries_are_one_problem_a_new_reason_is_announced_and_the_lowest_rank_is_named() {
    let j = with_status(job("mnist", None, 3), JobPhase::Pending, 0, &[0, 1, 2]);
    let pulling = |reason| {
        pods(&[
            p(0, 0, "Pending"),
            p(1, 0, "Pending").waiting(reason, "no such image"),
            p(2, 0, "Pending").waiting(reason, "no such image"),
        ])
    };
    let first = decide(&j, &pulling("ErrImagePull"), at(1));
    assert_eq!(events_but_created(&first).len(), 1);
    let c = condition(&first, condition::PODS_BLOCKED).expect("blocked");
    assert_eq!(
        c.message,
        "rank 1, pod mnist-worker-1, container worker: no such image (1 more rank(s) blocked)"
    );

    let backoff = decide(
        &after(j.clone(), &first),
        &pulling("ImagePullBackOff"),
        at(2),
    );
    let c = condition(&backoff, condition::PODS_BLOCKED).expect("blocked");
    assert_eq!(c.reason, "ImagePullBackOff");
    assert!(backoff.events.is_empty(), "{:?}", backoff.events);

    let config = pods(&[
        p(0, 0, "Pending").waiting("CreateContainerConfigError", "secret \"x\" not found"),
        p(1, 0, "Pending"),
        p(2, 0, "Pending"),
    ]);
    let changed = decide(&after(j, &backoff), &config, at(3));
    let c = condition(&changed, condition::PODS_BLOCKED).expect("blocked");
    assert_eq!(c.reason, "CreateContainerConfigError");
    assert_eq!(
        changed
            .events
            .iter()
            .map(|e| (e.warning, e.reason))
            .collect::<Vec<_>>(),
        vec![(true, "CreateContainerConfigError")]
    );
}

#[test]
fn the_condition_clears_when_the_problem_does() {
    let j = with_status(job("mnist", None, 2), JobPhase::Pending, 0, &[0, 1]);
    let blocked = decide(
        &j,
        &pods(&[
            p(0, 0, "Pending"),
            p(1, 0, "Pending").waiting("ErrImageNeverPull", "not present"),
        ]),
        at(1),
    );
    let running = pods(&[p(0, 0, "Running"), p(1, 0, "Running")]);
    let cleared = decide(&after(j, &blocked), &running, at(2));
    let c = blocked_condition(&cleared).expect("the condition is kept, False");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PodsUnblocked")
    );
    assert_eq!(cleared.status.phase, Some(JobPhase::Running));
    assert!(
        cleared
            .events
            .iter()
            .any(|e| !e.warning && e.reason == "PodsUnblocked"),
        "{:?}",
        cleared.events
    );
}

#[test]
fn old_generation_and_terminating_pods_block_nothing() {
    let j = with_status(job("mnist", None, 2), JobPhase::Restarting, 1, &[]);
    let observed = pods(&[
        p(0, 0, "Pending")
            .waiting("ErrImagePull", "gone")
            .terminating(),
        p(0, 1, "Pending"),
        p(1, 1, "Pending")
            .waiting("ErrImagePull", "gone")
            .terminating(),
    ]);
    let d = decide(&j, &observed, at(1));
    assert_eq!(blocked_condition(&d), None, "{:?}", d.status.conditions);
}

#[test]
fn a_failed_ranks_termination_message_is_the_reason_in_the_condition() {
    let j = with_status(job("mnist", None, 2), JobPhase::Running, 0, &[0, 1]);
    let why = "throughput 12.0 samples/s is below spec.training.minThroughput 400.0 samples/s";
    let d = decide(
        &j,
        &pods(&[
            p(0, 0, "Failed").exit(66).message(why),
            p(1, 0, "Failed").exit(75),
        ]),
        at(3),
    );
    let c = condition(&d, condition::FAILED).expect("failed");
    assert!(
        c.message
            .contains(&format!("rank 0 exited with code 66 ({why})")),
        "{}",
        c.message
    );
}

fn held(reason: &'static str, eviction: bool) -> Hold {
    Hold {
        reason,
        message: format!("{reason} by the queue"),
        eviction,
    }
}

fn decide_held(job: &RduJob, pods: &[Pod], now: Timestamp, hold: Option<&Hold>) -> Decision {
    super::decide(&valid(job), pods, &ClusterView::default(), now, hold)
}

#[test]
fn a_held_job_creates_no_pod_and_says_why() {
    let j = job("mnist", None, 2);
    let d = decide_held(&j, &[], at(1), Some(&held("Queued", false)));
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    assert_eq!(d.status.phase, Some(JobPhase::Suspended));
    let c = condition(&d, condition::SUSPENDED).expect("Suspended");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Queued"));
    assert_eq!(c.message, "Queued by the queue");
    assert_eq!(
        d.status.evictions, 0,
        "waiting for a first admission is no eviction"
    );

    // Admitted: the gang is created whole at generation 0.
    let mut j = j;
    j.status = Some(d.status);
    let d = decide_held(&j, &[], at(2), None);
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 0,
            ranks: vec![0, 1]
        }]
    );
    assert!(condition(&d, condition::SUSPENDED).is_none());
    assert!(d.events.iter().any(|e| e.reason == "Resumed"));
}

#[test]
fn an_eviction_stops_the_gang_without_counting_and_resumes_it_whole() {
    let mut j = with_status(job("mnist", None, 2), JobPhase::Running, 1, &[0, 1]);
    let running = pods(&[p(0, 1, "Running"), p(1, 1, "Running")]);
    let evicted = held("Evicted", true);
    let d = decide_held(&j, &running, at(3), Some(&evicted));
    assert_eq!(
        d.changes,
        vec![Change::DeletePods {
            names: names(&[0, 1])
        }]
    );
    assert_eq!(d.status.phase, Some(JobPhase::Suspended));
    assert_eq!(d.status.evictions, 1);
    assert_eq!(
        (
            d.status.restarts,
            d.status.failure_restarts,
            d.status.disruption_restarts
        ),
        (1, 0, 0),
        "an eviction is neither a failure nor a gang restart"
    );
    assert!(d.events.iter().any(|e| e.reason == "Evicted"));
    // Held again while the pods go and after: counted once.
    j.status = Some(d.status);
    let terminating = pods(&[p(0, 1, "Running").terminating()]);
    let d = decide_held(&j, &terminating, at(4), Some(&evicted));
    assert_eq!(d.status.evictions, 1);
    // Readmitted once the pods are gone: the same generation again, resumed from rank 0's checkpoint.
    j.status = Some(d.status);
    let d = decide_held(&j, &[], at(5), None);
    assert_eq!(
        d.changes,
        vec![Change::CreatePods {
            generation: 1,
            ranks: vec![0, 1]
        }]
    );
}

#[test]
fn a_new_reason_to_hold_updates_the_condition() {
    let j = job("mnist", None, 2);
    let d = decide_held(&j, &[], at(1), Some(&held("Queued", false)));
    let mut j = j;
    j.status = Some(d.status);
    let d = decide_held(&j, &[], at(2), Some(&held("PlacementConflict", false)));
    let c = condition(&d, condition::SUSPENDED).expect("Suspended");
    assert_eq!(c.reason, "PlacementConflict");
    assert!(d.events.iter().any(|e| e.reason == "PlacementConflict"));
}

#[test]
fn pods_by_rank_keep_the_first_current_pod_of_each_rank() {
    let j = with_status(job("mnist", None, 4), JobPhase::Running, 1, &[0, 1, 2, 3]);
    let observed = pods(&[
        p(0, 0, "Running"),               // an old generation: not current
        p(1, 1, "Running").terminating(), // current but going
        p(1, 1, "Pending"),               // the rank's live pod
        p(2, 1, "Running"),
        p(2, 1, "Pending"), // a second pod of rank 2: the first one counts
        p(7, 1, "Running"), // beyond the world size
    ]);
    let cluster = ClusterView::default();
    let valid = valid(&j);
    let step = Look {
        job: &valid,
        pods: observed.iter().filter_map(PodView::from_pod).collect(),
        cluster: &cluster,
        hold: None,
        now: at(1),
        status: j.status.clone().unwrap_or_default(),
        changes: Vec::new(),
        events: Vec::new(),
        requeue_after: None,
    };
    let states = |slots: Vec<Option<&PodView>>| -> Vec<Option<(bool, PodState)>> {
        slots
            .into_iter()
            .map(|p| p.map(|p| (p.terminating, p.state.clone())))
            .collect()
    };
    let running = PodState::Running { ready: true };
    assert_eq!(
        states(step.live_by_rank()),
        [
            None,
            Some((false, PodState::Pending)),
            Some((false, running.clone())),
            None
        ]
    );
    assert_eq!(
        states(step.by_rank(|_| true)),
        [
            None,
            Some((true, running.clone())),
            Some((false, running)),
            None
        ]
    );
    for rank in 0..4 {
        assert_eq!(
            step.live_by_rank()[rank as usize].map(|p| p.name.clone()),
            step.current_rank(rank).map(|p| p.name.clone()),
            "rank {rank}: the index and the lookup agree"
        );
    }
}
