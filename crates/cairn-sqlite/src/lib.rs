//! Cairn's store in one SQLite file: the `cairn_storage` traits on an
//! embedded database, for one machine with no server to run.
//!
//! Durability: the database runs in WAL mode with `synchronous=NORMAL`. A
//! committed transaction survives a crash of the Cairn process (the WAL is
//! written before `COMMIT` returns); after a power loss or an operating system
//! crash the last transactions before it may be lost, but the database stays
//! consistent. That is the trade the contract asks for: lifecycle events are
//! durable before anyone acts on them, as far as a process crash goes. A
//! new store is made the same way, without waiting for the disk: after a
//! power cut in its first seconds it may hold less, or (its file left as
//! zeros) be made again, never a half store.
//!
//! The write-ahead log is part of the store: `cairn.db`, `cairn.db-wal` and
//! `cairn.db-shm` together hold it. A process that stops writing moves the
//! log into the database file only once it has grown past
//! [`CHECKPOINT_FROM`] (see [`EventLog::checkpoint`]): moving it takes two
//! disk syncs and empties the log, so the next process's first commit syncs
//! a new log's header as well; a short `cairn run` would otherwise spend
//! most of its time in those four syncs.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use serde_json::Value;

use cairn_events::{NodePath, RunCommand, RunId};

use cairn_storage::prelude::*;
use cairn_storage::{
    run_id_from_row, EventQuery, GenerationRecord, InboxEntry, LeaseHolder, Listener, NewRun,
    PinnedFile, ProcessRecord, RecordStatus, RunFilter, RunLease, RunRecord, StoreError,
    StoreFuture, StoredEvent, ToolCallRecord, ToolCallStatus, Topic,
};

use crate::wake::WakeDir;

mod checkpoint;

mod locks;

mod events;
mod schedules;
mod wake;

/// The schema version kept in `PRAGMA user_version`. Version 1 indexed every
/// event by type and by node and kept commands as loosely typed control
/// requests; version 2 keeps one partial index (see
/// [`events::EVENTS_BY_TYPE`]), the
/// run inbox and the process records; version 3 keeps a run's workflow text
/// in a table of its own (see [`SOURCES`]); version 4 indexes child runs by
/// their parent (see [`RUNS_BY_PARENT`]); version 5 keeps the workflow
/// generations that reloads adopt (see [`GENERATIONS`]); version 6 pins
/// the files a generation refers to; version 7 keeps each event's envelope
/// once, in columns, with runs and types as small integers (see the
/// `events` module); version 8 keeps `cairn serve`'s schedules and
/// their history (`schedules`).
const SCHEMA_VERSION: i64 = 8;

/// Child runs by parent, for a parent's status and cancel; most runs have
/// no parent, and the partial index leaves them out.
const RUNS_BY_PARENT: &str = "CREATE INDEX IF NOT EXISTS runs_by_parent ON runs(parent_run_id) \
                              WHERE parent_run_id IS NOT NULL;";

/// Versions 2 to 6's index of events by type (version 7's is
/// [`events::EVENTS_BY_TYPE`]), for the tests that make stores of those
/// versions.
#[cfg(test)]
const EVENTS_BY_TYPE_V2: &str = "CREATE INDEX events_by_type ON events(run_id, type, seq) \
                                 WHERE type <> 'NodeOutput';";

/// The page size of a new store. Events are rows of a `WITHOUT ROWID`
/// table, whose b-tree keeps at most about a quarter of a page in place and
/// moves the rest of a row to overflow pages of its own: with 4 KiB pages,
/// every event over about 1 KB (an agent step, a loop's output) took a
/// whole 4 KiB page more, and the writer wrote about 4 bytes per byte of
/// events for loops nested 200 deep. 8 KiB pages keep rows up to about
/// 2 KB in place (bytes written for that run: 6.0 → 3.8 MB) for 7% more
/// bytes on logs of small events. 16 KiB would do better still, but raised
/// the peak memory of 100,000-node runs by 4-8 MB.
const PAGE_SIZE: u32 = 8192;

/// The size of the write-ahead log from which the checkpoint a process
/// makes when it stops writing runs ([`EventLog::checkpoint`]) moves it into
/// the database file. Below it the log stays for the next process, whose
/// first connection reads it back whole (about 0.25 ms a MiB on a busy
/// 2-core machine), and SQLite's own checkpoint at 1,000 pages (8 MiB)
/// still bounds it during long runs. A one-node run adds about 150 KB: one
/// short run in 7 pays for a checkpoint.
pub const CHECKPOINT_FROM: u64 = 1 << 20;

/// A tool call's row, inserted or replacing the one with its key.
const PUT_TOOL_CALL: &str = "INSERT INTO tool_calls (run_id, node_id, iteration, attempt, \
     tool_seq, tool, idempotency_key, side_effect, idempotent, input, output, started_ms, \
     finished_ms, status, error) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) \
     ON CONFLICT (run_id, node_id, iteration, attempt, tool_seq) DO UPDATE SET \
     tool = excluded.tool, idempotency_key = excluded.idempotency_key, \
     side_effect = excluded.side_effect, idempotent = excluded.idempotent, \
     input = excluded.input, output = excluded.output, started_ms = excluded.started_ms, \
     finished_ms = excluded.finished_ms, status = excluded.status, error = excluded.error";

/// The write connection's page cache, in KiB. Events are kept by run, so a
/// server streaming a thousand runs appends to a thousand leaf pages; with
/// SQLite's default of 2 MiB they did not all fit, and every commit read
/// back from the file the pages the one before had just written. SQLite
/// fills the cache as pages are used, so a small store does not pay for it.
const WRITE_CACHE_KIB: u32 = 16 * 1024;

/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

// What a store's open checks of its pages: the first row of every table,
// which reads the table's root page and its first leaf. Not `PRAGMA
// quick_check`, which reads a table whole: every table grows with the
// store's runs, and the check of the small ones alone took 5 ms of every
// command at 20,000 runs (the events, nearly all of a store, were never
// checked for the same reason). A page damaged deeper in is reported by
// SQLite when a command reads it, as [`StoreError::Corrupt`] too.

/// Idle read connections kept for reuse.
const READ_POOL_MAX: usize = 4;

/// Version 1's tables: [`RUNS`] and the events of versions 1 to 6 (the
/// base that migrations and the tests of old stores start from).
#[cfg(test)]
fn v1_schema() -> String {
    format!("{RUNS}{V1_EVENTS}")
}

/// Runs and their tool calls, as every version since 1 has them.
const RUNS: &str = r#"
CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    workflow_path   TEXT NOT NULL,
    workflow_hash   TEXT NOT NULL,
    input           TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    parent_run_id   TEXT
);
CREATE INDEX runs_by_created ON runs(created_ms);
CREATE INDEX runs_by_status ON runs(status, updated_ms);

CREATE TABLE tool_calls (
    run_id          TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    node_id         TEXT NOT NULL,
    iteration       INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    tool_seq        INTEGER NOT NULL,
    tool            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    side_effect     INTEGER NOT NULL,
    idempotent      INTEGER NOT NULL,
    input           TEXT NOT NULL,
    output          TEXT,
    started_ms      INTEGER NOT NULL,
    finished_ms     INTEGER,
    status          TEXT NOT NULL,
    error           TEXT,
    PRIMARY KEY (run_id, node_id, iteration, attempt, tool_seq)
);
"#;

/// Versions 1 to 6's events, which the migration to version 7 turns into
/// the tables of the `events` module (kept for the tests of old stores).
#[cfg(test)]
const V1_EVENTS: &str = r#"
CREATE TABLE events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    type    TEXT NOT NULL,
    node_id TEXT,
    ts      INTEGER NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
"#;

/// Commands to runs (approve, deny, answer, cancel), applied in id order by
/// the run's driver and marked taken with their outcome; and the process
/// groups of running attempts, so a resume can kill what a crashed engine
/// left behind. Version 2 moved both from version 1's loosely typed control
/// requests (which a running engine of version 1 polled; none is left to
/// apply when a newer Cairn opens the store).
const INBOX: &str = r#"
DROP TABLE IF EXISTS controls;
CREATE TABLE IF NOT EXISTS inbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    command    TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    taken_ms   INTEGER,
    outcome    TEXT
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox(run_id, taken_ms, id);
CREATE TABLE IF NOT EXISTS processes (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    node_id    TEXT NOT NULL,
    iteration  INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    pgid       INTEGER NOT NULL,
    started_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS processes_by_run ON processes(run_id);
"#;

/// The workflow text of each run, apart from the run's row: the row is
/// updated on every append (its status and time), and SQLite rewrites a
/// whole row to update it, so a text of megabytes in it was copied, into
/// memory and into the WAL, once per commit.
const SOURCES: &str = r#"
CREATE TABLE IF NOT EXISTS workflow_sources (
    run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
    source TEXT NOT NULL
);
"#;

/// The texts that reloads of a run adopted (`cairn run --watch`), one row
/// per generation, so that a resume runs the run's last definition. Apart
/// from the run's row for the reason [`SOURCES`] gives.
const GENERATIONS: &str = r#"
CREATE TABLE IF NOT EXISTS generations (
    run_id        TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    generation    INTEGER NOT NULL,
    workflow_hash TEXT NOT NULL,
    source        TEXT NOT NULL,
    created_ms    INTEGER NOT NULL,
    PRIMARY KEY (run_id, generation)
);
"#;

/// Version 6: each generation keeps the texts of the files its workflow
/// refers to (child workflows, model scripts), pinned when it began.
const PINNED_FILES: &str = "ALTER TABLE generations ADD COLUMN files TEXT NOT NULL DEFAULT '[]';";

/// [`GENERATIONS`] with [`PINNED_FILES`]' column, for a new store: an
/// `ALTER TABLE` makes SQLite parse the whole schema again.
const GENERATIONS_V6: &str = r#"
CREATE TABLE generations (
    run_id        TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    generation    INTEGER NOT NULL,
    workflow_hash TEXT NOT NULL,
    source        TEXT NOT NULL,
    created_ms    INTEGER NOT NULL,
    files TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (run_id, generation)
);
"#;

/// The tables a Cairn store has; a file with other tables is someone else's.
const TABLES: &[&str] = &[
    "events",
    "event_runs",
    "event_types",
    "generations",
    "inbox",
    "processes",
    "runs",
    "schedules",
    "schedule_fires",
    "sqlite_sequence",
    "tool_calls",
    "workflow_sources",
    // Version 1 only; the migration to 2 drops it.
    "controls",
];

/// Cairn's store in one SQLite file (WAL mode, `synchronous=NORMAL`).
///
/// Writes go through one connection; reads take a connection from a small
/// pool, so a reader never waits behind the writer (WAL lets them run at the
/// same time, also across processes).
pub struct SqliteBackend {
    path: PathBuf,
    lock_dir: PathBuf,
    /// The name this process's leases give (see [`SqliteBackend::name_instance`]).
    instance: Mutex<String>,
    wake: WakeDir,
    write: Mutex<Connection>,
    /// Checkpoints the log beside the writer (see `checkpoint`).
    checkpointer: checkpoint::Checkpointer,
    readers: Arc<Mutex<Vec<Connection>>>,
    types: events::TypeCodes,
}

impl SqliteBackend {
    /// Opens the database at `path`, creating it (and its parent directory)
    /// when missing. A file that is not a Cairn database, or is damaged, gives
    /// [`StoreError::Corrupt`] and is left untouched.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;

        // Making a store (or bringing it up to date) is several steps that
        // SQLite does not all wait for: switching an empty file to WAL takes
        // an exclusive lock without calling the busy handler, so a
        // `cairn status` reading the file in that instant made the
        // `cairn run` creating it fail with "locked". Every process that
        // finds the store unfinished does those steps one at a time, under
        // a lock on the folder, and looks again once it holds it.
        let _setup = if needs_setup(&path)? {
            Some(SetupLock::take(&dir)?)
        } else {
            None
        };
        let existing_len = check_header(&path)?;
        let conn = open_conn(&path, false)?;
        let corrupt = |detail: String| StoreError::Corrupt {
            store: path.display().to_string(),
            detail,
        };

        // Read-only checks first, so nothing is written to a file that turns
        // out not to be ours.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| map_err(&path, e))?;
        let tables: Vec<String> = {
            let mut st = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
                .map_err(|e| map_err(&path, e))?;
            let rows = st
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(|e| map_err(&path, e))?;
            rows.collect::<Result<_, _>>()
                .map_err(|e| map_err(&path, e))?
        };
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                store: path.display().to_string(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if let Some(t) = tables.iter().find(|t| !TABLES.contains(&t.as_str())) {
            return Err(corrupt(format!(
                "it has a table `{t}` that Cairn does not use"
            )));
        }
        if version >= 1 {
            let required: &[&str] = match version {
                1 => &["runs", "events", "controls", "tool_calls"],
                2 => &["runs", "events", "inbox", "processes", "tool_calls"],
                3 | 4 => &[
                    "runs",
                    "events",
                    "inbox",
                    "processes",
                    "tool_calls",
                    "workflow_sources",
                ],
                5 | 6 => &[
                    "generations",
                    "runs",
                    "events",
                    "inbox",
                    "processes",
                    "tool_calls",
                    "workflow_sources",
                ],
                7 => &[
                    "generations",
                    "runs",
                    "events",
                    "event_runs",
                    "event_types",
                    "inbox",
                    "processes",
                    "tool_calls",
                    "workflow_sources",
                ],
                _ => &[
                    "generations",
                    "runs",
                    "events",
                    "event_runs",
                    "event_types",
                    "inbox",
                    "processes",
                    "schedules",
                    "schedule_fires",
                    "tool_calls",
                    "workflow_sources",
                ],
            };
            for &t in required {
                if !tables.iter().any(|x| x == t) {
                    return Err(corrupt(format!("table `{t}` is missing")));
                }
            }
        } else if !tables.is_empty() {
            return Err(corrupt(format!(
                "it has tables ({}) but no Cairn schema version",
                tables.join(", ")
            )));
        }
        if existing_len > 0 {
            probe_tables(&conn, &tables).map_err(|e| map_err(&path, e))?;
        }

        if existing_len == 0 {
            // Only an empty file takes a page size; SQLite ignores it later.
            // No rollback journal for the switch to WAL below: it writes
            // the first page of a file that holds nothing, which a journal
            // cannot bring back to anything but empty, and the journal cost
            // two disk syncs (its own and its folder's) of a new store's five.
            // The file's own sync stays, and the log's (with its folder's)
            // comes before anything is committed.
            //
            // Nor any disk sync while the new file is made (the first
            // page, the log's header, its folder): the three were most of
            // what a new store cost over an existing one (about 1 ms each
            // on a journaling file system, a new file's first sync
            // committing its creation). What they would protect is a store
            // that holds nothing yet; the guarantee stays NORMAL's: a
            // process crash loses nothing committed (the writes are in the
            // OS), a power loss may lose the last transactions, SQLite's
            // checksums drop a log frame that did not reach the disk whole,
            // and the first checkpoint syncs the file, the log and its
            // folder. The setup is back to NORMAL before anything is
            // committed but the schema.
            conn.execute_batch(&format!(
                "PRAGMA page_size = {PAGE_SIZE}; PRAGMA journal_mode = OFF; \
                 PRAGMA synchronous = OFF"
            ))
            .map_err(|e| map_err(&path, e))?;
        }
        // WAL is a property of the file; setting it needs a brief write lock.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| map_err(&path, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(store = %path.display(), mode, "could not switch the store to WAL mode");
        }
        if version == 0 {
            create_schema(&conn).map_err(|e| map_err(&path, e))?;
        } else if version < SCHEMA_VERSION {
            migrate(&conn).map_err(|e| map_err(&path, e))?;
        }
        if existing_len == 0 {
            conn.execute_batch("PRAGMA synchronous = NORMAL")
                .map_err(|e| map_err(&path, e))?;
        }
        conn.execute_batch(&format!("PRAGMA cache_size = -{WRITE_CACHE_KIB}"))
            .map_err(|e| map_err(&path, e))?;
        checkpoint::watch_log(&conn).map_err(|e| map_err(&path, e))?;
        let wake = WakeDir::new(&path, dir.join("wake"));
        make_kept(&path, &dir);
        let readers = Arc::new(Mutex::new(Vec::new()));

        Ok(SqliteBackend {
            checkpointer: checkpoint::Checkpointer::new(&path),
            wake,
            lock_dir: dir.join("locks"),
            instance: Mutex::new(cairn_storage::default_instance_name()),
            path,
            write: Mutex::new(conn),
            readers,
            types: events::TypeCodes::default(),
        })
    }

    /// Names the instance whose leases this backend takes, for people
    /// asking who drives a run ([`Leases::drivers`]): written into each
    /// run's lock file as the lock is taken. The host name and pid unless
    /// named.
    pub fn name_instance(&self, name: &str) -> Result<(), StoreError> {
        cairn_storage::check_instance_name(name).map_err(|detail| StoreError::Open {
            store: self.path.display().to_string(),
            detail,
        })?;
        *self.instance.lock().unwrap_or_else(|p| p.into_inner()) = name.to_string();
        Ok(())
    }

    /// The instance named in the lock file at `path`, if someone holds it.
    fn lock_owner(&self, path: &Path, held: &HashMap<u64, u32>) -> Option<(u32, String)> {
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(path).ok()?.ino();
        let pid = *held.get(&inode)?;
        // Bounded: a lock file holds a name of at most 100 bytes.
        let mut name = String::new();
        let f = std::fs::File::open(path).ok()?;
        let _ = std::io::Read::read_to_string(&mut std::io::Read::take(f, 128), &mut name);
        let name = name.trim();
        let name = if cairn_storage::check_instance_name(name).is_ok() {
            name.to_string()
        } else {
            format!("pid {pid} on this machine")
        };
        Some((pid, name))
    }

    /// Opens the pool's first read connection on a thread of its own,
    /// beside whatever the caller does next: for a caller about to read
    /// (most commands read right after they open the store), since opening a
    /// connection (SQLite reads and parses the schema) is a good part of a
    /// short command's time. A caller that writes first (starting a run)
    /// leaves it: the connection would cost a thread and the schema's parse
    /// for nothing. Best effort: a reader that finds the pool empty opens
    /// its own.
    pub fn warm_readers(&self) {
        warm_readers(&self.path, &self.readers);
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size of the write-ahead log file (0 when there is none).
    fn wal_len(&self) -> u64 {
        let mut wal = self.path.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(wal).map_or(0, |m| m.len())
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        map_err(&self.path, e)
    }

    /// [`SqliteBackend::err`], except that a row naming a run that has no
    /// row of its own (a foreign key) is `RunNotFound` for `run`.
    fn or_no_run<'a>(&'a self, run: &'a RunId) -> impl Fn(rusqlite::Error) -> StoreError + 'a {
        move |e| {
            if is_fk_violation(&e) {
                StoreError::RunNotFound(run.to_string())
            } else {
                self.err(e)
            }
        }
    }

    /// Runs `f` on a pooled read connection.
    fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        read_on(&self.path, &self.readers, f)
    }

    /// Runs `f` on a pooled read connection on tokio's blocking pool: the
    /// blocking read of an [`AsyncReads`] method, off the caller's worker.
    fn read_async<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> StoreFuture<T> {
        let (path, readers) = (self.path.clone(), Arc::clone(&self.readers));
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || read_on(&path, &readers, f)).await {
                Ok(out) => out,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down and dropped the task unrun.
                Err(_) => Err(StoreError::Closed),
            }
        })
    }

    /// Runs `f` in a write transaction (taken at once, so that a busy
    /// database waits at `BEGIN` rather than failing mid-way).
    fn write<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| self.err(e))?;
        let pages = checkpoint::log_pages_after_commit();
        if pages >= checkpoint::INLINE_PAGES {
            // The thread's checkpoints never caught up with the log's end:
            // copy the rest here, so that the next commit starts it over.
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::debug!(store = %self.path.display(), error = %e, "a checkpoint after a commit failed; a later one takes its pages");
            }
        } else if pages >= checkpoint::CHECKPOINT_PAGES {
            self.checkpointer.ask();
        }
        Ok(out)
    }

    /// Stores a batch of events in `tx` and keeps each run's row in step
    /// (see [`EventLog::append`]); returns the event types it gave new codes,
    /// to be learned once the transaction commits.
    fn append_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        batch: &[StoredEvent],
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let err = |e| self.err(e);
        let appender = events::Appender {
            types: &self.types,
            err: &err,
        };
        let learned = appender.insert(tx, batch)?;
        // (run, latest ts, latest status) per run of the batch, in order
        // of first appearance; a busy server's batch holds a thousand runs,
        // found by id rather than by a scan per event.
        let mut runs: Vec<(&str, i64, Option<String>)> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for ev in batch {
            let status = status_of(ev);
            match index.get(ev.run_id.as_str()) {
                Some(&i) => {
                    let r = &mut runs[i];
                    r.1 = r.1.max(ev.timestamp_ms);
                    if status.is_some() {
                        r.2 = status;
                    }
                }
                None => {
                    index.insert(ev.run_id.as_str(), runs.len());
                    runs.push((ev.run_id.as_str(), ev.timestamp_ms, status));
                }
            }
        }
        let mut upd = tx
            .prepare_cached(UPDATE_RUN_AFTER_APPEND)
            .map_err(|e| self.err(e))?;
        // Only a status change touches the run's row; `updated_ms` is read
        // from the latest event otherwise (see `updated_ms!`).
        for (run, ts, status) in runs.into_iter().filter(|r| r.2.is_some()) {
            upd.execute(params![run, ts, status])
                .map_err(|e| self.err(e))?;
        }
        Ok(learned)
    }

    /// Inserts or replaces a tool call's row in `tx`.
    fn put_tool_call_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rec: &ToolCallRecord,
    ) -> Result<(), StoreError> {
        tx.prepare_cached(PUT_TOOL_CALL)
            .and_then(|mut st| {
                st.execute(params![
                    rec.run_id.as_str(),
                    rec.node_id,
                    rec.iteration,
                    rec.attempt,
                    rec.tool_seq,
                    rec.tool,
                    rec.idempotency_key,
                    rec.side_effect,
                    rec.idempotent,
                    json_text(&rec.input),
                    rec.output.as_ref().map(json_text),
                    rec.started_ms,
                    rec.finished_ms,
                    rec.status.as_str(),
                    rec.error.as_ref().map(json_text)
                ])
            })
            .map_err(self.or_no_run(&rec.run_id))?;
        Ok(())
    }

    /// Inserts a run's row and its workflow text in `tx`.
    fn insert_run(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rec: &RunRecord,
    ) -> Result<(), StoreError> {
        tx.prepare_cached(
            "INSERT INTO runs (run_id, workflow, workflow_path, workflow_hash, input, \
             status, created_ms, updated_ms, parent_run_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .and_then(|mut st| {
            st.execute(params![
                rec.run_id.as_str(),
                rec.workflow,
                rec.workflow_path,
                rec.workflow_hash,
                json_text(&rec.input),
                rec.status.as_str(),
                rec.created_ms,
                rec.updated_ms,
                rec.parent_run_id.as_deref()
            ])
        })
        .map_err(|e| {
            if is_unique_violation(&e) {
                StoreError::RunExists(rec.run_id.to_string())
            } else {
                self.err(e)
            }
        })?;
        tx.prepare_cached("INSERT INTO workflow_sources (run_id, source) VALUES (?1, ?2)")
            .and_then(|mut st| st.execute(params![rec.run_id.as_str(), rec.workflow_source]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Stores (or replaces) a generation of a run's workflow in `tx`.
    fn insert_generation(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rec: &GenerationRecord,
    ) -> Result<(), StoreError> {
        tx.execute(
            "INSERT INTO generations (run_id, generation, workflow_hash, source, created_ms, \
             files) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (run_id, generation) DO \
             UPDATE SET workflow_hash = excluded.workflow_hash, source = excluded.source, \
             created_ms = excluded.created_ms, files = excluded.files",
            params![
                rec.run_id.as_str(),
                rec.generation.min(i64::MAX as u64) as i64,
                rec.workflow_hash,
                rec.workflow_source,
                rec.created_ms,
                crate::PinnedFile::encode_all(&rec.files)
            ],
        )
        .map_err(self.or_no_run(&rec.run_id))?;
        Ok(())
    }
}

/// Runs `f` on a read connection from `readers` (opening one when none is
/// idle) and gives it back to the pool.
fn read_on<T>(
    path: &Path,
    readers: &Mutex<Vec<Connection>>,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<T, StoreError> {
    let conn = match readers.lock().unwrap_or_else(|p| p.into_inner()).pop() {
        Some(c) => c,
        None => open_conn(path, true)?,
    };
    let out = f(&conn).map_err(|e| map_err(path, e));
    let mut pool = readers.lock().unwrap_or_else(|p| p.into_inner());
    if pool.len() < READ_POOL_MAX {
        pool.push(conn);
    }
    out
}

/// A run's events as `q` selects them.
fn read_events_on(
    c: &Connection,
    run_id: &RunId,
    q: &EventQuery,
) -> rusqlite::Result<Vec<StoredEvent>> {
    let (sql, args) = events::query(run_id, q);
    let mut st = c.prepare_cached(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(args), |r| events::row(run_id, r))?;
    rows.collect()
}

/// A run's highest committed seq, 0 when it has none.
fn last_seq_on(c: &Connection, run_id: &RunId) -> rusqlite::Result<u64> {
    c.prepare_cached(LAST_SEQ)?
        .query_row([run_id.as_str()], |r| r.get::<_, Option<i64>>(0))
        .map(|s| s.unwrap_or(0) as u64)
}

/// A run's row.
fn get_run_on(c: &Connection, run_id: &RunId) -> rusqlite::Result<Option<RunRecord>> {
    c.prepare_cached(GET_RUN)?
        .query_row([run_id.as_str()], run_row)
        .optional()
}

/// The runs `f` selects, newest first.
fn list_runs_on(c: &Connection, f: &RunFilter) -> rusqlite::Result<Vec<RunRecord>> {
    let limit = f
        .limit
        .map(|l| l.min(i64::MAX as usize) as i64)
        .unwrap_or(-1);
    let offset = f.offset.unwrap_or(0).min(i64::MAX as usize) as i64;
    let mut st = c.prepare_cached(LIST_RUNS)?;
    let rows = st.query_map(
        params![
            f.status.map(RecordStatus::as_str),
            f.workflow,
            limit,
            offset,
            f.parent.as_deref()
        ],
        run_row,
    )?;
    rows.collect()
}

/// See [`SqliteBackend::warm_readers`].
fn warm_readers(path: &Path, pool: &Arc<Mutex<Vec<Connection>>>) {
    let path = path.to_path_buf();
    let pool = Arc::clone(pool);
    let _ = std::thread::Builder::new()
        .name("cairn-sqlite-open".into())
        .spawn(move || {
            let Ok(conn) = open_conn(&path, true) else {
                return;
            };
            let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < READ_POOL_MAX {
                pool.push(conn);
            }
        });
}

/// Reads the first row of each table (names checked against [`TABLES`]):
/// a table whose root page or first leaf is damaged fails the open with
/// SQLite's corruption error, before anything is written.
fn probe_tables(conn: &Connection, tables: &[String]) -> rusqlite::Result<()> {
    for t in tables {
        let mut st = conn.prepare(&format!("SELECT * FROM \"{t}\" LIMIT 1"))?;
        let mut rows = st.query([])?;
        rows.next()?;
    }
    Ok(())
}

/// Rejects a file that exists but does not start like a SQLite database,
/// before SQLite touches it. Returns the file's length (0 when missing).
/// Whether the file at `path` may still need the steps that make a store:
/// missing, empty, not yet in WAL mode, or stamped with an older schema in
/// its first page. The stamp there can lag behind the log (the schema's
/// commit may not have been moved into the file yet), which only means a
/// finished store is sometimes opened under the lock for nothing.
fn needs_setup(path: &Path) -> Result<bool, StoreError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    let mut head = [0u8; 100];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StoreError::io(path, e)),
        }
    }
    if got < head.len() {
        // Empty, or a header being written: the lock's holder finishes it.
        // A short file that is not a store is refused once the lock is held.
        return Ok(true);
    }
    // Bytes 18 and 19 are 2 in WAL mode; 60..64 hold `user_version`.
    let wal = head[18] == 2 && head[19] == 2;
    let version = i64::from(i32::from_be_bytes([head[60], head[61], head[62], head[63]]));
    Ok(!wal || version < SCHEMA_VERSION)
}

/// An exclusive `flock` on the store's folder, held while a store is made or
/// migrated, so two processes never do it at once; released when dropped
/// (or when the process dies, so a crash never leaves it taken).
struct SetupLock(#[allow(dead_code)] File);

impl SetupLock {
    fn take(dir: &Path) -> Result<SetupLock, StoreError> {
        let file = File::open(dir).map_err(|e| StoreError::io(dir, e))?;
        loop {
            // SAFETY: `file` owns an open descriptor for the whole call.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(SetupLock(file));
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(StoreError::io(dir, err));
            }
        }
    }
}

fn check_header(path: &Path) -> Result<u64, StoreError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    let len = f.metadata().map_err(|e| StoreError::io(path, e))?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut head = [0u8; 16];
    let n = f.read(&mut head).map_err(|e| StoreError::io(path, e))?;
    if head == [0; 16] && len <= NEVER_WRITTEN_MAX && never_written(&mut f, path)? {
        return Ok(0);
    }
    if len < 100 || n < 16 || &head != b"SQLite format 3\0" {
        return Err(StoreError::Corrupt {
            store: path.display().to_string(),
            detail: "the file does not start with a SQLite header".into(),
        });
    }
    Ok(len)
}

/// The largest file [`never_written`] looks at: a new store's first page
/// and then some.
const NEVER_WRITTEN_MAX: u64 = 64 * 1024;

/// Whether the file holds only zero bytes: a new store's first page that
/// never reached the disk (a power cut before the system wrote it back,
/// which a new store's creation does not wait for) leaves that on some
/// file systems. It holds nothing, so it is emptied and made again (its
/// write-ahead log, if it reached the disk, still holds what was
/// committed). `f` has read the first bytes.
fn never_written(f: &mut File, path: &Path) -> Result<bool, StoreError> {
    let mut rest = Vec::new();
    f.read_to_end(&mut rest)
        .map_err(|e| StoreError::io(path, e))?;
    if rest.iter().any(|b| *b != 0) {
        return Ok(false);
    }
    tracing::warn!(store = %path.display(), "the store's file holds only zeros (its first write never reached the disk); making it again");
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|w| w.set_len(0))
        .map_err(|e| StoreError::io(path, e))?;
    Ok(true)
}

fn open_conn(path: &Path, read_only: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX;
    flags |= if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
    };
    let conn = Connection::open_with_flags(path, flags).map_err(|e| match map_err(path, e) {
        StoreError::Database(detail) => StoreError::Open {
            store: path.display().to_string(),
            detail,
        },
        other => other,
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| map_err(path, e))?;
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
        .map_err(|e| map_err(path, e))?;
    // The last connection to close would otherwise checkpoint the log and
    // delete it, with the syncs CHECKPOINT_FROM spares a short run.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(|e| map_err(path, e))?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    in_schema_transaction(conn, |v| {
        // Another process may have created it while we waited for the lock.
        // The tables as they are now, made in one batch: the migrations'
        // renames, copies and `ALTER TABLE`s (each a parse of the whole
        // schema) were most of a new store's cost. A test holds the result
        // to a store migrated from version 1.
        if v == 0 {
            conn.execute_batch(&format!(
                "{RUNS}{INBOX}{SOURCES}{RUNS_BY_PARENT}{GENERATIONS_V6}{}{}{}",
                events::TABLES,
                events::EVENTS_BY_TYPE,
                schedules::SCHEDULES,
            ))?;
            events::fill_types(conn)?;
        }
        Ok(())
    })
}

/// Brings an older store to [`SCHEMA_VERSION`], in one transaction, so a
/// store is either migrated whole or not at all. From 1, only indexes and
/// the command tables change; from 2, every run's workflow text moves to
/// its table; from 6, every event row is rewritten into version 7's tables
/// (under the write lock, about a second per million events).
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    in_schema_transaction(conn, |v| {
        if v == 1 {
            conn.execute_batch(INBOX)?;
        }
        if v < 3 {
            conn.execute_batch(SOURCES)?;
            conn.execute_batch(
                "INSERT INTO workflow_sources (run_id, source) \
                 SELECT run_id, workflow_source FROM runs; \
                 ALTER TABLE runs DROP COLUMN workflow_source;",
            )?;
        }
        if v < 4 {
            conn.execute_batch(RUNS_BY_PARENT)?;
        }
        if v < 5 {
            conn.execute_batch(GENERATIONS)?;
        }
        if v < 6 {
            conn.execute_batch(PINNED_FILES)?;
        }
        if v < 7 {
            events::to_v7(conn)?;
        }
        if v < 8 {
            conn.execute_batch(schedules::SCHEDULES)?;
        }
        Ok(())
    })
}

/// Runs a schema change under the write lock, given the version found once
/// the lock is held, and stamps [`SCHEMA_VERSION`] if the version was older.
fn in_schema_transaction(
    conn: &Connection,
    f: impl FnOnce(i64) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let r = (|| {
        let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if v < SCHEMA_VERSION {
            f(v)?;
            conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
        }
        Ok(())
    })();
    match r {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Turns SQLite's errors into the store's own, which name what went wrong
/// without tying callers to SQLite; the message travels along.
pub(crate) fn map_err(path: &Path, e: rusqlite::Error) -> StoreError {
    let path = || path.display().to_string();
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) => {
            let detail = || msg.clone().unwrap_or_else(|| f.to_string());
            match f.code {
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                    StoreError::Locked { store: path() }
                }
                ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => StoreError::Corrupt {
                    store: path(),
                    detail: detail(),
                },
                ErrorCode::DiskFull => StoreError::DiskFull { store: path() },
                ErrorCode::ReadOnly | ErrorCode::PermissionDenied => StoreError::ReadOnly {
                    store: path(),
                    detail: detail(),
                },
                _ => StoreError::Database(detail()),
            }
        }
        rusqlite::Error::FromSqlConversionFailure(_, _, inner) => {
            match inner.downcast_ref::<BadColumn>() {
                Some(b) => StoreError::BadRow {
                    run: b.run.clone(),
                    detail: b.detail.clone(),
                },
                None => StoreError::Database(e.to_string()),
            }
        }
        _ => StoreError::Database(e.to_string()),
    }
}

/// A column of a run's row that does not hold what the schema says, carried
/// through rusqlite's row mapping so it comes out as [`StoreError::BadRow`].
#[derive(Debug)]
struct BadColumn {
    run: String,
    detail: String,
}

impl std::fmt::Display for BadColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run `{}`: {}", self.run, self.detail)
    }
}

impl std::error::Error for BadColumn {}

fn is_fk_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY)
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The status a lifecycle event puts the run in, if it changes it.
fn status_of(ev: &StoredEvent) -> Option<String> {
    match ev.type_name.as_str() {
        "RunStarted" => Some("running".into()),
        "RunFinished" => Some("finished".into()),
        "RunFailed" => Some("failed".into()),
        "RunCancelled" => Some("cancelled".into()),
        "RunStatusChanged" => serde_json::from_str::<Value>(&ev.json)
            .ok()?
            .get("status")?
            .as_str()
            .map(str::to_string),
        _ => None,
    }
}

fn json_text(v: &Value) -> String {
    serde_json::to_string(v).expect("JSON values always serialize")
}

/// A typed column's own check (a status, a run id), carried through
/// rusqlite's row mapping so that it comes out as the same
/// [`StoreError::BadRow`].
fn typed_column<T>(parsed: Result<T, StoreError>) -> rusqlite::Result<T> {
    parsed.map_err(|e| {
        let (run, detail) = match e {
            StoreError::BadRow { run, detail } => (run, detail),
            other => (String::new(), other.to_string()),
        };
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            Box::new(BadColumn { run, detail }),
        )
    })
}

fn parse_json(run: &str, col: &str, s: &str) -> rusqlite::Result<Value> {
    serde_json::from_str(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            Box::new(BadColumn {
                run: run.to_string(),
                detail: format!("column `{col}` is not JSON: {e}"),
            }),
        )
    })
}

/// A run's `updated_ms` as the trait defines it: the row's (set when it was
/// made and at each status change) or its latest event's timestamp, the
/// larger. The row is not rewritten per commit: with WAL, that rewrote the
/// run's page and its status index's page in every group commit, doubling
/// the pages a run's commits write against its events alone.
macro_rules! updated_ms {
    () => {
        "max(updated_ms, coalesce((SELECT ts FROM events e WHERE e.run = \
         (SELECT run FROM event_runs k WHERE k.run_id = runs.run_id) \
         ORDER BY e.seq DESC LIMIT 1), updated_ms))"
    };
}

macro_rules! run_cols {
    () => {
        concat!(
            "run_id, workflow, workflow_path, workflow_hash, source, input, \
             status, created_ms, ",
            updated_ms!(),
            ", parent_run_id"
        )
    };
}

// The statements that look rows up, named so that a test can check each one's
// query plan (every one must go through an index).
use events::LAST_SEQ;
const UPDATE_RUN_AFTER_APPEND: &str = "UPDATE runs SET updated_ms = max(updated_ms, ?2), \
                                       status = coalesce(?3, status) WHERE run_id = ?1";
const GET_RUN: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs JOIN workflow_sources USING (run_id) WHERE run_id = ?1"
);
const LIST_RUNS: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs JOIN workflow_sources USING (run_id) \
     WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR workflow = ?2) \
     AND (?5 IS NULL OR parent_run_id = ?5) \
     ORDER BY created_ms DESC, runs.rowid DESC LIMIT ?3 OFFSET ?4"
);
const GC_CANDIDATES: &str = concat!(
    "SELECT run_id FROM runs WHERE status IN ('finished', 'failed', 'cancelled') AND ",
    updated_ms!(),
    " < ?1 ORDER BY created_ms"
);
const GC_STILL_DUE: &str = concat!(
    "SELECT count(*) FROM runs WHERE run_id = ?1 AND status IN \
     ('finished', 'failed', 'cancelled') AND ",
    updated_ms!(),
    " < ?2"
);
const GET_GENERATION: &str = "SELECT run_id, generation, workflow_hash, source, created_ms, files \
                              FROM generations WHERE run_id = ?1 AND generation = ?2";
const TOOL_CALLS: &str = "SELECT run_id, node_id, iteration, attempt, tool_seq, tool, \
                          idempotency_key, side_effect, idempotent, input, output, started_ms, \
                          finished_ms, status, error FROM tool_calls WHERE run_id = ?1 AND \
                          node_id = ?2 AND iteration = ?3 ORDER BY attempt, tool_seq";

/// A run id column read back (`run` names the row's run as stored).
fn run_id_column(run: &str, col: &str, text: &str) -> rusqlite::Result<RunId> {
    typed_column(run_id_from_row(run, col, text))
}

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    let run_id: String = r.get(0)?;
    let input: String = r.get(5)?;
    let parent: Option<String> = r.get(9)?;
    Ok(RunRecord {
        input: parse_json(&run_id, "input", &input)?,
        workflow: r.get(1)?,
        workflow_path: r.get(2)?,
        workflow_hash: r.get(3)?,
        workflow_source: r.get(4)?,
        status: typed_column(RecordStatus::from_row(&run_id, &r.get::<_, String>(6)?))?,
        created_ms: r.get(7)?,
        updated_ms: r.get(8)?,
        parent_run_id: parent
            .map(|p| run_id_column(&run_id, "parent_run_id", &p))
            .transpose()?,
        run_id: run_id_column(&run_id, "run_id", &run_id)?,
    })
}

fn inbox_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InboxEntry> {
    let run_id: String = r.get(1)?;
    let text: String = r.get(2)?;
    let command = serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            2,
            rusqlite::types::Type::Text,
            format!("run `{run_id}`: inbox command is not a command: {e}").into(),
        )
    })?;
    Ok(InboxEntry {
        id: r.get::<_, i64>(0)? as u64,
        command,
        created_ms: r.get(3)?,
        run_id: run_id_column(&run_id, "run_id", &run_id)?,
    })
}

fn process_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ProcessRecord> {
    let run_id: String = r.get(1)?;
    Ok(ProcessRecord {
        id: r.get::<_, i64>(0)? as u64,
        run_id: run_id_column(&run_id, "run_id", &run_id)?,
        node_id: r.get(2)?,
        iteration: r.get(3)?,
        attempt: r.get(4)?,
        pgid: r.get(5)?,
        started_ms: r.get(6)?,
    })
}

fn tool_call_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ToolCallRecord> {
    let run_id: String = r.get(0)?;
    let input: String = r.get(9)?;
    let output: Option<String> = r.get(10)?;
    let error: Option<String> = r.get(14)?;
    Ok(ToolCallRecord {
        node_id: r.get(1)?,
        iteration: r.get(2)?,
        attempt: r.get(3)?,
        tool_seq: r.get(4)?,
        tool: r.get(5)?,
        idempotency_key: r.get(6)?,
        side_effect: r.get(7)?,
        idempotent: r.get(8)?,
        input: parse_json(&run_id, "input", &input)?,
        output: output
            .map(|s| parse_json(&run_id, "output", &s))
            .transpose()?,
        started_ms: r.get(11)?,
        finished_ms: r.get(12)?,
        status: typed_column(ToolCallStatus::from_row(&run_id, &r.get::<_, String>(13)?))?,
        error: error
            .map(|s| parse_json(&run_id, "error", &s))
            .transpose()?,
        run_id: run_id_column(&run_id, "run_id", &run_id)?,
    })
}

/// Makes the files and folders of [`Backend::files`] that SQLite or this
/// backend would only make later, so that a sandbox can cover every one of
/// them: a path that does not exist cannot be covered, and in a store kept
/// in a sandbox's root a node could create it first. The rollback journal
/// matters most: in WAL mode SQLite never writes one, but a connection
/// opening the database plays back a "hot" `-journal` it finds into the
/// database file, so a node that could plant one could rewrite the store.
/// An empty journal is never hot. Best effort: a folder this process cannot
/// write is one no node of it can write either.
fn make_kept(db: &Path, dir: &Path) {
    let mut journal = db.as_os_str().to_owned();
    journal.push("-journal");
    let _ = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(PathBuf::from(journal));
    for sub in ["locks", "wake"] {
        let _ = std::fs::create_dir_all(dir.join(sub));
    }
}

/// Holds `flock(LOCK_EX)` on the run's lock file while alive.
struct FlockLease {
    _file: File,
}

impl RunLease for FlockLease {}

impl EventLog for SqliteBackend {
    fn append(&self, batch: &[StoredEvent]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let learned = self.write(|tx| self.append_in(tx, batch))?;
        self.types.learn(learned);
        Ok(())
    }

    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        self.read(|c| read_events_on(c, run_id, q))
    }

    fn last_seq(&self, run_id: &RunId) -> Result<u64, StoreError> {
        self.read(|c| last_seq_on(c, run_id))
    }

    fn checkpoint(&self) -> Result<(), StoreError> {
        if self.wal_len() < CHECKPOINT_FROM {
            return Ok(());
        }
        let conn = self.write.lock().unwrap_or_else(|p| p.into_inner());
        // PASSIVE copies what no reader still needs and never waits. TRUNCATE
        // then empties the log file, but only if it can do so at once: with
        // no busy wait it never holds up another process's writer.
        let r = conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .and_then(|_| conn.busy_timeout(Duration::ZERO))
            .and_then(|_| {
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    r.get::<_, i64>(0)
                })
            });
        let restored = conn.busy_timeout(BUSY_TIMEOUT);
        match r {
            Ok(_) => {}
            // Someone else is reading or writing: what PASSIVE copied stays.
            Err(rusqlite::Error::SqliteFailure(f, _))
                if matches!(f.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {}
            Err(e) => return Err(self.err(e)),
        }
        restored.map_err(|e| self.err(e))
    }
}

impl Runs for SqliteBackend {
    fn create_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.write(|tx| self.insert_run(tx, rec))
    }

    fn start_run(&self, start: &NewRun<'_>) -> Result<(), StoreError> {
        let learned = self.write(|tx| {
            if let Some(rec) = start.record {
                self.insert_run(tx, rec)?;
            }
            if let Some(g) = start.pinned {
                self.insert_generation(tx, g)?;
            }
            self.append_in(tx, std::slice::from_ref(start.first))
        })?;
        self.types.learn(learned);
        Ok(())
    }

    fn get_run(&self, run_id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        self.read(|c| get_run_on(c, run_id))
    }

    fn list_runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.read(|c| list_runs_on(c, f))
    }

    fn delete_finished_before(&self, cutoff_ms: i64) -> Result<Vec<RunId>, StoreError> {
        let candidates: Vec<RunId> = self.read(|c| {
            let mut st = c.prepare_cached(GC_CANDIDATES)?;
            let rows = st.query_map([cutoff_ms], |r| {
                let id: String = r.get(0)?;
                run_id_column(&id, "run_id", &id)
            })?;
            rows.collect()
        })?;
        // A run being resumed right now holds its lease: leave it alone. The
        // leases stay held until the deletion has committed.
        let mut leases = Vec::new();
        let mut ids = Vec::new();
        for id in candidates {
            if let Some(l) = self.try_lock_run(&id)? {
                leases.push(l);
                ids.push(id);
            }
        }
        self.write(|tx| {
            let mut deleted = Vec::new();
            for id in ids {
                // Re-check inside the transaction: the status may have moved on.
                let still: bool = tx
                    .query_row(GC_STILL_DUE, params![id.as_str(), cutoff_ms], |r| {
                        r.get::<_, i64>(0)
                    })
                    .map_err(|e| self.err(e))?
                    > 0;
                if !still {
                    continue;
                }
                for sql in events::DELETE_RUN.into_iter().chain([
                    "DELETE FROM tool_calls WHERE run_id = ?1",
                    "DELETE FROM inbox WHERE run_id = ?1",
                    "DELETE FROM processes WHERE run_id = ?1",
                    "DELETE FROM generations WHERE run_id = ?1",
                    "DELETE FROM workflow_sources WHERE run_id = ?1",
                    "DELETE FROM runs WHERE run_id = ?1",
                ]) {
                    tx.execute(sql, [id.as_str()]).map_err(|e| self.err(e))?;
                }
                deleted.push(id);
            }
            Ok(deleted)
        })
    }
}

impl AsyncReads for SqliteBackend {
    fn read_events_async(&self, run_id: &RunId, q: &EventQuery) -> StoreFuture<Vec<StoredEvent>> {
        let (run, q) = (run_id.clone(), q.clone());
        self.read_async(move |c| read_events_on(c, &run, &q))
    }

    fn last_seq_async(&self, run_id: &RunId) -> StoreFuture<u64> {
        let run = run_id.clone();
        self.read_async(move |c| last_seq_on(c, &run))
    }

    fn get_run_async(&self, run_id: &RunId) -> StoreFuture<Option<RunRecord>> {
        let run = run_id.clone();
        self.read_async(move |c| get_run_on(c, &run))
    }

    fn list_runs_async(&self, f: &RunFilter) -> StoreFuture<Vec<RunRecord>> {
        let f = f.clone();
        self.read_async(move |c| list_runs_on(c, &f))
    }
}

impl Generations for SqliteBackend {
    fn put_generation(&self, rec: &GenerationRecord) -> Result<(), StoreError> {
        self.write(|tx| self.insert_generation(tx, rec))
    }

    fn generation(
        &self,
        run_id: &RunId,
        generation: u64,
    ) -> Result<Option<GenerationRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(GET_GENERATION)?
                .query_row(
                    params![run_id.as_str(), generation.min(i64::MAX as u64) as i64],
                    |r| {
                        let run: String = r.get(0)?;
                        Ok(GenerationRecord {
                            run_id: run_id_column(&run, "run_id", &run)?,
                            generation: r.get::<_, i64>(1)? as u64,
                            workflow_hash: r.get(2)?,
                            workflow_source: r.get(3)?,
                            created_ms: r.get(4)?,
                            files: crate::PinnedFile::decode_all(&r.get::<_, String>(5)?).map_err(
                                |e| {
                                    rusqlite::Error::FromSqlConversionFailure(
                                        5,
                                        rusqlite::types::Type::Text,
                                        Box::new(e),
                                    )
                                },
                            )?,
                        })
                    },
                )
                .optional()
        })
    }
}

impl Leases for SqliteBackend {
    fn try_lock_run(&self, run_id: &RunId) -> Result<Option<Box<dyn RunLease>>, StoreError> {
        std::fs::create_dir_all(&self.lock_dir).map_err(|e| StoreError::io(&self.lock_dir, e))?;
        let path = self.lock_dir.join(format!("{run_id}.lock"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        // flock locks belong to the open file description, so a second open
        // of the same file in this process conflicts too; the kernel drops
        // the lock when the descriptor closes, including on process death.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            // Who drives the run, for people; the lock alone decides.
            let name = self
                .instance
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let named = file
                .set_len(0)
                .and_then(|_| std::os::unix::fs::FileExt::write_all_at(&file, name.as_bytes(), 0));
            if let Err(e) = named {
                tracing::debug!(run = %run_id, error = %e, "could not name the lock's holder");
            }
            return Ok(Some(Box::new(FlockLease { _file: file })));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(StoreError::io(&path, err))
        }
    }

    /// The process holding the run's lock, from the kernel's table of
    /// locks (`/proc/locks`), without touching the lock: asking must not
    /// take the run from under a resume that is starting. A lock lasts
    /// exactly as long as its holder, so the holder is alive here.
    fn lease_holder(&self, run_id: &RunId) -> Result<Option<LeaseHolder>, StoreError> {
        let path = self.lock_dir.join(format!("{run_id}.lock"));
        match std::fs::metadata(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(&path, e)),
        }
        let Ok(table) = std::fs::read_to_string("/proc/locks") else {
            return Ok(None);
        };
        let held = locks::flock_holders(&table);
        let holder = self
            .lock_owner(&path, &held)
            .filter(|(pid, _)| *pid != std::process::id());
        Ok(holder.map(|(pid, instance)| LeaseHolder {
            holder: format!("pid {pid} on this machine"),
            expires_in: None,
            alive_here: true,
            instance: Some(instance),
        }))
    }

    /// From the kernel's table of locks, read once for the whole list.
    fn drivers(&self, runs: &[RunId]) -> Result<HashMap<RunId, String>, StoreError> {
        if runs.is_empty() {
            return Ok(HashMap::new());
        }
        let Ok(table) = std::fs::read_to_string("/proc/locks") else {
            return Ok(HashMap::new());
        };
        let held = locks::flock_holders(&table);
        Ok(runs
            .iter()
            .filter_map(|r| {
                let path = self.lock_dir.join(format!("{r}.lock"));
                self.lock_owner(&path, &held)
                    .map(|(_, name)| (r.clone(), name))
            })
            .collect())
    }
}

impl ToolCalls for SqliteBackend {
    fn put_tool_call(&self, rec: &ToolCallRecord) -> Result<(), StoreError> {
        self.write(|tx| self.put_tool_call_in(tx, rec))
    }

    fn tool_calls(
        &self,
        run_id: &RunId,
        node_id: &NodePath,
        iteration: u32,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare_cached(TOOL_CALLS)?;
            let rows = st.query_map(
                params![run_id.as_str(), node_id.as_str(), iteration],
                tool_call_row,
            )?;
            rows.collect()
        })
    }
}

impl Inbox for SqliteBackend {
    fn put_command(&self, run_id: &RunId, command: &RunCommand) -> Result<u64, StoreError> {
        let text = serde_json::to_string(command).map_err(|e| StoreError::BadRow {
            run: run_id.to_string(),
            detail: format!("command cannot be stored: {e}"),
        })?;
        self.write(|tx| {
            tx.execute(
                "INSERT INTO inbox (run_id, command, created_ms) VALUES (?1, ?2, ?3)",
                params![run_id.as_str(), text, now_ms()],
            )
            .map_err(self.or_no_run(run_id))?;
            Ok(tx.last_insert_rowid() as u64)
        })
    }

    fn pending_commands(&self, run_id: &RunId) -> Result<Vec<InboxEntry>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, run_id, command, created_ms FROM inbox \
                 WHERE run_id = ?1 AND taken_ms IS NULL ORDER BY id",
            )?;
            let rows = st.query_map([run_id.as_str()], inbox_row)?;
            rows.collect()
        })
    }

    fn take_command(&self, id: u64, outcome: &str) -> Result<(), StoreError> {
        self.write(|tx| {
            let n = tx
                .execute(
                    "UPDATE inbox SET taken_ms = coalesce(taken_ms, ?2), \
                     outcome = coalesce(outcome, ?3) WHERE id = ?1",
                    params![id as i64, now_ms(), outcome],
                )
                .map_err(|e| self.err(e))?;
            if n == 0 {
                return Err(StoreError::RecordNotFound {
                    what: "command",
                    id,
                });
            }
            Ok(())
        })
    }
}

impl Processes for SqliteBackend {
    fn put_process(&self, rec: &ProcessRecord) -> Result<u64, StoreError> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO processes (run_id, node_id, iteration, attempt, pgid, started_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    rec.run_id.as_str(),
                    rec.node_id,
                    rec.iteration,
                    rec.attempt,
                    rec.pgid,
                    rec.started_ms
                ],
            )
            .map_err(self.or_no_run(&rec.run_id))?;
            Ok(tx.last_insert_rowid() as u64)
        })
    }

    fn remove_process(&self, id: u64) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute("DELETE FROM processes WHERE id = ?1", [id as i64])
                .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    fn processes(&self, run_id: &RunId) -> Result<Vec<ProcessRecord>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare_cached(
                "SELECT id, run_id, node_id, iteration, attempt, pgid, started_ms \
                 FROM processes WHERE run_id = ?1 ORDER BY id",
            )?;
            let rows = st.query_map([run_id.as_str()], process_row)?;
            rows.collect()
        })
    }
}

impl Wakeups for SqliteBackend {
    fn notify(&self, topic: Topic<'_>) {
        self.wake.notify(topic);
    }

    fn notify_all(&self, topics: &[Topic<'_>]) {
        self.wake.notify_all(topics);
    }

    fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError> {
        self.wake.listen(topic)
    }
}

impl Backend for SqliteBackend {
    fn schedules(&self) -> Option<&dyn cairn_storage::Schedules> {
        Some(self)
    }

    fn append_with_calls(
        &self,
        calls: &[ToolCallRecord],
        batch: &[StoredEvent],
    ) -> Result<(), StoreError> {
        if calls.is_empty() {
            return self.append(batch);
        }
        let learned = self.write(|tx| {
            for c in calls {
                self.put_tool_call_in(tx, c)?;
            }
            self.append_in(tx, batch)
        })?;
        self.types.learn(learned);
        Ok(())
    }

    fn files(&self) -> Vec<PathBuf> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut files = vec![self.path.clone()];
        for suffix in ["-wal", "-shm", "-journal"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            files.push(PathBuf::from(p));
        }
        files.push(self.lock_dir.clone());
        files.push(dir.join("wake"));
        files
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<SqliteBackend>();
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The query plan's lines for a statement.
    fn plan(c: &Connection, sql: &str) -> Vec<String> {
        let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let nulls = vec![rusqlite::types::Value::Null; st.parameter_count()];
        let rows = st
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    /// A first `cairn run` and a `cairn status` polling for it open a new
    /// store in the same instant; neither may fail for it ("locked") nor
    /// find it half made.
    #[test]
    fn processes_opening_a_new_store_at_once_all_succeed() {
        for round in 0..40 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(".cairn/cairn.db");
            let start = Arc::new(std::sync::Barrier::new(6));
            let openers: Vec<_> = (0..6)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        SqliteBackend::open(&path).map(|b| b.path.clone())
                    })
                })
                .collect();
            for o in openers {
                let opened = o.join().unwrap();
                assert!(opened.is_ok(), "round {round}: {opened:?}");
            }
            let c = Connection::open(&path).unwrap();
            let v: i64 = c
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .unwrap();
            assert_eq!(v, SCHEMA_VERSION);
        }
    }

    #[test]
    fn every_lookup_goes_through_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let b = SqliteBackend::open(&dir.path().join("s.db")).unwrap();
        let c = b.write.lock().unwrap();
        let q = |types: &[&str], node: Option<&str>| EventQuery {
            after: 3,
            types: types.iter().map(|t| t.parse().unwrap()).collect(),
            node: node.map(str::to_string),
            limit: Some(10),
        };
        let mut statements: Vec<String> = [
            q(&[], None),
            q(&["NodeFinished"], None),
            q(&["NodeFinished", "RunStarted"], Some("a")),
            q(&["NodeOutput", "NodeFinished"], None),
            q(&[], Some("a")),
        ]
        .iter()
        .map(|q| events::query(&RunId::parse("r").unwrap(), q).0)
        .collect();
        statements.extend(
            [
                LAST_SEQ,
                events::DELETE_RUN[0],
                events::DELETE_RUN[1],
                UPDATE_RUN_AFTER_APPEND,
                GET_RUN,
                LIST_RUNS,
                GC_CANDIDATES,
                GC_STILL_DUE,
                TOOL_CALLS,
                GET_GENERATION,
            ]
            .iter()
            .chain(&[
                // As `delete_finished_before` runs them.
                "DELETE FROM tool_calls WHERE run_id = ?1",
                "DELETE FROM generations WHERE run_id = ?1",
                "DELETE FROM workflow_sources WHERE run_id = ?1",
                "DELETE FROM runs WHERE run_id = ?1",
            ])
            .map(|s| s.to_string()),
        );
        for sql in &statements {
            let plan = plan(&c, sql);
            assert!(!plan.is_empty(), "{sql}");
            for line in &plan {
                let indexed = line.contains("USING INDEX")
                    || line.contains("USING COVERING INDEX")
                    || line.contains("USING PRIMARY KEY")
                    || line.contains("USING INTEGER PRIMARY KEY")
                    || line.starts_with("USE TEMP B-TREE")
                    // The line that opens a subquery (a run's key); its own
                    // lines follow.
                    || line.starts_with("CORRELATED SCALAR SUBQUERY")
                    || line.starts_with("SCALAR SUBQUERY")
                    || line.starts_with("LIST SUBQUERY")
                    // A filter SQLite builds from an index's rows to skip others.
                    || line.starts_with("CREATE BLOOM FILTER");
                assert!(indexed, "{sql}\n  plan: {line}");
            }
        }
        // A type filter without the output stream uses the type index.
        let sql = events::query(
            &RunId::parse("r").unwrap(),
            &q(&["NodeFinished", "RunStarted"], None),
        )
        .0;
        assert!(
            plan(&c, &sql).iter().any(|l| l.contains("events_by_type")),
            "{sql}"
        );
    }

    /// Versions 1 and 2 kept the workflow text in the run's row.
    const RUNS_BEFORE_3: &str =
        "ALTER TABLE runs ADD COLUMN workflow_source TEXT NOT NULL DEFAULT '';";

    #[test]
    fn a_version_2_store_is_migrated_and_keeps_its_runs_workflow_text() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        {
            let c = Connection::open(&db).unwrap();
            c.execute_batch(&v1_schema()).unwrap();
            c.execute_batch(RUNS_BEFORE_3).unwrap();
            c.execute_batch(EVENTS_BY_TYPE_V2).unwrap();
            c.execute_batch(INBOX).unwrap();
            c.execute_batch(
                "INSERT INTO runs (run_id, workflow, workflow_path, workflow_hash, \
                 workflow_source, input, status, created_ms, updated_ms) \
                 VALUES ('r', 'wf', '/wf.yaml', 'h', 'name: wf', '{}', 'running', 1, 2);
                 INSERT INTO events VALUES ('r', 1, 'RunStarted', NULL, 5, '{}');
                 PRAGMA user_version = 2;",
            )
            .unwrap();
        }
        let b = SqliteBackend::open(&db).unwrap();
        let run = b
            .get_run(&RunId::parse("r").unwrap())
            .unwrap()
            .expect("the run is kept");
        assert_eq!(run.workflow_source, "name: wf");
        assert_eq!(run.status.as_str(), "running");
        assert_eq!(b.list_runs(&RunFilter::default()).unwrap().len(), 1);
        assert_eq!(b.last_seq(&RunId::parse("r").unwrap()).unwrap(), 1);
        let c = b.write.lock().unwrap();
        let cols: Vec<String> = c
            .prepare("SELECT name FROM pragma_table_info('runs')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(!cols.iter().any(|n| n == "workflow_source"), "{cols:?}");
    }

    /// A store as version 1 made it, with `rows` (SQL) run in it.
    fn v1_store(db: &Path, rows: &str) {
        let c = Connection::open(db).unwrap();
        c.execute_batch(&v1_schema()).unwrap();
        c.execute_batch(RUNS_BEFORE_3).unwrap();
        c.execute_batch(
            "CREATE TABLE controls (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
                 kind TEXT NOT NULL, node_id TEXT, payload TEXT NOT NULL,
                 created_ms INTEGER NOT NULL, consumed_ms INTEGER);
             CREATE INDEX events_by_type ON events(run_id, type, seq);
             CREATE INDEX events_by_node ON events(run_id, node_id, seq);",
        )
        .unwrap();
        c.execute_batch(rows).unwrap();
        c.execute_batch("PRAGMA user_version = 1;").unwrap();
    }

    /// Every table's columns, every index's columns and condition, and the
    /// type codes: what a store's shape is, in SQLite's own words.
    fn shape(c: &Connection) -> Vec<String> {
        let rows = |sql: &str| -> Vec<String> {
            let mut st = c.prepare(sql).unwrap();
            let n = st.column_count();
            st.query_map([], |r| {
                Ok((0..n)
                    .map(|i| match r.get_ref(i).unwrap() {
                        rusqlite::types::ValueRef::Text(t) => {
                            String::from_utf8_lossy(t).into_owned()
                        }
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" "))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
        };
        let mut out = rows("PRAGMA user_version");
        let tables = rows(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
             ORDER BY name",
        );
        for t in &tables {
            out.push(format!("table {t}"));
            out.extend(rows(&format!("PRAGMA table_xinfo('{t}')")));
            // WITHOUT ROWID or not.
            out.extend(rows(&format!(
                "SELECT instr(sql, 'WITHOUT ROWID') > 0 FROM sqlite_master WHERE name = '{t}'"
            )));
            for ix in rows(&format!(
                "SELECT name, \"unique\", origin, partial FROM pragma_index_list('{t}') ORDER BY name"
            )) {
                out.push(format!("index {ix}"));
                let name = ix.split(' ').next().unwrap();
                out.extend(rows(&format!("PRAGMA index_xinfo('{name}')")));
                // A partial index's condition, as written.
                out.extend(rows(&format!(
                    "SELECT substr(sql, instr(sql, ' WHERE ')) FROM sqlite_master \
                     WHERE name = '{name}' AND sql LIKE '% WHERE %'"
                )));
            }
        }
        out.extend(rows("SELECT type, name FROM event_types ORDER BY type"));
        out
    }

    /// A new store is made in one batch, not through the migrations: its
    /// tables, columns, keys, indexes and type codes are those of a store
    /// made by version 1 and migrated.
    #[test]
    fn a_new_store_has_the_shape_of_a_migrated_one() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.db");
        v1_store(&old, "");
        let migrated = SqliteBackend::open(&old).unwrap();
        let new = SqliteBackend::open(&dir.path().join("new.db")).unwrap();
        let (a, b) = (
            shape(&migrated.write.lock().unwrap()),
            shape(&new.write.lock().unwrap()),
        );
        let tables = a.iter().filter(|l| l.starts_with("table ")).count();
        assert_eq!(tables, 11, "{a:#?}");
        assert!(a.iter().any(|l| l.contains("files")), "{a:#?}");
        let differ: Vec<String> = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x != y)
            .map(|(x, y)| format!("migrated: {x}\n     new: {y}"))
            .collect();
        assert!(differ.is_empty(), "{}", differ.join("\n"));
        assert_eq!(a.len(), b.len(), "{a:#?}\n{b:#?}");
    }

    #[test]
    fn a_version_1_store_is_migrated_and_keeps_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        v1_store(
            &db,
            "INSERT INTO events VALUES ('r', 1, 'RunStarted', NULL, 5, '{}');",
        );
        let b = SqliteBackend::open(&db).unwrap();
        assert_eq!(b.last_seq(&RunId::parse("r").unwrap()).unwrap(), 1);
        let c = b.write.lock().unwrap();
        let v: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let tables: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(tables.iter().any(|t| t == "inbox"), "{tables:?}");
        assert!(tables.iter().any(|t| t == "processes"), "{tables:?}");
        assert!(tables.iter().any(|t| t == "generations"), "{tables:?}");
        assert!(!tables.iter().any(|t| t == "controls"), "{tables:?}");
        let indexes: Vec<String> = c
            .prepare("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' AND sql IS NOT NULL")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(indexes.len(), 1, "{indexes:?}");
        assert!(indexes[0].contains("WHERE type <> 0"), "{indexes:?}");
    }

    fn failure(code: i32, msg: &str) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some(msg.into()))
    }

    #[test]
    fn sqlite_errors_become_the_stores_own() {
        let p = Path::new("/x/cairn.db");
        let full = map_err(
            p,
            failure(rusqlite::ffi::SQLITE_FULL, "database or disk is full"),
        );
        assert!(
            matches!(full, StoreError::DiskFull { ref store } if store == "/x/cairn.db"),
            "{full:?}"
        );
        let ro = map_err(
            p,
            failure(
                rusqlite::ffi::SQLITE_READONLY,
                "attempt to write a readonly database",
            ),
        );
        assert!(
            matches!(ro, StoreError::ReadOnly { ref detail, .. } if detail.contains("readonly")),
            "{ro:?}"
        );
        let busy = map_err(p, failure(rusqlite::ffi::SQLITE_BUSY, "database is locked"));
        assert!(matches!(busy, StoreError::Locked { .. }), "{busy:?}");
        let other = map_err(
            p,
            failure(
                rusqlite::ffi::SQLITE_MISUSE,
                "bad parameter or other API misuse",
            ),
        );
        assert!(
            matches!(other, StoreError::Database(ref m) if m.contains("misuse")),
            "{other:?}"
        );
        let conv = map_err(
            p,
            rusqlite::Error::InvalidColumnType(0, "seq".into(), rusqlite::types::Type::Text),
        );
        assert!(
            matches!(conv, StoreError::Database(ref m) if m.contains("seq")),
            "{conv:?}"
        );
    }
}
