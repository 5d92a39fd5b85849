//! Append throughput: the journal against a bare SQLite insert loop.
//!
//! `cargo bench -p cairn-store --bench append` (a few seconds).
//!
//! - baseline: rusqlite alone, same schema and pragmas (WAL,
//!   synchronous=NORMAL), one prepared INSERT, one transaction per 1000 rows,
//!   rows serialized beforehand (so it measures the database only);
//! - the same loop on the version 1 events table (two full secondary
//!   indexes, by type and by node), to show what the schema costs;
//! - journal: `RunLog::append` of the same events (stamping, sequencing and
//!   JSON serialization included), then one `sync`; group commit decides the
//!   transaction sizes; without and with the NDJSON mirror, and on a store
//!   given back the version 1 indexes;
//! - durable: `append_durable` one at a time, each waiting for its commit.

use std::path::Path;
use std::time::Instant;

use cairn_events::{Event, EventKind, OutputStream, Scope};
use cairn_store::envelope::Envelope;
use cairn_store::{Journal, JournalOptions, SqliteBackend, StoredEvent};

const N: u64 = 100_000;
const DURABLE_N: u64 = 3_000;

fn kind(i: u64) -> EventKind {
    EventKind::NodeOutput {
        text: format!("line {i}: some output a command printed while it ran"),
        stream: OutputStream::Stdout,
    }
}

fn scope() -> Scope {
    Scope::node("build", 0).with_attempt(1)
}

/// The indexes of schema version 1's events table.
const INDEXES_V1: &str = "CREATE INDEX events_by_type ON events(run_id, type, seq); \
    CREATE INDEX events_by_node ON events(run_id, node_id, seq);";

/// The events table of schema version 1.
fn events_v1() -> String {
    format!(
        "CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, \
         type TEXT NOT NULL, node_id TEXT, ts INTEGER NOT NULL, json TEXT NOT NULL, \
         PRIMARY KEY (run_id, seq)) WITHOUT ROWID; {INDEXES_V1}"
    )
}

/// A current store whose events table is given back the version 1 indexes,
/// so the journal can be measured on both in one run.
fn store_with_v1_indexes(db: &Path) {
    drop(SqliteBackend::open(db).unwrap());
    let c = rusqlite::Connection::open(db).unwrap();
    // Version 1's two full indexes, on the current table's columns.
    c.execute_batch(
        "DROP INDEX events_by_type; \
         CREATE INDEX events_by_type ON events(run, type, seq); \
         CREATE INDEX events_by_node ON events(run, node_id, seq);",
    )
    .unwrap();
}

/// The bare insert loop on the store's schema, or on `schema` (version
/// 1's table) if given. On the store's schema the rows are what the
/// journal would store (the run's and the type's keys looked up once, the
/// body after its envelope), so it measures the database alone.
fn baseline(db: &Path, schema: Option<&str>) -> f64 {
    let events: Vec<StoredEvent> = (1..=N)
        .map(|seq| {
            StoredEvent::from_event(&Event {
                run_id: cairn_events::RunId::parse("bench").unwrap(),
                seq: cairn_events::Seq(seq),
                timestamp_ms: 1_700_000_000_000,
                scope: scope(),
                kind: kind(seq),
            })
        })
        .collect();
    let (insert, keys) = match schema {
        Some(sql) => {
            rusqlite::Connection::open(db)
                .unwrap()
                .execute_batch(sql)
                .unwrap();
            (
                "INSERT INTO events (run_id, seq, type, node_id, ts, json) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                None,
            )
        }
        None => {
            // The store makes its schema; its keys are made here once.
            drop(SqliteBackend::open(db).unwrap());
            let c = rusqlite::Connection::open(db).unwrap();
            c.execute("INSERT INTO event_runs (run_id) VALUES ('bench')", [])
                .unwrap();
            let run: i64 = c
                .query_row(
                    "SELECT run FROM event_runs WHERE run_id = 'bench'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            c.execute(
                "INSERT OR IGNORE INTO event_types (name) VALUES ('NodeOutput')",
                [],
            )
            .unwrap();
            let ty: i64 = c
                .query_row(
                    "SELECT type FROM event_types WHERE name = 'NodeOutput'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            (
                "INSERT INTO events (run, seq, type, node_id, ts, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                Some((run, ty)),
            )
        }
    };
    // The values of each row, made before the clock starts.
    let rows: Vec<(
        rusqlite::types::Value,
        i64,
        rusqlite::types::Value,
        Option<String>,
        i64,
        String,
    )> = events
        .iter()
        .map(|e| {
            let node = e.node_id.as_ref().map(|n| n.to_string());
            match keys {
                None => (
                    e.run_id.to_string().into(),
                    e.seq as i64,
                    e.type_name.clone().into(),
                    node,
                    e.timestamp_ms,
                    e.json.to_string(),
                ),
                Some((run, ty)) => {
                    let envelope = Envelope {
                        type_name: &e.type_name,
                        run_id: e.run_id.as_str(),
                        seq: e.seq,
                        timestamp_ms: e.timestamp_ms,
                        node_id: node.as_deref(),
                    };
                    let body = envelope.body(&e.json).into_owned();
                    (
                        run.into(),
                        e.seq as i64,
                        ty.into(),
                        node,
                        e.timestamp_ms,
                        body,
                    )
                }
            }
        })
        .collect();
    let mut conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
        .unwrap();
    let start = Instant::now();
    for chunk in rows.chunks(1000) {
        let tx = conn.transaction().unwrap();
        {
            let mut st = tx.prepare_cached(insert).unwrap();
            for (run, seq, ty, node, ts, text) in chunk {
                st.execute(rusqlite::params![run, seq, ty, node, ts, text])
                    .unwrap();
            }
        }
        tx.commit().unwrap();
    }
    N as f64 / start.elapsed().as_secs_f64()
}

fn journal_bulk(db: &Path, log_dir: Option<&Path>) -> f64 {
    let j = Journal::open_sqlite(
        db,
        JournalOptions {
            log_dir: log_dir.map(Path::to_path_buf),
        },
    )
    .unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("bench").unwrap())
        .unwrap();
    let start = Instant::now();
    for i in 0..N {
        log.append(scope(), kind(i));
    }
    log.sync_blocking().unwrap();
    let rate = N as f64 / start.elapsed().as_secs_f64();
    drop(log);
    j.close();
    rate
}

fn journal_durable(db: &Path) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let j = Journal::open_sqlite(db, JournalOptions::default()).unwrap();
    let log = j
        .run_log(&cairn_events::RunId::parse("bench").unwrap())
        .unwrap();
    let start = Instant::now();
    rt.block_on(async {
        for i in 0..DURABLE_N {
            log.append_durable(scope(), kind(i)).await.unwrap();
        }
    });
    let rate = DURABLE_N as f64 / start.elapsed().as_secs_f64();
    drop(log);
    j.close();
    rate
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let dir = tempfile::tempdir().unwrap();
    let a = baseline(&dir.path().join("baseline.db"), None);
    let a1 = baseline(&dir.path().join("baseline-v1.db"), Some(&events_v1()));
    let b = journal_bulk(&dir.path().join("journal.db"), None);
    let v1 = dir.path().join("journal-v1.db");
    store_with_v1_indexes(&v1);
    let b1 = journal_bulk(&v1, None);
    let logs = dir.path().join("logs");
    let m = journal_bulk(&dir.path().join("mirror.db"), Some(&logs));
    let d = journal_durable(&dir.path().join("durable.db"));
    println!("events: {N} NodeOutput rows (~170 bytes of JSON each)");
    println!("(a) bare rusqlite, prepared INSERT, 1000 rows/txn  : {a:>10.0} events/s");
    println!(
        "    same on the version 1 events table             : {a1:>10.0} events/s  ({:.0}% of a)",
        100.0 * a1 / a
    );
    println!(
        "(b) RunLog::append x{N} then sync, no mirror  : {b:>10.0} events/s  ({:.0}% of a)",
        100.0 * b / a
    );
    println!(
        "    same, with the NDJSON mirror                   : {m:>10.0} events/s  ({:.0}% of a)",
        100.0 * m / a
    );
    println!(
        "    same, no mirror, with the version 1 indexes    : {b1:>10.0} events/s  ({:.0}% of a, {:.0}% of a's version 1 run)",
        100.0 * b1 / a,
        100.0 * b1 / a1
    );
    println!(
        "    append_durable one at a time (x{DURABLE_N})      : {d:>10.0} events/s  (one commit each)"
    );
}
