//! Run logs: appending batches, reading them back.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use cairn_events::{NodePath, RunId};
use cairn_storage::envelope::{self, Envelope};
use cairn_storage::{
    EventQuery, GenerationRecord, RunRecord, StoreError, StoredEvent, ToolCallRecord,
};

use crate::db::Db;
use crate::lease;

/// How often a batch is tried when PostgreSQL aborts it for a deadlock with
/// another writer (possible when two batches update the same run rows in
/// different orders); the retry starts from scratch.
const APPEND_TRIES: usize = 3;

/// Gives the batch's runs and types their keys when they have none yet
/// (a run's first events, a type newer than the store's rows); the check
/// first spares the identity sequences a number per batch.
const ENSURE_KEYS: &str = "WITH r AS (INSERT INTO event_runs (run_id) \
     SELECT DISTINCT x.u FROM UNNEST($1::text[]) AS x (u) \
     WHERE NOT EXISTS (SELECT 1 FROM event_runs WHERE run_id = x.u) ON CONFLICT DO NOTHING), \
     t AS (INSERT INTO event_types (name) \
     SELECT DISTINCT x.u FROM UNNEST($2::text[]) AS x (u) \
     WHERE NOT EXISTS (SELECT 1 FROM event_types WHERE name = x.u) ON CONFLICT DO NOTHING) \
     SELECT 1";

/// The batch's rows, the envelope in columns (see `cairn_storage::envelope`).
const INSERT_EVENTS: &str = "INSERT INTO events (seq, timestamp_ms, run, type, node_id, body) \
     SELECT b.seq, b.ts, k.run, t.type, b.node_id, b.body \
     FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::text[]) \
     AS b (run_id, seq, type, node_id, ts, body) \
     JOIN event_runs k ON k.run_id = b.run_id JOIN event_types t ON t.name = b.type";

/// One row per run of the batch: its latest timestamp, and the status its
/// last lifecycle event sets (NULL keeps the row's).
const UPDATE_RUNS: &str = "UPDATE runs AS r \
     SET updated_ms = GREATEST(r.updated_ms, u.ts), status = COALESCE(u.status, r.status) \
     FROM UNNEST($1::text[], $2::int8[], $3::text[]) AS u (run_id, ts, status) \
     WHERE r.run_id = u.run_id";

/// The first event of the batch (by position) whose `(run, seq)` is stored.
const FIND_STORED: &str = "SELECT b.run_id, b.seq \
     FROM UNNEST($1::text[], $2::int8[]) WITH ORDINALITY AS b (run_id, seq, pos) \
     JOIN event_runs k ON k.run_id = b.run_id \
     JOIN events e ON e.run = k.run AND e.seq = b.seq ORDER BY b.pos LIMIT 1";

const LAST_SEQ: &str =
    "SELECT max(seq) FROM events WHERE run = (SELECT run FROM event_runs WHERE run_id = $1)";

macro_rules! select_events {
    ($($rest:literal)*) => {
        concat!(
            "SELECT e.seq, t.name, e.node_id, e.timestamp_ms, e.body, e.type FROM events e \
             LEFT JOIN event_types t ON t.type = e.type \
             WHERE e.run = (SELECT run FROM event_runs WHERE run_id = $1) AND e.seq > $2",
            $($rest,)*
            " ORDER BY e.seq LIMIT $3"
        )
    };
}

// One statement per combination of filters rather than `$n IS NULL OR ...`
// conditions, so that each keeps a plan that uses the right index.
const READ_ALL: &str = select_events!();
const READ_TYPES: &str =
    select_events!(" AND e.type IN (SELECT type FROM event_types WHERE name = ANY($4))");
const READ_NODE: &str = select_events!(" AND e.node_id = $4");
const READ_TYPES_NODE: &str = select_events!(
    " AND e.type IN (SELECT type FROM event_types WHERE name = ANY($4)) AND e.node_id = $5"
);

/// The batch as the columns of the multi-row insert.
struct Columns<'a> {
    runs: Vec<&'a str>,
    seqs: Vec<i64>,
    types: Vec<&'a str>,
    nodes: Vec<Option<&'a str>>,
    timestamps: Vec<i64>,
    /// What is stored of each event's JSON ([`Envelope::body`]).
    bodies: Vec<Cow<'a, str>>,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a [StoredEvent]) -> Result<Columns<'a>, StoreError> {
        let mut c = Columns {
            runs: Vec::with_capacity(batch.len()),
            seqs: Vec::with_capacity(batch.len()),
            types: Vec::with_capacity(batch.len()),
            nodes: Vec::with_capacity(batch.len()),
            timestamps: Vec::with_capacity(batch.len()),
            bodies: Vec::with_capacity(batch.len()),
        };
        for ev in batch {
            c.runs.push(ev.run_id.as_str());
            c.seqs.push(seq_column(ev)?);
            c.types.push(&ev.type_name);
            c.nodes.push(ev.node_id.as_ref().map(NodePath::as_str));
            c.timestamps.push(ev.timestamp_ms);
            c.bodies.push(
                Envelope {
                    type_name: &ev.type_name,
                    run_id: &ev.run_id,
                    seq: ev.seq,
                    timestamp_ms: ev.timestamp_ms,
                    node_id: ev.node_id.as_ref().map(NodePath::as_str),
                }
                .body(&ev.json),
            );
        }
        Ok(c)
    }
}

fn seq_column(ev: &StoredEvent) -> Result<i64, StoreError> {
    i64::try_from(ev.seq).map_err(|_| StoreError::BadRow {
        run: ev.run_id.to_string(),
        detail: format!("seq {} is beyond what the store keeps", ev.seq),
    })
}

/// What the batch does to run rows: per run, in order of first appearance,
/// its latest timestamp and the status of its last lifecycle event.
struct RunUpdates<'a> {
    runs: Vec<&'a str>,
    timestamps: Vec<i64>,
    statuses: Vec<Option<String>>,
}

impl<'a> RunUpdates<'a> {
    fn of(batch: &'a [StoredEvent]) -> RunUpdates<'a> {
        let mut u = RunUpdates {
            runs: Vec::new(),
            timestamps: Vec::new(),
            statuses: Vec::new(),
        };
        // A busy server's batch holds a thousand runs: found by id, not by
        // a scan per event.
        let mut index: HashMap<&str, usize> = HashMap::new();
        for ev in batch {
            let status = status_of(ev);
            match index.get(ev.run_id.as_str()).copied() {
                Some(i) => {
                    u.timestamps[i] = u.timestamps[i].max(ev.timestamp_ms);
                    if status.is_some() {
                        u.statuses[i] = status;
                    }
                }
                None => {
                    index.insert(ev.run_id.as_str(), u.runs.len());
                    u.runs.push(ev.run_id.as_str());
                    u.timestamps.push(ev.timestamp_ms);
                    u.statuses.push(status);
                }
            }
        }
        u
    }
}

/// The status a lifecycle event puts its run in, if it changes it.
fn status_of(ev: &StoredEvent) -> Option<String> {
    match ev.type_name.as_str() {
        "RunStarted" => Some("running".into()),
        "RunFinished" => Some("finished".into()),
        "RunFailed" => Some("failed".into()),
        "RunCancelled" => Some("cancelled".into()),
        "RunStatusChanged" => serde_json::from_str::<serde_json::Value>(&ev.json)
            .ok()?
            .get("status")?
            .as_str()
            .map(str::to_string),
        _ => None,
    }
}

/// Why one try of a batch failed.
enum Failed {
    /// Refused before anything was written (the lease fence).
    Refused(StoreError),
    /// The server aborted the transaction.
    Pg(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Failed {
    fn from(e: tokio_postgres::Error) -> Self {
        Failed::Pg(e)
    }
}

/// Commits `batch` in one transaction, unless a run of it is leased by
/// another owner than `owner` (see [`lease::fenced_run`]).
pub(crate) async fn append(
    db: &Db,
    owner: &str,
    calls: &[ToolCallRecord],
    batch: &[StoredEvent],
) -> Result<(), StoreError> {
    write(db, owner, None, None, calls, batch).await
}

/// A run's start in one transaction (see `Runs::start_run`): its row, its
/// pinned files and its first event, fenced by the run's lease as an
/// append is.
pub(crate) async fn start_run(
    db: &Db,
    owner: &str,
    record: Option<&RunRecord>,
    pinned: Option<&GenerationRecord>,
    first: &StoredEvent,
) -> Result<(), StoreError> {
    write(db, owner, record, pinned, &[], std::slice::from_ref(first)).await
}

/// Commits a new run's `record` and `pinned` files when given, then
/// `batch`, in one transaction, tried again when the server aborts it for
/// a deadlock. A row of a run that exists is `RunExists`, pinned files of
/// a run without a row `RunNotFound` (both only in a start: an append
/// writes neither).
async fn write(
    db: &Db,
    owner: &str,
    record: Option<&RunRecord>,
    pinned: Option<&GenerationRecord>,
    calls: &[ToolCallRecord],
    batch: &[StoredEvent],
) -> Result<(), StoreError> {
    if batch.is_empty() && calls.is_empty() {
        return Ok(());
    }
    let cols = Columns::of(batch)?;
    let updates = RunUpdates::of(batch);
    let mut client = db.client().await?;
    let mut tries = 0;
    loop {
        tries += 1;
        let attempt = try_write(&mut client, owner, record, pinned, calls, &cols, &updates);
        let e = match attempt.await {
            Ok(()) => return Ok(()),
            Err(Failed::Refused(e)) => return Err(e),
            Err(Failed::Pg(e)) => e,
        };
        let table = e.as_db_error().and_then(|d| d.table()).unwrap_or_default();
        match e.code() {
            Some(&SqlState::UNIQUE_VIOLATION) if table == "runs" => {
                return Err(StoreError::RunExists(batch[0].run_id.to_string()))
            }
            Some(&SqlState::UNIQUE_VIOLATION) => {
                return Err(duplicate(&client, batch, &cols, &e).await)
            }
            Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
                let run = match (calls.first(), batch.first()) {
                    (Some(c), _) if table == "tool_calls" => c.run_id.as_str(),
                    (_, Some(ev)) => ev.run_id.as_str(),
                    (Some(c), None) => c.run_id.as_str(),
                    (None, None) => "",
                };
                return Err(StoreError::RunNotFound(run.to_string()));
            }
            Some(&SqlState::T_R_DEADLOCK_DETECTED) | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                if tries < APPEND_TRIES =>
            {
                tracing::debug!(error = %e, "a write aborted by the server; trying again");
            }
            _ => return Err(db.err(e)),
        }
    }
}

/// One try of [`write`].
async fn try_write(
    client: &mut deadpool_postgres::Object,
    owner: &str,
    record: Option<&RunRecord>,
    pinned: Option<&GenerationRecord>,
    calls: &[ToolCallRecord],
    cols: &Columns<'_>,
    updates: &RunUpdates<'_>,
) -> Result<(), Failed> {
    let tx = client.transaction().await?;
    if let Some(rec) = record {
        crate::runs::insert(&tx, rec).await?;
    }
    if let Some(g) = pinned {
        crate::records::insert_generation(&tx, g).await?;
    }
    if !cols.seqs.is_empty() {
        write_batch(&tx, owner, cols, updates).await?;
    }
    // The calls' rows are fenced as the events are: only the process that
    // holds a run writes them.
    let unfenced: Vec<&str> = calls
        .iter()
        .map(|c| c.run_id.as_str())
        .filter(|r| !updates.runs.contains(r))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if !unfenced.is_empty() {
        if let Some(run) = lease::fenced_run(&tx, owner, &unfenced).await? {
            return Err(Failed::Refused(StoreError::LeaseHeld { run }));
        }
    }
    crate::records::put_tool_calls_in(&tx, calls).await?;
    tx.commit().await?;
    Ok(())
}

/// Writes a batch in `tx`: the lease fence first, then the rows of the
/// events and their runs.
async fn write_batch(
    tx: &deadpool_postgres::Transaction<'_>,
    owner: &str,
    cols: &Columns<'_>,
    updates: &RunUpdates<'_>,
) -> Result<(), Failed> {
    if let Some(run) = lease::fenced_run(tx, owner, &updates.runs).await? {
        return Err(Failed::Refused(StoreError::LeaseHeld { run }));
    }
    let ensure = tx.prepare_cached(ENSURE_KEYS).await?;
    let insert = tx.prepare_cached(INSERT_EVENTS).await?;
    let bodies: Vec<&str> = cols.bodies.iter().map(|b| &**b).collect();
    // Sent together: the keys' statement runs first on the connection.
    let keys: [&(dyn ToSql + Sync); 2] = [&updates.runs, &cols.types];
    let rows: [&(dyn ToSql + Sync); 6] = [
        &cols.runs,
        &cols.seqs,
        &cols.types,
        &cols.nodes,
        &cols.timestamps,
        &bodies,
    ];
    let (_, inserted) = futures::try_join!(tx.execute(&ensure, &keys), tx.execute(&insert, &rows))?;
    if inserted != cols.seqs.len() as u64 {
        return Err(Failed::Refused(StoreError::Database(format!(
            "{inserted} of a batch of {} events found their run's and type's keys",
            cols.seqs.len()
        ))));
    }
    let update = tx.prepare_cached(UPDATE_RUNS).await?;
    tx.execute(
        &update,
        &[&updates.runs, &updates.timestamps, &updates.statuses],
    )
    .await?;
    Ok(())
}

/// The `BadRow` for a batch refused for a duplicate `(run, seq)`, naming
/// the first such event: one repeated within the batch, or one already
/// stored (looked up after the rollback).
async fn duplicate(
    client: &deadpool_postgres::Object,
    batch: &[StoredEvent],
    cols: &Columns<'_>,
    e: &tokio_postgres::Error,
) -> StoreError {
    let bad = |run: &str, seq: u64| StoreError::BadRow {
        run: run.to_string(),
        detail: format!("seq {seq} is already stored"),
    };
    let mut seen = HashSet::new();
    if let Some(ev) = batch.iter().find(|ev| !seen.insert((&ev.run_id, ev.seq))) {
        return bad(&ev.run_id, ev.seq);
    }
    let found = client
        .query_opt(FIND_STORED, &[&cols.runs, &cols.seqs])
        .await
        .and_then(|row| {
            row.map(|r| {
                let run: String = r.try_get(0)?;
                let seq: i64 = r.try_get(1)?;
                Ok((run, seq))
            })
            .transpose()
        });
    match found {
        Ok(Some((run, seq))) => bad(&run, seq as u64),
        // Deleted meanwhile, or the lookup failed: name the batch's first
        // run with the server's words, which say which key.
        _ => StoreError::BadRow {
            run: batch[0].run_id.to_string(),
            detail: crate::db::describe(e),
        },
    }
}

/// A run's events as `q` selects them, in seq order.
pub(crate) async fn read(
    db: &Db,
    run_id: &RunId,
    q: &EventQuery,
) -> Result<Vec<StoredEvent>, StoreError> {
    let run = run_id.as_str();
    let after = q.after.min(i64::MAX as u64) as i64;
    let limit = q.limit.map(|l| l.min(i64::MAX as usize) as i64);
    let types: Vec<&str> = q.types.iter().map(|t| t.as_str()).collect();
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run, &after, &limit];
    let has_types = !types.is_empty();
    if has_types {
        params.push(&types);
    }
    if let Some(node) = &q.node {
        params.push(node);
    }
    let sql = match (has_types, q.node.is_some()) {
        (false, false) => READ_ALL,
        (true, false) => READ_TYPES,
        (false, true) => READ_NODE,
        (true, true) => READ_TYPES_NODE,
    };
    let client = db.client().await?;
    let st = client.prepare_cached(sql).await.map_err(|e| db.err(e))?;
    let rows = client.query(&st, &params).await.map_err(|e| db.err(e))?;
    rows.iter().map(|r| event_row(db, run_id, r)).collect()
}

/// One row of a read as the event it stores, its JSON rebuilt; a row that
/// cannot be is [`StoreError::BadRow`].
fn event_row(db: &Db, run_id: &RunId, r: &Row) -> Result<StoredEvent, StoreError> {
    let seq = r.try_get::<_, i64>(0).map_err(|e| db.err(e))? as u64;
    let bad = |detail: String| StoreError::BadRow {
        run: run_id.to_string(),
        detail: format!("event {seq}: {detail}"),
    };
    let (type_name, node_id, timestamp_ms, body, code) = (|| {
        Ok::<_, tokio_postgres::Error>((
            r.try_get::<_, Option<String>>(1)?,
            r.try_get::<_, Option<String>>(2)?,
            r.try_get::<_, i64>(3)?,
            r.try_get::<_, &str>(4)?,
            r.try_get::<_, i16>(5)?,
        ))
    })()
    .map_err(|e| db.err(e))?;
    let type_name =
        type_name.ok_or_else(|| bad(format!("type code {code} names no event type")))?;
    envelope::stored_event(run_id, seq, type_name, node_id, timestamp_ms, body)
        .map_err(|e| bad(e.to_string()))
}

/// The highest stored seq of a run, 0 when it has none.
pub(crate) async fn last_seq(db: &Db, run_id: &RunId) -> Result<u64, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(LAST_SEQ)
        .await
        .map_err(|e| db.err(e))?;
    let max: Option<i64> = client
        .query_one(&st, &[&run_id.as_str()])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| db.err(e))?;
    Ok(max.unwrap_or(0) as u64)
}
