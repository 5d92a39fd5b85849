//! The store's tables and their versioned migrations.

use cairn_storage::StoreError;

use crate::config::{fnv1a, quote};
use crate::db::Db;

/// The schema version this build writes, kept in the `cairn_schema` table.
/// A database at a newer version is refused ([`StoreError::TooNew`]).
pub const SCHEMA_VERSION: i64 = 8;

/// `MIGRATIONS[v]` takes a schema at version `v` to `v + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8];

/// The tables a store of the current version has; a schema with one of
/// them but no version is someone else's.
const TABLES: &[&str] = &[
    "cairn_schema",
    "runs",
    "events",
    "tool_calls",
    "inbox",
    "processes",
    "leases",
    "generations",
    "event_runs",
    "event_types",
    "model_calls",
    "instances",
    "snapshot_objects",
    "schedules",
    "schedule_fires",
];

/// Version 1. As on SQLite, with these differences:
/// - the workflow text stays in the run's row: PostgreSQL keeps a long text
///   out of line (TOAST) and an update that does not touch it does not copy
///   it, so the separate table SQLite needs would buy nothing;
/// - `created_order` tells apart runs created in the same millisecond (the
///   role of SQLite's rowid in `list_runs`);
/// - events are indexed by node (the conformance suite's node filter reads
///   whole runs otherwise), not by type: outputs are most of a log and
///   every index slows each append;
/// - leases are rows with an expiry (SQLite uses `flock`), see `lease.rs`.
const V1: &str = r#"
-- store_id: who this store is, the same for every process that opens it
-- whatever URL it was given (see `Backend::store_id`).
CREATE TABLE cairn_schema (
    version  BIGINT NOT NULL,
    store_id TEXT NOT NULL DEFAULT substr(md5(random()::text || clock_timestamp()::text), 1, 16)
);
INSERT INTO cairn_schema (version) VALUES (0);

CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    workflow_path   TEXT NOT NULL,
    workflow_hash   TEXT NOT NULL,
    workflow_source TEXT NOT NULL,
    input           TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_ms      BIGINT NOT NULL,
    updated_ms      BIGINT NOT NULL,
    parent_run_id   TEXT,
    created_order   BIGSERIAL NOT NULL
);
CREATE INDEX runs_by_created ON runs (created_ms DESC, created_order DESC);
CREATE INDEX runs_by_status ON runs (status, updated_ms);
CREATE INDEX runs_by_workflow ON runs (workflow, created_ms DESC, created_order DESC);
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- No foreign key to runs: events of a run without a row are kept, and a
-- check per event would slow every append. The JSON is TEXT, not JSONB, so
-- it comes back byte for byte.
CREATE TABLE events (
    run_id       TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    type         TEXT NOT NULL,
    node_id      TEXT,
    timestamp_ms BIGINT NOT NULL,
    json         TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX events_by_node ON events (run_id, node_id, seq) WHERE node_id IS NOT NULL;

CREATE TABLE tool_calls (
    run_id          TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    node_id         TEXT NOT NULL,
    iteration       BIGINT NOT NULL,
    attempt         BIGINT NOT NULL,
    tool_seq        BIGINT NOT NULL,
    tool            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    side_effect     BOOLEAN NOT NULL,
    idempotent      BOOLEAN NOT NULL,
    input           TEXT NOT NULL,
    output          TEXT,
    started_ms      BIGINT NOT NULL,
    finished_ms     BIGINT,
    status          TEXT NOT NULL,
    error           TEXT,
    PRIMARY KEY (run_id, node_id, iteration, attempt, tool_seq)
);

CREATE TABLE inbox (
    id         BIGSERIAL PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    command    TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    taken_ms   BIGINT,
    outcome    TEXT
);
CREATE INDEX inbox_by_run ON inbox (run_id, id);

CREATE TABLE processes (
    id         BIGSERIAL PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    node_id    TEXT NOT NULL,
    iteration  BIGINT NOT NULL,
    attempt    BIGINT NOT NULL,
    pgid       BIGINT NOT NULL,
    started_ms BIGINT NOT NULL
);
CREATE INDEX processes_by_run ON processes (run_id, id);

-- Not a foreign key either: a lease may be taken before the run's row is
-- made, and outlives its deletion by gc until it is released.
CREATE TABLE leases (
    run_id     TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
"#;

/// Version 2: the workflow texts that reloads of a run adopted
/// (`cairn run --watch`), one row per generation, so that a resume runs
/// the run's last definition.
const V2: &str = r#"
CREATE TABLE generations (
    run_id        TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    generation    BIGINT NOT NULL,
    workflow_hash TEXT NOT NULL,
    source        TEXT NOT NULL,
    created_ms    BIGINT NOT NULL,
    PRIMARY KEY (run_id, generation)
);
"#;

/// Version 3: each generation keeps the texts of the files its workflow
/// refers to (child workflows, model scripts), pinned when it began, as a
/// JSON array.
const V3: &str = "ALTER TABLE generations ADD COLUMN files TEXT NOT NULL DEFAULT '[]';";

/// Version 4: an event's envelope lives once, in columns, as on SQLite
/// (`cairn_storage::envelope`): runs and types are small integers of their
/// own tables, and the stored text is the JSON without the envelope, rebuilt
/// byte for byte when read. Fixed-width columns come first, widest first, so
/// that no row pads between them. Every row is converted in SQL within the
/// migration's transaction; a text whose ids hold a character JSON escapes
/// is kept whole (behind `=`), which reads back the same.
const V4: &str = r#"
CREATE TABLE event_runs (
    run    INT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE
);
CREATE TABLE event_types (
    type SMALLINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
INSERT INTO event_types (name) SELECT DISTINCT type FROM events ORDER BY 1;
INSERT INTO event_runs (run_id) SELECT DISTINCT run_id FROM events ORDER BY 1;
CREATE TABLE events_v4 (
    seq          BIGINT NOT NULL,
    timestamp_ms BIGINT NOT NULL,
    run          INT NOT NULL,
    type         SMALLINT NOT NULL,
    node_id      TEXT,
    body         TEXT NOT NULL,
    PRIMARY KEY (run, seq)
);
INSERT INTO events_v4 (seq, timestamp_ms, run, type, node_id, body)
SELECT e.seq, e.timestamp_ms, k.run, t.type, e.node_id,
       CASE WHEN p.plain AND left(e.json, length(p.prefix)) = p.prefix
                 AND substr(e.json, length(p.prefix) + 1, 1) IN (',', '}')
            THEN substr(e.json, length(p.prefix) + 1)
            ELSE '=' || e.json END
FROM events e
JOIN event_runs k ON k.run_id = e.run_id
JOIN event_types t ON t.name = e.type
CROSS JOIN LATERAL (SELECT
    '{"type":"' || e.type || '","runId":"' || e.run_id || '","seq":' || e.seq
        || ',"timestampMs":' || e.timestamp_ms
        || coalesce(',"nodeId":"' || e.node_id || '"', '') AS prefix,
    (e.type || e.run_id || coalesce(e.node_id, '')) !~ '["\-]' AS plain) p
ORDER BY k.run, e.seq;
DROP TABLE events;
ALTER TABLE events_v4 RENAME TO events;
ALTER INDEX events_v4_pkey RENAME TO events_pkey;
CREATE INDEX events_by_node ON events (run, node_id, seq) WHERE node_id IS NOT NULL;
"#;

/// Version 5: the models' shared budgets. A row per model call, kept while
/// the call runs (`open_until_ms`: its lease, for a process that dies in
/// it) and for a minute after it began (the per-minute windows count it).
const V5: &str = r#"
CREATE TABLE model_calls (
    id            BIGSERIAL PRIMARY KEY,
    model_key     TEXT NOT NULL,
    started_ms    BIGINT NOT NULL,
    tokens        BIGINT NOT NULL,
    open_until_ms BIGINT
);
CREATE INDEX model_calls_by_key ON model_calls (model_key, started_ms);
"#;

/// Version 6: the instances that claim queued runs (`claims.rs`): who,
/// with room for how many runs, last seen when. Queued runs are found by
/// `runs_by_status`.
const V6: &str = r#"
CREATE TABLE instances (
    owner    TEXT PRIMARY KEY,
    name     TEXT NOT NULL,
    capacity BIGINT NOT NULL,
    seen_at  TIMESTAMPTZ NOT NULL
);
"#;

/// Version 7: workspace snapshot objects (`objects.rs`), so that a revert
/// or a fork works on any machine of the store. `stored_ms` spares a
/// snapshot under way from a prune.
const V7: &str = r#"
CREATE TABLE snapshot_objects (
    id        BYTEA PRIMARY KEY,
    kind      TEXT NOT NULL,
    body      BYTEA NOT NULL,
    stored_ms BIGINT NOT NULL
);
"#;

/// Version 8: `cairn serve`'s schedules, shared by every instance, and
/// what each due time did (`schedules.rs`).
const V8: &str = r#"
CREATE TABLE schedules (
    name            TEXT PRIMARY KEY,
    definition      TEXT NOT NULL,
    from_file       BOOLEAN NOT NULL,
    paused          BOOLEAN NOT NULL,
    next_due_ms     BIGINT,
    pending_due_ms  BIGINT,
    last_run_id     TEXT,
    updated_ms      BIGINT NOT NULL
);
CREATE TABLE schedule_fires (
    schedule    TEXT NOT NULL,
    due_ms      BIGINT NOT NULL,
    decided_ms  BIGINT NOT NULL,
    outcome     TEXT NOT NULL,
    run_id      TEXT,
    detail      TEXT,
    PRIMARY KEY (schedule, due_ms)
);
CREATE INDEX schedule_fires_firing ON schedule_fires (outcome) WHERE outcome = 'firing';
"#;

/// Brings `schema` (created if missing) to [`SCHEMA_VERSION`] in one
/// transaction: a store is migrated whole or not at all. An advisory lock
/// keyed by the schema makes processes that open at once take turns; each
/// sees the version the one before it left. Returns the store's id.
pub(crate) async fn migrate(db: &Db, schema: &str) -> Result<String, StoreError> {
    let mut client = db.client().await?;
    let tx = client.transaction().await.map_err(|e| db.err(e))?;
    let key = fnv1a(format!("cairn-postgres schema {schema}").as_bytes()) as i64;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&key])
        .await
        .map_err(|e| db.err(e))?;
    let exists: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| db.err(e))?;
    // Only when missing: CREATE SCHEMA IF NOT EXISTS asks for the right to
    // create schemas even when there is nothing to create.
    let mut setup = String::new();
    if !exists {
        setup.push_str(&format!("CREATE SCHEMA {};", quote(schema)));
    }
    // The session's search_path named the schema before it existed.
    setup.push_str(&format!("SET LOCAL search_path TO {};", quote(schema)));
    tx.batch_execute(&setup).await.map_err(|e| db.err(e))?;

    let version = stored_version(&tx, db, schema).await?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            store: db.place().to_string(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION {
        for step in &MIGRATIONS[version as usize..] {
            tx.batch_execute(step).await.map_err(|e| db.err(e))?;
        }
        tx.execute("UPDATE cairn_schema SET version = $1", &[&SCHEMA_VERSION])
            .await
            .map_err(|e| db.err(e))?;
    }
    let id: String = tx
        .query_one("SELECT min(store_id) FROM cairn_schema", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| db.err(e))?;
    tx.commit().await.map_err(|e| db.err(e))?;
    Ok(id)
}

/// The schema's version: 0 for a schema without Cairn's tables.
async fn stored_version(
    tx: &deadpool_postgres::Transaction<'_>,
    db: &Db,
    schema: &str,
) -> Result<i64, StoreError> {
    let found: Vec<String> = tx
        .query(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema::text = $1 AND table_name::text = ANY($2::text[])",
            &[&schema, &TABLES],
        )
        .await
        .map_err(|e| db.err(e))?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(|e| db.err(e))?;
    if !found.iter().any(|t| t == "cairn_schema") {
        if let Some(t) = found.first() {
            return Err(StoreError::Corrupt {
                store: db.place().to_string(),
                detail: format!(
                    "the schema has a table `{t}` but no Cairn schema version; choose another schema"
                ),
            });
        }
        return Ok(0);
    }
    let version: Option<i64> = tx
        .query_one("SELECT max(version) FROM cairn_schema", &[])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| db.err(e))?;
    match version {
        Some(v) if v >= 1 => Ok(v),
        _ => Err(StoreError::Corrupt {
            store: db.place().to_string(),
            detail: "the table cairn_schema holds no version".into(),
        }),
    }
}
