//! Reading a data file whole, gunzipping it when it is gzipped (by magic bytes, whatever the name), never past
//! `spec.data.maxFileMiB`: the file as stored and its content after gunzip are each capped, so that a huge file
//! or a decompression bomb fails with an error naming the file and the limit instead of taking the rank's memory.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::DataError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// The most a gzipped file's first read reserves, whatever the ratio it claims: the rest grows as it inflates.
const INFLATE_RESERVE: u64 = 64 << 20;

/// The file's bytes, decompressed when they start with the gzip magic; at most `max_bytes` of either.
pub(super) fn read_maybe_gzipped(path: &Path, max_bytes: u64) -> Result<Vec<u8>, DataError> {
    let file = path.display().to_string();
    let missing = |source: std::io::Error| DataError::Missing {
        file: file.clone(),
        source,
    };
    let opened = File::open(path).map_err(missing)?;
    let stored = opened.metadata().map_err(missing)?.len();
    if stored > max_bytes {
        return Err(too_large(&file, max_bytes, false));
    }
    let raw = read_capped(opened, stored, max_bytes)
        .map_err(missing)?
        .ok_or_else(|| too_large(&file, max_bytes, false))?;
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    let reserve = (raw.len() as u64)
        .saturating_mul(4)
        .min(INFLATE_RESERVE)
        .min(max_bytes);
    read_capped(GzDecoder::new(raw.as_slice()), reserve, max_bytes)
        .map_err(|e| DataError::Invalid {
            file: file.clone(),
            reason: format!("corrupt gzip stream: {e}"),
        })?
        .ok_or_else(|| too_large(&file, max_bytes, true))
}

/// Everything `reader` holds if it is at most `max_bytes` (`None` beyond), reserving `reserve` bytes first.
fn read_capped(
    reader: impl Read,
    reserve: u64,
    max_bytes: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut out = Vec::with_capacity(usize::try_from(reserve.min(max_bytes)).unwrap_or(0));
    reader
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut out)?;
    Ok((out.len() as u64 <= max_bytes).then_some(out))
}

fn too_large(file: &str, max_bytes: u64, inflated: bool) -> DataError {
    let what = if inflated {
        "inflates past"
    } else {
        "is larger than"
    };
    DataError::TooLarge {
        file: file.to_string(),
        reason: format!(
            "{what} spec.data.maxFileMiB ({} MiB): raise spec.data.maxFileMiB (at most {}) if the data is meant \
             to be this large",
            max_bytes >> 20,
            rdu_crds::consts::MAX_DATA_FILE_MIB
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;

    const MIB: u64 = 1 << 20;

    fn gzipped(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn plain_and_gzipped_files_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a.csv");
        std::fs::write(&plain, b"1,2,0\n").unwrap();
        let gz = dir.path().join("a.bin");
        std::fs::write(&gz, gzipped(b"1,2,0\n")).unwrap();
        assert_eq!(read_maybe_gzipped(&plain, MIB).unwrap(), b"1,2,0\n");
        assert_eq!(read_maybe_gzipped(&gz, MIB).unwrap(), b"1,2,0\n");
    }

    #[test]
    fn truncated_gzip_is_bad_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gz");
        std::fs::write(&p, [0x1f, 0x8b, 8, 0, 0]).unwrap();
        assert!(matches!(
            read_maybe_gzipped(&p, MIB),
            Err(DataError::Invalid { .. })
        ));
    }

    #[test]
    fn a_file_up_to_the_cap_is_read_and_one_byte_more_is_refused_naming_file_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.csv");
        std::fs::write(&p, vec![b'7'; MIB as usize]).unwrap();
        assert_eq!(read_maybe_gzipped(&p, MIB).unwrap().len(), MIB as usize);
        std::fs::write(&p, vec![b'7'; MIB as usize + 1]).unwrap();
        let error = read_maybe_gzipped(&p, MIB).unwrap_err().to_string();
        assert!(error.starts_with(&p.display().to_string()), "{error}");
        assert!(
            error.contains("is larger than spec.data.maxFileMiB (1 MiB)"),
            "{error}"
        );
    }

    #[test]
    fn a_decompression_bomb_stops_at_the_cap() {
        // 64 MiB of zeros gzip to about 64 KiB; the cap is 1 MiB, so reading stops after 1 MiB and a byte.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bomb.csv.gz");
        let bomb = gzipped(&vec![0u8; 64 * MIB as usize]);
        assert!((bomb.len() as u64) < MIB);
        std::fs::write(&p, bomb).unwrap();
        let error = read_maybe_gzipped(&p, MIB).unwrap_err();
        assert!(matches!(error, DataError::TooLarge { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .contains("inflates past spec.data.maxFileMiB (1 MiB)"),
            "{error}"
        );
    }
}
