//! Checkpoints: rank 0 writes parameters, optimizer state and the global step atomically
//! (tmp file + rename), keeps the newest N, and on start shares the newest valid one with every rank.

use std::path::{Path, PathBuf};

use rdu_collective::Communicator;

use crate::error::WorkerError;
use crate::model::checksum;
use crate::optim::Optimizer;

const MAGIC: &[u8; 8] = b"RDUCKPT1";
const PREFIX: &str = "ckpt-";
const SUFFIX: &str = ".bin";

/// A checkpoint's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub step: u64,
    pub params: Vec<f32>,
    pub optimizer_state: Vec<Vec<f32>>,
}

fn file_name(step: u64) -> String {
    format!("{PREFIX}{step:012}{SUFFIX}")
}

fn encode(ckpt: &Checkpoint) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + 4 * ckpt.params.len() * (1 + ckpt.optimizer_state.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&ckpt.step.to_le_bytes());
    out.extend_from_slice(&(ckpt.params.len() as u64).to_le_bytes());
    out.extend_from_slice(&(ckpt.optimizer_state.len() as u32).to_le_bytes());
    for v in ckpt
        .params
        .iter()
        .chain(ckpt.optimizer_state.iter().flatten())
    {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let sum = fnv(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn decode(bytes: &[u8]) -> Option<Checkpoint> {
    let body_len = bytes.len().checked_sub(8)?;
    let (body, sum) = bytes.split_at(body_len);
    if fnv(body).to_le_bytes() != sum || body.len() < 28 || &body[..8] != MAGIC {
        return None;
    }
    let step = u64::from_le_bytes(body[8..16].try_into().ok()?);
    let n = u64::from_le_bytes(body[16..24].try_into().ok()?) as usize;
    let states = u32::from_le_bytes(body[24..28].try_into().ok()?) as usize;
    let floats: Vec<f32> = body[28..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if floats.len() != n.checked_mul(states + 1)? {
        return None;
    }
    let mut parts = floats.chunks_exact(n.max(1)).map(<[f32]>::to_vec);
    let params = if n == 0 { Vec::new() } else { parts.next()? };
    Some(Checkpoint {
        step,
        params,
        optimizer_state: parts.collect(),
    })
}

/// Writes `ckpt` into `dir` atomically and deletes all but the newest `keep`.
pub fn save(dir: &Path, ckpt: &Checkpoint, keep: usize) -> Result<PathBuf, WorkerError> {
    let err = |path: &Path, e: std::io::Error| WorkerError::Write {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let path = dir.join(file_name(ckpt.step));
    let tmp = dir.join(format!(".{}.tmp", file_name(ckpt.step)));
    std::fs::write(&tmp, encode(ckpt)).map_err(|e| err(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| err(&path, e))?;
    let mut all = list(dir);
    all.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
    for (_, old) in all.into_iter().skip(keep.max(1)) {
        if let Err(e) = std::fs::remove_file(&old) {
            tracing::warn!(path = %old.display(), error = %e, "cannot delete an old checkpoint");
        }
    }
    Ok(path)
}

fn list(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name
                .strip_prefix(PREFIX)?
                .strip_suffix(SUFFIX)?
                .parse()
                .ok()?;
            Some((step, e.path()))
        })
        .collect()
}

/// The newest checkpoint in `dir` that reads back intact with `params` parameters (corrupt or
/// foreign ones are skipped with a warning).
pub fn latest(dir: &Path, params: usize) -> Option<Checkpoint> {
    let mut all = list(dir);
    all.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
    all.into_iter().find_map(|(_, path)| {
        let ckpt = std::fs::read(&path).ok().and_then(|b| decode(&b));
        match ckpt {
            Some(c) if c.params.len() == params => Some(c),
            _ => {
                tracing::warn!(path = %path.display(), "skipping an unreadable or foreign checkpoint");
                None
            }
        }
    })
}

/// Rank 0's newest checkpoint (if any) copied into every rank's parameters and optimizer;
/// returns the global step to resume from (0 without a checkpoint).
pub async fn resume(
    comm: &Communicator,
    found: Option<Checkpoint>,
    params: &mut [f32],
    optimizer: &mut Optimizer,
) -> Result<u64, WorkerError> {
    // The step in 16-bit pieces: f32 holds them exactly.
    let mut header = [0.0f32; 4];
    if let Some(c) = &found {
        header[0] = 1.0;
        for (i, h) in header[1..].iter_mut().enumerate() {
            *h = ((c.step >> (16 * i)) & 0xffff) as f32;
        }
    }
    if comm.world_size() > 1 {
        comm.broadcast(&mut header, 0).await?;
    }
    if header[0] != 1.0 {
        return Ok(0);
    }
    let step = header[1..]
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, &h)| acc | ((h as u64) << (16 * i)));
    let state_lens: Vec<usize> = optimizer.state().iter().map(|s| s.len()).collect();
    let mut state: Vec<Vec<f32>> = state_lens.iter().map(|&n| vec![0.0; n]).collect();
    if let Some(c) = found {
        params.copy_from_slice(&c.params);
        if c.optimizer_state.len() == state.len()
            && c.optimizer_state
                .iter()
                .zip(&state)
                .all(|(a, b)| a.len() == b.len())
        {
            state = c.optimizer_state;
        } else {
            tracing::warn!(
                "checkpoint's optimizer state does not fit; optimizer restarts from zero"
            );
        }
    }
    if comm.world_size() > 1 {
        comm.broadcast(params, 0).await?;
        for s in state.iter_mut() {
            comm.broadcast(s, 0).await?;
        }
    }
    optimizer.restore(&state, step);
    tracing::info!(
        step,
        checksum = format!("{:016x}", checksum(params)),
        "resumed from checkpoint"
    );
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(step: u64) -> Checkpoint {
        Checkpoint {
            step,
            params: vec![1.0, -2.5, 3.25],
            optimizer_state: vec![vec![0.1, 0.2, 0.3], vec![4.0, 5.0, 6.0]],
        }
    }

    #[test]
    fn checkpoints_round_trip_and_only_the_newest_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for step in [10, 20, 30] {
            save(dir.path(), &sample(step), 2).unwrap();
        }
        assert_eq!(list(dir.path()).len(), 2);
        assert_eq!(latest(dir.path(), 3), Some(sample(30)));
        assert_eq!(latest(dir.path(), 4), None);
    }

    #[test]
    fn a_corrupt_newest_checkpoint_falls_back_to_the_previous() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &sample(10), 3).unwrap();
        let newest = save(dir.path(), &sample(20), 3).unwrap();
        let mut bytes = std::fs::read(&newest).unwrap();
        bytes[30] ^= 0xff;
        std::fs::write(&newest, bytes).unwrap();
        assert_eq!(latest(dir.path(), 3).map(|c| c.step), Some(10));
    }
}
