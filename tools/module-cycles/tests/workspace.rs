//! No crate of this workspace has an import circle between its modules, beyond the ones listed
//! in `KNOWN` (none today): circles found when the check was written, reported and waiting to be fixed by
//! whoever owns the crate. The list only shrinks: a new circle fails the test, and so does a
//! listed one that is gone (remove it from the list, so it cannot come back unnoticed).

use std::path::Path;

use rdu_module_cycles::{CrateCircle, check};

/// Circles known when the check was written: (crate, the modules of the circle).
const KNOWN: &[(&str, &[&str])] = &[];

fn is_known(circle: &CrateCircle) -> bool {
    KNOWN
        .iter()
        .any(|(target, modules)| *target == circle.target && circle.modules == *modules)
}

#[test]
fn no_crate_has_an_import_circle_beyond_the_known_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let report = check(&root).expect("the workspace is readable");
    assert!(
        report.crates >= 20 && report.modules >= 200,
        "read only {} crates and {} modules: is {} the workspace?",
        report.crates,
        report.modules,
        root.display()
    );
    assert!(
        report.missing.is_empty(),
        "module files not found, so not checked: {:?}",
        report.missing
    );
    let new: Vec<String> = report
        .circles
        .iter()
        .filter(|c| !is_known(c))
        .map(ToString::to_string)
        .collect();
    assert!(
        new.is_empty(),
        "import circles between modules (move what both sides need into a module of its own, \
         or make one side stop importing the other):\n{}",
        new.join("\n")
    );
    let gone: Vec<String> = KNOWN
        .iter()
        .filter(|(target, modules)| {
            !report
                .circles
                .iter()
                .any(|c| c.target == *target && c.modules == *modules)
        })
        .map(|(target, modules)| format!("{target}: {}", modules.join(", ")))
        .collect();
    assert!(
        gone.is_empty(),
        "these circles are fixed: remove them from KNOWN in {}:\n{}",
        file!(),
        gone.join("\n")
    );
}
