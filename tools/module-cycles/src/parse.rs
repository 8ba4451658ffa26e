//! What one source file says about modules: the modules it declares (`mod x;` and inline
//! `mod x { … }`, with `#[cfg(test)]` and `#[path]`), its `use` items expanded into one path per
//! imported name, and every other path of two or more segments in its code. Each is tagged with
//! the inline modules it sits in.

use crate::lex::{Spanned, Token};

/// One imported name of a `use` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsePath {
    /// The path as written (`crate`, `super`, `self` kept; a leading `::` dropped, see
    /// `absolute`); a trailing `self` of `a::{self}` is removed.
    pub segments: Vec<String>,
    /// `::std::…`: never a path into this crate.
    pub absolute: bool,
    /// The name it is bound to (`as` alias, else its last segment); `None` for `*`.
    pub binding: Option<String>,
    /// Visible outside its module (`pub`, `pub(crate)`, `pub(super)`…): a re-export.
    pub public: bool,
    pub line: usize,
}

/// A path in code, such as `crate::kernels::add` or `super::framing::HEADER_LEN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodePath {
    pub segments: Vec<String>,
    pub line: usize,
}

/// A `mod` declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModDecl {
    pub name: String,
    /// `mod x { … }` rather than `mod x;`.
    pub inline: bool,
    /// Under `#[cfg(test)]` (or a `cfg` naming `test`).
    pub test_only: bool,
    /// `#[path = "…"]`.
    pub path_attr: Option<String>,
    pub line: usize,
}

/// Something a file says, inside the inline modules `within` (outermost first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    pub within: Vec<String>,
    pub item: T,
}

/// Everything one file says about modules and paths.
#[derive(Debug, Default)]
pub struct FileFacts {
    pub mods: Vec<Located<ModDecl>>,
    pub uses: Vec<Located<UsePath>>,
    pub paths: Vec<Located<CodePath>>,
}

/// The facts of one file's tokens.
pub fn facts(tokens: &[Spanned]) -> FileFacts {
    let mut parser = Parser {
        tokens,
        at: 0,
        depth: 0,
        inline: Vec::new(),
        attrs: Vec::new(),
        facts: FileFacts::default(),
    };
    parser.run();
    parser.facts
}

struct Parser<'a> {
    tokens: &'a [Spanned],
    at: usize,
    /// Braces open at the cursor.
    depth: usize,
    /// Inline modules open at the cursor: name and the depth inside their braces.
    inline: Vec<(String, usize)>,
    /// Attributes read since the last item boundary.
    attrs: Vec<Vec<Token>>,
    facts: FileFacts,
}

impl Parser<'_> {
    fn token(&self, at: usize) -> Option<&Token> {
        self.tokens.get(at).map(|t| &t.token)
    }

    fn ident(&self, at: usize) -> Option<&str> {
        match self.token(at) {
            Some(Token::Ident(name)) => Some(name),
            _ => None,
        }
    }

    fn within(&self) -> Vec<String> {
        self.inline.iter().map(|(name, _)| name.clone()).collect()
    }

    fn run(&mut self) {
        while let Some(token) = self.token(self.at).cloned() {
            match token {
                Token::Punct('#') => self.attribute(),
                Token::Punct('{') => {
                    self.depth += 1;
                    self.attrs.clear();
                    self.at += 1;
                }
                Token::Punct('}') => {
                    if self.inline.last().is_some_and(|(_, d)| *d == self.depth) {
                        self.inline.pop();
                    }
                    self.depth = self.depth.saturating_sub(1);
                    self.attrs.clear();
                    self.at += 1;
                }
                Token::Punct(';') => {
                    self.attrs.clear();
                    self.at += 1;
                }
                Token::Ident(ref word) if word == "mod" && self.ident(self.at + 1).is_some() => {
                    self.module()
                }
                Token::Ident(ref word) if word == "use" => self.use_item(),
                Token::Ident(_) => self.code_path(),
                _ => self.at += 1,
            }
        }
    }

    /// `#[…]` or `#![…]`: kept for the next item; the paths it names (`#[error("…", crate::a::B)]`) are
    /// imports like those of code.
    fn attribute(&mut self) {
        let mut at = self.at + 1;
        if self.token(at) == Some(&Token::Punct('!')) {
            at += 1;
        }
        if self.token(at) != Some(&Token::Punct('[')) {
            self.at += 1;
            return;
        }
        let open = at;
        let mut depth = 0;
        let mut body = Vec::new();
        while let Some(token) = self.token(at) {
            match token {
                Token::Punct('[') => depth += 1,
                Token::Punct(']') => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            if depth > 1 || !matches!(token, Token::Punct('[')) {
                body.push(token.clone());
            }
            at += 1;
        }
        let mut inside = open + 1;
        while inside < at {
            if self.ident(inside).is_some() {
                self.at = inside;
                self.code_path();
                inside = self.at.max(inside + 1);
            } else {
                inside += 1;
            }
        }
        self.attrs.push(body);
        self.at = at + 1;
    }

    fn module(&mut self) {
        let line = self.tokens[self.at].line;
        let name = self.ident(self.at + 1).unwrap_or_default().to_string();
        let inline = self.token(self.at + 2) == Some(&Token::Punct('{'));
        let test_only = self.attrs.iter().any(|attr| names_test_cfg(attr));
        let path_attr = self.attrs.iter().find_map(|attr| match attr.as_slice() {
            [Token::Ident(path), Token::Punct('='), Token::Str(value)] if path == "path" => {
                Some(value.clone())
            }
            _ => None,
        });
        self.facts.mods.push(Located {
            within: self.within(),
            item: ModDecl {
                name: name.clone(),
                inline,
                test_only,
                path_attr,
                line,
            },
        });
        self.attrs.clear();
        if inline {
            self.depth += 1;
            self.inline.push((name, self.depth));
            self.at += 3;
        } else {
            self.at += 2;
        }
    }

    /// Whether the `use` at the cursor follows a visibility (`pub`, `pub(…)`).
    fn public_use(&self) -> bool {
        if self.at == 0 {
            return false;
        }
        let before = self.at - 1;
        if self.ident(before) == Some("pub") {
            return true;
        }
        if self.token(before) != Some(&Token::Punct(')')) {
            return false;
        }
        let mut at = before;
        while at > 0 && self.token(at) != Some(&Token::Punct('(')) {
            at -= 1;
        }
        at > 0 && self.ident(at - 1) == Some("pub")
    }

    fn use_item(&mut self) {
        let public = self.public_use();
        let line = self.tokens[self.at].line;
        self.at += 1;
        let absolute = self.token(self.at) == Some(&Token::PathSep);
        if absolute {
            self.at += 1;
        }
        let mut paths = Vec::new();
        self.use_tree(Vec::new(), &mut paths);
        while self.token(self.at).is_some_and(|t| *t != Token::Punct(';')) {
            self.at += 1;
        }
        let within = self.within();
        for (mut segments, binding) in paths {
            let binding = match binding {
                Binding::Glob => None,
                Binding::As(alias) => Some(alias),
                Binding::Last => {
                    if segments.last().is_some_and(|s| s == "self") {
                        segments.pop();
                    }
                    segments.last().cloned()
                }
            };
            self.facts.uses.push(Located {
                within: within.clone(),
                item: UsePath {
                    segments,
                    absolute,
                    binding,
                    public,
                    line,
                },
            });
        }
    }

    /// One use tree after `prefix`: `a::b`, `a::b as c`, `a::*`, `a::{…}`.
    fn use_tree(&mut self, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Binding)>) {
        let mut segments = prefix;
        loop {
            match self.token(self.at).cloned() {
                Some(Token::Ident(name)) => {
                    segments.push(name);
                    self.at += 1;
                    match self.token(self.at) {
                        Some(Token::PathSep) => self.at += 1,
                        Some(Token::Ident(word)) if word == "as" => {
                            let alias = self.ident(self.at + 1).unwrap_or("_").to_string();
                            self.at += 2;
                            out.push((segments, Binding::As(alias)));
                            return;
                        }
                        _ => {
                            out.push((segments, Binding::Last));
                            return;
                        }
                    }
                }
                Some(Token::Punct('*')) => {
                    self.at += 1;
                    out.push((segments, Binding::Glob));
                    return;
                }
                Some(Token::Punct('{')) => {
                    self.at += 1;
                    loop {
                        match self.token(self.at) {
                            Some(Token::Punct('}')) => {
                                self.at += 1;
                                return;
                            }
                            Some(Token::Punct(',')) => self.at += 1,
                            None | Some(Token::Punct(';')) => return,
                            Some(_) => self.use_tree(segments.clone(), out),
                        }
                    }
                }
                _ => return,
            }
        }
    }

    /// A path starting at the cursor's identifier; recorded when it has two segments or more.
    fn code_path(&mut self) {
        let line = self.tokens[self.at].line;
        let follows_separator = self.at > 0 && self.token(self.at - 1) == Some(&Token::PathSep);
        let mut segments = Vec::new();
        while let Some(name) = self.ident(self.at) {
            segments.push(name.to_string());
            self.at += 1;
            if self.token(self.at) == Some(&Token::PathSep) && self.ident(self.at + 1).is_some() {
                self.at += 1;
            } else {
                break;
            }
        }
        if segments.len() >= 2 && !follows_separator {
            self.facts.paths.push(Located {
                within: self.within(),
                item: CodePath { segments, line },
            });
        }
    }
}

enum Binding {
    Last,
    As(String),
    Glob,
}

/// Whether an attribute is a `cfg` whose predicate names `test`.
fn names_test_cfg(attr: &[Token]) -> bool {
    matches!(attr.first(), Some(Token::Ident(cfg)) if cfg == "cfg")
        && attr
            .iter()
            .any(|t| matches!(t, Token::Ident(name) if name == "test"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lex::tokenize;

    fn of(source: &str) -> FileFacts {
        facts(&tokenize(source))
    }

    fn joined(u: &UsePath) -> String {
        u.segments.join("::")
    }

    #[test]
    fn use_trees_expand_into_one_path_per_name() {
        let f = of("pub(crate) use crate::a::{b::{self, C}, d as e, f::*};\nuse ::std::io;");
        let uses: Vec<(String, Option<String>, bool)> = f
            .uses
            .iter()
            .map(|u| (joined(&u.item), u.item.binding.clone(), u.item.public))
            .collect();
        assert_eq!(
            uses,
            vec![
                ("crate::a::b".into(), Some("b".into()), true),
                ("crate::a::b::C".into(), Some("C".into()), true),
                ("crate::a::d".into(), Some("e".into()), true),
                ("crate::a::f".into(), None, true),
                ("std::io".into(), Some("io".into()), false),
            ]
        );
        assert!(f.uses[4].item.absolute && !f.uses[0].item.absolute);
        assert_eq!(f.uses[4].item.line, 2);
    }

    #[test]
    fn modules_inline_test_and_path_attributes_are_seen() {
        let source = r#"
            mod a;
            #[path = "other.rs"] mod b;
            #[cfg(test)]
            mod tests {
                use super::a::X;
                fn f() { crate::c::d(); }
            }
            fn g() { super::e::h(); }
        "#;
        let f = of(source);
        let mods: Vec<(&str, bool, bool, Option<&str>)> = f
            .mods
            .iter()
            .map(|m| {
                (
                    m.item.name.as_str(),
                    m.item.inline,
                    m.item.test_only,
                    m.item.path_attr.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            mods,
            vec![
                ("a", false, false, None),
                ("b", false, false, Some("other.rs")),
                ("tests", true, true, None),
            ]
        );
        assert_eq!(f.uses[0].within, vec!["tests".to_string()]);
        let paths: Vec<(String, Vec<String>)> = f
            .paths
            .iter()
            .map(|p| (p.item.segments.join("::"), p.within.clone()))
            .collect();
        assert_eq!(
            paths,
            vec![
                ("crate::c::d".into(), vec!["tests".to_string()]),
                ("super::e::h".into(), vec![]),
            ]
        );
    }

    #[test]
    fn paths_named_in_attributes_are_paths() {
        let source = r#"
            #[derive(Debug, thiserror::Error)]
            enum E {
                #[error("{} is missing", crate::cluster_cli::CLUSTER_CLI)]
                Missing,
            }
        "#;
        let paths: Vec<String> = of(source)
            .paths
            .iter()
            .map(|p| p.item.segments.join("::"))
            .collect();
        assert_eq!(
            paths,
            vec![
                "thiserror::Error".to_string(),
                "crate::cluster_cli::CLUSTER_CLI".to_string()
            ]
        );
    }

    #[test]
    fn single_identifiers_and_path_tails_are_not_paths() {
        let f = of("let x = y; Vec::<u8>::new(); a::b::c");
        let paths: Vec<String> = f.paths.iter().map(|p| p.item.segments.join("::")).collect();
        assert_eq!(paths, vec!["a::b::c".to_string()]);
    }
}
