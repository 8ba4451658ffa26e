//! A lexer for just enough Rust to find module declarations and paths: identifiers, `::`,
//! and single punctuation characters, each with its line. Comments, string, byte-string,
//! raw-string and character literals, and numbers are skipped, so a path inside a comment or a
//! string is never taken for code.

/// One token of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// An identifier or keyword (`r#` stripped from raw identifiers).
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// The contents of a string literal (escapes left as written), for `#[path = "…"]`.
    Str(String),
}

/// A token and the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spanned {
    pub token: Token,
    pub line: usize,
}

/// The tokens of `source`.
pub fn tokenize(source: &str) -> Vec<Spanned> {
    let chars: Vec<char> = source.chars().collect();
    let mut lexer = Lexer {
        chars: &chars,
        at: 0,
        line: 1,
        out: Vec::new(),
    };
    lexer.run();
    lexer.out
}

struct Lexer<'a> {
    chars: &'a [char],
    at: usize,
    line: usize,
    out: Vec<Spanned>,
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    /// Moves past one character, counting lines.
    fn bump(&mut self) {
        if self.peek(0) == Some('\n') {
            self.line += 1;
        }
        self.at += 1;
    }

    fn push(&mut self, token: Token, line: usize) {
        self.out.push(Spanned { token, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            let line = self.line;
            match c {
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => {
                    let text = self.string();
                    self.push(Token::Str(text), line);
                }
                'r' if self.raw_string_start(1) => {
                    self.bump();
                    let text = self.raw_string();
                    self.push(Token::Str(text), line);
                }
                'b' if self.peek(1) == Some('"') => {
                    self.bump();
                    self.string();
                }
                'b' if self.peek(1) == Some('r') && self.raw_string_start(2) => {
                    self.bump();
                    self.bump();
                    self.raw_string();
                }
                'b' if self.peek(1) == Some('\'') => {
                    self.bump();
                    self.quote();
                }
                'r' if self.peek(1) == Some('#') && self.peek(2).is_some_and(is_ident_start) => {
                    self.bump();
                    self.bump();
                    let ident = self.ident();
                    self.push(Token::Ident(ident), line);
                }
                '\'' => self.quote(),
                ':' if self.peek(1) == Some(':') => {
                    self.bump();
                    self.bump();
                    self.push(Token::PathSep, line);
                }
                c if is_ident_start(c) => {
                    let ident = self.ident();
                    self.push(Token::Ident(ident), line);
                }
                c if c.is_ascii_digit() => {
                    while self
                        .peek(0)
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    {
                        self.bump();
                    }
                }
                c if c.is_whitespace() => self.bump(),
                c => {
                    self.bump();
                    self.push(Token::Punct(c), line);
                }
            }
        }
    }

    fn ident(&mut self) -> String {
        let start = self.at;
        while self
            .peek(0)
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            self.bump();
        }
        self.chars[start..self.at].iter().collect()
    }

    fn line_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    /// A block comment, nested ones included.
    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            if c == '/' && self.peek(1) == Some('*') {
                depth += 1;
                self.bump();
            } else if c == '*' && self.peek(1) == Some('/') {
                depth -= 1;
                self.bump();
                if depth == 0 {
                    self.bump();
                    return;
                }
            }
            self.bump();
        }
    }

    /// A `"…"` literal with escapes (the opening quote at the cursor); its contents.
    fn string(&mut self) -> String {
        self.bump();
        let start = self.at;
        while let Some(c) = self.peek(0) {
            match c {
                '\\' => {
                    self.bump();
                    self.bump();
                }
                '"' => {
                    let text = self.chars[start..self.at].iter().collect();
                    self.bump();
                    return text;
                }
                _ => self.bump(),
            }
        }
        self.chars[start..].iter().collect()
    }

    /// Whether `r`, `#`…, `"` starts at `ahead` (the character after the `r`).
    fn raw_string_start(&self, ahead: usize) -> bool {
        let mut i = ahead;
        while self.peek(i) == Some('#') {
            i += 1;
        }
        self.peek(i) == Some('"')
    }

    /// A raw string from its `#`s or quote (the `r` already passed); its contents.
    fn raw_string(&mut self) -> String {
        let mut hashes = 0;
        while self.peek(0) == Some('#') {
            hashes += 1;
            self.bump();
        }
        self.bump();
        let start = self.at;
        while self.peek(0).is_some() {
            if self.peek(0) == Some('"') && (1..=hashes).all(|i| self.peek(i) == Some('#')) {
                let text = self.chars[start..self.at].iter().collect();
                for _ in 0..=hashes {
                    self.bump();
                }
                return text;
            }
            self.bump();
        }
        self.chars[start..].iter().collect()
    }

    /// A character literal, or a lifetime (which is dropped, quote and name).
    fn quote(&mut self) {
        self.bump();
        match (self.peek(0), self.peek(1)) {
            (Some('\\'), _) => {
                while self.peek(0).is_some_and(|c| c != '\'') {
                    if self.peek(0) == Some('\\') {
                        self.bump();
                    }
                    self.bump();
                }
                self.bump();
            }
            (Some(_), Some('\'')) => {
                self.bump();
                self.bump();
            }
            _ => {
                self.ident();
            }
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(source: &str) -> Vec<String> {
        tokenize(source)
            .into_iter()
            .filter_map(|t| match t.token {
                Token::Ident(i) => Some(i),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_chars_and_lifetimes_hide_nothing_that_is_code() {
        let source = r####"
            // use crate::commented;
            /* use crate::block; /* nested */ still */
            let s = "crate::in_string \" escaped";
            let r = r#"crate::raw "quoted" "#;
            let b = b"crate::bytes"; let rb = br##"x"##;
            let c = '"'; let e = '\''; let u = b'x';
            fn f<'a>(x: &'a str) -> &'static str { crate::real::path }
        "####;
        let found = idents(source);
        assert!(!found.iter().any(|i| i == "commented" || i == "block"));
        assert!(
            !found
                .iter()
                .any(|i| i == "in_string" || i == "raw" || i == "bytes")
        );
        assert!(
            !found.iter().any(|i| i == "a" || i == "static"),
            "{found:?}"
        );
        assert!(found.ends_with(&["crate".into(), "real".into(), "path".into()]));
    }

    #[test]
    fn path_separators_and_lines_are_kept() {
        let tokens = tokenize("a::b\n  r#mod::c");
        assert_eq!(
            tokens,
            vec![
                Spanned {
                    token: Token::Ident("a".into()),
                    line: 1
                },
                Spanned {
                    token: Token::PathSep,
                    line: 1
                },
                Spanned {
                    token: Token::Ident("b".into()),
                    line: 1
                },
                Spanned {
                    token: Token::Ident("mod".into()),
                    line: 2
                },
                Spanned {
                    token: Token::PathSep,
                    line: 2
                },
                Spanned {
                    token: Token::Ident("c".into()),
                    line: 2
                },
            ]
        );
    }
}
