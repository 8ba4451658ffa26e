//! The job result rank 0 writes to its termination message (DESIGN 4.6).

use std::path::Path;

use rdu_crds::JobResult;

use crate::error::WorkerError;

/// Writes `result` as one JSON line to `path` (the termination log, or a file for local mode).
pub(crate) fn write_result(path: &Path, result: &JobResult) -> Result<(), WorkerError> {
    let write_err = |source: Box<dyn std::error::Error + Send + Sync>| WorkerError::Write {
        path: path.display().to_string(),
        source,
    };
    let json = serde_json::to_string(result).map_err(|e| write_err(e.into()))?;
    std::fs::write(path, json + "\n").map_err(|e| write_err(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_uses_the_contract_field_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        let result = JobResult {
            final_loss: 0.5,
            test_accuracy: 0.9,
            samples_per_second: 100.0,
            train_seconds: 2.0,
            global_steps: 10,
            ..Default::default()
        };
        write_result(&path, &result).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for key in [
            "finalLoss",
            "testAccuracy",
            "samplesPerSecond",
            "trainSeconds",
            "globalSteps",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert!(write_result(&dir.path().join("no/such/dir"), &result).is_err());
    }
}
