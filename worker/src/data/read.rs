//! Reading a data file whole, gunzipping it when it is gzipped (by magic bytes, whatever the name).

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use super::DataError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The file's bytes, decompressed when they start with the gzip magic.
pub fn read_maybe_gzipped(path: &Path) -> Result<Vec<u8>, DataError> {
    let file = path.display().to_string();
    let raw = std::fs::read(path).map_err(|e| DataError::Missing {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(raw.len() * 4);
    GzDecoder::new(raw.as_slice())
        .read_to_end(&mut out)
        .map_err(|e| DataError::Invalid {
            file,
            reason: format!("corrupt gzip stream: {e}"),
        })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;

    #[test]
    fn plain_and_gzipped_files_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a.csv");
        std::fs::write(&plain, b"1,2,0\n").unwrap();
        let gz = dir.path().join("a.bin");
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(b"1,2,0\n").unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        assert_eq!(read_maybe_gzipped(&plain).unwrap(), b"1,2,0\n");
        assert_eq!(read_maybe_gzipped(&gz).unwrap(), b"1,2,0\n");
    }

    #[test]
    fn truncated_gzip_is_bad_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gz");
        std::fs::write(&p, [0x1f, 0x8b, 8, 0, 0]).unwrap();
        assert!(matches!(
            read_maybe_gzipped(&p),
            Err(DataError::Invalid { .. })
        ));
    }
}
