//! For tests that need a PostgreSQL server (this crate's and others'):
//! finding it from `CAIRN_TEST_PG` (or saying clearly that they skip when it
//! is not set, and failing when it is set but nothing answers), fresh
//! schemas dropped afterwards, and plain SQL beside the backend. Behind the
//! `testing` feature; not part of Cairn's API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::{PgBackend, PgOptions};
use cairn_storage::Backend;

/// The variable naming the server, e.g.
/// `postgres://postgres@127.0.0.1:5432/postgres`.
pub const ENV: &str = "CAIRN_TEST_PG";

/// Why there is no server to test against.
#[derive(Debug, Clone)]
enum NoServer {
    /// The variable is not set (or empty): the tests skip.
    Unset,
    /// The variable names a server that does not answer: the tests fail,
    /// or CI would be green with PostgreSQL never tested.
    Unreachable(String),
}

/// The server's URL, or why there is none; looked at once per test binary.
fn server() -> Result<&'static str, &'static NoServer> {
    static SERVER: OnceLock<Result<String, NoServer>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let url = std::env::var(ENV)
                .ok()
                .filter(|u| !u.trim().is_empty())
                .ok_or(NoServer::Unset)?;
            // The URL may hold a password: the reason does not repeat it.
            sql_with_timeout(&url, "SELECT 1", Duration::from_secs(3))
                .map_err(NoServer::Unreachable)?;
            Ok(url)
        })
        .as_ref()
        .map(String::as_str)
}

/// The server's URL; `None`, after saying so on stderr, when [`ENV`] is not
/// set. Panics (failing the test) when it is set but nothing answers there.
pub fn server_or_skip() -> Option<&'static str> {
    match server() {
        Ok(url) => Some(url),
        Err(NoServer::Unset) => {
            eprintln!("skipped: {ENV} is not set (PostgreSQL tests need a server)");
            None
        }
        Err(NoServer::Unreachable(e)) => panic!(
            "{ENV} is set but no PostgreSQL server answers there ({e}); \
             start the server, or unset {ENV} to skip the PostgreSQL tests"
        ),
    }
}

/// Runs `statements` on the server, off any runtime of the caller's.
pub fn sql(url: &str, statements: &str) {
    sql_with_timeout(url, statements, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{statements}: {e}"));
}

fn sql_with_timeout(url: &str, statements: &str, timeout: Duration) -> Result<(), String> {
    let (url, statements) = (url.to_string(), statements.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let mut config: tokio_postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
            config.connect_timeout(timeout);
            let (client, conn) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| chain(&e))?;
            tokio::spawn(conn);
            client
                .batch_execute(&statements)
                .await
                .map_err(|e| chain(&e))
        })
    })
    .join()
    .expect("the SQL thread does not panic")
}

/// The first column of the first row of `query`, an integer (a count, a
/// size), for tests and benches that measure what the server holds.
pub fn query_i64(url: &str, query: &str) -> i64 {
    let (url, text) = (url.to_string(), query.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| chain(&e))?;
            tokio::spawn(conn);
            let row = client.query_one(&text, &[]).await.map_err(|e| chain(&e))?;
            row.try_get::<_, i64>(0).map_err(|e| chain(&e))
        })
    })
    .join()
    .expect("the SQL thread does not panic")
    .unwrap_or_else(|e: String| panic!("{query}: {e}"))
}

/// Creates a database (for tests that need one of their own, e.g. several
/// processes started with a URL) and returns its URL; see [`drop_database`].
pub fn create_database(url: &str, name: &str) -> String {
    sql(url, &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    sql(url, &format!("CREATE DATABASE {name}"));
    let (base, _) = url
        .rsplit_once('/')
        .expect("CAIRN_TEST_PG names a database: postgres://user@host:port/db");
    format!("{base}/{name}")
}

/// Drops a database made by [`create_database`], ending its sessions first.
pub fn drop_database(url: &str, name: &str) {
    if let Err(e) = sql_with_timeout(
        url,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        Duration::from_secs(10),
    ) {
        eprintln!("could not drop the test database {name}: {e}");
    }
}

/// An error with its causes, which say what tokio-postgres's own words
/// ("db error") leave out.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}

/// The lease owner id a backend in process `pid` of this machine would
/// write, for tests that plant a lease of another (soon dead) process.
pub fn lease_owner_of(pid: u32) -> String {
    crate::lease::owner_id(
        rand::random(),
        &crate::holder::Holder::of(pid),
        &format!("planted-{pid}"),
    )
}

/// A schema name no other test (or test run) uses.
pub fn unique_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "cairn_t_{}_{}_{:08x}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        rand::random::<u32>()
    )
}

/// The schemas one test makes, dropped when it ends; kept (and named on
/// stderr) when it fails, to look at.
pub struct Scratch {
    /// The server's URL.
    pub url: &'static str,
    schemas: Mutex<Vec<String>>,
}

impl Scratch {
    /// `None` (after the skip line) when there is no server.
    pub fn new() -> Option<Scratch> {
        Some(Scratch {
            url: server_or_skip()?,
            schemas: Mutex::new(Vec::new()),
        })
    }

    /// A new schema name, dropped with the scratch.
    pub fn schema(&self) -> String {
        let s = unique_schema();
        self.schemas.lock().unwrap().push(s.clone());
        s
    }

    /// A backend on `schema`.
    pub fn open(&self, schema: &str, opts: PgOptions) -> PgBackend {
        PgBackend::open_with(
            self.url,
            PgOptions {
                schema: Some(schema.to_string()),
                ..opts
            },
        )
        .unwrap_or_else(|e| panic!("opening a backend on schema {schema}: {e}"))
    }

    /// A backend on a new, empty schema: the conformance suite's factory.
    pub fn fresh(&self) -> Arc<dyn Backend> {
        Arc::new(self.open(&self.schema(), PgOptions::default()))
    }

    /// Runs `statements` with `search_path` set to `schema`.
    pub fn sql_in(&self, schema: &str, statements: &str) {
        sql(
            self.url,
            &format!("SET search_path TO {schema}; {statements}"),
        );
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let schemas = std::mem::take(&mut *self.schemas.lock().unwrap_or_else(|p| p.into_inner()));
        if schemas.is_empty() {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "kept the schemas of the failed test: {}",
                schemas.join(", ")
            );
            return;
        }
        let drops: String = schemas
            .iter()
            .map(|s| format!("DROP SCHEMA IF EXISTS {s} CASCADE;"))
            .collect();
        // Never a panic here: a failed cleanup must not hide (or fake) the
        // test's own outcome.
        if let Err(e) = sql_with_timeout(self.url, &drops, Duration::from_secs(10)) {
            eprintln!(
                "could not drop the test schemas {}: {e}",
                schemas.join(", ")
            );
        }
    }
}
