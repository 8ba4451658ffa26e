//! Lands one drawn fault on the cluster and heals it: a crashed node boots again, a cut-off node is connected,
//! a drained node uncordoned, the API server put back; then waits until the node or component is back (Ready,
//! its tiles offered, the API answering), so the next fault meets a whole cluster, while the jobs may still be
//! recovering from this one.

use std::time::{Duration, Instant, SystemTime};

use crate::testbed::Testbed;
use serde_json::Value;

use super::jobs::{Jobs, SLOTS, oom_slot};
use super::plan::{Fault, FaultKind};
use crate::three_nodes::{LONG, TILES_PER_NODE};

/// How long a rank fault waits for its rank to run: its job may be between generations, or waiting for a
/// crashed node's pods to be declared lost (once over 60 s in a soak, which then skipped the fault).
const RANK_WAIT: Duration = Duration::from_secs(180);

/// The pause before an OOM fault looks again for a rank after the one it found ended.
const RANK_RETRY: Duration = Duration::from_secs(1);

/// How long a restart of etcd or the scheduler waits for it to run before and after: the kubelet's crash back-off
/// reaches 5 minutes when the container ended more than once in 10 minutes.
const STATIC_POD_WAIT: Duration = Duration::from_secs(420);

/// What became of a drawn fault.
#[derive(Debug, Clone)]
pub(crate) struct Landed {
    /// What it hit (a node, a rank of a job, a component).
    pub(crate) target: String,
    /// Why it was not landed (a rank fault with no rank running), if so.
    pub(crate) skipped: Option<String>,
    pub(crate) started: SystemTime,
    pub(crate) healed: SystemTime,
}

/// Lands `fault`, heals it and waits for what it broke to be back.
pub(crate) async fn land(bed: &mut Testbed, jobs: &mut Jobs, fault: &Fault) -> Landed {
    let started = SystemTime::now();
    let node = bed.node(fault.node).name.clone();
    let (target, skipped) = match fault.kind {
        FaultKind::NodeCrash => {
            bed.crash(fault.node);
            tokio::time::sleep(fault.hold).await;
            let booted = SystemTime::now();
            bed.reboot(fault.node).await;
            bed.wait_device_plugin(&node, booted, TILES_PER_NODE, LONG)
                .await;
            (node, None)
        }
        FaultKind::NodePartition => {
            bed.set_link(fault.node, false);
            tokio::time::sleep(fault.hold).await;
            let healed = SystemTime::now();
            bed.set_link(fault.node, true);
            bed.wait_lease_renewed_after(&node, healed, LONG).await;
            (node, None)
        }
        FaultKind::KubeletRestart => {
            let restarted = SystemTime::now();
            bed.restart_kubelet(fault.node);
            bed.wait_ready_heartbeat_after(&node, restarted, LONG).await;
            (node, None)
        }
        FaultKind::ContainerdRestart => {
            let restarted = SystemTime::now();
            // `systemctl restart` returns once containerd is up again (its unit notifies systemd). The kubelet was
            // not restarted, so it posts no Ready heartbeat until its status changes or 5 minutes pass: a Lease
            // renewed since shows it is in touch (waiting for the heartbeat timed out at fault 171 of a soak).
            bed.restart_containerd(fault.node);
            bed.wait_lease_renewed_after(&node, restarted, LONG).await;
            bed.wait_tiles(&node, TILES_PER_NODE, "after containerd restarted", LONG)
                .await;
            (node, None)
        }
        FaultKind::DevicePluginKilled => {
            let pod = bed
                .plugin_pod(&node)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let object = bed
                .get(
                    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
                        bed.client.clone(),
                        crate::testbed::SYSTEM_NAMESPACE,
                    ),
                    &pod,
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let container = object["status"]["containerStatuses"][0]["containerID"]
                .as_str()
                .unwrap_or_else(|| panic!("{pod} has no container: {}", object["status"]))
                .to_string();
            let killed = SystemTime::now();
            bed.kill_container(fault.node, &container);
            bed.wait_device_plugin(&node, killed, TILES_PER_NODE, LONG)
                .await;
            (format!("{node} {pod}"), None)
        }
        FaultKind::RankKilled => {
            // A slot whose job just ended gets its next one; the kill takes the drawn slot's rank, or the next
            // slot's while that one has none running.
            jobs.tend(bed, true).await;
            let slots: Vec<usize> = (0..SLOTS.len())
                .map(|i| (fault.slot + i) % SLOTS.len())
                .collect();
            match running_rank(bed, jobs, &slots, fault.rank_draw, RANK_WAIT).await {
                Err(why) => (format!("slot {}", SLOTS[slots[0]].key), Some(why)),
                Ok((slot, pod, index, container)) => {
                    bed.kill_container(index, &container);
                    jobs.count_fault(slot);
                    (pod, None)
                }
            }
        }
        FaultKind::RankOomKilled => oom_kill_a_rank(bed, jobs, fault.rank_draw).await,
        FaultKind::DrainUncordon => {
            bed.kubectl(&[
                "drain",
                &node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=180s",
            ]);
            tokio::time::sleep(fault.hold).await;
            bed.kubectl(&["uncordon", &node]);
            (node, None)
        }
        FaultKind::OperatorLeaderKilled => {
            let leader = bed
                .operator_leader()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_default();
            bed.kill_operator_leader(LONG).await;
            (leader, None)
        }
        FaultKind::ApiServerRestarted => {
            bed.set_api_server(false);
            bed.wait_api(false, LONG).await;
            tokio::time::sleep(fault.hold).await;
            bed.set_api_server(true);
            bed.wait_api(true, LONG).await;
            (bed.control_plane_node(), None)
        }
        FaultKind::EtcdRestarted => {
            bed.restart_static_pod("etcd", STATIC_POD_WAIT).await;
            (bed.control_plane_node(), None)
        }
        FaultKind::SchedulerRestarted => {
            bed.restart_static_pod("kube-scheduler", STATIC_POD_WAIT)
                .await;
            (bed.control_plane_node(), None)
        }
    };
    Landed {
        target,
        skipped,
        started,
        healed: SystemTime::now(),
    }
}

/// OOM-kills a running rank of the OOM slot's job and waits until the kill is seen; the rank it hit, or why none
/// was hit. A rank that ends between the look and the kill (its task gone: its gang restarting for an earlier
/// fault, which skipped 4 of run 5's 13 OOM faults together with waits that ran out) is looked for again, until
/// `RANK_WAIT` has passed since the first look.
async fn oom_kill_a_rank(bed: &Testbed, jobs: &mut Jobs, draw: u32) -> (String, Option<String>) {
    let deadline = Instant::now() + RANK_WAIT;
    loop {
        // A slot whose job just ended gets its next one.
        jobs.tend(bed, true).await;
        let left = deadline.saturating_duration_since(Instant::now());
        let (slot, pod, index, container) =
            match running_rank(bed, jobs, &[oom_slot()], draw, left).await {
                Ok(found) => found,
                Err(why) => return (format!("slot {}", SLOTS[oom_slot()].key), Some(why)),
            };
        let generation = generation_of(bed, &pod).await;
        if let Err(why) = bed.oom_kill_container(index, &container) {
            if Instant::now() < deadline {
                println!("soak: {pod} ended before its OOM kill ({why}); looking again");
                tokio::time::sleep(RANK_RETRY).await;
                continue;
            }
            return (pod, Some(why));
        }
        return match confirm_oom(bed, jobs, slot, generation, &container).await {
            Ok(seen) => {
                if let OomSeen::ByTheKernelOnly = seen {
                    jobs.oom_blamed_otherwise += 1;
                }
                jobs.count_fault(slot);
                (pod, None)
            }
            Err(why) => (pod, Some(why)),
        };
    }
}

/// A running rank (the draw modulo its job's ranks) of the first of `slots` whose job has one, waiting up to
/// `wait` for one (a job may be between generations or just submitted): its slot, pod, node index and container;
/// why there is none otherwise.
async fn running_rank(
    bed: &Testbed,
    jobs: &Jobs,
    slots: &[usize],
    draw: u32,
    wait: Duration,
) -> Result<(usize, String, u8, String), String> {
    let found = crate::poll_until("a rank running", wait, async || {
        let mut seen = Vec::new();
        for &slot in slots {
            let Some(job) = jobs.current[slot].as_ref() else {
                seen.push(format!("slot {} runs no job", SLOTS[slot].key));
                continue;
            };
            let pod = format!("{}-worker-{}", job.name, draw % SLOTS[slot].ranks);
            match running_container(bed, &pod).await {
                Ok((container, node)) => return Ok((slot, pod, container, node)),
                Err(why) => seen.push(why),
            }
        }
        Err(seen.join("; "))
    })
    .await;
    let (slot, pod, container, node) = found.map_err(|e| rdu_error_chain::chain(&e))?;
    Ok((slot, pod, bed.index_of(&node), container))
}

/// Pod `pod`'s worker container and node while it runs.
async fn running_container(bed: &Testbed, pod: &str) -> Result<(String, String), String> {
    let object: Value = bed.pod(pod).await?;
    let running = &object["status"]["containerStatuses"][0];
    if running["state"]["running"].is_null() || object["metadata"]["deletionTimestamp"].is_string()
    {
        return Err(format!("{pod} is not running"));
    }
    let container = running["containerID"]
        .as_str()
        .ok_or_else(|| format!("{pod} has no container"))?
        .to_string();
    let node = object["spec"]["nodeName"]
        .as_str()
        .ok_or_else(|| format!("{pod} is not scheduled"))?
        .to_string();
    Ok((container, node))
}

/// The gang generation pod `pod` belongs to (its `rdu.dev/generation` label).
async fn generation_of(bed: &Testbed, pod: &str) -> Option<u64> {
    let object = bed.pod(pod).await.ok()?;
    object["metadata"]["labels"]["rdu.dev/generation"]
        .as_str()?
        .parse()
        .ok()
}

/// Who saw an OOM kill land.
enum OomSeen {
    /// The runtime: the job blames the generation's end on `OOMKilled`.
    ByTheRuntime,
    /// The kernel: its log has the rank's worker OOM-killed in its container's cgroup, while the job blames the
    /// generation's end on something else: the runtime reported a plain `Error` exit 137 (containerd's race with
    /// systemd removing the cgroup, on cgroup v1), or a peer's exit 75 (its collective broke when the rank died)
    /// reached the operator first.
    ByTheKernelOnly,
}

/// Waits until slot `slot`'s job ended generation `generation` (in `status.stopping` or `status.history`) and the
/// kill is seen: the job blames the end on `OOMKilled`, or the kernel's log shows container `container`'s worker
/// OOM-killed. Either way the kernel, not the filler's exit, ended the rank.
async fn confirm_oom(
    bed: &Testbed,
    jobs: &Jobs,
    slot: usize,
    generation: Option<u64>,
    container: &str,
) -> Result<OomSeen, String> {
    let job = jobs.current[slot]
        .as_ref()
        .ok_or("the slot runs no job now")?;
    let generation = generation.ok_or("the rank's pod has no generation label")?;
    crate::poll_until(
        "the rank's generation ended by its OOM kill",
        RANK_WAIT,
        async || {
            let object = bed.job(&job.name).await?;
            let status = &object["status"];
            let ends: Vec<&Value> = status["history"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(std::iter::once(&status["stopping"]))
                .filter(|end| end["generation"].as_u64() == Some(generation))
                .collect();
            if ends.iter().any(|end| end["containerReason"] == "OOMKilled") {
                return Ok(OomSeen::ByTheRuntime);
            }
            if !ends.is_empty() && Testbed::oom_killed_by_kernel(container)? {
                return Ok(OomSeen::ByTheKernelOnly);
            }
            Err(format!(
                "generation {generation} ended as {ends:?}, the kernel's log has no OOM kill of {container}"
            ))
        },
    )
    .await
    .map_err(|e| rdu_error_chain::chain(&e))
}
