//! Which module uses which, and the circles among them.
//!
//! Every import and code path of a module is resolved to the deepest module it names
//! (`crate::`, `super::`, `self::`, a child module's name, or a name the module imported first;
//! re-exports such as `pub use ring::RingReader` are followed to the module that defines the
//! name). A use between a module and one of its ancestors is the ordinary facade pattern and
//! does not count. Any other use is lifted to the two sibling modules under the nearest common
//! ancestor (`transport::shm::ring` using `transport::tcp::framing` is `shm` using `tcp`), and a
//! circle is a strongly connected set of such siblings.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::tree::{CrateTree, ModuleId};

/// Where one module uses another: the file, line and path as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Evidence {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

/// Uses between sibling modules, lifted as described above, with where each was written.
pub type SiblingUses = BTreeMap<(ModuleId, ModuleId), BTreeSet<Evidence>>;

/// A set of sibling modules that use each other in a circle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The siblings, ascending by id.
    pub members: Vec<ModuleId>,
    /// Each use between two members, with its evidence.
    pub uses: Vec<((ModuleId, ModuleId), Vec<Evidence>)>,
}

/// How deep re-exports are followed (a re-export of a re-export…).
const MAX_HOPS: usize = 8;

/// Every use between sibling modules of `tree`.
pub fn sibling_uses(tree: &CrateTree) -> SiblingUses {
    let mut uses = SiblingUses::new();
    for (from, module) in tree.modules.iter().enumerate() {
        let written = module
            .uses
            .iter()
            .filter(|u| !u.absolute)
            .map(|u| (&u.segments, u.line))
            .chain(module.paths.iter().map(|p| (&p.segments, p.line)));
        for (segments, line) in written {
            let Some(to) = resolve(tree, from, segments, MAX_HOPS) else {
                continue;
            };
            if tree.is_within(from, to) || tree.is_within(to, from) {
                continue;
            }
            let (a, b) = siblings(tree, from, to);
            uses.entry((a, b)).or_default().insert(Evidence {
                file: module.file.clone(),
                line,
                path: segments.join("::"),
            });
        }
    }
    uses
}

/// The circles among sibling modules: strongly connected sets of two or more.
pub fn circles(uses: &SiblingUses) -> Vec<Circle> {
    let mut graph: BTreeMap<ModuleId, Vec<ModuleId>> = BTreeMap::new();
    for &(a, b) in uses.keys() {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    strongly_connected(&graph)
        .into_iter()
        .filter(|set| set.len() > 1)
        .map(|members| {
            let inside: Vec<_> = uses
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|(&pair, evidence)| (pair, evidence.iter().cloned().collect()))
                .collect();
            Circle {
                members,
                uses: inside,
            }
        })
        .collect()
}

/// The module `segments` names from module `from`, if it names one of this crate.
fn resolve(tree: &CrateTree, from: ModuleId, segments: &[String], hops: usize) -> Option<ModuleId> {
    let (first, rest) = segments.split_first()?;
    let mut at = match first.as_str() {
        "crate" => 0,
        "self" => from,
        "super" => tree.modules[from].parent?,
        name => match tree.modules[from].children.get(name) {
            Some(&child) => child,
            None => {
                let import = imported(tree, from, name)?;
                if hops == 0 {
                    return None;
                }
                let target = resolve(tree, from, &import.segments, hops - 1)?;
                return walk(tree, target, rest, hops - 1);
            }
        },
    };
    let mut rest = rest;
    while let Some((segment, tail)) = rest.split_first() {
        if segment != "super" {
            break;
        }
        at = tree.modules[at].parent?;
        rest = tail;
    }
    walk(tree, at, rest, hops)
}

/// From module `at` down `rest`, through child modules and re-exports.
fn walk(tree: &CrateTree, mut at: ModuleId, rest: &[String], hops: usize) -> Option<ModuleId> {
    for segment in rest {
        if let Some(&child) = tree.modules[at].children.get(segment) {
            at = child;
            continue;
        }
        let reexport = tree.modules[at]
            .uses
            .iter()
            .find(|u| u.public && !u.absolute && u.binding.as_deref() == Some(segment));
        if let Some(reexport) = reexport
            && hops > 0
            && let Some(target) = resolve(tree, at, &reexport.segments, hops - 1)
        {
            return Some(target);
        }
        break;
    }
    Some(at)
}

/// The import that binds `name` in module `m`.
fn imported<'a>(tree: &'a CrateTree, m: ModuleId, name: &str) -> Option<&'a crate::parse::UsePath> {
    tree.modules[m]
        .uses
        .iter()
        .find(|u| !u.absolute && u.binding.as_deref() == Some(name))
}

/// The children of the nearest common ancestor of `a` and `b` that contain them.
fn siblings(tree: &CrateTree, a: ModuleId, b: ModuleId) -> (ModuleId, ModuleId) {
    let chain = |mut m: ModuleId| {
        let mut up = vec![m];
        while let Some(parent) = tree.modules[m].parent {
            up.push(parent);
            m = parent;
        }
        up.reverse();
        up
    };
    let (ca, cb) = (chain(a), chain(b));
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    (ca[common], cb[common])
}

/// Tarjan's strongly connected components; each component ascending.
fn strongly_connected(graph: &BTreeMap<ModuleId, Vec<ModuleId>>) -> Vec<Vec<ModuleId>> {
    struct State<'g> {
        graph: &'g BTreeMap<ModuleId, Vec<ModuleId>>,
        next: usize,
        index: BTreeMap<ModuleId, usize>,
        low: BTreeMap<ModuleId, usize>,
        stack: Vec<ModuleId>,
        on_stack: BTreeSet<ModuleId>,
        out: Vec<Vec<ModuleId>>,
    }
    fn visit(s: &mut State<'_>, v: ModuleId) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in s.graph.get(&v).map(Vec::as_slice).unwrap_or_default() {
            if !s.index.contains_key(&w) {
                visit(s, w);
                let low = s.low[&v].min(s.low[&w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(&w) {
                let low = s.low[&v].min(s.index[&w]);
                s.low.insert(v, low);
            }
        }
        if s.low[&v] == s.index[&v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                set.push(w);
                if w == v {
                    break;
                }
            }
            set.sort_unstable();
            s.out.push(set);
        }
    }
    let mut state = State {
        graph,
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !state.index.contains_key(&v) {
            visit(&mut state, v);
        }
    }
    state.out.sort();
    state.out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate written to a temporary directory: (file under `src/`, contents).
    fn crate_of(name: &str, files: &[(&str, &str)]) -> (CrateTree, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("module-cycles-graph-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (file, contents) in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }
        (CrateTree::read(&dir.join("lib.rs")).unwrap(), dir)
    }

    fn named(tree: &CrateTree, circles: &[Circle]) -> Vec<Vec<String>> {
        circles
            .iter()
            .map(|c| c.members.iter().map(|&m| tree.name(m)).collect())
            .collect()
    }

    #[test]
    fn a_circle_through_nested_modules_is_found_between_the_siblings() {
        let (tree, dir) = crate_of(
            "nested",
            &[
                ("lib.rs", "mod compression;\nmod transport;"),
                ("compression.rs", "use crate::transport::inbox::Apply;"),
                ("transport/mod.rs", "mod inbox;"),
                (
                    "transport/inbox.rs",
                    "fn f() { crate::compression::decode(); }",
                ),
            ],
        );
        let found = circles(&sibling_uses(&tree));
        assert_eq!(
            named(&tree, &found),
            [["crate::compression", "crate::transport"]]
        );
        let evidence: Vec<&str> = found[0]
            .uses
            .iter()
            .flat_map(|(_, e)| e.iter().map(|e| e.path.as_str()))
            .collect();
        assert_eq!(
            evidence,
            [
                "crate::transport::inbox::Apply",
                "crate::compression::decode"
            ]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn parents_and_children_using_each_other_are_no_circle() {
        let (tree, dir) = crate_of(
            "facade",
            &[
                ("lib.rs", "mod t;\npub use t::Link;"),
                ("t/mod.rs", "mod tcp;\npub use tcp::Link;\nstruct Id;"),
                ("t/tcp.rs", "use super::Id;\nuse crate::t::Id as Same;"),
            ],
        );
        assert!(circles(&sibling_uses(&tree)).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn relative_paths_imports_and_reexports_are_followed() {
        let (tree, dir) = crate_of(
            "reexports",
            &[
                ("lib.rs", "mod a;\nmod b;\npub use b::Thing;"),
                // `crate::Thing` is b's, through the root's re-export; `inner` is a's child.
                ("a/mod.rs", "mod inner;\nuse crate::Thing;"),
                (
                    "a/inner.rs",
                    "use super::super::b as other;\nfn f() { other::g(); }",
                ),
                (
                    "b/mod.rs",
                    "mod deep;\npub(crate) use deep::Back;\nfn h() { deep::x(); }",
                ),
                ("b/deep.rs", "use crate::a::inner;\nfn k() { inner::z(); }"),
            ],
        );
        let uses = sibling_uses(&tree);
        let pairs: Vec<(String, String)> = uses
            .keys()
            .map(|&(x, y)| (tree.name(x), tree.name(y)))
            .collect();
        assert_eq!(
            pairs,
            [
                ("crate::a".to_string(), "crate::b".to_string()),
                ("crate::b".to_string(), "crate::a".to_string()),
            ]
        );
        assert_eq!(uses.values().map(BTreeSet::len).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(circles(&uses).len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_one_way_chain_is_no_circle() {
        let (tree, dir) = crate_of(
            "chain",
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;"),
                ("a.rs", "use crate::b::X;"),
                ("b.rs", "use crate::c::Y;"),
                ("c.rs", "use std::io;"),
            ],
        );
        let uses = sibling_uses(&tree);
        assert_eq!(uses.len(), 2);
        assert!(circles(&uses).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
