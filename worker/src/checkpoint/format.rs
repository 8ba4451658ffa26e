//! A checkpoint's bytes and its file name. Both say who wrote it (the job's UID and the gang generation), so a
//! resume can follow one lineage. Files of the first format (`RDUCKPT1`, `ckpt-<step>.bin`) read as generation 0
//! of an unknown job.

use serde::{Deserialize, Serialize};

const MAGIC_V1: &[u8; 8] = b"RDUCKPT1";
const MAGIC_V2: &[u8; 8] = b"RDUCKPT2";
const PREFIX: &str = "ckpt-";
const SUFFIX: &str = ".bin";
/// Longest job UID a checkpoint may carry (a Kubernetes UID has 36 characters).
const MAX_UID_BYTES: usize = 256;
/// Most optimizer state vectors a checkpoint may carry (Adam has two).
const MAX_STATES: usize = 2;

/// Who wrote a checkpoint, or holds the fence: one generation of one job (its UID: a job deleted and made
/// again, or a second `rdujob run`, is another job). Files of the first format have an empty UID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Writer {
    pub job_uid: String,
    pub generation: u64,
}

/// A checkpoint's content: parameters and optimizer state after `step` optimizer steps, and its writer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checkpoint {
    pub writer: Writer,
    pub step: u64,
    pub params: Vec<f32>,
    pub optimizer_state: Vec<Vec<f32>>,
}

/// What a checkpoint is written from: borrowed from the training state at a step boundary.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot<'a> {
    pub step: u64,
    pub params: &'a [f32],
    pub optimizer_state: Vec<&'a [f32]>,
}

impl Checkpoint {
    /// This checkpoint's content, to write again.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            step: self.step,
            params: &self.params,
            optimizer_state: self.optimizer_state.iter().map(Vec::as_slice).collect(),
        }
    }
}

/// What a checkpoint's file name says (step and generation; the first format's names say generation 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NameParts {
    pub step: u64,
    pub generation: u64,
}

/// `ckpt-<step, 12 digits>-g<generation, 6 digits>.bin`: sorted by name, sorted by step.
pub fn file_name(step: u64, generation: u64) -> String {
    format!("{PREFIX}{step:012}-g{generation:06}{SUFFIX}")
}

fn legacy_file_name(step: u64) -> String {
    format!("{PREFIX}{step:012}{SUFFIX}")
}

/// The step and generation of a checkpoint's file name; `None` for any other name (only the exact names
/// [`file_name`] and the first format write are accepted, so a name read from a file cannot point elsewhere).
pub(super) fn parse_name(name: &str) -> Option<NameParts> {
    let middle = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (step, generation) = match middle.split_once("-g") {
        Some((step, generation)) => (step, generation),
        None => (middle, "0"),
    };
    let parts = NameParts {
        step: digits(step)?,
        generation: digits(generation)?,
    };
    let canonical = name == file_name(parts.step, parts.generation)
        || (!middle.contains("-g") && name == legacy_file_name(parts.step));
    canonical.then_some(parts)
}

fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The largest file a checkpoint of `params` parameters can be: more is not one, and is not read.
pub(super) fn max_len(params: usize) -> u64 {
    let floats = (params as u64).saturating_mul(1 + MAX_STATES as u64);
    64 + MAX_UID_BYTES as u64 + floats.saturating_mul(4)
}

/// The current format: magic, generation, step, UID, parameter count, state count, values, FNV-1a of it all.
pub(super) fn encode(writer: &Writer, ckpt: &Snapshot<'_>) -> Vec<u8> {
    let uid = writer.job_uid.as_bytes();
    let floats = ckpt.params.len() * (1 + ckpt.optimizer_state.len());
    let mut out = Vec::with_capacity(48 + uid.len() + 4 * floats);
    out.extend_from_slice(MAGIC_V2);
    out.extend_from_slice(&writer.generation.to_le_bytes());
    out.extend_from_slice(&ckpt.step.to_le_bytes());
    out.extend_from_slice(&(uid.len() as u32).to_le_bytes());
    out.extend_from_slice(uid);
    out.extend_from_slice(&(ckpt.params.len() as u64).to_le_bytes());
    out.extend_from_slice(&(ckpt.optimizer_state.len() as u32).to_le_bytes());
    for v in ckpt
        .params
        .iter()
        .chain(ckpt.optimizer_state.iter().copied().flatten())
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

/// Reads `bytes` front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// The checkpoint in `bytes`, or `None` when they are not one, whole and unaltered (either format).
pub(super) fn decode(bytes: &[u8]) -> Option<Checkpoint> {
    let body_len = bytes.len().checked_sub(8)?;
    let (body, sum) = bytes.split_at(body_len);
    if fnv(body).to_le_bytes() != sum {
        return None;
    }
    let mut r = Reader(body);
    let magic = r.take(8)?;
    let (writer, step) = if magic == MAGIC_V2 {
        let generation = r.u64()?;
        let step = r.u64()?;
        let uid_len = r.u32()? as usize;
        if uid_len > MAX_UID_BYTES {
            return None;
        }
        let job_uid = std::str::from_utf8(r.take(uid_len)?).ok()?.to_string();
        (
            Writer {
                job_uid,
                generation,
            },
            step,
        )
    } else if magic == MAGIC_V1 {
        let step = r.u64()?;
        let writer = Writer {
            job_uid: String::new(),
            generation: 0,
        };
        (writer, step)
    } else {
        return None;
    };
    let n = usize::try_from(r.u64()?).ok()?;
    let states = r.u32()? as usize;
    if states > MAX_STATES || r.0.len() != n.checked_mul(states + 1)?.checked_mul(4)? {
        return None;
    }
    let floats: Vec<f32> =
        r.0.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
    let mut parts = floats.chunks_exact(n.max(1)).map(<[f32]>::to_vec);
    let params = if n == 0 { Vec::new() } else { parts.next()? };
    let optimizer_state = if n == 0 {
        vec![Vec::new(); states]
    } else {
        parts.collect()
    };
    Some(Checkpoint {
        writer,
        step,
        params,
        optimizer_state,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(step: u64, job_uid: &str, generation: u64) -> Checkpoint {
        Checkpoint {
            writer: Writer {
                job_uid: job_uid.into(),
                generation,
            },
            step,
            params: vec![1.0, -2.5, 3.25],
            optimizer_state: vec![vec![0.1, 0.2, 0.3], vec![4.0, 5.0, 6.0]],
        }
    }

    /// The first format, as the worker wrote it before checkpoints named their writer.
    pub(crate) fn encode_v1(ckpt: &Checkpoint) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC_V1);
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

    #[test]
    fn both_formats_decode_and_the_first_reads_as_generation_0_of_no_job() {
        let ckpt = sample(30, "uid-a", 4);
        assert_eq!(
            decode(&encode(&ckpt.writer, &ckpt.snapshot())),
            Some(ckpt.clone())
        );
        let old = decode(&encode_v1(&ckpt)).unwrap();
        assert_eq!(
            old.writer,
            Writer {
                job_uid: String::new(),
                generation: 0
            }
        );
        assert_eq!((old.step, &old.params), (30, &ckpt.params));
        assert!(encode(&ckpt.writer, &ckpt.snapshot()).len() as u64 <= max_len(3));
    }

    #[test]
    fn any_altered_byte_or_length_is_refused() {
        let ckpt = sample(7, "uid-a", 1);
        let bytes = encode(&ckpt.writer, &ckpt.snapshot());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert_eq!(decode(&bad), None, "byte {i}");
        }
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(&[]), None);
    }

    #[test]
    fn names_carry_step_and_generation_and_nothing_else_parses() {
        assert_eq!(file_name(30, 2), "ckpt-000000000030-g000002.bin");
        for (name, parsed) in [
            (
                "ckpt-000000000030-g000002.bin",
                Some(NameParts {
                    step: 30,
                    generation: 2,
                }),
            ),
            (
                "ckpt-000000000030.bin",
                Some(NameParts {
                    step: 30,
                    generation: 0,
                }),
            ),
            ("ckpt-30-g2.bin", None),
            ("ckpt-+00000000030.bin", None),
            ("ckpt-000000000030-g000002.bin.tmp", None),
            ("../ckpt-000000000030.bin", None),
            ("ckpt-000000000030-g/../x.bin", None),
            ("FENCE", None),
        ] {
            assert_eq!(parse_name(name), parsed, "{name}");
        }
    }
}
