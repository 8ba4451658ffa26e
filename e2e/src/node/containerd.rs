//! The node's container runtime: its own containerd (Debian's 1.6) in the node's namespaces, with the default
//! paths, which the node's mount namespace binds to its own directories (`/var/lib/containerd`, a `/run` of its
//! own): Debian's runc named explicitly, CNI from Debian's plugins with the node's network,
//! `restrict_oom_score_adj` (this machine may not lower oom_score_adj), and images imported with `ctr` run inside
//! the node. Another runtime (containerd 2, CRI-O) slots in here: a config, an endpoint, an import.

use std::path::Path;

use super::NodeError;
use super::sandbox::Sandbox;

/// Where Debian's containernetworking-plugins package puts the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Debian's runc (a runc built without seccomp fails with "seccomp not supported").
pub const RUNC: &str = "/usr/sbin/runc";
/// containerd's namespace for Kubernetes.
const K8S_NAMESPACE: &str = "k8s.io";
/// containerd's socket inside the node (on the node's own /run).
pub const SOCKET: &str = "/run/containerd/containerd.sock";
/// The CNI configuration directory inside the node.
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// The CRI endpoint as the kubelet names it.
pub fn endpoint() -> String {
    format!("unix://{SOCKET}")
}

/// containerd's configuration (version 2, containerd 1.6/1.7).
pub fn config(sandbox_image: &str) -> String {
    format!(
        r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{CNI_CONF_DIR}"
    max_conf_num = 1
"#
    )
}

/// `ctr` against the node's containerd, in the Kubernetes namespace.
fn ctr(sandbox: &Sandbox, args: &[&str]) -> Result<String, NodeError> {
    let out: std::process::Output = sandbox
        .command("ctr")
        .arg("--address")
        .arg(SOCKET)
        .arg("--namespace")
        .arg(K8S_NAMESPACE)
        .args(args)
        .output()
        .map_err(|e| NodeError::Command(format!("ctr: {e} (apt-get install containerd)")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NodeError::Command(format!(
            "ctr {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Whether containerd answers on its socket.
pub fn answers(sandbox: &Sandbox) -> Result<(), String> {
    ctr(sandbox, &["version"])
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Imports an OCI layout tar whose manifest is tagged with `name`'s tag as `name` (e.g.
/// `docker.io/library/rdu-worker:0.1.0`). `--base-name` makes `ctr` name it `<base>:<tag>` and nothing
/// else: without it `ctr` adds an `import-<date>:<tag>` name, on which the CRI trips.
pub fn import(sandbox: &Sandbox, tar: &Path, name: &str) -> Result<(), NodeError> {
    let (base, _tag) = name
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .ok_or_else(|| NodeError::Command(format!("image {name} has no tag")))?;
    let tar = tar.display().to_string();
    ctr(sandbox, &["images", "import", "--base-name", base, &tar])?;
    let listed = ctr(sandbox, &["images", "ls", "-q"])?;
    if !listed.lines().any(|l| l == name) {
        return Err(NodeError::Command(format!(
            "ctr imported {tar} but lists no {name}: {listed}"
        )));
    }
    Ok(())
}

/// The host PID of a running container's task (`ctr tasks ls`), by container ID.
pub fn task_pid(sandbox: &Sandbox, container_id: &str) -> Result<Option<u32>, NodeError> {
    let listed = ctr(sandbox, &["tasks", "ls"])?;
    Ok(listed.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let id = fields.next()?;
        let pid = fields.next()?.parse().ok()?;
        let running = fields.next() == Some("RUNNING");
        (id == container_id && running).then_some(pid)
    }))
}

/// The full reference the CRI gives a short image name (`rdu-worker:0.1.0` → `docker.io/library/…`).
pub fn normalized(image: &str) -> String {
    let first = image.split('/').next().unwrap_or_default();
    let has_registry =
        image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    match (has_registry, image.contains('/')) {
        (true, _) => image.to_string(),
        (false, true) => format!("docker.io/{image}"),
        (false, false) => format!("docker.io/library/{image}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_uses_the_default_paths_and_debians_runc() {
        let text = config("registry.k8s.io/pause:x");
        assert!(text.contains(r#"root = "/var/lib/containerd""#));
        assert!(text.contains(r#"state = "/run/containerd""#));
        assert!(text.contains(r#"address = "/run/containerd/containerd.sock""#));
        assert!(text.contains("restrict_oom_score_adj = true"));
        assert!(text.contains(r#"BinaryName = "/usr/sbin/runc""#));
        assert!(text.contains(r#"conf_dir = "/etc/cni/net.d""#));
        assert_eq!(endpoint(), "unix:///run/containerd/containerd.sock");
    }

    #[test]
    fn short_image_names_are_normalized_as_the_cri_does() {
        assert_eq!(
            normalized("rdu-worker:0.1.0"),
            "docker.io/library/rdu-worker:0.1.0"
        );
        assert_eq!(normalized("me/x:1"), "docker.io/me/x:1");
        assert_eq!(
            normalized("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
    }
}
