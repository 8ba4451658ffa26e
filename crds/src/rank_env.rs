//! The env contract of one rank (DESIGN 4.2) as one typed value: the operator turns it into the pod's `EnvVar`s,
//! local mode into plain pairs, and the worker reads it back with [`RankEnv::read`].

use crate::consts::{self, env};
use crate::{RduJob, RduJobSpec, job_name, job_namespace};

/// Everything the operator or local mode tells one rank, as values.
#[derive(Clone, Debug, PartialEq)]
pub struct RankEnv {
    pub rank: u32,
    pub world_size: u32,
    /// Host of rank 0's rendezvous (`<job>-worker-0.<job>.<ns>.svc` in a cluster, `127.0.0.1` locally).
    pub master_addr: String,
    pub master_port: u16,
    /// Port of this rank's collective server; 0 lets the rank bind a free port, which the rendezvous advertises.
    pub collective_port: u16,
    pub job_name: String,
    pub job_namespace: String,
    pub job_uid: String,
    /// The gang generation (restart count) this rank belongs to.
    pub generation: u32,
    pub spec: RduJobSpec,
    /// Where rank 0 writes its result JSON; the termination log when unset.
    pub result_path: Option<String>,
    /// Directory for checkpoints, when the job checkpoints.
    pub checkpoint_dir: Option<String>,
    /// Rank 0 in a cluster whose operator takes progress reports: where to send them, and the token file.
    pub progress: Option<ProgressEndpoint>,
    /// Rank 0 of a job with `spec.tensorboard`: the directory for its event files.
    pub tensorboard_dir: Option<String>,
    /// Local mode's rank 0: progress as JSON lines on stdout for `rdujob`'s progress line.
    pub progress_lines: bool,
}

/// Where rank 0 reports progress (DESIGN 4.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressEndpoint {
    /// The operator's base URL (`http://rdu-operator-metrics.rdu-system.svc:8080`).
    pub url: String,
    /// The projected ServiceAccount token to show it, re-read before each report.
    pub token_file: String,
}

/// A value the cluster supplies by reference rather than as a literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Supplied {
    /// The job token, from the job's Secret.
    Token,
    /// The node's name, from the downward API (`spec.nodeName`).
    NodeName,
    /// The pod's IP, from the downward API (`status.podIP`).
    PodIp,
}

/// Every supplied variable and what supplies it.
pub const SUPPLIED: [(&str, Supplied); 3] = [
    (env::JOB_TOKEN, Supplied::Token),
    (env::NODE_NAME, Supplied::NodeName),
    (env::POD_IP, Supplied::PodIp),
];

/// The supplied values themselves: what local mode sets and what the worker reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuppliedValues {
    pub token: String,
    pub node_name: String,
    pub pod_ip: String,
}

impl SuppliedValues {
    fn get(&self, which: Supplied) -> &str {
        match which {
            Supplied::Token => &self.token,
            Supplied::NodeName => &self.node_name,
            Supplied::PodIp => &self.pod_ip,
        }
    }
}

/// A variable of the contract that is missing or unusable; `var` names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct EnvError {
    pub var: &'static str,
    pub reason: String,
}

impl EnvError {
    fn new(var: &'static str, reason: impl Into<String>) -> EnvError {
        EnvError {
            var,
            reason: reason.into(),
        }
    }
}

impl RankEnv {
    /// A rank in a cluster: rank 0 by its stable DNS name, the fixed ports, the termination log for the result.
    pub fn in_cluster(job: &RduJob, rank: u32, generation: u32) -> RankEnv {
        let master_addr = consts::master_addr(job_name(job), job_namespace(job));
        RankEnv::new(
            job,
            rank,
            generation,
            master_addr,
            consts::MASTER_PORT,
            consts::COLLECTIVE_PORT,
        )
    }

    /// A rank of `job` with the rendezvous at `master_addr:master_port` and its collective server on
    /// `collective_port`.
    pub fn new(
        job: &RduJob,
        rank: u32,
        generation: u32,
        master_addr: String,
        master_port: u16,
        collective_port: u16,
    ) -> RankEnv {
        RankEnv {
            rank,
            world_size: job.spec.workers,
            master_addr,
            master_port,
            collective_port,
            job_name: job_name(job).to_string(),
            job_namespace: job_namespace(job).to_string(),
            job_uid: job.metadata.uid.clone().unwrap_or_default(),
            generation,
            spec: job.spec.clone(),
            result_path: None,
            checkpoint_dir: None,
            progress: None,
            tensorboard_dir: None,
            progress_lines: false,
        }
    }

    /// The literal variables, in a stable order (the supplied ones are in [`SUPPLIED`]).
    pub fn literal_vars(&self) -> Vec<(&'static str, String)> {
        // The spec holds only string-keyed maps and plain values, which serde_json always serializes.
        let spec_json = serde_json::to_string(&self.spec).unwrap_or_default();
        let mut vars = vec![
            (env::RANK, self.rank.to_string()),
            (env::WORLD_SIZE, self.world_size.to_string()),
            (env::LOCAL_RANK, "0".to_string()),
            (env::MASTER_ADDR, self.master_addr.clone()),
            (env::MASTER_PORT, self.master_port.to_string()),
            (env::COLLECTIVE_PORT, self.collective_port.to_string()),
            (env::JOB_NAME, self.job_name.clone()),
            (env::JOB_NAMESPACE, self.job_namespace.clone()),
            (env::JOB_UID, self.job_uid.clone()),
            (env::GENERATION, self.generation.to_string()),
            (env::JOB_SPEC, spec_json),
        ];
        if let Some(path) = &self.result_path {
            vars.push((env::RESULT_PATH, path.clone()));
        }
        if let Some(dir) = &self.checkpoint_dir {
            vars.push((env::CHECKPOINT_DIR, dir.clone()));
        }
        if let Some(dir) = &self.tensorboard_dir {
            vars.push((env::TENSORBOARD_DIR, dir.clone()));
        }
        if let Some(progress) = &self.progress {
            vars.push((env::PROGRESS_URL, progress.url.clone()));
            vars.push((env::PROGRESS_TOKEN_FILE, progress.token_file.clone()));
        }
        if self.progress_lines {
            vars.push((env::PROGRESS_LINES, "1".to_string()));
        }
        vars
    }

    /// Every variable with the supplied values filled in, as a process gets them (local mode).
    pub fn vars_with(&self, supplied: &SuppliedValues) -> Vec<(&'static str, String)> {
        let mut vars = self.literal_vars();
        vars.extend(
            SUPPLIED
                .iter()
                .map(|(name, which)| (*name, supplied.get(*which).to_string())),
        );
        vars
    }

    /// Reads the contract through `get` (the process env, or a map in tests): the values, and the supplied ones.
    /// A missing or bad variable is an error naming it; the spec must pass every rule of the CRD.
    pub fn read(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(RankEnv, SuppliedValues), EnvError> {
        let value = |name: &'static str| get(name).filter(|v| !v.is_empty());
        let required = |name: &'static str| {
            value(name).ok_or_else(|| {
                EnvError::new(name, "is not set; the operator or `rdujob run` sets it")
            })
        };
        let spec_json = required(env::JOB_SPEC)?;
        let spec: RduJobSpec = serde_json::from_str(&spec_json)
            .map_err(|e| EnvError::new(env::JOB_SPEC, format!("not a valid RduJob spec: {e}")))?;
        if let Err(errors) = crate::validate_spec(&spec) {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(EnvError::new(env::JOB_SPEC, text.join("; ")));
        }
        let rank: u32 = number(env::RANK, &required(env::RANK)?)?;
        let world_size: u32 = number(env::WORLD_SIZE, &required(env::WORLD_SIZE)?)?;
        if world_size == 0 || rank >= world_size {
            return Err(EnvError::new(
                env::RANK,
                format!("rank {rank} is outside the world of {world_size} ranks"),
            ));
        }
        let rank_env = RankEnv {
            rank,
            world_size,
            master_addr: required(env::MASTER_ADDR)?,
            master_port: number(env::MASTER_PORT, &required(env::MASTER_PORT)?)?,
            collective_port: value(env::COLLECTIVE_PORT)
                .map(|p| number(env::COLLECTIVE_PORT, &p))
                .transpose()?
                .unwrap_or(consts::COLLECTIVE_PORT),
            job_name: required(env::JOB_NAME)?,
            job_namespace: value(env::JOB_NAMESPACE).unwrap_or_else(|| "default".into()),
            job_uid: required(env::JOB_UID)?,
            generation: value(env::GENERATION)
                .map(|g| number(env::GENERATION, &g))
                .transpose()?
                .unwrap_or(0),
            spec,
            result_path: value(env::RESULT_PATH),
            checkpoint_dir: value(env::CHECKPOINT_DIR),
            tensorboard_dir: value(env::TENSORBOARD_DIR),
            progress_lines: match value(env::PROGRESS_LINES).as_deref() {
                None | Some("0") => false,
                Some("1") => true,
                Some(other) => {
                    return Err(EnvError::new(
                        env::PROGRESS_LINES,
                        format!("{other:?} is neither 1 nor 0; unset it unless rdujob sets it"),
                    ));
                }
            },
            progress: match (value(env::PROGRESS_URL), value(env::PROGRESS_TOKEN_FILE)) {
                (Some(url), Some(token_file)) => Some(ProgressEndpoint { url, token_file }),
                (None, None) => None,
                (Some(_), None) => {
                    return Err(EnvError::new(
                        env::PROGRESS_TOKEN_FILE,
                        format!(
                            "is not set, but {} is; set both or neither",
                            env::PROGRESS_URL
                        ),
                    ));
                }
                (None, Some(_)) => {
                    return Err(EnvError::new(
                        env::PROGRESS_URL,
                        format!(
                            "is not set, but {} is; set both or neither",
                            env::PROGRESS_TOKEN_FILE
                        ),
                    ));
                }
            },
        };
        let supplied = SuppliedValues {
            token: required(env::JOB_TOKEN)?,
            node_name: value(env::NODE_NAME).unwrap_or_else(|| "localhost".into()),
            pod_ip: value(env::POD_IP).unwrap_or_else(|| "127.0.0.1".into()),
        };
        Ok((rank_env, supplied))
    }
}

fn number<T: std::str::FromStr>(name: &'static str, value: &str) -> Result<T, EnvError> {
    value
        .trim()
        .parse()
        .map_err(|_| EnvError::new(name, format!("{value:?} is not a valid number")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn job(workers: u32, namespace: Option<&str>) -> RduJob {
        let ns = namespace.map_or(String::new(), |n| format!(", namespace: {n}"));
        let yaml = format!(
            "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {{name: mnist{ns}, uid: uid-mnist}}\nspec:\n  workers: {workers}\n  model: {{name: ffn-logreg}}\n  data: {{source: synthetic}}\n  training: {{epochs: 1, batchSize: 8, learningRate: 0.1}}\n"
        );
        crate::parse_manifest(&yaml).expect("job")
    }

    fn supplied() -> SuppliedValues {
        SuppliedValues {
            token: "tok".into(),
            node_name: "host1".into(),
            pod_ip: "10.0.0.7".into(),
        }
    }

    #[test]
    fn a_cluster_rank_gets_the_stable_names_and_fixed_ports() {
        let env = RankEnv::in_cluster(&job(4, Some("ml")), 3, 2);
        let vars: HashMap<_, _> = env.literal_vars().into_iter().collect();
        assert_eq!(vars[env::RANK], "3");
        assert_eq!(vars[env::WORLD_SIZE], "4");
        assert_eq!(vars[env::LOCAL_RANK], "0");
        assert_eq!(vars[env::MASTER_ADDR], "mnist-worker-0.mnist.ml.svc");
        assert_eq!(vars[env::MASTER_PORT], "29500");
        assert_eq!(vars[env::COLLECTIVE_PORT], "29501");
        assert_eq!(vars[env::JOB_NAMESPACE], "ml");
        assert_eq!(vars[env::JOB_UID], "uid-mnist");
        assert_eq!(vars[env::GENERATION], "2");
        assert!(!vars.contains_key(env::RESULT_PATH));
        assert!(SUPPLIED.iter().all(|(name, _)| !vars.contains_key(name)));
        assert_eq!(
            RankEnv::in_cluster(&job(1, None), 0, 0).job_namespace,
            "default"
        );
    }

    #[test]
    fn what_is_written_reads_back_the_same() {
        let mut env = RankEnv::new(&job(2, None), 1, 3, "127.0.0.1".into(), 4000, 0);
        env.result_path = Some("/tmp/r.json".into());
        env.checkpoint_dir = Some("/tmp/ckpt".into());
        env.tensorboard_dir = Some("/tmp/tb".into());
        env.progress_lines = true;
        env.progress = Some(ProgressEndpoint {
            url: "http://op:8080".into(),
            token_file: "/run/token".into(),
        });
        let vars: HashMap<&str, String> = env.vars_with(&supplied()).into_iter().collect();
        let (back, values) = RankEnv::read(|k| vars.get(k).cloned()).expect("reads back");
        assert_eq!(back, env);
        assert_eq!(values, supplied());
    }

    #[test]
    fn a_progress_url_without_its_token_file_is_refused() {
        let env = RankEnv::new(&job(2, None), 0, 0, "h".into(), 1, 2);
        let mut vars: HashMap<&str, String> = env.vars_with(&supplied()).into_iter().collect();
        vars.insert(env::PROGRESS_URL, "http://op:8080".into());
        let error = RankEnv::read(|k| vars.get(k).cloned()).expect_err("half a pair");
        assert_eq!(error.var, env::PROGRESS_TOKEN_FILE);
    }

    #[test]
    fn unset_optional_variables_take_their_defaults() {
        let env = RankEnv::new(&job(2, None), 1, 0, "h".into(), 1, 2);
        let mut vars: HashMap<&str, String> = env.vars_with(&supplied()).into_iter().collect();
        for optional in [
            env::JOB_NAMESPACE,
            env::GENERATION,
            env::COLLECTIVE_PORT,
            env::NODE_NAME,
            env::POD_IP,
        ] {
            vars.remove(optional);
        }
        let (back, values) = RankEnv::read(|k| vars.get(k).cloned()).expect("reads");
        assert_eq!(
            (
                back.job_namespace.as_str(),
                back.generation,
                back.collective_port
            ),
            ("default", 0, consts::COLLECTIVE_PORT)
        );
        assert_eq!(
            (values.node_name.as_str(), values.pod_ip.as_str()),
            ("localhost", "127.0.0.1")
        );
    }

    #[test]
    fn missing_or_bad_values_name_the_variable() {
        let env = RankEnv::new(&job(2, None), 1, 0, "h".into(), 1, 2);
        let base: HashMap<&str, String> = env.vars_with(&supplied()).into_iter().collect();
        for (var, value) in [
            (env::RANK, ""),
            (env::RANK, "2"),
            (env::MASTER_PORT, "http"),
            (env::COLLECTIVE_PORT, "70000"),
            (env::JOB_SPEC, "{"),
            (env::JOB_TOKEN, ""),
            (env::GENERATION, "-1"),
            (env::PROGRESS_LINES, "yes"),
        ] {
            let mut vars = base.clone();
            vars.insert(var, value.to_string());
            let err = RankEnv::read(|k| vars.get(k).cloned()).expect_err(var);
            assert_eq!(err.var, var, "{var}={value}: {err}");
        }
    }
}
