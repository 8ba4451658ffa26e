//! What one rank reads from its environment: the contract of `rdu_crds::RankEnv` (DESIGN 4.2) as it is, the tiles
//! the device plugin handed out (DESIGN 4.3), and the optional `RDU_DATA_PATH`.

use std::path::Path;

use rdu_collective::DataPath;
use rdu_crds::RankEnv;
use rdu_crds::consts::{TERMINATION_LOG_PATH, env};
use rdu_crds::rank_env::SuppliedValues;

use crate::error::WorkerError;
use crate::fault::Faults;

/// Everything a rank reads from its environment, checked.
#[derive(Debug, Clone)]
pub struct WorkerEnv {
    /// The contract the operator or local mode set (rank, world, rendezvous, job, generation, spec, paths).
    pub contract: RankEnv,
    /// What the cluster supplies by reference: the job token, the node's name, the pod's IP.
    pub supplied: SuppliedValues,
    /// This rank's tiles: its compute threads.
    pub tiles: usize,
    /// The tiles the device plugin (or local mode) gave this rank, as it gave them:
    /// `SF_RNT_TILE_AFFINITY` and `RDU_VISIBLE_TILES` (empty when unset).
    pub tile_affinity: String,
    pub visible_tiles: String,
    /// How chunks travel to peers (`RDU_DATA_PATH`, default `auto`).
    pub data_path: DataPath,
    /// Test fault injection (`RDU_TEST_HANG_AT_STEP`, `RDU_TEST_ALLOCATE_MIB`); none in production.
    pub faults: Faults,
}

impl WorkerEnv {
    /// Reads the contract (`rdu_crds::RankEnv`) and the device plugin's tile env through `get` (the process env
    /// in production, a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<WorkerEnv, WorkerError> {
        let (contract, supplied) =
            RankEnv::read(&get).map_err(|e| WorkerError::config(e.var, e.reason))?;
        let tiles = tile_count(
            get(env::TILE_AFFINITY).as_deref(),
            get(env::VISIBLE_TILES).as_deref(),
            contract.spec.tiles_per_worker,
        )?;
        let data_path = match get(env::DATA_PATH) {
            None => DataPath::default(),
            Some(path) => path.parse().map_err(|_| {
                WorkerError::config(
                    env::DATA_PATH,
                    format!("{path:?} is not auto, tcp or grpc; unset it for auto"),
                )
            })?,
        };
        let faults = Faults::from_vars(&get)?;
        Ok(WorkerEnv {
            faults,
            contract,
            supplied,
            tiles,
            tile_affinity: get(env::TILE_AFFINITY).unwrap_or_default(),
            visible_tiles: get(env::VISIBLE_TILES).unwrap_or_default(),
            data_path,
        })
    }

    /// Where rank 0 writes its result: `RDU_RESULT_PATH`, else the termination log.
    pub fn result_path(&self) -> &Path {
        Path::new(
            self.contract
                .result_path
                .as_deref()
                .unwrap_or(TERMINATION_LOG_PATH),
        )
    }

    /// The checkpoint directory, when the job checkpoints and this rank has one.
    pub fn checkpoint_dir(&self) -> Option<&Path> {
        self.contract.checkpoint_dir.as_deref().map(Path::new)
    }

    /// Rank 0's TensorBoard directory, when the job asks for one.
    pub fn tensorboard_dir(&self) -> Option<&Path> {
        self.contract.tensorboard_dir.as_deref().map(Path::new)
    }
}

/// Tiles from the affinity mask (bits set), else the visible tile IDs, else `tilesPerWorker`.
fn tile_count(
    affinity: Option<&str>,
    visible: Option<&str>,
    tiles_per_worker: u32,
) -> Result<usize, WorkerError> {
    if let Some(mask) = affinity.map(str::trim).filter(|m| !m.is_empty()) {
        let hex = mask.trim_start_matches("0x").trim_start_matches("0X");
        let mut bits = 0usize;
        for c in hex.chars() {
            let digit = c.to_digit(16).ok_or_else(|| {
                WorkerError::config(
                    env::TILE_AFFINITY,
                    format!("{mask:?} is not a 0x-prefixed hex tile mask"),
                )
            })?;
            bits += digit.count_ones() as usize;
        }
        if bits == 0 {
            return Err(WorkerError::config(
                env::TILE_AFFINITY,
                "the mask selects no tile",
            ));
        }
        return Ok(bits);
    }
    if let Some(list) = visible.map(str::trim).filter(|l| !l.is_empty()) {
        return Ok(list
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .count()
            .max(1));
    }
    Ok(tiles_per_worker.max(1) as usize)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_dra_drivers_domain_is_where_the_collective_looks_for_ring_sockets() {
        use rdu_collective::{MAX_RING_DIR_BYTES, RING_DIR_ENV};
        use rdu_crds::shm_domain;
        assert_eq!(shm_domain::ENV, RING_DIR_ENV);
        assert!(shm_domain::MOUNT_PATH.len() <= MAX_RING_DIR_BYTES);
    }

    pub(crate) fn vars(spec_yaml: &str) -> HashMap<String, String> {
        let spec = rdu_crds::parse_manifest(spec_yaml).unwrap().spec;
        [
            (env::RANK, "1".to_string()),
            (env::WORLD_SIZE, "2".into()),
            (env::MASTER_ADDR, "127.0.0.1".into()),
            (env::MASTER_PORT, "29500".into()),
            (env::JOB_NAME, "t".into()),
            (env::JOB_UID, "uid-1".into()),
            (env::JOB_TOKEN, "secret".into()),
            (env::GENERATION, "2".into()),
            (env::JOB_SPEC, serde_json::to_string(&spec).unwrap()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn read(map: &HashMap<String, String>) -> Result<WorkerEnv, WorkerError> {
        WorkerEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn the_contract_reads_with_defaults() {
        let map = vars(crate::test_fixtures::MINIMAL);
        let e = read(&map).unwrap();
        let c = &e.contract;
        assert_eq!((c.rank, c.world_size, c.generation), (1, 2, 2));
        assert_eq!(c.job_namespace, "default");
        assert_eq!(e.supplied.pod_ip, "127.0.0.1");
        assert_eq!(e.result_path(), Path::new("/dev/termination-log"));
        assert_eq!((e.checkpoint_dir(), e.tensorboard_dir()), (None, None));
        assert_eq!(c.collective_port, 29501);
        assert_eq!(e.tiles, 1);
        assert_eq!(
            (e.tile_affinity.as_str(), e.visible_tiles.as_str()),
            ("", "")
        );
        assert_eq!(e.data_path, DataPath::Auto);
        let mut tcp = map.clone();
        tcp.insert(env::DATA_PATH.into(), "tcp".into());
        assert_eq!(read(&tcp).unwrap().data_path, DataPath::Tcp);
    }

    #[test]
    fn the_tiles_the_device_plugin_gave_are_kept_as_given() {
        let mut map = vars(crate::test_fixtures::MINIMAL);
        map.insert(env::TILE_AFFINITY.into(), "0x00000006".into());
        map.insert(env::VISIBLE_TILES.into(), "rdu0-tile1,rdu0-tile2".into());
        let e = read(&map).unwrap();
        assert_eq!(e.tile_affinity, "0x00000006");
        assert_eq!(e.visible_tiles, "rdu0-tile1,rdu0-tile2");
        assert_eq!(e.tiles, 2);
    }

    #[test]
    fn missing_or_bad_values_name_the_variable() {
        let base = vars(crate::test_fixtures::MINIMAL);
        for (key, value, expected) in [
            (env::RANK, "", "RANK"),
            (env::RANK, "2", "RANK"),
            (env::MASTER_PORT, "http", "MASTER_PORT"),
            (env::JOB_SPEC, "{", "RDU_JOB_SPEC"),
            (env::JOB_TOKEN, "", "RDU_JOB_TOKEN"),
            (env::TILE_AFFINITY, "0xzz", "SF_RNT_TILE_AFFINITY"),
            (env::DATA_PATH, "udp", "RDU_DATA_PATH"),
        ] {
            let mut map = base.clone();
            map.insert(key.to_string(), value.to_string());
            match read(&map) {
                Err(WorkerError::Config { field, .. }) => {
                    assert_eq!(field, expected, "{key}={value}")
                }
                other => panic!("{key}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_spec_breaking_the_crd_rules_is_refused_naming_its_field() {
        let bad = crate::test_fixtures::MINIMAL.replace("batchSize: 8", "batchSize: 0");
        match read(&vars(&bad)) {
            Err(WorkerError::Config { field, reason }) => {
                assert_eq!(field, env::JOB_SPEC);
                assert!(
                    reason.contains("spec.training.batchSize must be at least 1"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tiles_come_from_the_mask_then_the_list_then_the_spec() {
        assert_eq!(tile_count(Some("0x0000000f"), Some("a,b"), 1).unwrap(), 4);
        assert_eq!(
            tile_count(None, Some("rdu0-tile0,rdu0-tile1"), 1).unwrap(),
            2
        );
        assert_eq!(tile_count(None, None, 8).unwrap(), 8);
        assert!(tile_count(Some("0x0"), None, 1).is_err());
    }
}
