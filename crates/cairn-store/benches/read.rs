//! Reading a run's log back: the store's reads against a bare rusqlite scan
//! of version 1's table, where each row held its event's whole JSON.
//!
//! `cargo bench -p cairn-store --bench read` (a few seconds).
//!
//! One run of 100,000 events (nine output lines to each lifecycle event, as
//! a busy command node writes them), read page by page (1,000 events, as
//! a subscriber catching up or `GET /v1/runs/{id}/events` reads them):
//!
//! - baseline: rusqlite alone on version 1's table (`json` whole, the text
//!   `run_id` in every row), one prepared `SELECT` a page, the text copied
//!   out: what reading cost before schema 7, measured in the same run;
//! - `read_events` of the store, every event (the JSON rebuilt from the
//!   columns and the stored body, `cairn_storage::envelope`);
//! - `read_events` of one type that is not the output stream (the partial
//!   type index) and of one node (the run's seq range);
//! - `last_seq`, once per page (what a subscription asks between pages).
//!
//! Each case prints events per second and its ratio to the baseline.

use std::path::Path;
use std::time::Instant;

use cairn_events::{Event, EventKind, EventType, NodePath, OutputStream, RunId, Scope, Seq};
use cairn_store::prelude::*;
use cairn_store::{EventQuery, SqliteBackend, StoredEvent};

const N: u64 = 100_000;
const PAGE: usize = 1_000;
/// Nodes the run's events are spread over.
const NODES: u64 = 10;

/// The `i`th event: an output line, or every tenth a lifecycle event, of
/// node `n{i % NODES}`.
fn event(run: &RunId, i: u64) -> StoredEvent {
    let node = format!("n{}", i % NODES);
    let kind = if i.is_multiple_of(10) {
        EventKind::NodeHeartbeat {
            elapsed_ms: i,
            timeout_ms: Some(600_000),
            percent_elapsed: None,
        }
    } else {
        EventKind::NodeOutput {
            text: format!("line {i}: some output a command printed while it ran"),
            stream: OutputStream::Stdout,
        }
    };
    StoredEvent::from_event(&Event {
        run_id: run.clone(),
        seq: Seq(i),
        timestamp_ms: 1_700_000_000_000 + i as i64,
        scope: Scope::node(NodePath::from(node.as_str()), 0).with_attempt(1),
        kind,
    })
}

/// Version 1's events table, filled with the same events.
fn version_1(db: &Path, events: &[StoredEvent]) {
    let mut c = rusqlite::Connection::open(db).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
         CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, \
         type TEXT NOT NULL, node_id TEXT, ts INTEGER NOT NULL, json TEXT NOT NULL, \
         PRIMARY KEY (run_id, seq)) WITHOUT ROWID;",
    )
    .unwrap();
    let tx = c.transaction().unwrap();
    {
        let mut st = tx
            .prepare(
                "INSERT INTO events (run_id, seq, type, node_id, ts, json) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .unwrap();
        for e in events {
            st.execute(rusqlite::params![
                e.run_id.as_str(),
                e.seq as i64,
                e.type_name,
                e.node_id.as_ref().map(|n| n.to_string()),
                e.timestamp_ms,
                &*e.json
            ])
            .unwrap();
        }
    }
    tx.commit().unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
}

/// Reads the whole run from version 1's table, a page at a time; events/s.
fn baseline(db: &Path, run: &RunId) -> f64 {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut st = c
        .prepare(
            "SELECT run_id, seq, type, node_id, ts, json FROM events \
             WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .unwrap();
    let start = Instant::now();
    let (mut after, mut read) = (0i64, 0u64);
    loop {
        let page: Vec<(String, i64, String, Option<String>, i64, String)> = st
            .query_map(rusqlite::params![run.as_str(), after, PAGE as i64], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.1;
        read += page.len() as u64;
    }
    assert_eq!(read, N);
    N as f64 / start.elapsed().as_secs_f64()
}

/// Reads what `q` selects of the run, a page at a time (asking `last_seq`
/// before each page when `with_last_seq`); events read and events/s.
fn store_reads(b: &SqliteBackend, run: &RunId, q: EventQuery, with_last_seq: bool) -> (u64, f64) {
    let start = Instant::now();
    let (mut after, mut read) = (0u64, 0u64);
    loop {
        if with_last_seq {
            assert_eq!(b.last_seq(run).unwrap(), N);
        }
        let page = b
            .read_events(
                run,
                &EventQuery {
                    after,
                    limit: Some(PAGE),
                    ..q.clone()
                },
            )
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        read += page.len() as u64;
    }
    (read, read as f64 / start.elapsed().as_secs_f64())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let dir = tempfile::tempdir().unwrap();
    let run = RunId::parse("bench").unwrap();
    let events: Vec<StoredEvent> = (1..=N).map(|i| event(&run, i)).collect();
    let v1 = dir.path().join("v1.db");
    version_1(&v1, &events);
    let db = dir.path().join("cairn.db");
    let b = SqliteBackend::open(&db).unwrap();
    for chunk in events.chunks(10_000) {
        b.append(chunk).unwrap();
    }
    b.checkpoint().unwrap();
    // Each case once before it is measured, so both start from a warm cache.
    baseline(&v1, &run);
    store_reads(&b, &run, EventQuery::default(), false);

    let base = baseline(&v1, &run);
    let (all_n, all) = store_reads(&b, &run, EventQuery::default(), false);
    let by_type = EventQuery {
        types: vec![EventType::NodeHeartbeat],
        ..Default::default()
    };
    let (type_n, typed) = store_reads(&b, &run, by_type, false);
    let by_node = EventQuery {
        node: Some("n3".into()),
        ..Default::default()
    };
    let (node_n, noded) = store_reads(&b, &run, by_node, false);
    let (_, with_last) = store_reads(&b, &run, EventQuery::default(), true);
    assert_eq!(all_n, N);

    println!(
        "read: one run of {N} events ({NODES} nodes, one lifecycle event in ten), pages of {PAGE}"
    );
    println!("(a) bare rusqlite, version 1's table (whole JSON)     : {base:>10.0} events/s");
    println!(
        "(b) read_events, every event (JSON rebuilt)           : {all:>10.0} events/s  ({:.2}x a)",
        all / base
    );
    println!(
        "    read_events, one type ({type_n} events, type index) : {typed:>10.0} events/s  ({:.2}x a)",
        typed / base
    );
    println!(
        "    read_events, one node ({node_n} events, seq range)  : {noded:>10.0} events/s  ({:.2}x a)",
        noded / base
    );
    println!(
        "    read_events with last_seq before each page       : {with_last:>10.0} events/s  ({:.2}x a)",
        with_last / base
    );
}
