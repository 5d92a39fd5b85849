//! Identifiers with one validation rule each, for every layer.
//!
//! A run id is also a file name (the NDJSON mirror's folder, the run's lock)
//! and part of a URL path, so every part of Cairn accepts exactly the same
//! ones: the store, the engine, the CLI and the server all call
//! [`RunId::parse`].

use std::fmt;

/// The longest run id.
pub const MAX_RUN_ID_LEN: usize = 128;

/// A run's id: 1 to 128 ASCII letters, digits, `-`, `_`, `.` or `:`, not
/// starting with `.` (so it can never be `.` or `..` as a file name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

/// Why a text is not a run id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run id `{0}` is not allowed: use 1 to 128 letters, digits, `-`, `_`, `.` or `:`, not starting with `.`")]
pub struct InvalidRunId(pub String);

impl RunId {
    /// Checks a text against the rule.
    pub fn parse(text: &str) -> Result<RunId, InvalidRunId> {
        let ok = !text.is_empty()
            && text.len() <= MAX_RUN_ID_LEN
            && !text.starts_with('.')
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if ok {
            Ok(RunId(text.to_string()))
        } else {
            Err(InvalidRunId(
                text.chars().take(MAX_RUN_ID_LEN + 8).collect(),
            ))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        for ok in ["a", "run-1", "A_b.c:d", &"x".repeat(128)] {
            assert_eq!(RunId::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "sp ace",
            "é",
            "a\0b",
            &"x".repeat(129),
        ] {
            assert!(RunId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
