//! Writes the RduJob CRD YAML generated from the Rust types to `crds/rdujob.yaml` and the Helm chart.
//!
//! `cargo run -p rdu-crds --bin crdgen` rewrites both files; `--check` only reports whether they are current.
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let yaml = rdu_crds::crd_yaml();
    let mut stale = false;
    for rel in rdu_crds::CRD_YAML_PATHS {
        let path = root.join(rel);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == yaml {
            continue;
        }
        if check {
            eprintln!("{rel} is not current: run `cargo run -p rdu-crds --bin crdgen`");
            stale = true;
            continue;
        }
        if let Some(dir) = path.parent()
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            eprintln!("cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
        if let Err(e) = std::fs::write(&path, &yaml) {
            eprintln!("cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {rel}");
    }
    if stale {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
