//! How rdu-operator shows an error: its message, then each cause's, on one line (`outer: inner: innermost`, as
//! anyhow's `{:#}`). The project's own errors keep their cause out of their message and expose it as `source`, so
//! whatever shows an error to people (a log line, a condition, an event, a termination message, the CLI) shows
//! `Chain(&error)`. A cause whose text the line already ends with is not repeated: some other crates' errors put
//! their source's text in their own message too.

use std::error::Error;
use std::fmt;

/// An error and its causes, displayed on one line.
#[derive(Clone, Copy, Debug)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&chain(self.0))
    }
}

/// `error` and its causes as one line (see the module).
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = inner.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}")]
    struct Read {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("loading the job")]
    struct Load(#[source] Read);

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped: {0}")]
    struct Repeats(#[source] std::io::Error);

    fn missing() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn every_cause_is_shown_once_in_order() {
        let load = Load(Read {
            path: "job.yaml",
            source: missing(),
        });
        assert_eq!(
            Chain(&load).to_string(),
            "loading the job: cannot read job.yaml: no such file"
        );
        // An error that repeats its cause's text does not show it twice.
        assert_eq!(chain(&Repeats(missing())), "wrapped: no such file");
    }
}
