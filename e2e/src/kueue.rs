//! Kueue's manager beside the test control plane: its CRDs applied server-side, its Configuration (RduJob as an
//! external framework, internal certificate management off, a self-signed certificate for its webhook server,
//! which nothing calls as no webhook configuration is registered), run as its ServiceAccount
//! `kueue-system/kueue-controller-manager` with Kueue's own roles (`manager-role`, `manager-secrets-role`) and
//! whatever the chart grants that account (read access to RduJobs), as in a cluster. Its metrics server reads
//! its certificate from the fixed path `/etc/kueue/metrics/certs`, so it runs in a mount namespace of its own
//! where a directory of the test is bound over `/etc/kueue`: nothing is written to the host's `/etc` but an
//! empty `/etc/kueue` mount point (and a marker in it that a test made it), removed at the end by the last Kueue
//! that uses it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cluster::{ClusterError, create_namespace, kubectl};
use crate::control_plane::ControlPlane;
use crate::poll::poll_until;
use crate::ports::free_port;
use crate::tools::workspace_root;

/// Env var naming Kueue's directory (`bin/kueue`, `crds/*.yaml`, `rbac/*.yaml`), as `e2e/kueue/build.sh`
/// prints it. Unset, [`kueue_dir`] runs that script when a test first needs Kueue.
pub const KUEUE_ENV: &str = "RDU_E2E_KUEUE";
/// The script that builds Kueue's directory (or finds it cached) and prints it on its last line.
const BUILD_SCRIPT: &str = "e2e/kueue/build.sh";
/// Kueue's namespace.
pub const KUEUE_NAMESPACE: &str = "kueue-system";
/// Kueue's ServiceAccount, as its release manifests name it (and the chart's `kueue.managerServiceAccount`).
pub const KUEUE_ACCOUNT: &str = "kueue-controller-manager";
const MOUNT_POINT: &str = "/etc/kueue";
/// A file in the host's mount point (hidden under each Kueue's bind mount) saying an e2e Kueue made the mount point,
/// so that the last Kueue to end removes it even when another made it.
const MADE_MARKER: &str = "/etc/kueue/.made-by-rdu-e2e";

/// Kueue's directory, or why there is none: the one [`KUEUE_ENV`] names, else the one `e2e/kueue/build.sh`
/// prints, built now when it is not cached. Built this late, Kueue's compile overlaps what a test does before it
/// needs Kueue (CI starts the same build beside its stages; the script's lock makes a second caller wait for it).
pub fn kueue_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os(KUEUE_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => build()?,
    };
    if dir.join("bin/kueue").is_file()
        && dir.join("crds").is_dir()
        && dir.join("rbac/role.yaml").is_file()
        && dir.join("rbac/manager_secrets_role.yaml").is_file()
    {
        Ok(dir)
    } else {
        Err(format!(
            "{} has no bin/kueue, crds/ and rbac/: run bash {BUILD_SCRIPT}",
            dir.display()
        ))
    }
}

/// Runs [`BUILD_SCRIPT`] (its log goes to the test's stderr) and returns the directory on its last line.
fn build() -> Result<PathBuf, String> {
    let root = workspace_root();
    let out = Command::new("bash")
        .arg(root.join(BUILD_SCRIPT))
        .current_dir(&root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run bash {BUILD_SCRIPT}: {e} (or set {KUEUE_ENV})"))?;
    if !out.status.success() {
        return Err(format!(
            "bash {BUILD_SCRIPT} failed ({}); its log is above (or set {KUEUE_ENV})",
            out.status
        ));
    }
    last_line(&String::from_utf8_lossy(&out.stdout))
        .map(PathBuf::from)
        .ok_or_else(|| format!("bash {BUILD_SCRIPT} printed no directory"))
}

/// The last non-empty line of a script's output, trimmed.
fn last_line(stdout: &str) -> Option<&str> {
    stdout.lines().map(str::trim).rfind(|line| !line.is_empty())
}

/// A running Kueue manager (the process is the plane's); when dropped, removes the mount point a test made, unless
/// another Kueue still has it mounted.
pub struct Kueue {
    pid: u32,
}

impl Drop for Kueue {
    fn drop(&mut self) {
        if Path::new(MADE_MARKER).exists() && !mounted_by_another(self.pid, MOUNT_POINT) {
            let _ = std::fs::remove_file(MADE_MARKER);
            let _ = std::fs::remove_dir(MOUNT_POINT);
        }
    }
}

/// Whether a process other than `own` has something mounted at `point`: for the mount point, another test's
/// Kueue, in a mount namespace of its own. Removing the directory would detach that mount (Linux unmounts a
/// removed directory in every namespace) and take its certificates away. One `mountinfo` is read per mount
/// namespace but ours.
fn mounted_by_another(own: u32, point: &str) -> bool {
    let ns_of = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let mut seen = vec![ns_of("self")];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|p| p.parse::<u32>().is_ok()) else {
            continue;
        };
        let ns = ns_of(pid);
        if pid.parse() == Ok(own) || ns.is_none() || seen.contains(&ns) {
            continue;
        }
        seen.push(ns);
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
        if mounts_at(&mounts, point) {
            return true;
        }
    }
    false
}

/// Whether `mountinfo` (a `/proc/PID/mountinfo`) lists a mount at `point` (its fifth field).
fn mounts_at(mountinfo: &str, point: &str) -> bool {
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(point))
}

fn self_signed(dir: &Path) -> Result<(), ClusterError> {
    std::fs::create_dir_all(dir)?;
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=kueue",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .output()?;
    if status.status.success() {
        Ok(())
    } else {
        Err(ClusterError::Io(std::io::Error::other(format!(
            "openssl: {}",
            String::from_utf8_lossy(&status.stderr)
        ))))
    }
}

/// Installs Kueue's CRDs, starts its manager (log `kueue`) and waits until it is ready. `wait_for_pods_ready`
/// turns on `waitForPodsReady` with that timeout.
pub async fn start(
    plane: &mut ControlPlane,
    dir: &Path,
    wait_for_pods_ready: Option<Duration>,
) -> Result<Kueue, ClusterError> {
    let crds = dir.join("crds").display().to_string();
    kubectl(plane, &["apply", "--server-side", "-f", &crds], None)?;
    poll_until(
        "Kueue's CRDs established",
        Duration::from_secs(60),
        || async {
            kubectl(
                plane,
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=5s",
                    "crd/workloads.kueue.x-k8s.io",
                    "crd/clusterqueues.kueue.x-k8s.io",
                    "crd/localqueues.kueue.x-k8s.io",
                    "crd/resourceflavors.kueue.x-k8s.io",
                ],
                None,
            )
            .map_err(|e| e.to_string())
        },
    )
    .await?;
    create_namespace(plane, KUEUE_NAMESPACE).await?;
    let kubeconfig = service_account(plane, dir)?;
    let root = plane.dir().join("kueue");
    let etc = root.join("etc");
    self_signed(&etc.join("metrics/certs"))?;
    self_signed(&root.join("webhook-certs"))?;
    let health = free_port()?;
    let pods_ready = wait_for_pods_ready
        .map(|t| {
            format!(
                "waitForPodsReady:\n  timeout: {}s\n  recoveryTimeout: {}s\n  blockAdmission: false\n  \
                 requeuingStrategy: {{timestamp: Eviction, backoffBaseSeconds: 1, backoffMaxSeconds: 5}}\n",
                t.as_secs(),
                t.as_secs()
            )
        })
        .unwrap_or_default();
    let config = format!(
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\nnamespace: {KUEUE_NAMESPACE}\n\
         health:\n  healthProbeBindAddress: 127.0.0.1:{health}\nmetrics:\n  bindAddress: 127.0.0.1:{}\n\
         webhook:\n  host: 127.0.0.1\n  port: {}\n  certDir: {}\nleaderElection:\n  leaderElect: false\n\
         internalCertManagement:\n  enable: false\nmanageJobsWithoutQueueName: false\n\
         integrations:\n  frameworks: []\n  externalFrameworks: [\"RduJob.v1alpha1.rdu.dev\"]\n{pods_ready}",
        free_port()?,
        free_port()?,
        root.join("webhook-certs").display(),
    );
    let config_file = root.join("config.yaml");
    std::fs::write(&config_file, config)?;
    if !Path::new(MOUNT_POINT).exists() {
        std::fs::create_dir_all(MOUNT_POINT)?;
        std::fs::write(MADE_MARKER, "")?;
    }
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount --bind \"$0\" {MOUNT_POINT} && exec \"$1\" --config=\"$2\" --kubeconfig=\"$3\" --feature-gates=VisibilityOnDemand=false --zap-log-level=3"
        ))
        .arg(&etc)
        .arg(dir.join("bin/kueue"))
        .arg(&config_file)
        .arg(&kubeconfig);
    // Made before the process, so that a failed start removes the mount point as well.
    let mut kueue = Kueue { pid: 0 };
    kueue.pid = plane.spawn("kueue", command)?;
    let up = poll_until(
        "Kueue's manager ready",
        Duration::from_secs(120),
        || async { ready(health).map_err(|e| rdu_error_chain::chain(&e)) },
    )
    .await;
    if let Err(e) = up {
        return Err(ClusterError::Io(std::io::Error::other(format!(
            "{e}\n--- kueue's log\n{}",
            plane.log_tail("kueue", 40)
        ))));
    }
    Ok(kueue)
}

/// Kueue's ServiceAccount bound to Kueue's own ClusterRole and its Role for Secrets in its namespace; a
/// kubeconfig with a token of it.
fn service_account(plane: &ControlPlane, dir: &Path) -> Result<PathBuf, ClusterError> {
    let role = dir.join("rbac/role.yaml").display().to_string();
    kubectl(plane, &["apply", "-f", &role], None)?;
    // The Role for Secrets in Kueue's namespace (its release manifests' `system`, renamed by kustomize).
    let secrets = std::fs::read_to_string(dir.join("rbac/manager_secrets_role.yaml"))?.replace(
        "namespace: system",
        &format!("namespace: {KUEUE_NAMESPACE}"),
    );
    kubectl(plane, &["apply", "-f", "-"], Some(&secrets))?;
    let binding = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {KUEUE_ACCOUNT}, namespace: {KUEUE_NAMESPACE}}}\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: kueue-manager}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: manager-role}}\n\
         subjects: [{{kind: ServiceAccount, name: {KUEUE_ACCOUNT}, namespace: {KUEUE_NAMESPACE}}}]\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
         metadata: {{name: kueue-manager-secrets, namespace: {KUEUE_NAMESPACE}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: manager-secrets-role}}\n\
         subjects: [{{kind: ServiceAccount, name: {KUEUE_ACCOUNT}, namespace: {KUEUE_NAMESPACE}}}]\n"
    );
    kubectl(plane, &["apply", "-f", "-"], Some(&binding))?;
    let token = crate::cluster::service_account_token(plane, KUEUE_NAMESPACE, KUEUE_ACCOUNT)?;
    Ok(plane.write_kubeconfig(
        "kueue",
        &format!("system:serviceaccount:{KUEUE_NAMESPACE}:{KUEUE_ACCOUNT}"),
        &token,
        KUEUE_NAMESPACE,
    )?)
}

/// Whether `GET /readyz` on 127.0.0.1:`port` answers 200.
fn ready(port: u16) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    if answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(std::io::Error::other(
            answer.lines().next().unwrap_or_default().to_string(),
        ))
    }
}

/// Job `name`'s Workload in `namespace` (the one labelled with the job's UID), as JSON.
pub async fn workload_of(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<serde_json::Value, String> {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
    let job = Api::<rdu_crds::RduJob>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("get rdujob {name}: {}", rdu_error_chain::Chain(&e)))?;
    let uid = job.metadata.uid.unwrap_or_default();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    );
    let list = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .list(&ListParams::default().labels(&format!("kueue.x-k8s.io/job-uid={uid}")))
        .await
        .map_err(|e| e.to_string())?;
    match &list.items[..] {
        [one] => serde_json::to_value(one).map_err(|e| e.to_string()),
        other => Err(format!("{} Workloads of {name}", other.len())),
    }
}

/// Condition `type_` of a Workload (JSON), if it has one.
pub fn condition<'a>(
    workload: &'a serde_json::Value,
    type_: &str,
) -> Option<&'a serde_json::Value> {
    workload["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether condition `type_` of a Workload has status `status` (`"True"`, `"False"`).
pub fn condition_is(workload: &serde_json::Value, type_: &str, status: &str) -> bool {
    condition(workload, type_).is_some_and(|c| c["status"] == status)
}

/// Asserts that a Workload (JSON) still holds its quota as `admission` gave it: QuotaReserved and Admitted, not
/// Evicted, the same `status.admission` (what a gang restart inside an admitted job must leave alone).
pub fn assert_keeps_admission(workload: &serde_json::Value, admission: &serde_json::Value) {
    assert!(
        condition_is(workload, "QuotaReserved", "True")
            && condition_is(workload, "Admitted", "True")
            && !condition_is(workload, "Evicted", "True"),
        "a gang restart lost the quota: {}",
        workload["status"]
    );
    assert_eq!(
        &workload["status"]["admission"], admission,
        "the admission changed"
    );
}

/// PriorityClasses `low` (10) and `high` (1000), for the tests that preempt.
pub const PRIORITY_CLASSES: &str = r#"apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
"#;

/// A ResourceFlavor, a ClusterQueue with a quota of tiles in it and a LocalQueue pointing at the ClusterQueue: what
/// a test's queued jobs need.
#[derive(Debug, Clone, Copy)]
pub struct TileQueue<'a> {
    pub flavor: &'a str,
    /// The flavor's `spec` (node labels, tolerations) as a YAML flow mapping, if it has one.
    pub flavor_spec: Option<&'a str>,
    pub cluster_queue: &'a str,
    pub nominal_tiles: u32,
    /// The ClusterQueue preempts lower priorities within itself.
    pub preempt_lower_priority: bool,
    pub local_queue: &'a str,
    pub namespace: &'a str,
}

impl TileQueue<'_> {
    /// The three objects as YAML for `kubectl apply -f -`.
    pub fn yaml(&self) -> String {
        let TileQueue {
            flavor,
            cluster_queue,
            nominal_tiles,
            local_queue,
            namespace,
            ..
        } = self;
        let flavor_spec = self
            .flavor_spec
            .map_or(String::new(), |spec| format!("\nspec: {spec}"));
        let preemption = if self.preempt_lower_priority {
            "\n  preemption: {withinClusterQueue: LowerPriority}"
        } else {
            ""
        };
        format!(
            "apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: {flavor}}}{flavor_spec}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: {cluster_queue}}}
spec:
  namespaceSelector: {{}}{preemption}
  resourceGroups:
  - coveredResources: [rdu.dev/tile]
    flavors:
    - name: {flavor}
      resources: [{{name: rdu.dev/tile, nominalQuota: {nominal_tiles}}}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{name: {local_queue}, namespace: {namespace}}}
spec: {{clusterQueue: {cluster_queue}}}
"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{TileQueue, last_line, mounted_by_another, mounts_at};
    use serde::Deserialize;
    use serde_json::{Value, json};

    #[test]
    fn the_build_scripts_directory_is_its_last_printed_line() {
        let cached = "/root/.cache/rdu-e2e/kueue-0.17.0\n";
        assert_eq!(last_line(cached), Some("/root/.cache/rdu-e2e/kueue-0.17.0"));
        assert_eq!(last_line("go: downloading x\n/dir \n\n"), Some("/dir"));
        assert_eq!(last_line(""), None);
        assert_eq!(last_line("\n  \n"), None);
    }

    fn documents(yaml: &str) -> Vec<Value> {
        serde_yaml_ng::Deserializer::from_str(yaml)
            .map(|doc| Value::deserialize(doc).expect("a YAML document"))
            .collect()
    }

    #[test]
    fn a_tile_queue_is_a_flavor_a_cluster_queue_and_a_local_queue() {
        let queue = TileQueue {
            flavor: "pool-a",
            flavor_spec: Some("{nodeLabels: {rdu.dev/pool: a}}"),
            cluster_queue: "rdu",
            nominal_tiles: 4,
            preempt_lower_priority: true,
            local_queue: "team",
            namespace: "ml",
        };
        let docs = documents(&queue.yaml());
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0]["spec"]["nodeLabels"], json!({"rdu.dev/pool": "a"}));
        let cq = &docs[1]["spec"];
        assert_eq!(cq["preemption"]["withinClusterQueue"], "LowerPriority");
        assert_eq!(cq["resourceGroups"][0]["flavors"][0]["name"], "pool-a");
        assert_eq!(
            cq["resourceGroups"][0]["flavors"][0]["resources"][0],
            json!({"name": "rdu.dev/tile", "nominalQuota": 4})
        );
        assert_eq!(
            docs[2]["metadata"],
            json!({"name": "team", "namespace": "ml"})
        );
        assert_eq!(docs[2]["spec"]["clusterQueue"], "rdu");

        let plain = documents(
            &TileQueue {
                flavor_spec: None,
                preempt_lower_priority: false,
                ..queue
            }
            .yaml(),
        );
        assert!(plain[0].get("spec").is_none());
        assert!(plain[1]["spec"].get("preemption").is_none());
    }

    #[test]
    fn a_mount_is_found_by_its_mount_point_field_only() {
        let mountinfo = "36 35 98:0 /kueue/etc /etc/kueue rw,noatime master:1 - ext3 /dev/root rw\n\
                         37 35 98:0 / /etc/kueue-other rw - ext3 /dev/root rw\n";
        assert!(mounts_at(mountinfo, "/etc/kueue"));
        assert!(
            !mounts_at(mountinfo, "/kueue/etc"),
            "a root field is no mount point"
        );
        assert!(!mounts_at(
            "37 35 98:0 / /etc/kueue-other rw - ext3 /dev/root rw\n",
            "/etc/kueue"
        ));
    }

    #[test]
    fn a_mount_in_another_namespace_is_seen_unless_it_is_the_own_processs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let point = dir.path().join("point");
        std::fs::create_dir(&point).expect("mkdir");
        let point = point.to_str().expect("utf-8 path").to_string();
        assert!(!mounted_by_another(0, &point), "nothing mounted yet");
        // A process in a mount namespace of its own with a tmpfs at the point, as a Kueue has its bind mount.
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs none \"$0\" && exec sleep 60")
            .arg(&point)
            .spawn()
            .expect("unshare");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen = false;
        while !seen
            && std::time::Instant::now() < deadline
            && child.try_wait().ok().flatten().is_none()
        {
            seen = mounted_by_another(0, &point);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let own = mounted_by_another(child.id(), &point);
        let ended = child.try_wait().ok().flatten();
        let _ = child.kill();
        let _ = child.wait();
        if let Some(status) = ended {
            // Without CAP_SYS_ADMIN there is no namespace to look into: say so rather than pass or fail.
            eprintln!("skipped: unshare and mount ended with {status} (needs root)");
            return;
        }
        assert!(seen, "the other namespace's mount at {point} was not seen");
        assert!(!own, "the own Kueue's mount counts as another's");
    }
}
