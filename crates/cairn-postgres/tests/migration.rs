//! A schema-3 store's events, moved to schema 4 when the store is opened,
//! read back byte for byte.

use cairn_events::{Event, EventKind, OutputStream, Scope, Seq};
use cairn_postgres::testing::{self, Scratch};
use cairn_postgres::PgOptions;
use cairn_storage::prelude::*;
use cairn_storage::EventQuery;

/// Version 1's events table (unchanged to version 3) and the version row.
const V3_EVENTS: &str = "CREATE TABLE cairn_schema (version BIGINT NOT NULL, \
     store_id TEXT NOT NULL DEFAULT 'test'); \
     INSERT INTO cairn_schema (version) VALUES (3); \
     CREATE TABLE events (run_id TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL, \
     node_id TEXT, timestamp_ms BIGINT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_id, seq)); \
     CREATE INDEX events_by_node ON events (run_id, node_id, seq) WHERE node_id IS NOT NULL;";

fn events() -> Vec<Event> {
    let node = |n: &str| Scope::node(n, 2).with_attempt(1);
    let kinds = [
        (Scope::run(), EventKind::RunCancelled { reason: None }),
        (
            node("ünï/🙂"),
            EventKind::NodeFinished {
                duration_ms: 3,
                output: Some(serde_json::json!({"é": [1, null]}).into()),
                cached: None,
                snapshot: None,
            },
        ),
        // A node id JSON escapes: kept whole, and read back the same.
        (
            node("a\"b"),
            EventKind::NodeOutput {
                text: "x\n".repeat(3000),
                stream: OutputStream::Stdout,
            },
        ),
        (
            Scope::run(),
            EventKind::RunHijackRequested {
                node_id: "n".into(),
                requested_by: None,
            },
        ),
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, (scope, kind))| Event {
            run_id: cairn_events::RunId::parse("r-1").unwrap(),
            seq: Seq(i as u64 + 1),
            timestamp_ms: 1_764_000_000_000 + i as i64,
            scope,
            kind,
        })
        .collect()
}

#[test]
fn a_schema_3_stores_events_read_back_byte_for_byte() {
    let Some(scratch) = Scratch::new() else {
        return;
    };
    let schema = scratch.schema();
    testing::sql(scratch.url, &format!("CREATE SCHEMA {schema}"));
    let evs = events();
    let mut sql = String::from(V3_EVENTS);
    for e in &evs {
        let node = match e.scope.node_id.as_deref() {
            Some(n) => format!("$n${n}$n$"),
            None => "NULL".into(),
        };
        sql.push_str(&format!(
            "INSERT INTO events VALUES ('{}', {}, '{}', {node}, {}, $j${}$j$);",
            e.run_id,
            e.seq.get(),
            e.type_name(),
            e.timestamp_ms,
            e.to_json()
        ));
    }
    scratch.sql_in(&schema, &sql);

    let b = scratch.open(&schema, PgOptions::default());
    let read = b
        .read_events(
            &cairn_events::RunId::parse("r-1").unwrap(),
            &EventQuery::default(),
        )
        .unwrap();
    let got: Vec<&str> = read.iter().map(|e| &*e.json).collect();
    let want: Vec<String> = evs.iter().map(Event::to_json).collect();
    assert_eq!(got, want);
    assert_eq!(
        b.last_seq(&cairn_events::RunId::parse("r-1").unwrap())
            .unwrap(),
        4
    );
    // The envelope is stored once, but for the row whose node id JSON escapes.
    let kept_whole = testing::query_i64(
        scratch.url,
        &format!("SELECT count(*) FROM {schema}.events WHERE body LIKE '=%'"),
    );
    assert_eq!(kept_whole, 1);
    let version = testing::query_i64(
        scratch.url,
        &format!("SELECT max(version) FROM {schema}.cairn_schema"),
    );
    assert_eq!(version, cairn_postgres::SCHEMA_VERSION);
}
