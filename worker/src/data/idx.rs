//! The `idx` source: MNIST's own format (big-endian magic, dimensions, u8 payload), gzipped or not.

use std::path::Path;

use super::read::read_maybe_gzipped;
use super::{DataError, Dataset};

/// Magic of an unsigned-byte IDX file: 0x00 0x00 type 0x08, then the number of dimensions.
const UBYTE: u8 = 0x08;

/// Reads an images file and its labels file, each of at most `max_bytes` (after gunzip too).
pub(super) fn read(images: &Path, labels: &Path, max_bytes: u64) -> Result<Dataset, DataError> {
    let image_file = images.display().to_string();
    let label_file = labels.display().to_string();
    let image_bytes = read_maybe_gzipped(images, max_bytes)?;
    let label_raw = read_maybe_gzipped(labels, max_bytes)?;
    let (image_dims, pixels) = parse(&image_bytes, &image_file)?;
    let (label_dims, label_bytes) = parse(&label_raw, &label_file)?;
    if image_dims.len() < 2 {
        return Err(invalid(
            &image_file,
            format!(
                "an images file needs at least 2 dimensions, found {}",
                image_dims.len()
            ),
        ));
    }
    if label_dims.len() != 1 {
        return Err(invalid(
            &label_file,
            format!("a labels file has 1 dimension, found {}", label_dims.len()),
        ));
    }
    if image_dims[0] != label_dims[0] {
        return Err(invalid(
            &label_file,
            format!(
                "{} labels for {} images in {image_file}",
                label_dims[0], image_dims[0]
            ),
        ));
    }
    let dim: usize = image_dims[1..].iter().product();
    Ok(Dataset {
        features: pixels.iter().map(|&p| p as f32 / 255.0).collect(),
        labels: label_bytes.iter().map(|&l| l as u32).collect(),
        dim,
    })
}

fn invalid(file: &str, reason: String) -> DataError {
    DataError::Invalid {
        file: file.to_string(),
        reason,
    }
}

/// The dimensions and the payload of an unsigned-byte IDX file.
fn parse<'a>(bytes: &'a [u8], file: &str) -> Result<(Vec<usize>, &'a [u8]), DataError> {
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != UBYTE {
        return Err(invalid(
            file,
            "wrong magic: not an unsigned-byte IDX file (expected 00 00 08 <ndims>)".into(),
        ));
    }
    let ndims = bytes[3] as usize;
    let header = 4 + 4 * ndims;
    if ndims == 0 || bytes.len() < header {
        return Err(invalid(
            file,
            format!("truncated header ({ndims} dimensions)"),
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid(file, format!("dimensions {dims:?} overflow")))?;
    let payload = &bytes[header..];
    if payload.len() != expected {
        return Err(invalid(
            file,
            format!(
                "dimensions {dims:?} need {expected} bytes of data, the file has {}",
                payload.len()
            ),
        ));
    }
    Ok((dims, payload))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes an IDX file of `dims` with `payload`.
    pub(crate) fn idx_bytes(dims: &[u32], payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, UBYTE, dims.len() as u8];
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn images_and_labels_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let lbl = dir.path().join("lbl");
        std::fs::write(
            &img,
            idx_bytes(&[2, 2, 2], &[0, 255, 51, 0, 255, 255, 0, 0]),
        )
        .unwrap();
        std::fs::write(&lbl, idx_bytes(&[2], &[3, 7])).unwrap();
        let d = read(&img, &lbl, 1 << 20).unwrap();
        assert_eq!(d.dim, 4);
        assert_eq!(d.labels, vec![3, 7]);
        assert_eq!(d.features[..3], [0.0, 1.0, 0.2]);
    }

    #[test]
    fn wrong_magic_and_mismatched_counts_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let lbl = dir.path().join("lbl");
        std::fs::write(&img, b"P5\n28 28\n").unwrap();
        std::fs::write(&lbl, idx_bytes(&[1], &[3])).unwrap();
        let err = read(&img, &lbl, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("wrong magic") && err.contains("img"), "{err}");
        std::fs::write(&img, idx_bytes(&[2, 1, 1], &[1, 2])).unwrap();
        let err = read(&img, &lbl, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("1 labels for 2 images"), "{err}");
        std::fs::write(&img, idx_bytes(&[2, 1, 1], &[1])).unwrap();
        assert!(read(&img, &lbl, 1 << 20).is_err());
    }
}
