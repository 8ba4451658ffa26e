//! The module tree of one crate: from its root file, every `mod` declaration followed to its
//! file (`x.rs` or `x/mod.rs`, or `#[path]`) or inline block, each module with the imports and
//! code paths written in it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::lex::tokenize;
use crate::parse::{CodePath, FileFacts, Located, UsePath, facts};

/// Index of a module in its [`CrateTree`].
pub type ModuleId = usize;

/// One module of a crate.
#[derive(Debug)]
pub struct Module {
    /// Path from the crate root: `[]` for the root, `["transport", "tcp"]`.
    pub path: Vec<String>,
    pub parent: Option<ModuleId>,
    pub children: BTreeMap<String, ModuleId>,
    /// The file its items are written in (the enclosing file for an inline module).
    pub file: PathBuf,
    /// Compiled only for tests (`#[cfg(test)]` on it or an ancestor).
    pub test_only: bool,
    pub uses: Vec<UsePath>,
    pub paths: Vec<CodePath>,
}

/// A crate's modules; the root is module 0.
#[derive(Debug)]
pub struct CrateTree {
    pub modules: Vec<Module>,
    /// `mod` declarations whose file was not found (file, line, name).
    pub missing: Vec<(PathBuf, usize, String)>,
}

impl CrateTree {
    /// Reads the crate whose root file is `root` and every module file it reaches.
    pub fn read(root: &Path) -> std::io::Result<CrateTree> {
        let mut tree = CrateTree {
            modules: Vec::new(),
            missing: Vec::new(),
        };
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        tree.add_file(None, Vec::new(), root, dir, false)?;
        Ok(tree)
    }

    /// `crate::a::b` for module `id`.
    pub fn name(&self, id: ModuleId) -> String {
        let mut name = String::from("crate");
        for segment in &self.modules[id].path {
            name.push_str("::");
            name.push_str(segment);
        }
        name
    }

    /// Whether `ancestor` is `id` or contains it.
    pub fn is_within(&self, id: ModuleId, ancestor: ModuleId) -> bool {
        let mut at = Some(id);
        while let Some(m) = at {
            if m == ancestor {
                return true;
            }
            at = self.modules[m].parent;
        }
        false
    }

    /// Adds the module written in `file` (its children's files under `child_dir`) and all
    /// it declares.
    fn add_file(
        &mut self,
        parent: Option<ModuleId>,
        path: Vec<String>,
        file: &Path,
        child_dir: PathBuf,
        test_only: bool,
    ) -> std::io::Result<ModuleId> {
        let source = std::fs::read_to_string(file)?;
        let facts = facts(&tokenize(&source));
        let id = self.push(parent, path, file, test_only);
        self.add_contents(id, file, child_dir, facts)?;
        Ok(id)
    }

    fn push(
        &mut self,
        parent: Option<ModuleId>,
        path: Vec<String>,
        file: &Path,
        test_only: bool,
    ) -> ModuleId {
        let id = self.modules.len();
        if let (Some(parent), Some(name)) = (parent, path.last()) {
            self.modules[parent].children.insert(name.clone(), id);
        }
        self.modules.push(Module {
            path,
            parent,
            children: BTreeMap::new(),
            file: file.to_path_buf(),
            test_only,
            uses: Vec::new(),
            paths: Vec::new(),
        });
        id
    }

    /// Places the facts of `file` (module `id`) in their modules, following declarations.
    fn add_contents(
        &mut self,
        id: ModuleId,
        file: &Path,
        child_dir: PathBuf,
        facts: FileFacts,
    ) -> std::io::Result<()> {
        // Inline modules first, in order, so later facts find their module.
        let mut inline_dirs: BTreeMap<Vec<String>, PathBuf> = BTreeMap::new();
        inline_dirs.insert(Vec::new(), child_dir);
        let mut file_mods = Vec::new();
        for Located { within, item } in facts.mods {
            let Some(container) = self.inline_module(id, &within) else {
                continue;
            };
            let dir = inline_dirs.get(&within).cloned().unwrap_or_default();
            let test_only = self.modules[container].test_only || item.test_only;
            let mut path = self.modules[container].path.clone();
            path.push(item.name.clone());
            if item.inline {
                self.push(Some(container), path, file, test_only);
                let mut inner = within.clone();
                inner.push(item.name.clone());
                inline_dirs.insert(inner, dir.join(&item.name));
            } else {
                file_mods.push((container, path, dir, item, test_only));
            }
        }
        for Located { within, item } in facts.uses {
            if let Some(m) = self.inline_module(id, &within) {
                self.modules[m].uses.push(item);
            }
        }
        for Located { within, item } in facts.paths {
            if let Some(m) = self.inline_module(id, &within) {
                self.modules[m].paths.push(item);
            }
        }
        for (container, path, dir, decl, test_only) in file_mods {
            let here = file.parent().unwrap_or(Path::new("."));
            let candidates = match &decl.path_attr {
                Some(p) => vec![here.join(p)],
                None => vec![
                    dir.join(format!("{}.rs", decl.name)),
                    dir.join(&decl.name).join("mod.rs"),
                ],
            };
            let Some(found) = candidates.into_iter().find(|c| c.is_file()) else {
                self.missing
                    .push((file.to_path_buf(), decl.line, decl.name.clone()));
                continue;
            };
            let child_dir = if found.file_name().is_some_and(|n| n == "mod.rs") {
                found.parent().unwrap_or(Path::new(".")).to_path_buf()
            } else {
                found.with_extension("")
            };
            self.add_file(Some(container), path, &found, child_dir, test_only)?;
        }
        Ok(())
    }

    /// The inline module `within` (names from `id` down), if it was declared.
    fn inline_module(&self, id: ModuleId, within: &[String]) -> Option<ModuleId> {
        let mut at = id;
        for name in within {
            at = *self.modules[at].children.get(name)?;
        }
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_inline_modules_and_paths_form_one_tree() {
        let dir = std::env::temp_dir().join(format!("module-cycles-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(
            dir.join("lib.rs"),
            "mod a;\nmod b;\n#[path = \"elsewhere.rs\"] mod c;\nmod gone;\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("a/mod.rs"),
            "mod inner;\n#[cfg(test)] mod tests { use crate::b::X; }",
        )
        .unwrap();
        std::fs::write(dir.join("a/inner.rs"), "use super::super::b::Y;").unwrap();
        std::fs::write(dir.join("b.rs"), "fn f() { crate::a::g(); }").unwrap();
        std::fs::write(dir.join("elsewhere.rs"), "").unwrap();
        let tree = CrateTree::read(&dir.join("lib.rs")).unwrap();
        let names: Vec<String> = (0..tree.modules.len()).map(|m| tree.name(m)).collect();
        assert_eq!(
            names,
            [
                "crate",
                "crate::a",
                "crate::a::tests",
                "crate::a::inner",
                "crate::b",
                "crate::c"
            ]
        );
        assert!(tree.modules[2].test_only && !tree.modules[3].test_only);
        assert_eq!(tree.modules[2].uses[0].segments, ["crate", "b", "X"]);
        assert_eq!(
            tree.modules[3].uses[0].segments,
            ["super", "super", "b", "Y"]
        );
        assert_eq!(tree.modules[4].paths[0].segments, ["crate", "a", "g"]);
        assert_eq!(tree.missing.len(), 1);
        assert!(tree.is_within(3, 1) && !tree.is_within(1, 3));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
