//! Where the operator runs: moves it off a node a test is about to break, so the fault under test is a lost rank,
//! not a lost operator (which is the Deployment's and the Lease's business: `operator.replicas: 2`), and kills its
//! leader when that is the fault under test.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::{SYSTEM_NAMESPACE, Testbed};

const OPERATOR_SELECTOR: &str = "app.kubernetes.io/component=operator";
const LEASE: &str = "rdu-operator";

impl Testbed {
    /// The node the leading operator replica runs on, if it runs.
    pub async fn operator_node(&self) -> Result<Option<String>, String> {
        let leader = self.operator_leader().await?;
        let pods = self.pods(SYSTEM_NAMESPACE, OPERATOR_SELECTOR).await?;
        Ok(pods
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == leader.as_deref())
            .and_then(|p| p.spec.and_then(|s| s.node_name)))
    }

    /// The Lease's holder: the leading replica's pod name.
    pub async fn operator_leader(&self) -> Result<Option<String>, String> {
        let lease = Api::<Lease>::namespaced(self.client.clone(), SYSTEM_NAMESPACE)
            .get_opt(LEASE)
            .await
            .map_err(|e| format!("get lease {LEASE}: {}", rdu_error_chain::Chain(&e)))?;
        Ok(lease.and_then(|l| l.spec.and_then(|s| s.holder_identity)))
    }

    /// If an operator replica runs on `node`, cordons the node, deletes that replica and waits until a replica on
    /// another node leads, then uncordons. Running rank pods stay where they are.
    pub async fn keep_operator_off(&self, node: &str, timeout: Duration) {
        let pods = self
            .pods(SYSTEM_NAMESPACE, OPERATOR_SELECTOR)
            .await
            .unwrap_or_else(|e| panic!("operator pods: {e}"));
        let on_node: Vec<String> = pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        if on_node.is_empty() {
            return;
        }
        self.kubectl(&["cordon", node]);
        for pod in &on_node {
            self.kubectl(&["delete", "pod", pod, "-n", SYSTEM_NAMESPACE, "--wait=true"]);
        }
        self.wait(
            "an operator replica off the node to lead",
            timeout,
            async || {
                let leader = self.operator_leader().await?;
                let pods = Api::<Pod>::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
                let leading = match &leader {
                    Some(name) => pods.get_opt(name).await.map_err(|e| e.to_string())?,
                    None => None,
                };
                let elsewhere = leading.as_ref().is_some_and(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node)
                        && p.metadata.deletion_timestamp.is_none()
                });
                if elsewhere {
                    Ok(())
                } else {
                    Err(format!("lease held by {leader:?}"))
                }
            },
        )
        .await;
        self.kubectl(&["uncordon", node]);
    }

    /// Kills the leading replica (its pod force-deleted: no graceful release of the Lease) and waits until another
    /// replica leads; the seconds that took.
    pub async fn kill_operator_leader(&self, timeout: Duration) -> f64 {
        let leader = self
            .operator_leader()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .expect("a leader");
        let killed = Instant::now();
        self.kubectl(&[
            "delete",
            "pod",
            &leader,
            "-n",
            SYSTEM_NAMESPACE,
            "--grace-period=0",
            "--force",
        ]);
        self.wait("another replica leads", timeout, async || {
            match self.operator_leader().await? {
                Some(now) if now != leader => Ok(()),
                other => Err(format!("lease held by {other:?}")),
            }
        })
        .await;
        killed.elapsed().as_secs_f64()
    }
}
