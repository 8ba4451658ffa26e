//! Import circles between the modules of one crate, for every crate of a Cargo workspace: a
//! plain parse of `mod` declarations, `use` items and paths in code (no compiler, no network
//! install), enough to hold a crate's layering in place. See `graph` for what counts as a use
//! and as a circle.

pub mod graph;
pub mod lex;
pub mod parse;
pub mod tree;
pub mod workspace;

use std::fmt;
use std::path::Path;

use graph::Evidence;
use tree::CrateTree;
pub use workspace::WorkspaceError;

/// A circle among the modules of one crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrateCircle {
    /// The crate: `rdu-collective (lib)`.
    pub target: String,
    /// The sibling modules in the circle: `crate::compression`, `crate::transport`.
    pub modules: Vec<String>,
    /// Each use between two of them, with where it is written (paths relative to the workspace).
    pub uses: Vec<(String, String, Vec<Evidence>)>,
}

impl CrateCircle {
    /// Every file that holds a use of the circle, sorted, each once.
    pub fn files(&self) -> Vec<String> {
        let mut files: Vec<String> = self
            .uses
            .iter()
            .flat_map(|(_, _, evidence)| evidence.iter().map(|e| e.file.display().to_string()))
            .collect();
        files.sort();
        files.dedup();
        files
    }
}

impl fmt::Display for CrateCircle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: import circle between {}",
            self.target,
            self.modules.join(", ")
        )?;
        for (from, to, evidence) in &self.uses {
            writeln!(f, "  {from} -> {to}")?;
            for e in evidence.iter().take(4) {
                writeln!(f, "    {}:{}  {}", e.file.display(), e.line, e.path)?;
            }
            if evidence.len() > 4 {
                writeln!(f, "    … and {} more", evidence.len() - 4)?;
            }
        }
        Ok(())
    }
}

/// What a check of a workspace found.
#[derive(Debug, Default)]
pub struct Report {
    /// Crates (targets) read.
    pub crates: usize,
    /// Modules read, over all crates.
    pub modules: usize,
    pub circles: Vec<CrateCircle>,
    /// `mod` declarations whose file does not exist: `file:line mod name`.
    pub missing: Vec<String>,
}

/// Checks every crate of the workspace at `root`.
pub fn check(root: &Path) -> Result<Report, WorkspaceError> {
    let mut report = Report::default();
    for target in workspace::targets(root)? {
        let tree = CrateTree::read(&root.join(&target.root))
            .map_err(|e| WorkspaceError(format!("reading {}: {e}", target.root.display())))?;
        report.crates += 1;
        report.modules += tree.modules.len();
        let relative = |file: &Path| file.strip_prefix(root).unwrap_or(file).to_path_buf();
        for (file, line, name) in &tree.missing {
            report
                .missing
                .push(format!("{}:{line} mod {name}", relative(file).display()));
        }
        for circle in graph::circles(&graph::sibling_uses(&tree)) {
            report.circles.push(CrateCircle {
                target: target.label.clone(),
                modules: circle.members.iter().map(|&m| tree.name(m)).collect(),
                uses: circle
                    .uses
                    .iter()
                    .map(|&((a, b), ref evidence)| {
                        let evidence = evidence
                            .iter()
                            .map(|e| Evidence {
                                file: relative(&e.file),
                                ..e.clone()
                            })
                            .collect();
                        (tree.name(a), tree.name(b), evidence)
                    })
                    .collect(),
            });
        }
    }
    Ok(report)
}
