//! The store a test's `cairn` processes share: a SQLite file in the test's
//! folder, or a PostgreSQL database of the test's own. The crash tests run
//! the same scenario on both.

use std::path::PathBuf;

use cairn_store::{Backend, SqliteBackend};

/// Leases on PostgreSQL: far longer than a test waits between a kill and
/// the resume that follows, so that only the takeover of a dead holder's
/// lease lets the resume in.
pub const PG_LEASE_TTL: &str = "60s";

/// Where the test's runs are stored.
pub enum Store {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by URL.
    Pg(String),
}

impl Store {
    /// The `cairn` options that name this store.
    pub fn args(&self) -> Vec<String> {
        match self {
            Store::Sqlite(p) => vec!["--store".into(), p.display().to_string()],
            Store::Pg(url) => vec![
                "--store".into(),
                url.clone(),
                "--lease-ttl".into(),
                PG_LEASE_TTL.into(),
            ],
        }
    }

    /// The store as another process opens it: `None` before it exists;
    /// a store that exists but does not open fails the test.
    pub fn open(&self) -> Option<Box<dyn Backend>> {
        match self {
            Store::Sqlite(p) if !p.exists() => None,
            Store::Sqlite(p) => Some(Box::new(SqliteBackend::open(p).expect("open the store"))),
            Store::Pg(url) => Some(Box::new(
                cairn_postgres::PgBackend::open(url).expect("open the store"),
            )),
        }
    }

    /// Like [`Store::open`], but `None` too while the store cannot be
    /// opened (a `cairn` process is still making it).
    pub fn try_open(&self) -> Option<Box<dyn Backend>> {
        match self {
            Store::Sqlite(p) if !p.exists() => None,
            Store::Sqlite(p) => Some(Box::new(SqliteBackend::open(p).ok()?)),
            Store::Pg(url) => Some(Box::new(cairn_postgres::PgBackend::open(url).ok()?)),
        }
    }

    /// Whether run `run` has a record: a session killed between the record
    /// and the run's first event leaves one with an empty log, and then
    /// the run is begun (`cairn resume` starts it, `cairn run` refuses the id).
    pub fn run_exists(&self, run: &str) -> bool {
        self.try_open()
            .and_then(|b| {
                b.get_run(&cairn_events::RunId::parse(run).unwrap())
                    .ok()
                    .flatten()
            })
            .is_some()
    }
}

/// Run `run`'s events in `b`, decoded; none when it has none or the store
/// cannot be read (a `cairn` process may still be making it).
pub fn decoded_events(b: &dyn Backend, run: &str) -> Vec<cairn_events::Event> {
    b.read_events(
        &cairn_events::RunId::parse(run).unwrap(),
        &cairn_store::EventQuery::default(),
    )
    .unwrap_or_default()
    .iter()
    .map(|s| s.decode().expect("stored events decode"))
    .collect()
}
