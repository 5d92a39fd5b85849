//! Bytes on disk per event, for a chain of value nodes run by the engine.
//!
//! `cargo bench -p cairn-engine --bench event_size`: a chain of 10,000
//! `value` nodes (`n1` needs `n0`, ...) runs on a SQLite store in a
//! temporary folder and, when `CAIRN_TEST_PG` names a server (e.g.
//! `postgres://postgres@127.0.0.1:5432/postgres`), on a PostgreSQL schema
//! of its own. It prints per store the events written and the bytes per
//! event: on SQLite the database file's size once the write-ahead log is
//! moved into it (`wal_checkpoint(TRUNCATE)`), over the events; on
//! PostgreSQL `pg_total_relation_size` of the events table (heap, indexes,
//! TOAST), over the events, and the whole schema's run tables as well.
//! SQLite also gets a breakdown by table and index (`dbstat`).
//! `CAIRN_BENCH_SIZES=1000,10000` picks the chain's lengths.

use std::path::Path;
use std::sync::Arc;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_store::{Journal, JournalOptions};
use serde_json::json;

/// The chain's workflow file: `n` value nodes, each needing the one before.
fn chain(n: usize) -> String {
    let mut y = String::from("name: size-chain\nnodes:\n");
    for i in 0..n {
        y.push_str(&format!("  - id: n{i}\n    value: {i}\n"));
        if i > 0 {
            y.push_str(&format!("    needs: [n{}]\n", i - 1));
        }
    }
    y
}

/// Runs the chain on `journal` to its end.
fn run_chain(dir: &Path, journal: Journal, n: usize) {
    let path = dir.join("wf.yaml");
    std::fs::write(&path, chain(n)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wf = cairn_workflow::load(&path).expect("load the workflow");
    let engine = Engine::new(journal.clone(), EngineOptions::default());
    let outcome = rt.block_on(async {
        engine
            .start(wf, json!({}), StartOptions::default())
            .await
            .expect("start")
            .wait()
            .await
    });
    assert!(
        matches!(outcome, RunOutcome::Finished(_)),
        "the chain ended {outcome:?}"
    );
    drop(engine);
    journal.close();
}

/// SQLite: (events, bytes per event, lines of the breakdown by table).
fn on_sqlite(n: usize) -> (i64, f64, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let journal = Journal::open_sqlite(&db, JournalOptions::default()).expect("open the store");
    run_chain(dir.path(), journal, n);
    let c = rusqlite::Connection::open(&db).unwrap();
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let events: i64 = c
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    let size = std::fs::metadata(&db).unwrap().len();
    let mut st = c
        .prepare(
            "SELECT name, sum(pgsize) FROM dbstat GROUP BY name \
             HAVING sum(pgsize) > 8192 * 4 ORDER BY 2 DESC",
        )
        .unwrap();
    let parts = st
        .query_map([], |r| {
            let (name, bytes): (String, i64) = (r.get(0)?, r.get(1)?);
            Ok(format!(
                "  {name}: {bytes} bytes, {:.1} per event",
                bytes as f64 / events as f64
            ))
        })
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    (events, size as f64 / events as f64, parts)
}

/// PostgreSQL, when there is a server: (events, bytes per event of the
/// events table, bytes per event of every table of the schema).
fn on_postgres(n: usize) -> Option<(i64, f64, f64)> {
    let scratch = cairn_postgres::testing::Scratch::new()?;
    let schema = scratch.schema();
    let backend = scratch.open(&schema, cairn_postgres::PgOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let journal =
        Journal::open(Arc::new(backend), JournalOptions::default()).expect("open the store");
    run_chain(dir.path(), journal, n);
    let q = |sql: &str| cairn_postgres::testing::query_i64(scratch.url, sql);
    let events = q(&format!("SELECT count(*) FROM {schema}.events"));
    let size_of = |tables: &str| {
        q(&format!(
            "SELECT sum(pg_total_relation_size(c.oid))::int8 FROM pg_class c \
             JOIN pg_namespace s ON s.oid = c.relnamespace \
             WHERE s.nspname = '{schema}' AND c.relkind = 'r' AND c.relname LIKE '{tables}'"
        ))
    };
    // The events with the keys of their runs and types (schema 4 on).
    let table = size_of("event%");
    let all = size_of("%");
    Some((
        events,
        table as f64 / events as f64,
        all as f64 / events as f64,
    ))
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the arguments.
    let sizes: Vec<usize> = std::env::var("CAIRN_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000]);
    for n in sizes {
        let (events, per_event, parts) = on_sqlite(n);
        println!("sqlite   chain of {n}: {events} events, {per_event:.1} bytes per event (file after checkpoint)");
        for p in parts {
            println!("{p}");
        }
        match on_postgres(n) {
            Some((events, table, all)) => println!(
                "postgres chain of {n}: {events} events, {table:.1} bytes per event \
                 (events and their keys' tables, with indexes), {all:.1} with every table of the schema"
            ),
            None => println!("postgres chain of {n}: skipped (CAIRN_TEST_PG is not set)"),
        }
    }
}
