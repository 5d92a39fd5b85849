//! The connection pool, and how PostgreSQL's errors become the store's own.

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use tokio_postgres::error::{DbError, SqlState};
use tokio_postgres_rustls::MakeRustlsConnect;

use cairn_storage::StoreError;

/// The pool of connections to the store's database, and the store's place
/// (what errors name). Cheap to clone; the tasks of the backend's runtime
/// hold clones, never the backend itself.
#[derive(Clone)]
pub(crate) struct Db {
    pool: Pool,
    place: Arc<str>,
}

impl Db {
    /// A pool of at most `size` connections made from `config`. Connects
    /// lazily: nothing is opened until the first query.
    pub(crate) fn new(
        config: tokio_postgres::Config,
        tls: MakeRustlsConnect,
        size: usize,
        place: String,
    ) -> Result<Db, StoreError> {
        let manager = Manager::from_config(
            config,
            tls,
            // A connection the server closed is dropped on return; one that
            // died silently fails its next query, which the caller sees.
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size.max(1))
            .build()
            .map_err(|e| StoreError::Open {
                store: place.clone(),
                detail: e.to_string(),
            })?;
        Ok(Db {
            pool,
            place: Arc::from(place),
        })
    }

    /// A connection from the pool, connecting if none is idle.
    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| self.pool_err(e))
    }

    /// What errors name as the store: its server, database and schema.
    pub(crate) fn place(&self) -> &str {
        &self.place
    }

    /// The store's error for a failed statement.
    pub(crate) fn err(&self, e: tokio_postgres::Error) -> StoreError {
        map_err(&self.place, &e)
    }

    fn pool_err(&self, e: PoolError) -> StoreError {
        match e {
            PoolError::Closed => StoreError::Closed,
            // Connecting failed: the server is down, refuses us, or the
            // database does not exist.
            PoolError::Backend(e) => StoreError::Open {
                store: self.place.to_string(),
                detail: describe(&e),
            },
            other => StoreError::Open {
                store: self.place.to_string(),
                detail: other.to_string(),
            },
        }
    }
}

/// Turns PostgreSQL's errors into the store's own, like the SQLite backend
/// does, so that callers need not know which database they talk to.
pub(crate) fn map_err(place: &str, e: &tokio_postgres::Error) -> StoreError {
    let Some(db) = e.as_db_error() else {
        return StoreError::Database(describe(e));
    };
    let path = || place.to_string();
    match *db.code() {
        SqlState::DISK_FULL => StoreError::DiskFull { store: path() },
        SqlState::READ_ONLY_SQL_TRANSACTION | SqlState::INSUFFICIENT_PRIVILEGE => {
            StoreError::ReadOnly {
                store: path(),
                detail: describe_db(db),
            }
        }
        // Only with a `lock_timeout` set (by the URL's options): another
        // session kept what we needed locked.
        SqlState::LOCK_NOT_AVAILABLE => StoreError::Locked { store: path() },
        _ => StoreError::Database(describe_db(db)),
    }
}

/// The server's words for an error with its SQLSTATE, or the client's own
/// with its cause.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => describe_db(db),
        // The client's own words name only the kind ("error connecting to
        // server"); the causes say what happened.
        None => {
            let mut s = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                s.push_str(": ");
                s.push_str(&c.to_string());
                cause = c.source();
            }
            s
        }
    }
}

fn describe_db(db: &DbError) -> String {
    let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        s.push_str(": ");
        s.push_str(detail);
    }
    s
}
