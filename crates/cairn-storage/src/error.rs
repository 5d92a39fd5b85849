//! What can go wrong in a store, in the store's terms, whatever the
//! database: the edges (the CLI's exit codes, the server's statuses) choose
//! the words and numbers.

use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong in the store.
///
/// Variants about the store as a whole name it by [`StoreError`]'s `store`
/// field: a SQLite file's path, or a PostgreSQL URL without its password
/// ([`crate::StoreUrl`]'s `Display`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database exists but is not a Cairn store, or is damaged.
    #[error("the store {store} is not a Cairn database or is damaged ({detail}); move it aside or point --store elsewhere")]
    Corrupt {
        /// Which store.
        store: String,
        /// What the database (or the schema check) said.
        detail: String,
    },
    /// Another process kept the database locked beyond the busy timeout.
    #[error("the store {store} is locked by another process; try again when it is done")]
    Locked {
        /// Which store.
        store: String,
    },
    /// The database was written by a newer Cairn.
    #[error("the store {store} has schema version {found}, newer than this Cairn understands ({supported}); upgrade Cairn")]
    TooNew {
        /// Which store.
        store: String,
        /// The version found in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// No run with this id.
    #[error("no run `{0}` in the store")]
    RunNotFound(String),
    /// No inbox command or process record with this id.
    #[error("no {what} {id} in the store")]
    RecordNotFound {
        /// `command` or `process`.
        what: &'static str,
        /// The id asked for.
        id: u64,
    },
    /// The store could not be opened (connected to, created, migrated).
    #[error("cannot open the store {store}: {detail}")]
    Open {
        /// Which store.
        store: String,
        /// What the database said.
        detail: String,
    },
    /// No store there, and the caller asked not to create one (only
    /// commands that start runs create a store, so a typo never leaves an
    /// empty database behind).
    #[error("no store at {store} (no run was started with this store yet)")]
    Missing {
        /// Which store.
        store: String,
    },
    /// A store address that names no backend Cairn has.
    #[error("{0}")]
    BadUrl(#[from] crate::url::BadStoreUrl),
    /// The disk (or the quota) holding the store is full; nothing of the
    /// failed write was committed.
    #[error("the disk holding the store {store} is full; free some space and try again")]
    DiskFull {
        /// Which store.
        store: String,
    },
    /// The store can be read but not written (permissions, a read-only
    /// mount, a read-only database user).
    #[error("the store {store} cannot be written ({detail}); check its permissions")]
    ReadOnly {
        /// Which store.
        store: String,
        /// What the database said.
        detail: String,
    },
    /// A run with this id already exists.
    #[error("a run `{0}` already exists in the store")]
    RunExists(String),
    /// The run's lease is held by another process (or another log in this
    /// one): someone else drives it.
    #[error("run `{run}` is in use by another Cairn process")]
    LeaseHeld {
        /// The run id.
        run: String,
    },
    /// A stored row could not be read back.
    #[error("run `{run}`: stored data is invalid: {detail}")]
    BadRow {
        /// The run id.
        run: String,
        /// What was wrong.
        detail: String,
    },
    /// Any other failure the database reported, in its own words.
    #[error("store error: {0}")]
    Database(String),
    /// A file system error, with the path it concerns (the mirror, a lock
    /// file, a wake-up marker: files, never a database row).
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The journal was closed (or its writer stopped) before the request ran.
    #[error("the store is closed")]
    Closed,
    /// A commit failed; the message is the original error's, shared by every
    /// waiter of the failed batch.
    #[error("commit failed: {0}")]
    Commit(Arc<str>),
}

impl StoreError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}
