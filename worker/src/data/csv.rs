//! The `csv` source: one sample per line, features then the integer label, an optional header line.

use std::path::Path;

use super::read::read_maybe_gzipped;
use super::{DataError, Dataset};

/// Parses a CSV file (gzipped or not) of at most `max_bytes` (after gunzip too).
pub(super) fn read(path: &Path, max_bytes: u64) -> Result<Dataset, DataError> {
    let file = path.display().to_string();
    let bytes = read_maybe_gzipped(path, max_bytes)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| DataError::Invalid {
        file: file.clone(),
        reason: format!("not UTF-8 text: {e}"),
    })?;
    parse(text, &file)
}

fn parse(text: &str, file: &str) -> Result<Dataset, DataError> {
    let bad = |line: usize, reason: String| DataError::Malformed {
        file: file.to_string(),
        line,
        reason,
    };
    let mut features = Vec::new();
    let mut labels = Vec::new();
    let mut dim: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if dim.is_none() && labels.is_empty() && fields.iter().any(|f| f.parse::<f64>().is_err()) {
            continue; // a header line
        }
        if fields.len() < 2 {
            return Err(bad(
                line_no,
                "a row needs at least one feature and a label".into(),
            ));
        }
        let row_dim = fields.len() - 1;
        match dim {
            None => dim = Some(row_dim),
            Some(d) if d != row_dim => {
                return Err(bad(
                    line_no,
                    format!("{} columns, but earlier rows have {}", fields.len(), d + 1),
                ));
            }
            Some(_) => {}
        }
        for (col, f) in fields[..row_dim].iter().enumerate() {
            let v: f32 = f.parse().map_err(|_| {
                bad(
                    line_no,
                    format!("column {}: {f:?} is not a number", col + 1),
                )
            })?;
            if !v.is_finite() {
                return Err(bad(
                    line_no,
                    format!("column {}: {f:?} is not finite", col + 1),
                ));
            }
            features.push(v);
        }
        let label = fields[row_dim];
        let label: u32 = label.parse().map_err(|_| {
            bad(
                line_no,
                format!("label {label:?} (last column) is not a non-negative integer"),
            )
        })?;
        if label > 65_535 {
            return Err(bad(
                line_no,
                format!("label {label} is out of range (max 65535)"),
            ));
        }
        labels.push(label);
    }
    Ok(Dataset {
        features,
        labels,
        dim: dim.unwrap_or(0),
    })
}

/// Min-max scales every feature to [0, 1] with the training set's global range (digits: 0..16),
/// applying the same transform to the test set.
pub(super) fn scale_to_unit(train: &mut Dataset, test: &mut Dataset) {
    let min = train.features.iter().copied().fold(f32::INFINITY, f32::min);
    let max = train
        .features
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if max.partial_cmp(&min) != Some(std::cmp::Ordering::Greater) {
        return;
    }
    let range = max - min;
    for v in train.features.iter_mut().chain(test.features.iter_mut()) {
        *v = (*v - min) / range;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_with_a_header_parse() {
        let d = parse("a,b,label\n0,16,1\n8,4,0\n", "f.csv").unwrap();
        assert_eq!(d.dim, 2);
        assert_eq!(d.labels, vec![1, 0]);
        assert_eq!(d.features, vec![0.0, 16.0, 8.0, 4.0]);
    }

    #[test]
    fn ragged_rows_name_the_line() {
        let err = parse("1,2,0\n1,2,3,0\n", "f.csv").unwrap_err().to_string();
        assert!(err.starts_with("f.csv:2:"), "{err}");
    }

    #[test]
    fn bad_labels_and_numbers_name_the_line() {
        let err = parse("1,2,0\n1,2,-1\n", "f.csv").unwrap_err().to_string();
        assert!(err.contains("f.csv:2:") && err.contains("label"), "{err}");
        let err = parse("1,2,0\n1,x,1\n", "f.csv").unwrap_err().to_string();
        assert!(
            err.contains("f.csv:2:") && err.contains("column 2"),
            "{err}"
        );
    }

    #[test]
    fn scaling_maps_the_training_range_to_unit() {
        let mut train = parse("0,16,1\n8,4,0\n", "f").unwrap();
        let mut test = parse("4,8,0\n", "g").unwrap();
        scale_to_unit(&mut train, &mut test);
        assert_eq!(train.features, vec![0.0, 1.0, 0.5, 0.25]);
        assert_eq!(test.features, vec![0.25, 0.5]);
    }

    #[test]
    fn the_shipped_digits_file_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/digits.csv.gz");
        let d = read(&path, 1 << 20).unwrap();
        assert_eq!(d.len(), 1797);
        assert_eq!(d.dim, 64);
        assert_eq!(d.labels.iter().max(), Some(&9));
    }
}
