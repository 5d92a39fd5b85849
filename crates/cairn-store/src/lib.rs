//! Cairn's store as the engine and the server use it, over any backend.
//!
//! The storage API (the traits a database implements, split by concern,
//! the records and the errors) is `cairn-storage`, re-exported here; the
//! backends are `cairn-sqlite` and `cairn-postgres`. This crate is what sits
//! above them and works the same on each:
//!
//! - [`open`]: a store from its address ([`StoreUrl`]), the one place that
//!   chooses a backend;
//! - [`Journal`]: the per-run sequencer ([`RunLog`]), one writer thread that
//!   commits in groups, the NDJSON mirror and live [`Subscription`]s;
//! - [`copy`]: runs moved from one store to another, byte for byte;
//! - [`aggregate_scores`]: the scorers' results across runs.

pub mod copy;
mod journal;
mod mirror;
mod scores;

use std::sync::Arc;
use std::time::Duration;

pub use cairn_sqlite::SqliteBackend;
pub use cairn_storage::*;
pub use journal::{
    Journal, JournalOptions, Observer, RunLog, RunStart, SubscribeError, Subscription,
};
pub use scores::{
    aggregate_scores, GenerationScores, ScoreFilter, ScoreReport, ScorerStats, WorkflowScores,
};

/// How [`open`] opens a store.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Make a SQLite store that does not exist yet (commands that start
    /// runs); otherwise a missing one is [`StoreError::Missing`]. A
    /// PostgreSQL database is never created, only its tables.
    pub create: bool,
    /// How long a PostgreSQL lease lasts unless renewed (the backend's
    /// default when `None`). SQLite's leases last as long as their process.
    pub lease_ttl: Option<Duration>,
    /// The caller reads the store right after opening it (most commands, a
    /// server): SQLite then opens a read connection beside what the caller
    /// does next (see `SqliteBackend::warm_readers`). A caller that writes
    /// first, such as `cairn run` starting its run, leaves it off.
    pub reads_first: bool,
    /// The name of the instance whose leases the backend takes, shown as
    /// who drives a run (`Leases::drivers`); the host name and pid when
    /// `None`. Checked: [`cairn_storage::check_instance_name`].
    pub instance: Option<String>,
}

/// Opens the store at `url`: the one place where an address becomes a
/// backend, so every command and the server agree on what an address means.
pub fn open(url: &StoreUrl, opts: &OpenOptions) -> Result<Arc<dyn Backend>, StoreError> {
    match url {
        StoreUrl::Sqlite(path) => {
            if path.is_dir() {
                return Err(StoreError::Open {
                    store: url.to_string(),
                    detail: format!(
                        "it is a folder; a store is a file, e.g. {}",
                        path.join("cairn.db").display()
                    ),
                });
            }
            if !opts.create && !path.exists() {
                return Err(StoreError::Missing {
                    store: url.to_string(),
                });
            }
            let backend = SqliteBackend::open(path)?;
            if let Some(name) = &opts.instance {
                backend.name_instance(name)?;
            }
            if opts.reads_first {
                backend.warm_readers();
            }
            Ok(Arc::new(backend))
        }
        StoreUrl::Postgres(text) => {
            let mut pg = cairn_postgres::PgOptions::default();
            if let Some(ttl) = opts.lease_ttl {
                pg.lease_ttl = ttl;
            }
            pg.instance = opts.instance.clone();
            Ok(Arc::new(cairn_postgres::PgBackend::open_with(text, pg)?))
        }
    }
}
