//! Training data: the `synthetic`, `csv` and `idx` sources, scaling, and the held-out test split.

mod csv;
mod idx;
mod read;
mod synthetic;

use std::path::{Path, PathBuf};

use rdu_crds::{DataSource, DataSpec, ModelSpec};

use crate::rng::Rng;

/// Stream id of the train/test split's shuffle.
const SPLIT_STREAM: u64 = 0x5EED_5917;

/// Bad data: the file, the line or record when known, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{file}: cannot read")]
    Missing {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}: {reason}")]
    Malformed {
        file: String,
        line: usize,
        reason: String,
    },
    #[error("{file}: {reason}")]
    Invalid { file: String, reason: String },
    #[error("{file} {reason}")]
    TooLarge { file: String, reason: String },
}

/// Samples as a row-major feature matrix and class labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub features: Vec<f32>,
    pub labels: Vec<u32>,
    pub dim: usize,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.features[i * self.dim..(i + 1) * self.dim]
    }

    /// The samples at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        let mut features = Vec::with_capacity(indices.len() * self.dim);
        for &i in indices {
            features.extend_from_slice(self.row(i));
        }
        Dataset {
            features,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            dim: self.dim,
        }
    }
}

/// The training and test sets and the shape the model gets from them.
#[derive(Debug, Clone)]
pub struct Splits {
    pub train: Dataset,
    pub test: Dataset,
    pub classes: usize,
}

/// Loads `spec`'s data; relative paths are relative to `base_dir` (the worker's working directory).
pub(crate) fn load(
    spec: &DataSpec,
    model: &ModelSpec,
    base_dir: &Path,
) -> Result<Splits, DataError> {
    let resolve = |p: &str| -> PathBuf { base_dir.join(p) };
    let required = |p: &Option<String>, field: &str| -> Result<PathBuf, DataError> {
        p.as_deref().map(resolve).ok_or_else(|| DataError::Invalid {
            file: format!("spec.data.{field}"),
            reason: format!("spec.data.{field} is required for this source"),
        })
    };
    let (all, given_test) = match spec.source {
        DataSource::Synthetic => (synthetic::generate(spec, model), None),
        DataSource::Csv => {
            let cap = spec.max_file_bytes();
            let train = csv::read(&required(&spec.path, "path")?, cap)?;
            let test = match &spec.test_path {
                Some(p) => Some(csv::read(&resolve(p), cap)?),
                None => None,
            };
            (train, test)
        }
        DataSource::Idx => {
            let cap = spec.max_file_bytes();
            let train = idx::read(
                &required(&spec.path, "path")?,
                &required(&spec.labels_path, "labelsPath")?,
                cap,
            )?;
            let test = match (&spec.test_path, &spec.test_labels_path) {
                (Some(images), Some(labels)) => {
                    Some(idx::read(&resolve(images), &resolve(labels), cap)?)
                }
                (None, None) => None,
                _ => {
                    return Err(DataError::Invalid {
                        file: "spec.data.testPath".into(),
                        reason: "the idx source needs both testPath and testLabelsPath, or neither"
                            .into(),
                    });
                }
            };
            (train, test)
        }
    };
    let source_name = spec.path.clone().unwrap_or_else(|| "synthetic".into());
    let (mut train, mut test) = match given_test {
        Some(test) => (all, test),
        None => split(all, spec.test_fraction, spec.seed),
    };
    if train.is_empty() {
        return Err(DataError::Invalid {
            file: source_name,
            reason: "no training samples left (empty file, or testFraction too large)".into(),
        });
    }
    if !test.is_empty() && test.dim != train.dim {
        return Err(DataError::Invalid {
            file: spec.test_path.clone().unwrap_or_default(),
            reason: format!(
                "test samples have {} features, training samples {}",
                test.dim, train.dim
            ),
        });
    }
    if spec.source == DataSource::Csv {
        csv::scale_to_unit(&mut train, &mut test);
    }
    let classes = check_shape(&train, &test, model, &source_name)?;
    Ok(Splits {
        train,
        test,
        classes,
    })
}

/// Holds out `fraction` of the samples (a seeded shuffle, the same on every rank).
fn split(all: Dataset, fraction: f64, seed: u64) -> (Dataset, Dataset) {
    let perm = Rng::derive(seed, SPLIT_STREAM).permutation(all.len());
    let n_test = ((all.len() as f64) * fraction).round() as usize;
    let n_test = n_test.min(all.len());
    let (test_idx, train_idx) = perm.split_at(n_test);
    (all.subset(train_idx), all.subset(test_idx))
}

/// Number of classes, checked against the model's `inputSize`/`classes` when given.
fn check_shape(
    train: &Dataset,
    test: &Dataset,
    model: &ModelSpec,
    file: &str,
) -> Result<usize, DataError> {
    if let Some(input) = model.input_size
        && input as usize != train.dim
    {
        return Err(DataError::Invalid {
            file: file.into(),
            reason: format!(
                "samples have {} features but spec.model.inputSize is {input}; fix inputSize or omit it",
                train.dim
            ),
        });
    }
    let max_label = train
        .labels
        .iter()
        .chain(&test.labels)
        .copied()
        .max()
        .unwrap_or(0) as usize;
    match model.classes {
        Some(c) if max_label >= c as usize => Err(DataError::Invalid {
            file: file.into(),
            reason: format!(
                "label {max_label} is out of range for spec.model.classes {c}; raise classes or omit it"
            ),
        }),
        Some(c) => Ok(c as usize),
        None => Ok((max_label + 1).max(2)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdu_crds::ModelName;

    pub(crate) fn data_spec(source: DataSource) -> DataSpec {
        DataSpec {
            source,
            path: None,
            labels_path: None,
            test_path: None,
            test_labels_path: None,
            test_fraction: 0.25,
            samples: Some(200),
            shuffle: true,
            drop_last: false,
            seed: 1,
            max_file_mib: None,
        }
    }

    pub(crate) fn model_spec() -> ModelSpec {
        ModelSpec {
            name: ModelName::FfnLogreg,
            hidden_sizes: vec![],
            input_size: None,
            classes: None,
            kernels: Default::default(),
        }
    }

    #[test]
    fn the_split_is_deterministic_and_disjoint() {
        let spec = data_spec(DataSource::Synthetic);
        let a = load(&spec, &model_spec(), Path::new(".")).unwrap();
        let b = load(&spec, &model_spec(), Path::new(".")).unwrap();
        assert_eq!(a.train, b.train);
        assert_eq!(a.test.len(), 50);
        assert_eq!(a.train.len(), 150);
    }

    #[test]
    fn model_shapes_that_do_not_fit_the_data_are_bad_data() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.csv"), "1,2,0\n3,4,5\n5,6,1\n7,8,2\n").unwrap();
        let mut spec = data_spec(DataSource::Csv);
        spec.path = Some("d.csv".into());
        let splits = load(&spec, &model_spec(), dir.path()).unwrap();
        assert_eq!(splits.classes, 6);
        let mut model = model_spec();
        model.classes = Some(3);
        let err = load(&spec, &model, dir.path()).unwrap_err().to_string();
        assert!(err.contains("label 5") && err.contains("classes"), "{err}");
        model.classes = None;
        model.input_size = Some(3);
        let err = load(&spec, &model, dir.path()).unwrap_err().to_string();
        assert!(err.contains("inputSize"), "{err}");
    }

    #[test]
    fn a_file_past_spec_data_max_file_mib_fails_the_load_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.csv"), "1,2,0\n".repeat(200_000)).unwrap();
        let mut spec = data_spec(DataSource::Csv);
        spec.path = Some("d.csv".into());
        assert!(load(&spec, &model_spec(), dir.path()).is_ok());
        spec.max_file_mib = Some(1);
        let err = load(&spec, &model_spec(), dir.path()).unwrap_err();
        assert!(matches!(err, DataError::TooLarge { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("d.csv is larger than spec.data.maxFileMiB (1 MiB)"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_file_names_the_file() {
        let mut spec = data_spec(DataSource::Csv);
        spec.path = Some("nope/missing.csv".into());
        let err = load(&spec, &model_spec(), Path::new("/tmp")).unwrap_err();
        assert!(matches!(err, DataError::Missing { .. }));
        assert!(err.to_string().contains("missing.csv"), "{err}");
    }
}
