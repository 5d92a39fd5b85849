//! The event log's tables since version 7, and the move to them.
//!
//! An event's envelope lives once, in columns: a run is a small integer
//! (`event_runs`), a type too (`event_types`), and the stored text is the
//! JSON without the fields the columns hold (`cairn_storage::envelope`),
//! rebuilt byte for byte when read. Version 6 repeated the run id's text in
//! every row and in the type index, and the envelope in the JSON (see
//! docs/benchmarks.md, "Bytes per event", for the sizes before and after).

use std::collections::HashMap;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension, Transaction};

use cairn_events::{EventType, NodePath, RunId};
use cairn_storage::envelope::{self, Envelope};
use cairn_storage::{EventQuery, StoreError, StoredEvent};

use crate::BadColumn;

/// Version 7's event tables. `event_runs` gives each run id that has
/// events a small key, `event_types` each type name; codes are never
/// reused or changed, so a process may keep what it has read of them.
/// No foreign key to runs: an insert per event would pay for the check,
/// events of a run without a row are kept, and gc deletes a run's events
/// and key explicitly.
pub(crate) const TABLES: &str = r#"
CREATE TABLE event_runs (
    run    INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE
);
CREATE TABLE event_types (
    type INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE events (
    run     INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    type    INTEGER NOT NULL,
    node_id TEXT,
    ts      INTEGER NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run, seq)
) WITHOUT ROWID;
"#;

/// The code of the output stream's type, the same in every store: the type
/// index leaves it out (see [`EVENTS_BY_TYPE`]), so its condition names it.
pub(crate) const STREAM_CODE: i64 = 0;

/// The event type that makes up most of a busy log.
const STREAM_TYPE: EventType = EventType::NodeOutput;

/// Events by type, for every type but the output stream. Two full secondary
/// indexes (by type, by node) made every append update three b-trees and cost
/// about 40% of the insert rate; output lines, most of a log, are rarely
/// looked up by type, and a node's events are read from the run's seq range.
pub(crate) const EVENTS_BY_TYPE: &str =
    "CREATE INDEX events_by_type ON events(run, type, seq) WHERE type <> 0;";

/// The run key of a run id, in a statement's `WHERE`.
macro_rules! run_key {
    ($param:literal) => {
        concat!("(SELECT run FROM event_runs WHERE run_id = ", $param, ")")
    };
}

/// The highest seq of a run.
pub(crate) const LAST_SEQ: &str =
    concat!("SELECT max(seq) FROM events WHERE run = ", run_key!("?1"));

/// The statements that remove a run's events and key, in this order.
pub(crate) const DELETE_RUN: [&str; 2] = [
    concat!("DELETE FROM events WHERE run = ", run_key!("?1")),
    "DELETE FROM event_runs WHERE run_id = ?1",
];

const INSERT: &str = "INSERT INTO events (run, seq, type, node_id, ts, body) \
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// Makes version 7's event tables from version 1-6's `events(run_id, seq,
/// type, node_id, ts, json)`, converting every row, inside the caller's
/// schema transaction: a store is moved whole or not at all. A new store
/// goes through it too, with no rows.
pub(crate) fn to_v7(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "DROP INDEX IF EXISTS events_by_type; DROP INDEX IF EXISTS events_by_node; \
         ALTER TABLE events RENAME TO events_v6;",
    )?;
    conn.execute_batch(TABLES)?;
    fill_types(conn)?;
    // Names this build does not know (a store's own) keep their rows; keys
    // follow the old order of runs, so rows go in in key order.
    conn.execute_batch(
        "INSERT OR IGNORE INTO event_types (name) SELECT DISTINCT type FROM events_v6; \
         INSERT INTO event_runs (run_id) SELECT DISTINCT run_id FROM events_v6 ORDER BY run_id;",
    )?;
    {
        let mut read = conn.prepare(
            "SELECT k.run, o.seq, t.type, o.node_id, o.ts, o.json, o.run_id, o.type \
             FROM events_v6 o JOIN event_runs k ON k.run_id = o.run_id \
             JOIN event_types t ON t.name = o.type ORDER BY o.run_id, o.seq",
        )?;
        let mut ins = conn.prepare(INSERT)?;
        let mut rows = read.query([])?;
        while let Some(r) = rows.next()? {
            let (run_id, type_name): (String, String) = (r.get(6)?, r.get(7)?);
            let node: Option<String> = r.get(3)?;
            let json: String = r.get(5)?;
            let env = Envelope {
                type_name: &type_name,
                run_id: &run_id,
                seq: r.get::<_, i64>(1)? as u64,
                timestamp_ms: r.get(4)?,
                node_id: node.as_deref(),
            };
            ins.execute(params![
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                node,
                env.timestamp_ms,
                &*env.body(&json)
            ])?;
        }
    }
    conn.execute_batch("DROP TABLE events_v6;")?;
    conn.execute_batch(EVENTS_BY_TYPE)
}

/// Gives every event type this build knows its code: the output stream
/// [`STREAM_CODE`], the others from 1 in the contract's order. One
/// statement (the names are the contract's, plain identifiers).
pub(crate) fn fill_types(conn: &Connection) -> rusqlite::Result<()> {
    let mut sql = format!(
        "INSERT INTO event_types (type, name) VALUES ({STREAM_CODE}, '{}');\n\
         INSERT INTO event_types (name) VALUES ",
        STREAM_TYPE.as_str()
    );
    let rest: Vec<String> = EventType::ALL
        .iter()
        .filter(|t| **t != STREAM_TYPE)
        .map(|t| {
            debug_assert!(t.as_str().bytes().all(|b| b.is_ascii_alphanumeric()));
            format!("('{}')", t.as_str())
        })
        .collect();
    sql.push_str(&rest.join(", "));
    sql.push(';');
    conn.execute_batch(&sql)
}

/// The type codes this process has seen committed, by name. Codes never
/// change once committed, so what is here stays true; a name missing here
/// is looked up (or given a code) in the appending transaction.
#[derive(Debug, Default)]
pub(crate) struct TypeCodes(Mutex<HashMap<String, i64>>);

impl TypeCodes {
    /// Keeps codes read or made by a transaction that has committed.
    pub(crate) fn learn(&self, codes: Vec<(String, i64)>) {
        if !codes.is_empty() {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(codes);
        }
    }

    fn get(&self, name: &str) -> Option<i64> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
    }
}

/// What an append needs besides the transaction: the known type codes and
/// the backend's error mapping.
pub(crate) struct Appender<'a> {
    pub(crate) types: &'a TypeCodes,
    pub(crate) err: &'a dyn Fn(rusqlite::Error) -> StoreError,
}

impl Appender<'_> {
    /// Inserts a batch's rows; returns the type codes it had to look up,
    /// for [`TypeCodes::learn`] once the transaction has committed.
    pub(crate) fn insert(
        &self,
        tx: &Transaction<'_>,
        batch: &[StoredEvent],
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let mut ins = tx.prepare_cached(INSERT).map_err(self.err)?;
        let mut runs: HashMap<&str, i64> = HashMap::new();
        let mut learned: Vec<(String, i64)> = Vec::new();
        for ev in batch {
            let run = match runs.get(ev.run_id.as_str()) {
                Some(&k) => k,
                None => {
                    let key = key_of_run(tx, &ev.run_id).map_err(self.err)?;
                    runs.insert(ev.run_id.as_str(), key);
                    key
                }
            };
            let code = match self.types.get(&ev.type_name) {
                Some(c) => c,
                None => match learned.iter().find(|l| l.0 == ev.type_name) {
                    Some(l) => l.1,
                    None => {
                        let c = type_code(tx, &ev.type_name).map_err(self.err)?;
                        learned.push((ev.type_name.clone(), c));
                        c
                    }
                },
            };
            let node = ev.node_id.as_ref().map(NodePath::as_str);
            let env = Envelope {
                type_name: &ev.type_name,
                run_id: &ev.run_id,
                seq: ev.seq,
                timestamp_ms: ev.timestamp_ms,
                node_id: node,
            };
            let seq = i64::try_from(ev.seq).map_err(|_| StoreError::BadRow {
                run: ev.run_id.to_string(),
                detail: format!("seq {} is beyond what the store keeps", ev.seq),
            })?;
            ins.execute(params![
                run,
                seq,
                code,
                node,
                ev.timestamp_ms,
                &*env.body(&ev.json)
            ])
            .map_err(|e| {
                if crate::is_unique_violation(&e) {
                    StoreError::BadRow {
                        run: ev.run_id.to_string(),
                        detail: format!("seq {} is already stored", ev.seq),
                    }
                } else {
                    (self.err)(e)
                }
            })?;
        }
        Ok(learned)
    }
}

/// A run's key, made on its first event.
fn key_of_run(tx: &Transaction<'_>, run_id: &str) -> rusqlite::Result<i64> {
    let found = tx
        .prepare_cached("SELECT run FROM event_runs WHERE run_id = ?1")?
        .query_row([run_id], |r| r.get(0))
        .optional()?;
    match found {
        Some(k) => Ok(k),
        None => {
            tx.prepare_cached("INSERT INTO event_runs (run_id) VALUES (?1)")?
                .execute([run_id])?;
            Ok(tx.last_insert_rowid())
        }
    }
}

/// A type name's code, made when the store has none for it yet (a type
/// newer than the store's tables).
fn type_code(tx: &Transaction<'_>, name: &str) -> rusqlite::Result<i64> {
    tx.prepare_cached("INSERT OR IGNORE INTO event_types (name) VALUES (?1)")?
        .execute([name])?;
    tx.prepare_cached("SELECT type FROM event_types WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
}

/// The statement and arguments that read a run's events as `q` selects them.
pub(crate) fn query(run_id: &RunId, q: &EventQuery) -> (String, Vec<rusqlite::types::Value>) {
    // A type filter without the output stream can go through the partial
    // type index; SQLite only sees that if the query repeats the index's
    // condition, and without table statistics it would rather walk the
    // primary key to save the sort, so the index is named. The LEFT JOIN
    // keeps the events table outer (a row whose code names no type is an
    // error, not a row left out).
    let by_type = !q.types.is_empty() && !q.types.contains(&STREAM_TYPE);
    let mut sql =
        String::from("SELECT e.seq, t.name, e.node_id, e.ts, e.body, e.type FROM events e");
    if by_type {
        sql.push_str(" INDEXED BY events_by_type");
    }
    sql.push_str(concat!(
        " LEFT JOIN event_types t ON t.type = e.type WHERE e.run = ",
        run_key!("?1"),
        " AND e.seq > ?2"
    ));
    let mut args: Vec<rusqlite::types::Value> = vec![
        run_id.to_string().into(),
        (q.after.min(i64::MAX as u64) as i64).into(),
    ];
    if let [one] = q.types.as_slice() {
        // One type: an equality, so the type index is walked in seq order
        // and a page stops at its limit. A list of types is a union of
        // ranges that SQLite merges with a sort of everything after `after`.
        args.push(one.as_str().to_string().into());
        sql.push_str(&format!(
            " AND e.type = (SELECT type FROM event_types WHERE name = ?{})",
            args.len()
        ));
    } else if !q.types.is_empty() {
        sql.push_str(" AND e.type IN (SELECT type FROM event_types WHERE name IN (");
        for (i, t) in q.types.iter().enumerate() {
            if i > 0 {
                sql.push(',');
            }
            args.push(t.as_str().to_string().into());
            sql.push_str(&format!("?{}", args.len()));
        }
        sql.push_str("))");
    }
    if by_type {
        sql.push_str(&format!(" AND e.type <> {STREAM_CODE}"));
    }
    if let Some(n) = &q.node {
        args.push(n.clone().into());
        sql.push_str(&format!(" AND e.node_id = ?{}", args.len()));
    }
    sql.push_str(" ORDER BY e.seq");
    if let Some(l) = q.limit {
        args.push((l.min(i64::MAX as usize) as i64).into());
        sql.push_str(&format!(" LIMIT ?{}", args.len()));
    }
    (sql, args)
}

/// One row of [`query`]'s statement as the event it stores, its JSON
/// rebuilt; a row that cannot be is [`StoreError::BadRow`].
pub(crate) fn row(run_id: &RunId, r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredEvent> {
    let seq = r.get::<_, i64>(0)? as u64;
    let bad = |detail: String| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            Box::new(BadColumn {
                run: run_id.to_string(),
                detail: format!("event {seq}: {detail}"),
            }),
        )
    };
    let Some(type_name) = r.get::<_, Option<String>>(1)? else {
        let code: i64 = r.get(5)?;
        return Err(bad(format!("type code {code} names no event type")));
    };
    let node_id: Option<String> = r.get(2)?;
    let timestamp_ms: i64 = r.get(3)?;
    let body = match r.get_ref(4)? {
        rusqlite::types::ValueRef::Text(t) => {
            std::str::from_utf8(t).map_err(|e| bad(format!("its text is not UTF-8: {e}")))?
        }
        other => return Err(bad(format!("its text is {:?}", other.data_type()))),
    };
    envelope::stored_event(run_id, seq, type_name, node_id, timestamp_ms, body)
        .map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteBackend;
    use cairn_events::{Event, EventKind, Scope, Seq};
    use cairn_storage::prelude::*;
    use serde_json::json;

    /// A version 6 row: run id, seq, type, node id, timestamp, JSON bytes.
    type V6Row<'a> = (&'a str, u64, &'a str, Option<&'a str>, i64, &'a [u8]);

    /// A store as version 6 made it, with `rows` in its events table.
    fn v6_store(db: &std::path::Path, rows: &[V6Row<'_>]) {
        let c = Connection::open(db).unwrap();
        let v1 = crate::v1_schema();
        for sql in [
            v1.as_str(),
            crate::EVENTS_BY_TYPE_V2,
            crate::INBOX,
            crate::SOURCES,
            crate::RUNS_BY_PARENT,
            crate::GENERATIONS,
            crate::PINNED_FILES,
        ] {
            c.execute_batch(sql).unwrap();
        }
        let mut ins = c
            .prepare("INSERT INTO events (run_id, seq, type, node_id, ts, json) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .unwrap();
        for (run, seq, ty, node, ts, json) in rows {
            // As text when it is UTF-8, as version 6 wrote; a blob otherwise.
            let json: rusqlite::types::Value = match std::str::from_utf8(json) {
                Ok(t) => t.to_string().into(),
                Err(_) => json.to_vec().into(),
            };
            ins.execute(params![run, *seq as i64, ty, node, ts, json])
                .unwrap();
        }
        c.execute_batch("PRAGMA user_version = 6").unwrap();
    }

    fn events_of_every_shape() -> Vec<Event> {
        let node = |n: &str| Scope::node(n, 3).with_attempt(2);
        let kinds = [
            (Scope::run(), EventKind::RunCancelled { reason: None }),
            (
                node("ünï/cødé 🙂"),
                EventKind::NodeOutput {
                    text: "\"q\" \\ \n\u{1}".repeat(5000),
                    stream: cairn_events::OutputStream::Stderr,
                },
            ),
            (
                node("a\"b\\c\n"),
                EventKind::NodeFinished {
                    duration_ms: 1,
                    output: Some(json!({"ü": [1, 2.5, null]}).into()),
                    cached: Some(false),
                    snapshot: None,
                },
            ),
            (
                Scope::run(),
                EventKind::RunHijackRequested {
                    node_id: "x/y".into(),
                    requested_by: None,
                },
            ),
            (
                node("g").with_chapter(Some("stage".into())),
                EventKind::NodeStarted { snapshot: None },
            ),
        ];
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, (scope, kind))| Event {
                run_id: cairn_events::RunId::parse(if i % 2 == 0 { "r-1" } else { "r:2" }).unwrap(),
                seq: Seq(i as u64 / 2 + 1),
                timestamp_ms: 1_764_000_000_000 + i as i64,
                scope,
                kind,
            })
            .collect()
    }

    #[test]
    fn a_version_6_stores_events_read_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        let evs = events_of_every_shape();
        let texts: Vec<String> = evs.iter().map(Event::to_json).collect();
        let mut rows: Vec<V6Row<'_>> = evs
            .iter()
            .zip(&texts)
            .map(|(e, t)| {
                (
                    e.run_id.as_str(),
                    e.seq.get(),
                    e.type_name(),
                    e.scope.node_id.as_deref(),
                    e.timestamp_ms,
                    t.as_bytes(),
                )
            })
            .collect();
        // A row whose text is not its columns' event (version 1's tests
        // wrote such rows): kept as it was.
        rows.push(("r-1", 9, "RunStarted", None, 5, b"{}"));
        v6_store(&db, &rows);

        let b = SqliteBackend::open(&db).unwrap();
        for run in ["r-1", "r:2"] {
            let read = b
                .read_events(&RunId::parse(run).unwrap(), &EventQuery::default())
                .unwrap();
            let want: Vec<&[u8]> = rows.iter().filter(|r| r.0 == run).map(|r| r.5).collect();
            let got: Vec<&[u8]> = read.iter().map(|e| e.json.as_bytes()).collect();
            assert_eq!(got, want, "{run}");
            for (e, r) in read.iter().zip(rows.iter().filter(|r| r.0 == run)) {
                assert_eq!(
                    (
                        e.seq,
                        e.type_name.as_str(),
                        e.node_id.as_deref(),
                        e.timestamp_ms
                    ),
                    (r.1, r.2, r.3, r.4)
                );
            }
        }
        assert_eq!(b.last_seq(&RunId::parse("r-1").unwrap()).unwrap(), 9);
        let by_type = EventQuery {
            types: vec![EventType::NodeStarted, EventType::RunStarted],
            ..EventQuery::default()
        };
        let seqs: Vec<u64> = b
            .read_events(&RunId::parse("r-1").unwrap(), &by_type)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [3, 9]);
        // Stored once: no JSON begins with its envelope any more.
        let c = Connection::open(&db).unwrap();
        let (whole, version): (i64, i64) = c
            .query_row(
                "SELECT (SELECT count(*) FROM events WHERE body LIKE '{%' OR body LIKE '={\"type%'), \
                 (SELECT user_version FROM pragma_user_version)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((whole, version), (0, crate::SCHEMA_VERSION));
    }

    #[test]
    fn a_migration_that_fails_part_way_leaves_the_version_6_store_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        let good = r#"{"type":"RunCancelled","runId":"a","seq":1,"timestampMs":5}"#;
        // The last row (run `z`) cannot be read as text: the conversion
        // stops after converting the others.
        v6_store(
            &db,
            &[
                ("a", 1, "RunCancelled", None, 5, good.as_bytes()),
                ("z", 1, "RunCancelled", None, 5, b"\xff\xfe"),
            ],
        );
        let err = SqliteBackend::open(&db).unwrap_err();
        assert!(
            matches!(err, StoreError::Database(_) | StoreError::BadRow { .. }),
            "{err:?}"
        );
        let c = Connection::open(&db).unwrap();
        let version: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 6);
        let tables: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !tables.iter().any(|t| t.starts_with("event_")),
            "{tables:?}"
        );
        let (n, json): (i64, String) = c
            .query_row(
                "SELECT count(*), max(CASE WHEN run_id = 'a' THEN json END) FROM events",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((n, json.as_str()), (2, good));
        // Mended, the store moves to version 7 whole.
        c.execute("DELETE FROM events WHERE run_id = 'z'", [])
            .unwrap();
        drop(c);
        let b = SqliteBackend::open(&db).unwrap();
        let read = b
            .read_events(&RunId::parse("a").unwrap(), &EventQuery::default())
            .unwrap();
        assert_eq!(&*read[0].json, good);
    }

    #[test]
    fn a_damaged_event_row_is_a_bad_row_of_its_run_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let b = SqliteBackend::open(&dir.path().join("s.db")).unwrap();
        let ev = Event {
            run_id: cairn_events::RunId::parse("r").unwrap(),
            seq: Seq(1),
            timestamp_ms: 1,
            scope: Scope::run(),
            kind: EventKind::RunCancelled { reason: None },
        };
        b.append(&[StoredEvent::from_event(&ev)]).unwrap();
        let c = Connection::open(b.path()).unwrap();
        for (damage, says) in [
            ("UPDATE events SET body = 'x'", "no stored form"),
            ("UPDATE events SET body = ''", "is empty"),
            (
                "UPDATE events SET body = CAST(x'fffe' AS TEXT)",
                "not UTF-8",
            ),
            ("UPDATE events SET body = x'7d'", "Blob"),
            ("UPDATE events SET body = '}', type = 999", "type code 999"),
        ] {
            c.execute_batch(damage).unwrap();
            match b.read_events(&RunId::parse("r").unwrap(), &EventQuery::default()) {
                Err(StoreError::BadRow { run, detail }) => {
                    assert_eq!(run, "r");
                    assert!(detail.contains(says), "{damage}: {detail}");
                }
                other => panic!("{damage}: {other:?}"),
            }
        }
    }
}
