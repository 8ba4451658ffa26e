//! Local mode's launch plan for one gang generation: every rank's env from the operator's own
//! `rank_env` (valueFrom resolved locally), plus its tiles from a simulated node.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::EnvVarSource;
use rdu_crds::RduJob;
use rdu_crds::consts::env;
use rdu_operator::builders::{RankPlacement, rank_env};

use crate::error::CliError;

/// What local mode substitutes for the cluster: the token Secret, the downward API, the ports.
#[derive(Debug, Clone)]
pub struct LocalContext {
    pub token: String,
    pub node_name: String,
    pub master_port: u16,
    /// One collective port per rank.
    pub collective_ports: Vec<u16>,
    /// One tile allocation env (SF_RNT_TILE_AFFINITY, RDU_VISIBLE_TILES) per rank.
    pub tiles: Vec<BTreeMap<String, String>>,
    pub result_path: PathBuf,
    pub checkpoint_dir: Option<PathBuf>,
}

/// One rank's process environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankLaunch {
    pub rank: u32,
    pub env: Vec<(String, String)>,
}

const LOCALHOST: &str = "127.0.0.1";

/// Every rank's env for `generation`.
pub fn plan(
    job: &RduJob,
    generation: u32,
    ctx: &LocalContext,
) -> Result<Vec<RankLaunch>, CliError> {
    (0..job.spec.workers)
        .map(|rank| {
            let i = rank as usize;
            let placement = RankPlacement {
                master_addr: LOCALHOST,
                master_port: ctx.master_port,
                collective_port: *ctx
                    .collective_ports
                    .get(i)
                    .ok_or_else(|| CliError::Env(format!("no collective port for rank {rank}")))?,
            };
            let mut vars = Vec::new();
            for var in rank_env(job, rank, generation, &placement) {
                let value = match (var.value, var.value_from) {
                    (Some(v), _) => v,
                    (None, Some(from)) => resolve(&var.name, &from, ctx)?,
                    (None, None) => String::new(),
                };
                vars.push((var.name, value));
            }
            if let Some(tiles) = ctx.tiles.get(i) {
                vars.extend(tiles.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            vars.push((
                env::RESULT_PATH.into(),
                ctx.result_path.display().to_string(),
            ));
            if let Some(dir) = &ctx.checkpoint_dir {
                vars.push((env::CHECKPOINT_DIR.into(), dir.display().to_string()));
            }
            Ok(RankLaunch { rank, env: vars })
        })
        .collect()
}

/// What the kubelet would put in a `valueFrom` var, locally.
fn resolve(name: &str, from: &EnvVarSource, ctx: &LocalContext) -> Result<String, CliError> {
    if from.secret_key_ref.is_some() {
        return Ok(ctx.token.clone());
    }
    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
        Some("spec.nodeName") => Ok(ctx.node_name.clone()),
        Some("status.podIP") => Ok(LOCALHOST.into()),
        other => Err(CliError::Env(format!(
            "{name}: local mode cannot resolve valueFrom {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(workers: u32) -> RduJob {
        let yaml = format!(
            "apiVersion: rdu.dev/v1alpha1\nkind: RduJob\nmetadata: {{name: t}}\nspec:\n  workers: {workers}\n  model: {{name: ffn-logreg}}\n  data: {{source: synthetic}}\n  training: {{epochs: 1, batchSize: 8, learningRate: 0.1}}\n"
        );
        rdu_crds::parse_manifest(&yaml).unwrap()
    }

    fn ctx() -> LocalContext {
        let tiles = |t: &str| BTreeMap::from([(env::VISIBLE_TILES.to_string(), t.to_string())]);
        LocalContext {
            token: "tok".into(),
            node_name: "host1".into(),
            master_port: 4000,
            collective_ports: vec![4001, 4002],
            tiles: vec![tiles("rdu0-tile0"), tiles("rdu0-tile1")],
            result_path: "/tmp/r.json".into(),
            checkpoint_dir: None,
        }
    }

    fn get<'a>(l: &'a RankLaunch, key: &str) -> Option<&'a str> {
        l.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn every_rank_gets_the_contract_resolved_locally() {
        let launches = plan(&job(2), 3, &ctx()).unwrap();
        assert_eq!(launches.len(), 2);
        let r1 = &launches[1];
        assert_eq!(get(r1, env::RANK), Some("1"));
        assert_eq!(get(r1, env::WORLD_SIZE), Some("2"));
        assert_eq!(get(r1, env::MASTER_ADDR), Some("127.0.0.1"));
        assert_eq!(get(r1, env::MASTER_PORT), Some("4000"));
        assert_eq!(get(r1, env::COLLECTIVE_PORT), Some("4002"));
        assert_eq!(get(r1, env::GENERATION), Some("3"));
        assert_eq!(get(r1, env::JOB_TOKEN), Some("tok"));
        assert_eq!(get(r1, env::NODE_NAME), Some("host1"));
        assert_eq!(get(r1, env::POD_IP), Some("127.0.0.1"));
        assert_eq!(get(r1, env::VISIBLE_TILES), Some("rdu0-tile1"));
        assert_eq!(get(r1, env::RESULT_PATH), Some("/tmp/r.json"));
        assert!(get(r1, env::JOB_SPEC).is_some_and(|s| s.contains("\"workers\":2")));
    }

    #[test]
    fn missing_ports_are_an_error_not_a_panic() {
        assert!(plan(&job(3), 0, &ctx()).is_err());
    }
}
