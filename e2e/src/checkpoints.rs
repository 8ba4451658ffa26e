//! What a job left in its checkpoint directory (`ckpt-<step>-g<generation>.bin` beside the `FENCE`), read from
//! the host side of the shared storage.

use serde_json::Value;

/// Checkpoints in a job's checkpoint directory that a superseded generation wrote after the current lineage
/// left it: files of a generation older than the `FENCE`'s whose step is newer than the checkpoint the fenced
/// generation resumed from (`ckpt-<step>-g<generation>.bin`). A refused write never lands, so this is 0 unless
/// the fence leaked.
pub fn stale_checkpoints(dir: &std::path::Path) -> usize {
    let fence: Value = std::fs::read_to_string(dir.join("FENCE"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("no readable FENCE in {}", dir.display()));
    let generation = fence["generation"].as_u64().expect("FENCE generation");
    let resumed_step = fence["resumedFrom"]
        .as_str()
        .and_then(checkpoint_name)
        .map_or(0, |(step, _)| step);
    std::fs::read_dir(dir)
        .expect("checkpoint directory")
        .flatten()
        .filter_map(|e| checkpoint_name(&e.file_name().to_string_lossy()))
        .filter(|(step, g)| *g < generation && *step > resumed_step)
        .count()
}

/// (step, generation) of a checkpoint file name `ckpt-<step>-g<generation>.bin`.
pub fn checkpoint_name(name: &str) -> Option<(u64, u64)> {
    let (step, generation) = name
        .strip_prefix("ckpt-")?
        .strip_suffix(".bin")?
        .split_once("-g")?;
    Some((step.parse().ok()?, generation.parse().ok()?))
}

#[test]
pub fn checkpoint_names_are_read() {
    assert_eq!(
        checkpoint_name("ckpt-000000001200-g000003.bin"),
        Some((1200, 3))
    );
    assert_eq!(checkpoint_name("ckpt-000000001200.bin"), None);
    assert_eq!(checkpoint_name("FENCE"), None);
}
