//! A node's own Linux namespaces and cgroup on this machine, as a container runtime gives a kind node: a network
//! namespace (made by [`super::network`]), a mount namespace and a cgroup namespace held by a small holder process,
//! and a cgroup in every hierarchy. In the mount namespace the node gets its own `/run` (a tmpfs: containerd's and
//! runc's state, shim sockets), sysfs of its network namespace, cgroup filesystems rooted at its cgroup, and
//! bind mounts of its own directories over the paths the kubelet, containerd and CNI fix (`/var/lib/kubelet`, whose
//! `device-plugins/kubelet.sock` the device plugin API fixes whatever `--root-dir` says; `/var/lib/containerd`,
//! `/var/lib/cni`, `/etc/cni/net.d`, `/var/log/pods`, …). Every process of the node is started inside with
//! [`Sandbox::command`]; killing the cgroup kills the node.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::NodeError;
use super::cgroups::{self, Hierarchy, NodeCgroup};
use crate::process::Managed;

/// The line the holder prints once its namespaces are ready.
const READY_LINE: &str = "rdu-e2e sandbox ready";
/// How long the holder may take to set up the namespaces.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A directory of the node bound over a path of this machine inside the node's mount namespace.
#[derive(Debug, Clone)]
pub struct Bind {
    pub source: PathBuf,
    pub target: PathBuf,
}

/// The node's namespaces and cgroup while it runs.
pub struct Sandbox {
    name: String,
    netns: PathBuf,
    cgroup: NodeCgroup,
    holder: Option<Managed>,
}

impl Sandbox {
    /// Makes the node's cgroup, starts the holder of its mount and cgroup namespaces inside network namespace
    /// `netns` (a path such as `/run/netns/x`), and waits until its mounts are in place. `binds`' targets must
    /// exist on this machine ([`MountPoints`]); their sources are created.
    pub fn start(
        name: &str,
        netns: &Path,
        binds: &[Bind],
        log_dir: &Path,
    ) -> Result<Self, NodeError> {
        let cgroup = NodeCgroup::create(name)?;
        for bind in binds {
            std::fs::create_dir_all(&bind.source)?;
        }
        let script = holder_script(cgroup.hierarchies(), binds);
        let join = cgroup
            .procs_files()
            .iter()
            .map(|f| format!("echo $$ > {}", quote(&f.display().to_string())))
            .collect::<Vec<_>>()
            .join("; ");
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", netns.display()))
            .args(["--", "sh", "-c"])
            .arg(format!(
                "{join}; exec unshare --mount --cgroup --propagation private sh -c \"$0\"",
            ))
            .arg(script);
        let holder = Managed::spawn(&format!("{name}-sandbox"), command, log_dir)?;
        let mut sandbox = Self {
            name: name.to_string(),
            netns: netns.to_path_buf(),
            cgroup,
            holder: Some(holder),
        };
        sandbox.wait_ready()?;
        Ok(sandbox)
    }

    fn wait_ready(&mut self) -> Result<(), NodeError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let holder = self.holder.as_mut().expect("started");
        loop {
            if holder.log_tail(50).lines().any(|l| l == READY_LINE) {
                return Ok(());
            }
            if let Some(dead) = holder.exited() {
                return Err(NodeError::Command(format!(
                    "the sandbox of {}: {dead}",
                    self.name
                )));
            }
            if Instant::now() >= deadline {
                return Err(NodeError::Command(format!(
                    "the sandbox of {} was not ready after {READY_TIMEOUT:?}: {}",
                    self.name,
                    holder.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The holder's PID: its `/proc/<pid>/ns/{mnt,cgroup}` are the node's namespaces.
    fn holder_pid(&self) -> u32 {
        self.holder.as_ref().map_or(0, Managed::id)
    }

    /// How many mounts the node's mount namespace has stacked at `path`.
    pub fn mounts_at(&self, path: &Path) -> Result<usize, NodeError> {
        let mountinfo = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.holder_pid()))?;
        Ok(count_mounts_at(&mountinfo, path))
    }

    /// `program` to run inside the node: its network, mount and cgroup namespaces, in the node's `system` cgroup.
    /// Add arguments as to any `Command`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let pid = self.holder_pid();
        let join = self
            .cgroup
            .hierarchies()
            .iter()
            .map(|h| {
                let file = h.mount_point.join(cgroups::SYSTEM).join("cgroup.procs");
                format!("echo $$ > {}", quote(&file.display().to_string()))
            })
            .collect::<Vec<_>>()
            .join("; ");
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.netns.display()))
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .arg(format!("--cgroup=/proc/{pid}/ns/cgroup"))
            .args(["--", "sh", "-c"])
            .arg(format!("{join}; exec \"$@\""))
            .arg("rdu-node")
            .arg(program);
        command
    }

    /// Every process of the node (the holder too) killed at once; the namespaces go with the last of them.
    pub fn kill_all(&mut self) -> Result<(), NodeError> {
        let result = self.cgroup.kill_all();
        // Reaps the holder (already dead).
        self.holder.take();
        result
    }

    /// Whether the holder (and with it, usually, the node) still runs.
    pub fn alive(&mut self) -> bool {
        self.holder.as_mut().is_some_and(|h| h.exited().is_none())
    }

    /// The processes of the node now.
    pub fn pids(&self) -> Vec<u32> {
        self.cgroup.pids()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.cgroup.remove();
        self.holder.take();
    }
}

/// The holder's shell script: remounts sysfs (of the node's network namespace) and the cgroup filesystems
/// (rooted at the node's cgroup), mounts a tmpfs on `/run`, binds the node's directories as shared mounts, moves
/// itself into the node's `system` cgroup, and then waits forever.
pub fn holder_script(hierarchies: &[Hierarchy], binds: &[Bind]) -> String {
    let mut lines = vec![
        "set -e".to_string(),
        "mount --make-rprivate /".to_string(),
        "mount -t sysfs sysfs /sys".to_string(),
    ];
    if cgroups::unified_only(hierarchies) {
        lines.push("mount -t cgroup2 cgroup2 /sys/fs/cgroup".into());
    } else {
        lines.push("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup".into());
        for h in hierarchies {
            let args: Vec<String> = h.mount_args().iter().map(|a| quote(a)).collect();
            lines.push(format!(
                "mkdir -p {}; mount {}",
                quote(&h.mount_point.display().to_string()),
                args.join(" ")
            ));
        }
    }
    lines.push("mount -t tmpfs -o mode=755 tmpfs /run".into());
    // Each bind is made shared, as systemd leaves every mount of a real node: the kubelet finds its root not
    // shared otherwise and binds it over itself at start, racing its own pod-resources listener, whose rename of
    // the socket into place then fails with EXDEV when the bind lands between the rename's two lookups.
    for bind in binds {
        let target = quote(&bind.target.display().to_string());
        lines.push(format!(
            "mount --bind {} {target}",
            quote(&bind.source.display().to_string()),
        ));
        lines.push(format!("mount --make-shared {target}"));
    }
    for h in hierarchies {
        let file = h.mount_point.join(cgroups::SYSTEM).join("cgroup.procs");
        lines.push(format!("echo $$ > {}", quote(&file.display().to_string())));
    }
    lines.push(format!("echo '{READY_LINE}'"));
    lines.push("exec sleep infinity".into());
    lines.join("\n")
}

/// The number of `mountinfo` lines (proc(5)) whose mount point is `path`.
fn count_mounts_at(mountinfo: &str, path: &Path) -> usize {
    mountinfo
        .lines()
        .filter(|line| line.split(' ').nth(4).map(Path::new) == Some(path))
        .count()
}

/// Single-quotes `text` for sh.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Paths of this machine the nodes bind over, created when missing and removed again (if still empty) when
/// dropped, so the machine is left as it was.
#[derive(Debug, Default)]
pub struct MountPoints {
    created: Vec<PathBuf>,
}

impl MountPoints {
    /// Creates each of `paths` that does not exist, remembering the first missing ancestor.
    pub fn ensure(paths: &[PathBuf]) -> Result<Self, NodeError> {
        let mut points = Self::default();
        for path in paths {
            let mut missing = None;
            let mut current = Some(path.as_path());
            while let Some(p) = current {
                if p.exists() {
                    break;
                }
                missing = Some(p.to_path_buf());
                current = p.parent();
            }
            std::fs::create_dir_all(path)?;
            points.created.extend(missing);
        }
        Ok(points)
    }
}

impl Drop for MountPoints {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            remove_empty_tree(dir);
        }
    }
}

/// Removes `dir` and its subdirectories if they hold no file.
fn remove_empty_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_remounts_cgroups_and_binds_the_node_directories() {
        let found = cgroups::parse_hierarchies(
            "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
             41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
            "1:cpu:/\n0::/\n",
        );
        let script = holder_script(
            &found,
            &[Bind {
                source: "/tmp/n1/var/lib/kubelet".into(),
                target: "/var/lib/kubelet".into(),
            }],
        );
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(lines[2], "mount -t sysfs sysfs /sys");
        assert!(lines.contains(&"mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup"));
        assert!(lines.contains(
            &"mkdir -p '/sys/fs/cgroup/cpu'; mount '-t' 'cgroup' '-o' 'cpu' 'cgroup' '/sys/fs/cgroup/cpu'"
        ));
        let bind = lines
            .iter()
            .position(|l| *l == "mount --bind '/tmp/n1/var/lib/kubelet' '/var/lib/kubelet'")
            .expect("the kubelet root is bound");
        assert_eq!(lines[bind + 1], "mount --make-shared '/var/lib/kubelet'");
        assert!(lines.contains(&"echo $$ > '/sys/fs/cgroup/unified/system/cgroup.procs'"));
        // The binds come after /run's tmpfs, the ready line just before the wait.
        let run = lines.iter().position(|l| l.contains("tmpfs /run")).unwrap();
        let bind = lines.iter().position(|l| l.contains("--bind")).unwrap();
        assert!(run < bind);
        assert_eq!(lines[lines.len() - 2], format!("echo '{READY_LINE}'"));
    }

    #[test]
    fn mounts_are_counted_by_their_mount_point() {
        let mountinfo = "36 35 98:0 / /var/lib/kubelet rw shared:2 - ext4 /dev/vda rw\n\
                         37 36 98:0 / /var/lib/kubelet rw shared:3 - ext4 /dev/vda rw\n\
                         38 36 0:40 / /var/lib/kubelet/pods/x rw - tmpfs tmpfs rw\n";
        assert_eq!(count_mounts_at(mountinfo, Path::new("/var/lib/kubelet")), 2);
        assert_eq!(count_mounts_at(mountinfo, Path::new("/var/lib")), 0);
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("a'b"), r"'a'\''b'");
    }

    #[test]
    fn mount_points_created_are_removed_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        let kept = dir.path().join("keep");
        std::fs::create_dir(&kept).unwrap();
        let points = MountPoints::ensure(&[deep.clone(), kept.clone()]).unwrap();
        assert!(deep.is_dir());
        drop(points);
        assert!(!dir.path().join("a").exists());
        assert!(kept.is_dir(), "an existing directory is left alone");
    }
}
