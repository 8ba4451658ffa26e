//! The PEF (DESIGN 4.5): what `compile` fixes about a job — model, layer shapes, parameter count,
//! batch size, tiles, the smallest world size — in a small versioned file with a checksum.
//! `run` with `spec.pef` refuses to start when the job does not match it.

use std::path::Path;

use rdu_crds::RduJobSpec;
use serde::{Deserialize, Serialize};

use crate::data::{self, Splits};
use crate::error::WorkerError;
use crate::model::Mlp;

/// Format version written by this build.
pub(crate) const PEF_VERSION: u32 = 1;

/// A compiled artefact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Pef {
    pub version: u32,
    pub model: String,
    /// Layer widths, input first, classes last.
    pub layers: Vec<usize>,
    pub param_count: usize,
    pub batch_size: u32,
    pub tiles_per_worker: u32,
    pub min_world_size: u32,
    /// FNV-1a of every other field, hex.
    pub checksum: String,
}

impl Pef {
    fn body_checksum(&self) -> String {
        let body = format!(
            "{}|{}|{:?}|{}|{}|{}|{}",
            self.version,
            self.model,
            self.layers,
            self.param_count,
            self.batch_size,
            self.tiles_per_worker,
            self.min_world_size
        );
        let sum = body.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("{sum:016x}")
    }
}

/// The model's layer widths for `spec`, taking input size and classes from the data when omitted.
pub(crate) fn model_for(spec: &RduJobSpec, base_dir: &Path) -> Result<Mlp, WorkerError> {
    let splits = data::load(&spec.data, &spec.model, base_dir)?;
    Ok(Mlp::for_job(&spec.model, &splits))
}

/// Compiles `spec` (data read relative to `base_dir`); `spec.compile.minWorldSize` (1 without a
/// compile section) becomes the smallest world size the PEF runs with.
pub(crate) fn compile(spec: &RduJobSpec, base_dir: &Path) -> Result<Pef, WorkerError> {
    let model = model_for(spec, base_dir)?;
    let mut pef = Pef {
        version: PEF_VERSION,
        model: "ffn-logreg".into(),
        layers: model.sizes().to_vec(),
        param_count: model.param_count(),
        batch_size: spec.training.batch_size,
        tiles_per_worker: spec.tiles_per_worker,
        min_world_size: spec.compile.as_ref().map_or(1, |c| c.min_world_size),
        checksum: String::new(),
    };
    pef.checksum = pef.body_checksum();
    Ok(pef)
}

/// `compile FILE --out PEF` for the binaries: reads the RduJob YAML, compiles, writes, and returns
/// the exit code (64 bad file or spec, 65 bad data).
pub fn compile_file(file: &Path, out: &Path) -> i32 {
    let compiled = (|| -> Result<Pef, WorkerError> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| WorkerError::config(file.display().to_string(), e.to_string()))?;
        let job = rdu_crds::parse_manifest(&text)
            .map_err(|e| WorkerError::config(file.display().to_string(), e.to_string()))?;
        if let Err(errors) = rdu_crds::validate_spec(&job.spec) {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(WorkerError::config(
                file.display().to_string(),
                text.join("; "),
            ));
        }
        let base = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let pef = compile(&job.spec, base)?;
        write(out, &pef)?;
        Ok(pef)
    })();
    match compiled {
        Ok(pef) => {
            tracing::info!(
                out = %out.display(),
                layers = ?pef.layers,
                params = pef.param_count,
                batch_size = pef.batch_size,
                tiles_per_worker = pef.tiles_per_worker,
                min_world_size = pef.min_world_size,
                checksum = %pef.checksum,
                "compiled"
            );
            0
        }
        Err(e) => {
            tracing::error!(error = %rdu_error_chain::Chain(&e), "compile failed");
            e.exit_code()
        }
    }
}

/// Writes `pef` as JSON.
pub(crate) fn write(path: &Path, pef: &Pef) -> Result<(), WorkerError> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| WorkerError::Write {
        path: path.display().to_string(),
        source,
    };
    let json = serde_json::to_string_pretty(pef).map_err(|e| err(e.into()))?;
    std::fs::write(path, json + "\n").map_err(|e| err(e.into()))
}

/// Reads a PEF and checks its version and checksum.
pub(crate) fn read(path: &Path) -> Result<Pef, WorkerError> {
    let bad =
        |reason: String| WorkerError::config("spec.pef", format!("{}: {reason}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
    let pef: Pef = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not a PEF ({e}); compile it with `rdujob compile`")))?;
    if pef.version != PEF_VERSION {
        return Err(bad(format!(
            "PEF version {} is not {PEF_VERSION}: recompile it",
            pef.version
        )));
    }
    if pef.checksum != pef.body_checksum() {
        return Err(bad(
            "checksum mismatch: the PEF is corrupted, recompile it".into()
        ));
    }
    Ok(pef)
}

/// With `spec.pef` set: reads it and refuses a job that does not match it (before any rendezvous,
/// so every rank fails the same way with the config exit code).
pub(crate) fn check_job(
    spec: &RduJobSpec,
    splits: &Splits,
    world_size: u32,
) -> Result<(), WorkerError> {
    let Some(path) = &spec.pef else {
        return Ok(());
    };
    let pef = read(Path::new(path))?;
    let model = Mlp::for_job(&spec.model, splits);
    check_run(&pef, &model, spec, world_size)?;
    tracing::info!(pef = %path, checksum = %pef.checksum, "running the compiled PEF");
    Ok(())
}

/// Refuses a run that does not match what was compiled.
pub(crate) fn check_run(
    pef: &Pef,
    model: &Mlp,
    spec: &RduJobSpec,
    world_size: u32,
) -> Result<(), WorkerError> {
    if world_size < pef.min_world_size {
        return Err(WorkerError::config(
            "spec.workers",
            format!(
                "{world_size} rank(s), but the PEF was compiled for at least {}: raise workers or recompile with a smaller spec.compile.minWorldSize",
                pef.min_world_size
            ),
        ));
    }
    if spec.tiles_per_worker != pef.tiles_per_worker {
        return Err(WorkerError::config(
            "spec.tilesPerWorker",
            format!(
                "{} tiles, but the PEF was compiled for {}: use {} or recompile",
                spec.tiles_per_worker, pef.tiles_per_worker, pef.tiles_per_worker
            ),
        ));
    }
    if spec.training.batch_size != pef.batch_size {
        return Err(WorkerError::config(
            "spec.training.batchSize",
            format!(
                "{}, but the PEF was compiled for {}: use {} or recompile",
                spec.training.batch_size, pef.batch_size, pef.batch_size
            ),
        ));
    }
    if model.sizes() != pef.layers.as_slice() {
        return Err(WorkerError::config(
            "spec.model",
            format!(
                "layers {:?}, but the PEF was compiled for {:?}: recompile",
                model.sizes(),
                pef.layers
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::minimal;

    #[test]
    fn compile_write_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let spec = minimal();
        let pef = compile(&spec, dir.path()).unwrap();
        assert_eq!(pef.layers, vec![32, 8, 4]);
        assert_eq!(pef.min_world_size, 1);
        let path = dir.path().join("x.pef");
        write(&path, &pef).unwrap();
        assert_eq!(read(&path).unwrap(), pef);
    }

    #[test]
    fn a_corrupted_pef_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pef");
        write(&path, &compile(&minimal(), dir.path()).unwrap()).unwrap();
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"batchSize\": 8", "\"batchSize\": 9");
        std::fs::write(&path, text).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn runs_that_do_not_match_the_pef_are_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = minimal();
        spec.compile = Some(rdu_crds::CompileSpec { min_world_size: 2 });
        let pef = compile(&spec, dir.path()).unwrap();
        let model = model_for(&spec, dir.path()).unwrap();
        assert!(check_run(&pef, &model, &spec, 2).is_ok());
        let field = |r: Result<(), WorkerError>| match r {
            Err(WorkerError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(check_run(&pef, &model, &spec, 1)), "spec.workers");
        let mut tiles = spec.clone();
        tiles.tiles_per_worker = 2;
        assert_eq!(
            field(check_run(&pef, &model, &tiles, 2)),
            "spec.tilesPerWorker"
        );
        let mut batch = spec.clone();
        batch.training.batch_size = 16;
        assert_eq!(
            field(check_run(&pef, &model, &batch, 2)),
            "spec.training.batchSize"
        );
        let other = Mlp::new(32, &[9], 4);
        assert_eq!(field(check_run(&pef, &other, &spec, 2)), "spec.model");
    }
}
