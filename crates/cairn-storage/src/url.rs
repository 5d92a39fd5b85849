//! Where a store is: the one parser of `--store`, `--from`, `--to` and
//! `CAIRN_STORE`, so every command and the server tell backends apart the
//! same way, and an address that names no backend is refused rather than
//! taken for a file name.

use std::fmt;
use std::path::{Path, PathBuf};

/// A store's address: a SQLite database file, or a PostgreSQL URL.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite database file (created on first use by commands that start
    /// runs).
    Sqlite(PathBuf),
    /// A `postgres://` or `postgresql://` URL. It may hold a password, so
    /// it is shown through [`StoreUrl`]'s `Display`, which drops it.
    Postgres(String),
}

/// Why a text is not a store address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store `{shown}`: {why}")]
pub struct BadStoreUrl {
    /// The address as it may be printed (no password).
    pub shown: String,
    /// What is wrong with it.
    pub why: String,
}

/// The schemes of the backends Cairn has, for messages.
const SCHEMES: &str = "a SQLite file path, sqlite://<path>, or postgres://user@host:port/db";

impl StoreUrl {
    /// Reads an address. A text with a `scheme://` prefix must name a
    /// backend (`sqlite://`, `postgres://`, `postgresql://`); anything else
    /// is a file path. Nothing is looked at on disk: opening the store
    /// tells whether the file can be one.
    pub fn parse(text: &str) -> Result<StoreUrl, BadStoreUrl> {
        let bad = |why: String| BadStoreUrl {
            shown: redact(text),
            why,
        };
        if text.is_empty() {
            return Err(bad(format!("empty; write {SCHEMES}")));
        }
        if let Some((scheme, rest)) = text.split_once("://") {
            let plausible_scheme = !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
            if plausible_scheme {
                return match scheme.to_ascii_lowercase().as_str() {
                    "postgres" | "postgresql" => Ok(StoreUrl::Postgres(text.to_string())),
                    "sqlite" if !rest.is_empty() => Ok(StoreUrl::Sqlite(PathBuf::from(rest))),
                    "sqlite" => Err(bad(format!("no path after sqlite://; write {SCHEMES}"))),
                    other => Err(bad(format!(
                        "`{other}://` is not a store Cairn knows; write {SCHEMES}"
                    ))),
                };
            }
        }
        Ok(StoreUrl::Sqlite(PathBuf::from(text)))
    }

    /// Reads an address given as a path (clap's `PathBuf` arguments).
    pub fn from_path(path: &Path) -> Result<StoreUrl, BadStoreUrl> {
        match path.to_str() {
            Some(text) => StoreUrl::parse(text),
            // Not UTF-8: no scheme can be in it, so it is a file.
            None => Ok(StoreUrl::Sqlite(path.to_path_buf())),
        }
    }

    /// The SQLite file, for a SQLite store.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            StoreUrl::Sqlite(p) => Some(p),
            StoreUrl::Postgres(_) => None,
        }
    }

    /// Whether the store is a PostgreSQL database.
    pub fn is_postgres(&self) -> bool {
        matches!(self, StoreUrl::Postgres(_))
    }
}

impl fmt::Display for StoreUrl {
    /// A path, or a URL without its password: safe to print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(p) => write!(f, "{}", p.display()),
            StoreUrl::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// A store URL as it may be printed: without the password of its user info
/// (`postgres://user:secret@host/db` → `postgres://user@host/db`) or of its
/// query (`?password=...`). Anything that is not a URL is returned as is.
pub fn redact(store: &str) -> String {
    let Some((scheme, rest)) = store.split_once("://") else {
        return store.to_string();
    };
    let query_at = rest.find(['?', '#']).unwrap_or(rest.len());
    let (before_query, query) = rest.split_at(query_at);
    // The last `@` before the query ends the user info, so a password that
    // holds `@` or `/` (unescaped) is cut whole.
    let before_query = match before_query.rfind('@') {
        Some(at) => {
            let user = before_query[..at].split(':').next().unwrap_or("");
            format!("{user}{}", &before_query[at..])
        }
        None => before_query.to_string(),
    };
    let query = match query.strip_prefix('?') {
        Some(q) => {
            let (q, fragment) = q.split_at(q.find('#').unwrap_or(q.len()));
            let kept: Vec<&str> = q
                .split('&')
                .filter(|kv| {
                    let key = kv.split('=').next().unwrap_or("").trim();
                    !key.eq_ignore_ascii_case("password")
                })
                .collect();
            if kept.is_empty() {
                fragment.to_string()
            } else {
                format!("?{}{fragment}", kept.join("&"))
            }
        }
        None => query.to_string(),
    };
    format!("{scheme}://{before_query}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_name_backends_and_anything_else_is_refused() {
        assert_eq!(
            StoreUrl::parse("runs.db").unwrap(),
            StoreUrl::Sqlite("runs.db".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/x.db").unwrap(),
            StoreUrl::Sqlite("/tmp/x.db".into())
        );
        assert!(StoreUrl::parse("postgres://u@h/db").unwrap().is_postgres());
        assert!(StoreUrl::parse("PostgreSQL://u@h/db")
            .unwrap()
            .is_postgres());
        let err = StoreUrl::parse("mysql://x/y").unwrap_err();
        assert!(
            err.to_string().contains("`mysql://` is not a store"),
            "{err}"
        );
        assert!(StoreUrl::parse("sqlite://").is_err());
        assert!(StoreUrl::parse("").is_err());
        // A colon alone is no scheme: `a:b` is a file name.
        assert_eq!(
            StoreUrl::parse("a:b/c.db").unwrap(),
            StoreUrl::Sqlite("a:b/c.db".into())
        );
    }

    #[test]
    fn a_password_is_never_shown() {
        let url = StoreUrl::parse("postgres://cairn:s3cret@db.example:5432/runs").unwrap();
        assert_eq!(url.to_string(), "postgres://cairn@db.example:5432/runs");
        assert!(!format!("{url:?}").contains("s3cret"));
        let err = StoreUrl::parse("mysql://root:hunter2@x/y").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert_eq!(
            redact("postgres://u@host/db?password=x&application_name=a"),
            "postgres://u@host/db?application_name=a"
        );
    }

    #[test]
    fn passwords_are_never_shown() {
        for (url, shown) in [
            (
                "postgres://cairn:s3cret@db.example:5432/runs",
                "postgres://cairn@db.example:5432/runs",
            ),
            (
                "postgresql://u:p@ss/w@rd@host/db?sslmode=disable",
                "postgresql://u@host/db?sslmode=disable",
            ),
            (
                "postgres://u@host/db?password=x&application_name=a",
                "postgres://u@host/db?application_name=a",
            ),
            ("postgres://host/db?PassWord=x", "postgres://host/db"),
            ("postgres://u@127.0.0.1/db", "postgres://u@127.0.0.1/db"),
            (".cairn/cairn.db", ".cairn/cairn.db"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }
}
