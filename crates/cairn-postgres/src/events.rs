//! Run logs: appending batches, reading them back.

use std::collections::HashSet;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use cairn_events::NodePath;
use cairn_storage::{EventQuery, StoreError, StoredEvent};

use crate::db::Db;
use crate::lease;

/// How often a batch is tried when PostgreSQL aborts it for a deadlock with
/// another writer (possible when two batches update the same run rows in
/// different orders); the retry starts from scratch.
const APPEND_TRIES: usize = 3;

const INSERT_EVENTS: &str = "INSERT INTO events (run_id, seq, type, node_id, timestamp_ms, json) \
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::text[])";

/// One row per run of the batch: its latest timestamp, and the status its
/// last lifecycle event sets (NULL keeps the row's).
const UPDATE_RUNS: &str = "UPDATE runs AS r \
     SET updated_ms = GREATEST(r.updated_ms, u.ts), status = COALESCE(u.status, r.status) \
     FROM UNNEST($1::text[], $2::int8[], $3::text[]) AS u (run_id, ts, status) \
     WHERE r.run_id = u.run_id";

/// The first event of the batch (by position) whose `(run, seq)` is stored.
const FIND_STORED: &str = "SELECT b.run_id, b.seq \
     FROM UNNEST($1::text[], $2::int8[]) WITH ORDINALITY AS b (run_id, seq, pos) \
     JOIN events e ON e.run_id = b.run_id AND e.seq = b.seq ORDER BY b.pos LIMIT 1";

const LAST_SEQ: &str = "SELECT max(seq) FROM events WHERE run_id = $1";

macro_rules! select_events {
    ($($rest:literal)*) => {
        concat!(
            "SELECT run_id, seq, type, node_id, timestamp_ms, json FROM events \
             WHERE run_id = $1 AND seq > $2",
            $($rest,)*
            " ORDER BY seq LIMIT $3"
        )
    };
}

// One statement per combination of filters rather than `$n IS NULL OR ...`
// conditions, so that each keeps a plan that uses the right index.
const READ_ALL: &str = select_events!();
const READ_TYPES: &str = select_events!(" AND type = ANY($4)");
const READ_NODE: &str = select_events!(" AND node_id = $4");
const READ_TYPES_NODE: &str = select_events!(" AND type = ANY($4) AND node_id = $5");

/// The batch as the columns of the multi-row insert.
struct Columns<'a> {
    runs: Vec<&'a str>,
    seqs: Vec<i64>,
    types: Vec<&'a str>,
    nodes: Vec<Option<&'a str>>,
    timestamps: Vec<i64>,
    json: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn of(batch: &'a [StoredEvent]) -> Result<Columns<'a>, StoreError> {
        let mut c = Columns {
            runs: Vec::with_capacity(batch.len()),
            seqs: Vec::with_capacity(batch.len()),
            types: Vec::with_capacity(batch.len()),
            nodes: Vec::with_capacity(batch.len()),
            timestamps: Vec::with_capacity(batch.len()),
            json: Vec::with_capacity(batch.len()),
        };
        for ev in batch {
            c.runs.push(&ev.run_id);
            c.seqs.push(seq_column(ev)?);
            c.types.push(&ev.type_name);
            c.nodes.push(ev.node_id.as_ref().map(NodePath::as_str));
            c.timestamps.push(ev.timestamp_ms);
            c.json.push(&ev.json);
        }
        Ok(c)
    }
}

fn seq_column(ev: &StoredEvent) -> Result<i64, StoreError> {
    i64::try_from(ev.seq).map_err(|_| StoreError::BadRow {
        run: ev.run_id.clone(),
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
        for ev in batch {
            let status = status_of(ev);
            // Batches rarely hold more than a few runs: a scan beats a map.
            match u.runs.iter().position(|r| *r == ev.run_id) {
                Some(i) => {
                    u.timestamps[i] = u.timestamps[i].max(ev.timestamp_ms);
                    if status.is_some() {
                        u.statuses[i] = status;
                    }
                }
                None => {
                    u.runs.push(&ev.run_id);
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
pub(crate) async fn append(db: &Db, owner: &str, batch: &[StoredEvent]) -> Result<(), StoreError> {
    if batch.is_empty() {
        return Ok(());
    }
    let cols = Columns::of(batch)?;
    let updates = RunUpdates::of(batch);
    let mut client = db.client().await?;
    let mut tries = 0;
    loop {
        tries += 1;
        let e = match try_append(&mut client, owner, &cols, &updates).await {
            Ok(()) => return Ok(()),
            Err(Failed::Refused(e)) => return Err(e),
            Err(Failed::Pg(e)) => e,
        };
        match e.code() {
            Some(&SqlState::UNIQUE_VIOLATION) => {
                return Err(duplicate(&client, batch, &cols, &e).await)
            }
            Some(&SqlState::T_R_DEADLOCK_DETECTED) | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                if tries < APPEND_TRIES =>
            {
                tracing::debug!(error = %e, "append aborted by the server; trying again");
            }
            _ => return Err(db.err(e)),
        }
    }
}

async fn try_append(
    client: &mut deadpool_postgres::Object,
    owner: &str,
    cols: &Columns<'_>,
    updates: &RunUpdates<'_>,
) -> Result<(), Failed> {
    let tx = client.transaction().await?;
    if let Some(run) = lease::fenced_run(&tx, owner, &updates.runs).await? {
        return Err(Failed::Refused(StoreError::LeaseHeld { run }));
    }
    let insert = tx.prepare_cached(INSERT_EVENTS).await?;
    tx.execute(
        &insert,
        &[
            &cols.runs,
            &cols.seqs,
            &cols.types,
            &cols.nodes,
            &cols.timestamps,
            &cols.json,
        ],
    )
    .await?;
    let update = tx.prepare_cached(UPDATE_RUNS).await?;
    tx.execute(
        &update,
        &[&updates.runs, &updates.timestamps, &updates.statuses],
    )
    .await?;
    tx.commit().await?;
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
            run: batch[0].run_id.clone(),
            detail: crate::db::describe(e),
        },
    }
}

/// A run's events as `q` selects them, in seq order.
pub(crate) async fn read(
    db: &Db,
    run_id: &str,
    q: &EventQuery,
) -> Result<Vec<StoredEvent>, StoreError> {
    let after = q.after.min(i64::MAX as u64) as i64;
    let limit = q.limit.map(|l| l.min(i64::MAX as usize) as i64);
    let types: Vec<&str> = q.types.iter().map(|t| t.as_str()).collect();
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&run_id, &after, &limit];
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
    rows.iter()
        .map(event_row)
        .collect::<Result<_, _>>()
        .map_err(|e| db.err(e))
}

fn event_row(r: &Row) -> Result<StoredEvent, tokio_postgres::Error> {
    Ok(StoredEvent {
        run_id: r.try_get(0)?,
        seq: r.try_get::<_, i64>(1)? as u64,
        type_name: r.try_get(2)?,
        node_id: r.try_get::<_, Option<String>>(3)?.map(NodePath::from),
        timestamp_ms: r.try_get(4)?,
        json: r.try_get::<_, String>(5)?.into(),
    })
}

/// The highest stored seq of a run, 0 when it has none.
pub(crate) async fn last_seq(db: &Db, run_id: &str) -> Result<u64, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(LAST_SEQ)
        .await
        .map_err(|e| db.err(e))?;
    let max: Option<i64> = client
        .query_one(&st, &[&run_id])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| db.err(e))?;
    Ok(max.unwrap_or(0) as u64)
}
