//! The cluster side: a client found as kubectl finds one (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`, the
//! in-cluster account; `--context`; the context's namespace unless `-n`), the job, the pods of its current
//! generation, and their logs.

use std::path::PathBuf;

use futures::AsyncBufReadExt;
use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rdu_crds::{RduJob, consts};

/// The container whose log is a rank's log.
pub use rdu_crds::consts::WORKER_CONTAINER;

/// What went wrong, said so that the next step is clear.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot read the kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("cannot reach the cluster")]
    Client(#[from] kube::Error),
    #[error("no RduJob {name} in namespace {namespace} (kubectl get rdujobs -n {namespace})")]
    NoJob { namespace: String, name: String },
    #[error("--rank {rank}: job {job} has ranks 0 to {last}")]
    NoSuchRank { job: String, rank: u32, last: u32 },
    #[error(
        "rank {rank} of {job} has no pod in generation {generation} yet (phase {phase}): try again when it runs"
    )]
    NoPod {
        job: String,
        rank: u32,
        generation: u32,
        phase: String,
    },
    #[error("pod {pod} (rank {rank}) is not on a node yet, so it has no log: {why}")]
    NotScheduled { pod: String, rank: u32, why: String },
}

/// A client and the namespace commands act in.
pub struct Target {
    pub client: Client,
    pub namespace: String,
}

/// Connects as kubectl would with these flags.
pub async fn connect(
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    namespace: Option<String>,
) -> Result<Target, ClusterError> {
    let config = if kubeconfig.is_some() || context.is_some() {
        let file = match &kubeconfig {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        }
        .map_err(|e| ClusterError::Kubeconfig(e.to_string()))?;
        let options = KubeConfigOptions {
            context,
            ..Default::default()
        };
        Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|e| ClusterError::Kubeconfig(e.to_string()))?
    } else {
        Config::infer()
            .await
            .map_err(|e| ClusterError::Kubeconfig(e.to_string()))?
    };
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config)?;
    Ok(Target { client, namespace })
}

impl Target {
    /// The job named `name`.
    pub async fn job(&self, name: &str) -> Result<RduJob, ClusterError> {
        let jobs: Api<RduJob> = Api::namespaced(self.client.clone(), &self.namespace);
        jobs.get_opt(name)
            .await?
            .ok_or_else(|| ClusterError::NoJob {
                namespace: self.namespace.clone(),
                name: name.to_string(),
            })
    }

    /// Every pod of the job, all generations.
    pub async fn pods(&self, job: &str) -> Result<Vec<Pod>, ClusterError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let selector = format!("{}={job}", consts::LABEL_JOB_NAME);
        Ok(pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// A rank's whole log.
    pub async fn log(&self, pod: &str, previous: bool) -> Result<String, ClusterError> {
        Ok(self
            .pods_api()
            .logs(pod, &log_params(false, previous))
            .await?)
    }

    /// A rank's log as it is written, until the container ends.
    pub async fn follow(
        &self,
        pod: &str,
    ) -> Result<BoxStream<'static, std::io::Result<String>>, ClusterError> {
        let reader = self
            .pods_api()
            .log_stream(pod, &log_params(true, false))
            .await?;
        Ok(reader.lines().boxed())
    }
}

fn log_params(follow: bool, previous: bool) -> LogParams {
    LogParams {
        container: Some(WORKER_CONTAINER.to_string()),
        follow,
        previous,
        ..Default::default()
    }
}

/// The pods whose logs `--rank` asks for (every rank when none), of the job's current generation, each scheduled:
/// (rank, pod name). Errors name the rank and what to do.
pub fn rank_pods(
    job: &RduJob,
    pods: &[Pod],
    only: Option<u32>,
) -> Result<Vec<(u32, String)>, ClusterError> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let workers = job.spec.workers;
    let status = job.status.clone().unwrap_or_default();
    let generation = status.restarts;
    if let Some(rank) = only.filter(|r| *r >= workers) {
        return Err(ClusterError::NoSuchRank {
            job: name,
            rank,
            last: workers.saturating_sub(1),
        });
    }
    let ranks: Vec<u32> = match only {
        Some(rank) => vec![rank],
        None => (0..workers).collect(),
    };
    let mut out = Vec::new();
    for rank in ranks {
        let pod = pods.iter().find(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            labels.get(consts::LABEL_RANK) == Some(&rank.to_string())
                && labels.get(consts::LABEL_GENERATION) == Some(&generation.to_string())
        });
        let Some(pod) = pod else {
            return Err(ClusterError::NoPod {
                job: name,
                rank,
                generation,
                phase: status.phase.map_or("Pending".into(), |p| format!("{p:?}")),
            });
        };
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        {
            let why = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                .and_then(|c| c.message.clone())
                .unwrap_or_else(|| "the scheduler has not placed it".into());
            return Err(ClusterError::NotScheduled {
                pod: pod_name,
                rank,
                why,
            });
        }
        out.push((rank, pod_name));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(restarts: u32) -> RduJob {
        let mut job: RduJob = serde_yaml_ng::from_str(
            "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {name: digits}\nspec:\n  workers: 2\n  \
             model: {name: ffn-logreg, hiddenSizes: [8]}\n  data: {source: synthetic, samples: 64}\n  \
             training: {epochs: 1, batchSize: 8, learningRate: 0.1}\n",
        )
        .expect("job");
        job.status = Some(rdu_crds::RduJobStatus {
            restarts,
            ..Default::default()
        });
        job
    }

    fn pod(rank: u32, generation: u32, node: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("digits-worker-{rank}"),
                         "labels": {"rdu.dev/rank": rank.to_string(), "rdu.dev/generation": generation.to_string()}},
            "spec": {"containers": [{"name": "worker"}], "nodeName": node},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                       "message": "0/1 nodes are available: 1 Insufficient rdu.dev/tile."}]}
        }))
        .expect("pod")
    }

    #[test]
    fn the_current_generations_scheduled_pods_by_rank() {
        let pods = [
            pod(0, 1, Some("n")),
            pod(1, 1, Some("n")),
            pod(1, 0, Some("n")),
        ];
        let got = rank_pods(&job(1), &pods, None).expect("pods");
        assert_eq!(
            got,
            [(0, "digits-worker-0".into()), (1, "digits-worker-1".into())]
        );
        assert_eq!(rank_pods(&job(1), &pods, Some(1)).expect("one").len(), 1);
    }

    #[test]
    fn a_rank_out_of_range_a_missing_pod_and_an_unscheduled_pod_are_explained() {
        let e = rank_pods(&job(0), &[], Some(2)).expect_err("rank 2");
        assert_eq!(e.to_string(), "--rank 2: job digits has ranks 0 to 1");
        let e = rank_pods(&job(1), &[pod(0, 0, Some("n"))], Some(0)).expect_err("old generation");
        assert!(
            e.to_string()
                .contains("rank 0 of digits has no pod in generation 1"),
            "{e}"
        );
        let e = rank_pods(&job(0), &[pod(0, 0, None)], Some(0)).expect_err("pending");
        assert!(e.to_string().contains("Insufficient rdu.dev/tile"), "{e}");
    }
}
