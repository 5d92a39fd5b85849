//! What the engine keeps beside a run's log: tool calls, the inbox of
//! commands, the process groups of running attempts, and the workflow
//! generations reloads adopted.

use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use cairn_events::{NodePath, RunCommand, RunId};
use cairn_storage::{
    run_id_from_row, GenerationRecord, InboxEntry, ProcessRecord, StoreError, ToolCallRecord,
    ToolCallStatus,
};

use crate::db::Db;

const PUT_TOOL_CALL: &str = "INSERT INTO tool_calls (run_id, node_id, iteration, attempt, \
     tool_seq, tool, idempotency_key, side_effect, idempotent, input, output, started_ms, \
     finished_ms, status, error) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
     ON CONFLICT (run_id, node_id, iteration, attempt, tool_seq) DO UPDATE SET \
     tool = EXCLUDED.tool, idempotency_key = EXCLUDED.idempotency_key, \
     side_effect = EXCLUDED.side_effect, idempotent = EXCLUDED.idempotent, \
     input = EXCLUDED.input, output = EXCLUDED.output, started_ms = EXCLUDED.started_ms, \
     finished_ms = EXCLUDED.finished_ms, status = EXCLUDED.status, error = EXCLUDED.error";
const TOOL_CALLS: &str = "SELECT run_id, node_id, iteration, attempt, tool_seq, tool, \
     idempotency_key, side_effect, idempotent, input, output, started_ms, finished_ms, status, \
     error FROM tool_calls WHERE run_id = $1 AND node_id = $2 AND iteration = $3 \
     ORDER BY attempt, tool_seq";
const PUT_COMMAND: &str =
    "INSERT INTO inbox (run_id, command, created_ms) VALUES ($1, $2, $3) RETURNING id";
const PENDING_COMMANDS: &str = "SELECT id, run_id, command, created_ms FROM inbox \
     WHERE run_id = $1 AND taken_ms IS NULL ORDER BY id";
/// The first outcome stays: taking a command twice changes nothing.
const TAKE_COMMAND: &str = "UPDATE inbox SET taken_ms = COALESCE(taken_ms, $2), \
     outcome = COALESCE(outcome, $3) WHERE id = $1";
const PUT_PROCESS: &str = "INSERT INTO processes (run_id, node_id, iteration, attempt, pgid, \
     started_ms) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id";
const PUT_GENERATION: &str = "INSERT INTO generations (run_id, generation, workflow_hash, \
     source, created_ms, files) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (run_id, generation) DO UPDATE SET workflow_hash = EXCLUDED.workflow_hash, \
     source = EXCLUDED.source, created_ms = EXCLUDED.created_ms, files = EXCLUDED.files";
const GENERATION: &str = "SELECT run_id, generation, workflow_hash, source, created_ms, files \
     FROM generations WHERE run_id = $1 AND generation = $2";
const PROCESSES: &str = "SELECT id, run_id, node_id, iteration, attempt, pgid, started_ms \
     FROM processes WHERE run_id = $1 ORDER BY id";

/// Inserts or replaces a tool call; `NotFound` when its run has no row.
pub(crate) async fn put_tool_call(db: &Db, rec: &ToolCallRecord) -> Result<(), StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(PUT_TOOL_CALL)
        .await
        .map_err(|e| db.err(e))?;
    execute_tool_call(&**client, &st, rec)
        .await
        .map_err(|e| no_run(db, e, &rec.run_id))?;
    Ok(())
}

/// Tool calls' rows in `tx`, beside a batch of events (see
/// `Backend::append_with_calls`).
pub(crate) async fn put_tool_calls_in(
    tx: &deadpool_postgres::Transaction<'_>,
    calls: &[ToolCallRecord],
) -> Result<(), tokio_postgres::Error> {
    if calls.is_empty() {
        return Ok(());
    }
    let st = tx.prepare_cached(PUT_TOOL_CALL).await?;
    for rec in calls {
        execute_tool_call(&**tx, &st, rec).await?;
    }
    Ok(())
}

/// Runs `PUT_TOOL_CALL` (prepared as `st`) with the record's values.
async fn execute_tool_call<C: tokio_postgres::GenericClient>(
    c: &C,
    st: &tokio_postgres::Statement,
    rec: &ToolCallRecord,
) -> Result<u64, tokio_postgres::Error> {
    let input = json_text(&rec.input);
    let output = rec.output.as_ref().map(json_text);
    let error = rec.error.as_ref().map(json_text);
    c.execute(
        st,
        &[
            &rec.run_id.as_str(),
            &rec.node_id,
            &i64::from(rec.iteration),
            &i64::from(rec.attempt),
            &i64::from(rec.tool_seq),
            &rec.tool,
            &rec.idempotency_key,
            &rec.side_effect,
            &rec.idempotent,
            &input,
            &output,
            &rec.started_ms,
            &rec.finished_ms,
            &rec.status.as_str(),
            &error,
        ],
    )
    .await
}

/// The tool calls of one node pass, by attempt then tool_seq.
pub(crate) async fn tool_calls(
    db: &Db,
    run_id: &RunId,
    node_id: &NodePath,
    iteration: u32,
) -> Result<Vec<ToolCallRecord>, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(TOOL_CALLS)
        .await
        .map_err(|e| db.err(e))?;
    let rows = client
        .query(
            &st,
            &[&run_id.as_str(), &node_id.as_str(), &i64::from(iteration)],
        )
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(|r| tool_call_row(db, r)).collect()
}

/// Records a command in a run's inbox; `NotFound` for an unknown run.
pub(crate) async fn put_command(
    db: &Db,
    run_id: &RunId,
    command: &RunCommand,
) -> Result<u64, StoreError> {
    let text = serde_json::to_string(command).map_err(|e| StoreError::BadRow {
        run: run_id.to_string(),
        detail: format!("command cannot be stored: {e}"),
    })?;
    let client = db.client().await?;
    let st = client
        .prepare_cached(PUT_COMMAND)
        .await
        .map_err(|e| db.err(e))?;
    let id: i64 = client
        .query_one(&st, &[&run_id.as_str(), &text, &now_ms()])
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| no_run(db, e, run_id))?;
    Ok(id as u64)
}

/// A run's commands not yet taken, oldest first.
pub(crate) async fn pending_commands(
    db: &Db,
    run_id: &RunId,
) -> Result<Vec<InboxEntry>, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(PENDING_COMMANDS)
        .await
        .map_err(|e| db.err(e))?;
    let rows = client
        .query(&st, &[&run_id.as_str()])
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(|r| inbox_row(db, r)).collect()
}

/// Marks a command taken with its outcome, keeping a first one.
pub(crate) async fn take_command(db: &Db, id: u64, outcome: &str) -> Result<(), StoreError> {
    let not_found = StoreError::RecordNotFound {
        what: "command",
        id,
    };
    // Ids are BIGSERIAL: a larger one names nothing.
    let Ok(key) = i64::try_from(id) else {
        return Err(not_found);
    };
    let client = db.client().await?;
    let st = client
        .prepare_cached(TAKE_COMMAND)
        .await
        .map_err(|e| db.err(e))?;
    let n = client
        .execute(&st, &[&key, &now_ms(), &outcome])
        .await
        .map_err(|e| db.err(e))?;
    if n == 0 {
        return Err(not_found);
    }
    Ok(())
}

/// Records a process group; `NotFound` for an unknown run.
pub(crate) async fn put_process(db: &Db, rec: &ProcessRecord) -> Result<u64, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(PUT_PROCESS)
        .await
        .map_err(|e| db.err(e))?;
    let id: i64 = client
        .query_one(
            &st,
            &[
                &rec.run_id.as_str(),
                &rec.node_id,
                &i64::from(rec.iteration),
                &i64::from(rec.attempt),
                &i64::from(rec.pgid),
                &rec.started_ms,
            ],
        )
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| no_run(db, e, &rec.run_id))?;
    Ok(id as u64)
}

/// Forgets a process group; an unknown id is no error.
pub(crate) async fn remove_process(db: &Db, id: u64) -> Result<(), StoreError> {
    let Ok(key) = i64::try_from(id) else {
        return Ok(());
    };
    let client = db.client().await?;
    client
        .execute("DELETE FROM processes WHERE id = $1", &[&key])
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}

/// The process groups recorded for a run, in insertion order.
pub(crate) async fn processes(db: &Db, run_id: &RunId) -> Result<Vec<ProcessRecord>, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(PROCESSES)
        .await
        .map_err(|e| db.err(e))?;
    let rows = client
        .query(&st, &[&run_id.as_str()])
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(|r| process_row(db, r)).collect()
}

/// Inserts or replaces a generation of a run's workflow; `NotFound` when
/// the run has no row.
pub(crate) async fn put_generation(db: &Db, rec: &GenerationRecord) -> Result<(), StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(PUT_GENERATION)
        .await
        .map_err(|e| db.err(e))?;
    execute_generation(&**client, &st, rec)
        .await
        .map_err(|e| no_run(db, e, &rec.run_id))?;
    Ok(())
}

/// Stores a generation in `tx` (a run's start, see `events::start_run`).
pub(crate) async fn insert_generation(
    tx: &deadpool_postgres::Transaction<'_>,
    rec: &GenerationRecord,
) -> Result<u64, tokio_postgres::Error> {
    let st = tx.prepare_cached(PUT_GENERATION).await?;
    execute_generation(&**tx, &st, rec).await
}

/// Runs `PUT_GENERATION` (prepared as `st`) with the record's values.
async fn execute_generation<C: tokio_postgres::GenericClient>(
    c: &C,
    st: &tokio_postgres::Statement,
    rec: &GenerationRecord,
) -> Result<u64, tokio_postgres::Error> {
    let generation = rec.generation.min(i64::MAX as u64) as i64;
    let files = cairn_storage::PinnedFile::encode_all(&rec.files);
    c.execute(
        st,
        &[
            &rec.run_id.as_str(),
            &generation,
            &rec.workflow_hash,
            &rec.workflow_source,
            &rec.created_ms,
            &files,
        ],
    )
    .await
}

/// One generation of a run's workflow, if stored.
pub(crate) async fn generation(
    db: &Db,
    run_id: &RunId,
    generation: u64,
) -> Result<Option<GenerationRecord>, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(GENERATION)
        .await
        .map_err(|e| db.err(e))?;
    let generation = generation.min(i64::MAX as u64) as i64;
    let row = client
        .query_opt(&st, &[&run_id.as_str(), &generation])
        .await
        .map_err(|e| db.err(e))?;
    let Some(r) = row else {
        return Ok(None);
    };
    let got = (|| {
        let n: i64 = r.try_get(1)?;
        let files: String = r.try_get(5)?;
        Ok::<_, tokio_postgres::Error>((
            GenerationRecord {
                // The row is the one asked for by its run id.
                run_id: run_id.clone(),
                generation: n as u64,
                workflow_hash: r.try_get(2)?,
                workflow_source: r.try_get(3)?,
                created_ms: r.try_get(4)?,
                files: Vec::new(),
            },
            files,
        ))
    })();
    let (mut rec, files) = got.map_err(|e| db.err(e))?;
    rec.files = cairn_storage::PinnedFile::decode_all(&files).map_err(|e| StoreError::Corrupt {
        store: format!("generation {generation} of run {run_id}"),
        detail: format!("its pinned files are not readable: {e}"),
    })?;
    Ok(Some(rec))
}

/// A foreign key to `runs` refused the row: the run has none.
fn no_run(db: &Db, e: tokio_postgres::Error, run_id: &str) -> StoreError {
    match e.code() {
        Some(&SqlState::FOREIGN_KEY_VIOLATION) => StoreError::RunNotFound(run_id.to_string()),
        _ => db.err(e),
    }
}

/// A JSON value as stored: its compact text.
pub(crate) fn json_text(v: &serde_json::Value) -> String {
    serde_json::to_string(v).expect("JSON values always serialize")
}

/// A JSON column read back; `BadRow` naming the run if it is not JSON.
pub(crate) fn json_column(
    run_id: &str,
    column: &str,
    text: &str,
) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::BadRow {
        run: run_id.to_string(),
        detail: format!("column `{column}` is not JSON: {e}"),
    })
}

/// A BIGINT column that holds a `u32`; `BadRow` naming the run otherwise.
fn u32_column(db: &Db, r: &Row, idx: usize, run_id: &str) -> Result<u32, StoreError> {
    let v: i64 = r.try_get(idx).map_err(|e| db.err(e))?;
    u32::try_from(v).map_err(|_| StoreError::BadRow {
        run: run_id.to_string(),
        detail: format!("column `{}` holds {v}, not a u32", r.columns()[idx].name()),
    })
}

fn tool_call_row(db: &Db, r: &Row) -> Result<ToolCallRecord, StoreError> {
    let get = |e| db.err(e);
    let run_id: String = r.try_get(0).map_err(get)?;
    let json = |idx: usize, col: &str| -> Result<Option<serde_json::Value>, StoreError> {
        let text: Option<String> = r.try_get(idx).map_err(get)?;
        text.map(|t| json_column(&run_id, col, &t)).transpose()
    };
    Ok(ToolCallRecord {
        node_id: r.try_get(1).map_err(get)?,
        iteration: u32_column(db, r, 2, &run_id)?,
        attempt: u32_column(db, r, 3, &run_id)?,
        tool_seq: u32_column(db, r, 4, &run_id)?,
        tool: r.try_get(5).map_err(get)?,
        idempotency_key: r.try_get(6).map_err(get)?,
        side_effect: r.try_get(7).map_err(get)?,
        idempotent: r.try_get(8).map_err(get)?,
        input: json_column(&run_id, "input", &r.try_get::<_, String>(9).map_err(get)?)?,
        output: json(10, "output")?,
        started_ms: r.try_get(11).map_err(get)?,
        finished_ms: r.try_get(12).map_err(get)?,
        status: ToolCallStatus::from_row(&run_id, &r.try_get::<_, String>(13).map_err(get)?)?,
        error: json(14, "error")?,
        run_id: run_id_from_row(&run_id, "run_id", &run_id)?,
    })
}

fn inbox_row(db: &Db, r: &Row) -> Result<InboxEntry, StoreError> {
    let get = |e| db.err(e);
    let run_id: String = r.try_get(1).map_err(get)?;
    let text: String = r.try_get(2).map_err(get)?;
    let command = serde_json::from_str(&text).map_err(|e| StoreError::BadRow {
        run: run_id.clone(),
        detail: format!("inbox command is not a command: {e}"),
    })?;
    Ok(InboxEntry {
        id: r.try_get::<_, i64>(0).map_err(get)? as u64,
        command,
        created_ms: r.try_get(3).map_err(get)?,
        run_id: run_id_from_row(&run_id, "run_id", &run_id)?,
    })
}

fn process_row(db: &Db, r: &Row) -> Result<ProcessRecord, StoreError> {
    let get = |e| db.err(e);
    let run_id: String = r.try_get(1).map_err(get)?;
    Ok(ProcessRecord {
        id: r.try_get::<_, i64>(0).map_err(get)? as u64,
        node_id: r.try_get(2).map_err(get)?,
        iteration: u32_column(db, r, 3, &run_id)?,
        attempt: u32_column(db, r, 4, &run_id)?,
        pgid: u32_column(db, r, 5, &run_id)?,
        started_ms: r.try_get(6).map_err(get)?,
        run_id: run_id_from_row(&run_id, "run_id", &run_id)?,
    })
}

/// Unix ms by this machine's clock, as the SQLite backend stamps commands.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
