//! The control plane's own faults on the kind cluster's control-plane node, as they happen to real clusters: the
//! API server's static pod taken away and put back (an outage), etcd or the scheduler stopped (the kubelet starts
//! its container again, etcd on the same data), the chart upgraded in place.

use std::time::{Duration, Instant};

use super::{RELEASE, SYSTEM_NAMESPACE, Testbed};
use crate::cluster::kubectl;
use crate::tools::{helm_binary, run_ok, workspace_root};

/// Where kubeadm keeps the API server's static pod, and where it is put while the API server is down.
const API_SERVER_MANIFEST: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";
const API_SERVER_PARKED: &str = "/etc/kubernetes/kube-apiserver.yaml.down";

/// A control-plane component's static pod, as its mirror pod shows it.
#[derive(Debug, Clone, Copy)]
pub struct StaticPod {
    /// How often the kubelet started its container again.
    pub restarts: u64,
    /// Whether its container runs and passes its readiness probe.
    pub ready: bool,
}

impl Testbed {
    /// The control-plane node's name.
    pub fn control_plane_node(&self) -> String {
        format!("{}-control-plane", self.kind.name)
    }

    fn control_plane_exec(&self, args: &[&str]) -> String {
        let node = self.control_plane_node();
        self.kind
            .exec(&node, args)
            .unwrap_or_else(|e| panic!("{args:?} on {node}: {}", rdu_error_chain::Chain(&e)))
    }

    /// Takes the API server away (its static pod's manifest out of the kubelet's directory) or puts it back.
    pub fn set_api_server(&self, up: bool) {
        let (from, to) = if up {
            (API_SERVER_PARKED, API_SERVER_MANIFEST)
        } else {
            (API_SERVER_MANIFEST, API_SERVER_PARKED)
        };
        self.control_plane_exec(&["mv", from, to]);
    }

    /// How control-plane component `component`'s static pod stands (`etcd`, `kube-scheduler`: kubeadm names the
    /// pod, its container and the process alike), as its mirror pod says.
    pub async fn static_pod(&self, component: &str) -> Result<StaticPod, String> {
        let pod = format!("{component}-{}", self.control_plane_node());
        let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
            self.client.clone(),
            "kube-system",
        );
        let found = self.get(pods, &pod).await?;
        let container = &found["status"]["containerStatuses"][0];
        let restarts = container["restartCount"]
            .as_u64()
            .ok_or_else(|| format!("{pod} has no restart count: {}", found["status"]))?;
        Ok(StaticPod {
            restarts,
            ready: container["ready"] == true && container["state"]["running"].is_object(),
        })
    }

    /// Restarts control-plane component `component` as a crash does: waits until its process runs (the kubelet
    /// holds a container that ended often in crash back-off, up to 5 minutes, and the scheduler also ends itself
    /// when the API server was away longer than its lease), stops it with SIGTERM, and waits until the kubelet
    /// started it again, it is ready and the API server answers. Returns the restart count it was stopped at.
    pub async fn restart_static_pod(&self, component: &str, timeout: Duration) -> u64 {
        let node = self.control_plane_node();
        let stopped_at = self
            .wait(
                &format!("{component} running, then stopped"),
                timeout,
                async || {
                    let before = self.static_pod(component).await?;
                    if !before.ready {
                        return Err(format!("{component} is not running: {before:?}"));
                    }
                    self.kind
                        .exec(&node, &["pkill", "-TERM", "-x", component])
                        .map_err(|e| {
                            format!("pkill {component}: {}", rdu_error_chain::Chain(&e))
                        })?;
                    Ok(before.restarts)
                },
            )
            .await;
        self.wait(&format!("{component} started again"), timeout, async || {
            let now = self.static_pod(component).await?;
            if now.restarts > stopped_at && now.ready && self.api_ready() {
                Ok(())
            } else {
                Err(format!("{component} after restart {stopped_at}: {now:?}"))
            }
        })
        .await;
        stopped_at
    }

    /// Whether the API server answers `/readyz` now.
    pub fn api_ready(&self) -> bool {
        kubectl(
            &self.plane,
            &["get", "--raw", "/readyz", "--request-timeout=3s"],
            None,
        )
        .is_ok_and(|out| out.trim() == "ok")
    }

    /// Waits until the API server's `/readyz` is `up` (answers ok) or not; how long that took.
    pub async fn wait_api(&self, up: bool, timeout: Duration) -> f64 {
        let started = Instant::now();
        let what = if up {
            "the API server ready"
        } else {
            "the API server gone"
        };
        self.wait(what, timeout, async || {
            if self.api_ready() == up {
                Ok(())
            } else {
                Err(format!("ready: {}", !up))
            }
        })
        .await;
        started.elapsed().as_secs_f64()
    }

    /// `helm upgrade` of the release with its values and `--set` values on top, as an admin rolls out a change.
    pub fn helm_upgrade(&self, sets: &[String]) {
        let chart = workspace_root()
            .join("charts/rdu-operator")
            .display()
            .to_string();
        let kubeconfig = format!("--kubeconfig={}", self.plane.admin_kubeconfig.display());
        let mut args = vec![
            "upgrade",
            RELEASE,
            chart.as_str(),
            "--namespace",
            SYSTEM_NAMESPACE,
            "--reuse-values",
            kubeconfig.as_str(),
        ];
        for set in sets {
            args.extend(["--set", set.as_str()]);
        }
        run_ok(&helm_binary(), &args, None)
            .unwrap_or_else(|e| panic!("helm upgrade: {}", rdu_error_chain::Chain(&e)));
    }
}
