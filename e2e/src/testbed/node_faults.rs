//! More faults of a node's own software, as a soak picks them at random: containerd restarted under running
//! pods, a container's cgroup driven out of memory (the kernel's OOM killer picks the container's process, as
//! it does when a rank outgrows its limit); and what a node must not keep after its
//! jobs are gone (worker processes, shared-memory segments).

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::Testbed;

/// The shell a node runs to OOM-kill container process `$1` (its pid in the node): the process is made the
/// OOM killer's first choice, then this shell joins the process's memory cgroup and fills it (`tail` keeps
/// everything it reads from /dev/zero, which has no newline) until the cgroup's limit is hit; the shell, far
/// smaller, ends 0 once the filler is killed in turn. The container's limit is first lowered to its usage + 16
/// MiB: the pod's cgroup has the same limit and also holds the pause container, so it would run out first, and
/// an OOM there is not the container's (containerd watches the container's cgroup and would report `Error`, as
/// measured). cgroup v1 names the memory controller; on v2 the unified line (`0::`) is the cgroup.
const OOM_SCRIPT: &str = r#"pid="$1"
echo 1000 > "/proc/$pid/oom_score_adj" || exit 3
cg="$(awk -F: '$2 == "memory" { print $3 }' "/proc/$pid/cgroup")"
if [ -n "$cg" ]; then dir="/sys/fs/cgroup/memory$cg"; else dir="/sys/fs/cgroup$(awk -F: '$1 == "0" { print $3 }' "/proc/$pid/cgroup")"; fi
[ -w "$dir/cgroup.procs" ] || { echo "no memory cgroup for $pid at $dir" >&2; exit 4; }
if [ -f "$dir/memory.limit_in_bytes" ]; then usage=memory.usage_in_bytes limit=memory.limit_in_bytes; else usage=memory.current limit=memory.max; fi
echo $(( $(cat "$dir/$usage") + 16777216 )) > "$dir/$limit" || exit 6
echo $$ > "$dir/cgroup.procs" || exit 5
tail /dev/zero
exit 0
"#;

impl Testbed {
    /// Restarts node `index`'s containerd (`systemctl restart containerd`); its containers keep running.
    pub fn restart_containerd(&self, index: u8) {
        let name = &self.node(index).name;
        self.kind
            .exec(name, &["systemctl", "restart", "containerd"])
            .unwrap_or_else(|e| {
                panic!(
                    "containerd restart on {name}: {}",
                    rdu_error_chain::Chain(&e)
                )
            });
    }

    /// Drives container `container_id`'s (`containerd://…`) memory cgroup on node `index` past its limit with
    /// the container's process made the OOM killer's first choice: the kernel kills it and the runtime reports
    /// `OOMKilled`. The container needs a memory limit. Errors name what was missing.
    pub fn oom_kill_container(&self, index: u8, container_id: &str) -> Result<(), String> {
        let name = &self.node(index).name;
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let tasks = self.running_tasks(index)?;
        let pid = tasks
            .iter()
            .find(|(task, _)| task == id)
            .map(|(_, pid)| pid.clone())
            .ok_or_else(|| format!("container {id} on {name} has no running task"))?;
        let pid = pid.as_str();
        // The filler is OOM-killed too once the process is gone (this shell, a few KiB, outlives it).
        self.kind
            .exec(name, &["sh", "-c", OOM_SCRIPT, "oom", pid])
            .map(drop)
            .map_err(|e| format!("OOM of {id} on {name}: {}", rdu_error_chain::Chain(&e)))
    }

    /// Whether the kernel's OOM killer killed the worker process of container `container_id` (`containerd://…`):
    /// its log names the container's cgroup (`cri-containerd-<id>.scope`) as the killed task's. The runtime may
    /// report such a kill as a plain `Error` (exit 137): on cgroup v1 with the systemd cgroup driver containerd
    /// learns of it only from the container's cgroup, which systemd may remove first (containerd's
    /// `internal/cri/server/events.go` says so). Read with `dmesg` on the host, whose kernel the nodes share.
    pub fn oom_killed_by_kernel(container_id: &str) -> Result<bool, String> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let out = std::process::Command::new("dmesg")
            .output()
            .map_err(|e| format!("dmesg: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "dmesg: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(kernel_log_oom_killed(
            &String::from_utf8_lossy(&out.stdout),
            id,
        ))
    }

    /// The running containerd tasks of node `index` (containers and pod sandboxes, `k8s.io` namespace): id and pid.
    fn running_tasks(&self, index: u8) -> Result<Vec<(String, String)>, String> {
        let name = &self.node(index).name;
        let listed = self
            .kind
            .exec(name, &["ctr", "-n", "k8s.io", "task", "ls"])
            .map_err(|e| format!("tasks on {name}: {}", rdu_error_chain::Chain(&e)))?;
        Ok(listed
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (task, pid, status) = (fields.next()?, fields.next()?, fields.next()?);
                (status == "RUNNING").then(|| (task.to_string(), pid.to_string()))
            })
            .collect())
    }

    /// Waits until node `name` is Ready and its kubelet renewed its Lease (`kube-node-lease`) after `after`: the
    /// kubelet reaches the API server again. After a partition or a containerd restart the Ready heartbeat may not
    /// move for minutes (the kubelet posts an unchanged status every 5 minutes), the Lease every 10 s.
    pub async fn wait_lease_renewed_after(&self, name: &str, after: SystemTime, timeout: Duration) {
        let leases = Api::<Lease>::namespaced(self.client.clone(), "kube-node-lease");
        self.wait(
            &format!("{name} Ready with its Lease renewed after {after:?}"),
            timeout,
            async || {
                let lease = leases
                    .get(name)
                    .await
                    .map_err(|e| format!("lease {name}: {}", rdu_error_chain::Chain(&e)))?;
                let renewed = lease
                    .spec
                    .and_then(|s| s.renew_time)
                    .map(|t| SystemTime::from(t.0))
                    .ok_or("no renewTime")?;
                let node = self.node_object(name).await?;
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if renewed > after && ready {
                    Ok(())
                } else {
                    Err(format!("renewed {renewed:?}, Ready {ready}"))
                }
            },
        )
        .await;
    }

    /// The worker processes (`rdu-worker`) still running on node `index`, as `pgrep -a` lists them.
    pub fn worker_processes(&self, index: u8) -> Vec<String> {
        let name = &self.node(index).name;
        // pgrep exits 1 when nothing matches: that is the answer, not an error.
        self.kind
            .exec(name, &["sh", "-c", "pgrep -a -x rdu-worker || true"])
            .unwrap_or_else(|e| panic!("pgrep on {name}: {}", rdu_error_chain::Chain(&e)))
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Shared memory node `index` still holds that no running pod owns: files in the node's own `/dev/shm`, and
    /// the `/dev/shm` mounts containerd makes per pod sandbox whose sandbox no longer runs (a pod's rings
    /// and segments live there; they go with the sandbox unless something leaks).
    pub fn shm_leftovers(&self, index: u8) -> Vec<String> {
        let name = &self.node(index).name;
        let exec = |args: &[&str]| {
            self.kind
                .exec(name, args)
                .unwrap_or_else(|e| panic!("{args:?} on {name}: {}", rdu_error_chain::Chain(&e)))
        };
        let mut left: Vec<String> = exec(&["ls", "-A", "/dev/shm"])
            .lines()
            .map(|f| format!("/dev/shm/{f}"))
            .collect();
        let running: Vec<String> = self
            .running_tasks(index)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|(task, _)| task)
            .collect();
        let mounts = exec(&["cat", "/proc/self/mounts"]);
        left.extend(
            mounts
                .lines()
                .filter_map(|m| m.split_whitespace().nth(1))
                .filter_map(|target| {
                    let sandbox = target.strip_suffix("/shm")?.rsplit('/').next()?;
                    (target.contains("/sandboxes/") && !running.iter().any(|t| t == sandbox))
                        .then(|| target.to_string())
                }),
        );
        left
    }
}

/// Whether kernel log `log` records an OOM kill of a `rdu-worker` process in container `id`'s cgroup (the
/// filler in the same cgroup is killed too, and does not count).
fn kernel_log_oom_killed(log: &str, id: &str) -> bool {
    log.lines()
        .filter(|line| line.contains("oom-kill:"))
        .any(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            fields
                .iter()
                .any(|f| f.starts_with("task_memcg=") && f.contains(id))
                && fields.contains(&"task=rdu-worker")
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_workers_kill_in_its_containers_cgroup_counts() {
        let line = |task: &str, id: &str| {
            format!(
                "[14125.152770] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-cfd0,mems_allowed=0,\
                 oom_memcg=/libpod_parent/kubelet.slice/cri-containerd-{id}.scope,\
                 task_memcg=/libpod_parent/kubelet.slice/cri-containerd-{id}.scope,task={task},pid=2497,uid=65532"
            )
        };
        let log = format!(
            "{}\n[1.0] Memory cgroup out of memory: Killed process 2497 (rdu-worker)\n{}\n",
            line("rdu-worker", "5c23a6"),
            line("tail", "77aa01")
        );
        assert!(super::kernel_log_oom_killed(&log, "5c23a6"));
        // Only the filler was killed in that container's cgroup.
        assert!(!super::kernel_log_oom_killed(&log, "77aa01"));
        // No kill in this container's cgroup.
        assert!(!super::kernel_log_oom_killed(&log, "0b0b0b"));
    }
}
