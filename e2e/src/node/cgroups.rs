//! A node's own cgroup in every hierarchy of this machine, so that all its processes (containerd, the kubelet,
//! kube-proxy, every container) can be frozen or killed as one. The hierarchies are read from
//! `/proc/self/mountinfo` and `/proc/self/cgroup`: cgroup v1 (one mount per controller set, as on this machine)
//! and the unified v2 hierarchy both work. Inside the node's cgroup namespace the node's cgroup is the root, so
//! runc's container cgroups land below it; the node's own processes live in its `system` child, as the v2
//! "no internal processes" rule asks.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::NodeError;

/// The child of a node's cgroup its own processes (not containers) are placed in.
pub const SYSTEM: &str = "system";

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted here, e.g. `/sys/fs/cgroup/memory`.
    pub mount_point: PathBuf,
    /// `None` for the unified (v2) hierarchy; else the mount options naming it (`memory`, `none,name=systemd`).
    pub v1_options: Option<String>,
    /// This process's cgroup in it, e.g. `/process_api/90df…`.
    pub own: String,
}

impl Hierarchy {
    /// The `mount` arguments that mount this hierarchy again (inside a cgroup namespace: rooted at its root).
    pub fn mount_args(&self) -> Vec<String> {
        let point = self.mount_point.display().to_string();
        match &self.v1_options {
            Some(options) => vec![
                "-t".into(),
                "cgroup".into(),
                "-o".into(),
                options.clone(),
                "cgroup".into(),
                point,
            ],
            None => vec!["-t".into(), "cgroup2".into(), "cgroup2".into(), point],
        }
    }
}

/// The cgroup hierarchies mounted below `/sys/fs/cgroup` and this process's place in each.
pub fn hierarchies() -> Result<Vec<Hierarchy>, NodeError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let found = parse_hierarchies(&mountinfo, &own);
    if found.is_empty() {
        return Err(NodeError::Missing(
            "no cgroup hierarchy is mounted below /sys/fs/cgroup".into(),
        ));
    }
    Ok(found)
}

/// [`hierarchies`] from the text of `/proc/self/mountinfo` and `/proc/self/cgroup`.
pub fn parse_hierarchies(mountinfo: &str, own_cgroups: &str) -> Vec<Hierarchy> {
    // "4:memory:/process_api/x" (v1) and "0::/x" (v2).
    let own_of = |controllers: &str| {
        own_cgroups.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            (names == controllers).then(|| path.to_string())
        })
    };
    mountinfo
        .lines()
        .filter_map(|line| {
            // The optional fields end with " - "; then fstype, source, super options.
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            if !mount_point.starts_with("/sys/fs/cgroup") {
                return None;
            }
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let super_options = right.nth(1)?;
            match fstype {
                "cgroup2" => Some(Hierarchy {
                    mount_point: PathBuf::from(mount_point),
                    v1_options: None,
                    own: own_of("")?,
                }),
                "cgroup" => {
                    let names: Vec<&str> = super_options
                        .split(',')
                        .filter(|o| {
                            !matches!(
                                *o,
                                "rw" | "ro"
                                    | "relatime"
                                    | "nosuid"
                                    | "nodev"
                                    | "noexec"
                                    | "xattr"
                                    | "clone_children"
                            ) && !o.starts_with("release_agent")
                        })
                        .collect();
                    let key = names.join(",");
                    let options = if names.iter().all(|n| n.starts_with("name=")) {
                        format!("none,{key}")
                    } else {
                        key.clone()
                    };
                    Some(Hierarchy {
                        mount_point: PathBuf::from(mount_point),
                        v1_options: Some(options),
                        own: own_of(&key)?,
                    })
                }
                _ => None,
            }
        })
        .collect()
}

/// Whether `/sys/fs/cgroup` itself is the unified hierarchy (a pure cgroup v2 machine).
pub fn unified_only(found: &[Hierarchy]) -> bool {
    found
        .iter()
        .any(|h| h.v1_options.is_none() && h.mount_point == Path::new("/sys/fs/cgroup"))
}

/// A node's cgroup: `<own>/<name>` in every hierarchy, with its `system` child.
#[derive(Debug)]
pub struct NodeCgroup {
    pub name: String,
    hierarchies: Vec<Hierarchy>,
}

impl NodeCgroup {
    /// Creates `<own>/<name>` and `<own>/<name>/system` in every hierarchy (cpuset gets its parent's cpus and mems).
    pub fn create(name: &str) -> Result<Self, NodeError> {
        let cgroup = Self {
            name: name.to_string(),
            hierarchies: hierarchies()?,
        };
        for h in &cgroup.hierarchies {
            let dir = cgroup.dir(h);
            for path in [dir.clone(), dir.join(SYSTEM)] {
                std::fs::create_dir_all(&path).map_err(|e| {
                    NodeError::Command(format!("cannot create cgroup {}: {e}", path.display()))
                })?;
                inherit_cpuset(&path);
            }
        }
        Ok(cgroup)
    }

    /// The node's directory in one hierarchy, in this machine's view.
    fn dir(&self, h: &Hierarchy) -> PathBuf {
        h.mount_point
            .join(h.own.trim_start_matches('/'))
            .join(&self.name)
    }

    /// The hierarchies it lives in.
    pub fn hierarchies(&self) -> &[Hierarchy] {
        &self.hierarchies
    }

    /// Every `cgroup.procs` a process must be written to, in this machine's view, to join the node's cgroup
    /// itself (the holder of the namespaces, before it makes them).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.hierarchies
            .iter()
            .map(|h| self.dir(h).join("cgroup.procs"))
            .collect()
    }

    /// Every process in the node's cgroup and below (from the first hierarchy: all hold the same processes).
    pub fn pids(&self) -> Vec<u32> {
        let Some(h) = self.hierarchies.first() else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        collect_pids(&self.dir(h), &mut pids);
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills every process of the node at once, as a power cut would: freezes it (v1 freezer, so nothing forks
    /// or reacts meanwhile), sends SIGKILL to every process, thaws it, and waits until none is left.
    pub fn kill_all(&self) -> Result<(), NodeError> {
        let freezer = self
            .hierarchies
            .iter()
            .find(|h| h.v1_options.as_deref() == Some("freezer"))
            .map(|h| self.dir(h));
        let unified = self
            .hierarchies
            .iter()
            .find(|h| h.v1_options.is_none())
            .map(|h| self.dir(h));
        match (&freezer, &unified) {
            (Some(f), _) => {
                let _ = std::fs::write(f.join("freezer.state"), "FROZEN");
            }
            (None, Some(u)) => {
                // cgroup.kill (Linux 5.14) kills the whole subtree atomically.
                let _ = std::fs::write(u.join("cgroup.kill"), "1");
            }
            (None, None) => {}
        }
        for pid in self.pids() {
            // SAFETY: kill(2) on a pid read from the node's cgroup; no memory is touched.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        if let Some(f) = &freezer {
            let _ = std::fs::write(f.join("freezer.state"), "THAWED");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = self.pids();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NodeError::Command(format!(
                    "processes {left:?} of cgroup {} outlived SIGKILL",
                    self.name
                )));
            }
            for pid in &left {
                // SAFETY: as above.
                unsafe {
                    libc::kill(*pid as libc::pid_t, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills what is left and removes the node's cgroups, deepest first. Best effort.
    pub fn remove(&self) {
        let _ = self.kill_all();
        for h in &self.hierarchies {
            remove_tree(&self.dir(h));
        }
    }
}

/// Removes every cgroup named like a node of this harness (`prefix*`) below this process's cgroups: what a killed
/// earlier run left behind.
pub fn sweep(prefix: &str) {
    let Ok(found) = hierarchies() else {
        return;
    };
    for h in &found {
        let own = h.mount_point.join(h.own.trim_start_matches('/'));
        let Ok(entries) = std::fs::read_dir(&own) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                let cgroup = NodeCgroup {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    hierarchies: found.clone(),
                };
                cgroup.remove();
            }
        }
    }
}

fn collect_pids(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&entry.path(), pids);
            }
        }
    }
}

/// rmdir of a cgroup tree, children first (a cgroup with children or processes cannot be removed).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A new v1 cpuset cgroup starts with no cpus and mems: copy its parent's.
fn inherit_cpuset(dir: &Path) {
    let Some(parent) = dir.parent() else {
        return;
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let (mine, theirs) = (dir.join(file), parent.join(file));
        if mine.exists()
            && std::fs::read_to_string(&mine).is_ok_and(|v| v.trim().is_empty())
            && let Ok(value) = std::fs::read_to_string(&theirs)
        {
            let _ = std::fs::write(&mine, value.trim());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
        40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
        50 23 0:40 / /proc rw - proc proc rw\n";
    const OWN: &str = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn hierarchies_and_this_process_place_are_read() {
        let found = parse_hierarchies(MOUNTINFO, OWN);
        let summary: Vec<(String, Option<String>, String)> = found
            .iter()
            .map(|h| {
                (
                    h.mount_point.display().to_string(),
                    h.v1_options.clone(),
                    h.own.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("/sys/fs/cgroup/cpu".into(), Some("cpu".into()), "/".into()),
                (
                    "/sys/fs/cgroup/memory".into(),
                    Some("memory".into()),
                    "/process_api/abc".into()
                ),
                (
                    "/sys/fs/cgroup/systemd".into(),
                    Some("none,name=systemd".into()),
                    "/".into()
                ),
                ("/sys/fs/cgroup/unified".into(), None, "/".into()),
            ]
        );
        assert!(!unified_only(&found));
        assert_eq!(
            found[2].mount_args(),
            [
                "-t",
                "cgroup",
                "-o",
                "none,name=systemd",
                "cgroup",
                "/sys/fs/cgroup/systemd"
            ]
        );
        assert_eq!(
            found[3].mount_args(),
            ["-t", "cgroup2", "cgroup2", "/sys/fs/cgroup/unified"]
        );
    }

    #[test]
    fn a_pure_v2_machine_is_recognised() {
        let info = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let found = parse_hierarchies(info, "0::/user.slice/x\n");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].own, "/user.slice/x");
        assert!(unified_only(&found));
    }
}
