//! The crates of a Cargo workspace: its members (`members = [...]` of the root `Cargo.toml`) and
//! each member's targets, found where Cargo looks for them (`src/lib.rs`, `src/main.rs`,
//! `src/bin/`, `tests/`, `benches/`, `examples/`) and where a `path = "…"` names them.

use std::path::{Path, PathBuf};

/// One crate to check: a target of a workspace member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `rdu-collective (lib)`, `rdu-collective (tests/all_reduce.rs)`.
    pub label: String,
    /// Its root file.
    pub root: PathBuf,
}

/// Why the workspace could not be read.
#[derive(Debug)]
pub struct WorkspaceError(pub String);

impl std::fmt::Display for WorkspaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WorkspaceError {}

/// Every target of every member of the workspace at `root`.
pub fn targets(root: &Path) -> Result<Vec<Target>, WorkspaceError> {
    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| WorkspaceError(format!("cannot read {}: {e}", manifest.display())))?;
    let members = array_of(&text, "members").ok_or_else(|| {
        WorkspaceError(format!(
            "{} has no `members = [...]`: point at a workspace root",
            manifest.display()
        ))
    })?;
    let mut out = Vec::new();
    for member in members {
        out.extend(member_targets(root, &root.join(&member))?);
    }
    Ok(out)
}

fn member_targets(root: &Path, dir: &Path) -> Result<Vec<Target>, WorkspaceError> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| WorkspaceError(format!("cannot read {}: {e}", manifest.display())))?;
    let name = string_value(&text, "name").unwrap_or_else(|| dir.display().to_string());
    let mut roots: Vec<PathBuf> = ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    roots.extend(
        text.lines()
            .filter_map(|line| string_value(line, "path"))
            .map(|p| dir.join(p)),
    );
    for folder in ["src/bin", "tests", "benches", "examples"] {
        let Ok(entries) = std::fs::read_dir(dir.join(folder)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter_map(|p| {
                if p.extension().is_some_and(|e| e == "rs") {
                    Some(p)
                } else {
                    let main = p.join("main.rs");
                    (folder != "tests" && main.is_file()).then_some(main)
                }
            })
            .collect();
        found.sort();
        roots.extend(found);
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for file in roots {
        if !file.is_file() || seen.contains(&file) {
            continue;
        }
        seen.push(file.clone());
        let shown = file
            .strip_prefix(dir)
            .unwrap_or(&file)
            .display()
            .to_string();
        let kind = match shown.as_str() {
            "src/lib.rs" => "lib".to_string(),
            "src/main.rs" => "bin".to_string(),
            other => other.to_string(),
        };
        out.push(Target {
            label: format!("{name} ({kind})"),
            root: file
                .strip_prefix(root)
                .map(Path::to_path_buf)
                .unwrap_or(file),
        });
    }
    Ok(out)
}

/// The strings of `key = [ "…", … ]`, which may span lines.
fn array_of(text: &str, key: &str) -> Option<Vec<String>> {
    let start = text
        .lines()
        .scan(0, |offset, line| {
            let at = *offset;
            *offset += line.len() + 1;
            Some((at, line))
        })
        .find(|(_, line)| line.trim_start().starts_with(key) && line.contains('='))
        .map(|(at, _)| at)?;
    let rest = &text[start..];
    let open = rest.find('[')?;
    let close = open + rest[open..].find(']')?;
    Some(
        rest[open + 1..close]
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

/// The value of the first `key = "…"` line.
fn string_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_their_targets_are_found() {
        let dir = std::env::temp_dir().join(format!("module-cycles-ws-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for file in [
            "a/src/lib.rs",
            "a/src/main.rs",
            "a/src/bin/tool.rs",
            "a/tests/it.rs",
            "a/tests/common/mod.rs",
            "b/c/src/other.rs",
        ] {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        std::fs::write(
            dir.join("Cargo.toml"),
            "[workspace]\nmembers = [\n  \"a\",\n  \"b/c\",\n]\n",
        )
        .unwrap();
        std::fs::write(dir.join("a/Cargo.toml"), "[package]\nname = \"pa\"\n").unwrap();
        std::fs::write(
            dir.join("b/c/Cargo.toml"),
            "[package]\nname = \"pc\"\n[[bin]]\nname = \"x\"\npath = \"src/other.rs\"\n",
        )
        .unwrap();
        let found: Vec<(String, PathBuf)> = targets(&dir)
            .unwrap()
            .into_iter()
            .map(|t| (t.label, t.root))
            .collect();
        assert_eq!(
            found,
            [
                ("pa (lib)".to_string(), PathBuf::from("a/src/lib.rs")),
                ("pa (bin)".to_string(), PathBuf::from("a/src/main.rs")),
                (
                    "pa (src/bin/tool.rs)".to_string(),
                    PathBuf::from("a/src/bin/tool.rs")
                ),
                (
                    "pa (tests/it.rs)".to_string(),
                    PathBuf::from("a/tests/it.rs")
                ),
                (
                    "pc (src/other.rs)".to_string(),
                    PathBuf::from("b/c/src/other.rs")
                ),
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
