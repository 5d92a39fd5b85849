//! Run rows: creating, reading, listing, and deleting finished runs.

use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use cairn_events::RunId;
use cairn_storage::{run_id_from_row, RecordStatus, RunFilter, RunRecord, StoreError};

use crate::db::Db;
use crate::records::{json_column, json_text};

macro_rules! run_cols {
    () => {
        "run_id, workflow, workflow_path, workflow_hash, workflow_source, input, \
         status, created_ms, updated_ms, parent_run_id"
    };
}

const CREATE_RUN: &str = concat!(
    "INSERT INTO runs (",
    run_cols!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
);
const GET_RUN: &str = concat!("SELECT ", run_cols!(), " FROM runs WHERE run_id = $1");
const LIST_RUNS: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs WHERE ($1::text IS NULL OR status = $1) \
     AND ($2::text IS NULL OR workflow = $2) \
     AND ($3::text IS NULL OR parent_run_id = $3) \
     ORDER BY created_ms DESC, created_order DESC LIMIT $4 OFFSET $5"
);

/// The statuses after which a run may be deleted.
macro_rules! ended {
    () => {
        "status IN ('finished', 'failed', 'cancelled')"
    };
}
const GC_CANDIDATES: &str = concat!(
    "SELECT run_id FROM runs WHERE ",
    ended!(),
    " AND updated_ms < $1 ORDER BY created_ms, created_order"
);
/// Of the candidates, those still due once their rows are locked: a resume
/// may have moved one on since the candidates were read.
const GC_STILL_DUE: &str = concat!(
    "SELECT run_id FROM runs WHERE run_id = ANY($1) AND ",
    ended!(),
    " AND updated_ms < $2 ORDER BY run_id FOR UPDATE"
);
/// Child tables first; their foreign keys cascade anyway, but saying so
/// keeps the statement list the same as SQLite's.
const GC_DELETES: &[&str] = &[
    "DELETE FROM events WHERE run IN (SELECT run FROM event_runs WHERE run_id = ANY($1))",
    "DELETE FROM event_runs WHERE run_id = ANY($1)",
    "DELETE FROM tool_calls WHERE run_id = ANY($1)",
    "DELETE FROM inbox WHERE run_id = ANY($1)",
    "DELETE FROM processes WHERE run_id = ANY($1)",
    "DELETE FROM generations WHERE run_id = ANY($1)",
    "DELETE FROM runs WHERE run_id = ANY($1)",
];

/// Inserts a run row (its id already checked); `RunExists` if taken.
pub(crate) async fn create(db: &Db, rec: &RunRecord) -> Result<(), StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(CREATE_RUN)
        .await
        .map_err(|e| db.err(e))?;
    execute_insert(&**client, &st, rec)
        .await
        .map_err(|e| match e.code() {
            Some(&SqlState::UNIQUE_VIOLATION) => StoreError::RunExists(rec.run_id.to_string()),
            _ => db.err(e),
        })?;
    Ok(())
}

/// Inserts a run's row in `tx` (a run's start, see `events::start_run`).
pub(crate) async fn insert(
    tx: &deadpool_postgres::Transaction<'_>,
    rec: &RunRecord,
) -> Result<u64, tokio_postgres::Error> {
    let st = tx.prepare_cached(CREATE_RUN).await?;
    execute_insert(&**tx, &st, rec).await
}

/// Runs `CREATE_RUN` (prepared as `st`) with the record's values.
async fn execute_insert<C: tokio_postgres::GenericClient>(
    c: &C,
    st: &tokio_postgres::Statement,
    rec: &RunRecord,
) -> Result<u64, tokio_postgres::Error> {
    let input = json_text(&rec.input);
    let parent = rec.parent_run_id.as_ref().map(|p| p.as_str());
    c.execute(
        st,
        &[
            &rec.run_id.as_str(),
            &rec.workflow,
            &rec.workflow_path,
            &rec.workflow_hash,
            &rec.workflow_source,
            &input,
            &rec.status.as_str(),
            &rec.created_ms,
            &rec.updated_ms,
            &parent,
        ],
    )
    .await
}

/// A run's row, if it exists.
pub(crate) async fn get(db: &Db, run_id: &RunId) -> Result<Option<RunRecord>, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(GET_RUN)
        .await
        .map_err(|e| db.err(e))?;
    let row = client
        .query_opt(&st, &[&run_id.as_str()])
        .await
        .map_err(|e| db.err(e))?;
    row.map(|r| run_row(db, &r)).transpose()
}

/// Runs matching the filter, newest first.
pub(crate) async fn list(db: &Db, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
    // NULL is no limit.
    let limit = f.limit.map(|l| l.min(i64::MAX as usize) as i64);
    let offset = f.offset.unwrap_or(0).min(i64::MAX as usize) as i64;
    let client = db.client().await?;
    let st = client
        .prepare_cached(LIST_RUNS)
        .await
        .map_err(|e| db.err(e))?;
    let rows = client
        .query(
            &st,
            &[
                &f.status.map(RecordStatus::as_str),
                &f.workflow,
                &f.parent.as_deref(),
                &limit,
                &offset,
            ],
        )
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(|r| run_row(db, r)).collect()
}

/// Ended runs last updated before `cutoff_ms`, oldest first.
pub(crate) async fn gc_candidates(db: &Db, cutoff_ms: i64) -> Result<Vec<RunId>, StoreError> {
    let client = db.client().await?;
    let rows = client
        .query(GC_CANDIDATES, &[&cutoff_ms])
        .await
        .map_err(|e| db.err(e))?;
    rows.iter()
        .map(|r| {
            let id: &str = r.try_get(0).map_err(|e| db.err(e))?;
            run_id_from_row(id, "run_id", id)
        })
        .collect()
}

/// Deletes those of `ids` still due, with everything kept about them, in
/// one transaction; returns them in the order of `ids`.
pub(crate) async fn delete_due(
    db: &Db,
    ids: &[RunId],
    cutoff_ms: i64,
) -> Result<Vec<RunId>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let texts: Vec<&str> = ids.iter().map(RunId::as_str).collect();
    let mut client = db.client().await?;
    let tx = client.transaction().await.map_err(|e| db.err(e))?;
    let due: Vec<String> = tx
        .query(GC_STILL_DUE, &[&texts, &cutoff_ms])
        .await
        .map_err(|e| db.err(e))?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(|e| db.err(e))?;
    for sql in GC_DELETES {
        tx.execute(*sql, &[&due]).await.map_err(|e| db.err(e))?;
    }
    tx.commit().await.map_err(|e| db.err(e))?;
    Ok(ids
        .iter()
        .filter(|id| due.iter().any(|d| *d == **id))
        .cloned()
        .collect())
}

fn run_row(db: &Db, r: &Row) -> Result<RunRecord, StoreError> {
    let get = |e| db.err(e);
    let run_id: String = r.try_get(0).map_err(get)?;
    let input: String = r.try_get(5).map_err(get)?;
    Ok(RunRecord {
        input: json_column(&run_id, "input", &input)?,
        workflow: r.try_get(1).map_err(get)?,
        workflow_path: r.try_get(2).map_err(get)?,
        workflow_hash: r.try_get(3).map_err(get)?,
        workflow_source: r.try_get(4).map_err(get)?,
        status: RecordStatus::from_row(&run_id, &r.try_get::<_, String>(6).map_err(get)?)?,
        created_ms: r.try_get(7).map_err(get)?,
        updated_ms: r.try_get(8).map_err(get)?,
        parent_run_id: r
            .try_get::<_, Option<&str>>(9)
            .map_err(get)?
            .map(|p| run_id_from_row(&run_id, "parent_run_id", p))
            .transpose()?,
        run_id: run_id_from_row(&run_id, "run_id", &run_id)?,
    })
}
