//! Schedules in the database (schema 8, [`cairn_storage::Schedules`]):
//! every instance of a fleet reads the same rows, and deciding a due time
//! is an `UPDATE` whose `WHERE` names the cursor it read, so that one
//! instance decides it and the others find the row moved on.

use cairn_events::RunId;
use cairn_storage::{
    run_id_from_row, Cursor, FireOutcome, FireRecord, ScheduleRecord, StoreError, FIRES_KEPT,
};
use tokio_postgres::Row;

use crate::db::Db;

const COLUMNS: &str =
    "name, definition, from_file, paused, next_due_ms, pending_due_ms, last_run_id, updated_ms";
const FIRE_COLUMNS: &str = "schedule, due_ms, decided_ms, outcome, run_id, detail";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn bad(detail: String) -> StoreError {
    StoreError::BadRow {
        run: String::new(),
        detail,
    }
}

fn run_of(text: Option<String>, col: &str) -> Result<Option<RunId>, StoreError> {
    text.map(|t| run_id_from_row(&t, col, &t)).transpose()
}

fn schedule_row(r: &Row) -> Result<ScheduleRecord, StoreError> {
    let name: String = r.get(0);
    let definition: String = r.get(1);
    Ok(ScheduleRecord {
        definition: serde_json::from_str(&definition)
            .map_err(|e| bad(format!("schedule `{name}`'s definition is not JSON: {e}")))?,
        from_file: r.get(2),
        paused: r.get(3),
        cursor: Cursor {
            next_due_ms: r.get(4),
            pending_due_ms: r.get(5),
        },
        last_run_id: run_of(r.get(6), "last_run_id")?,
        updated_ms: r.get(7),
        name,
    })
}

fn fire_row(r: &Row) -> Result<FireRecord, StoreError> {
    let outcome: String = r.get(3);
    Ok(FireRecord {
        schedule: r.get(0),
        due_ms: r.get(1),
        decided_ms: r.get(2),
        outcome: FireOutcome::parse(&outcome)
            .ok_or_else(|| bad(format!("`{outcome}` is not a fire's outcome")))?,
        run_id: run_of(r.get(4), "run_id")?,
        detail: r.get(5),
    })
}

pub(crate) async fn put(db: &Db, rec: ScheduleRecord, replace: bool) -> Result<bool, StoreError> {
    let conflict = if replace {
        "ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition, \
         from_file = EXCLUDED.from_file, paused = EXCLUDED.paused, \
         next_due_ms = EXCLUDED.next_due_ms, pending_due_ms = EXCLUDED.pending_due_ms, \
         last_run_id = EXCLUDED.last_run_id, updated_ms = EXCLUDED.updated_ms"
    } else {
        "ON CONFLICT (name) DO NOTHING"
    };
    let client = db.client().await?;
    let n = client
        .execute(
            &format!("INSERT INTO schedules ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) {conflict}"),
            &[
                &rec.name,
                &rec.definition.to_string(),
                &rec.from_file,
                &rec.paused,
                &rec.cursor.next_due_ms,
                &rec.cursor.pending_due_ms,
                &rec.last_run_id.as_ref().map(|r| r.as_str()),
                &rec.updated_ms,
            ],
        )
        .await
        .map_err(|e| db.err(e))?;
    Ok(n > 0)
}

pub(crate) async fn get(db: &Db, name: String) -> Result<Option<ScheduleRecord>, StoreError> {
    let client = db.client().await?;
    let row = client
        .query_opt(
            &format!("SELECT {COLUMNS} FROM schedules WHERE name = $1"),
            &[&name],
        )
        .await
        .map_err(|e| db.err(e))?;
    row.as_ref().map(schedule_row).transpose()
}

pub(crate) async fn list(db: &Db) -> Result<Vec<ScheduleRecord>, StoreError> {
    let client = db.client().await?;
    let rows = client
        .query(
            &format!("SELECT {COLUMNS} FROM schedules ORDER BY name"),
            &[],
        )
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(schedule_row).collect()
}

pub(crate) async fn delete(db: &Db, name: String) -> Result<bool, StoreError> {
    let mut client = db.client().await?;
    let tx = client.transaction().await.map_err(|e| db.err(e))?;
    tx.execute("DELETE FROM schedule_fires WHERE schedule = $1", &[&name])
        .await
        .map_err(|e| db.err(e))?;
    let n = tx
        .execute("DELETE FROM schedules WHERE name = $1", &[&name])
        .await
        .map_err(|e| db.err(e))?;
    tx.commit().await.map_err(|e| db.err(e))?;
    Ok(n > 0)
}

pub(crate) async fn set_paused(
    db: &Db,
    name: String,
    paused: bool,
    cursor: Cursor,
) -> Result<bool, StoreError> {
    let client = db.client().await?;
    let n = client
        .execute(
            "UPDATE schedules SET paused = $2, next_due_ms = $3, pending_due_ms = $4, \
             updated_ms = $5 WHERE name = $1",
            &[
                &name,
                &paused,
                &cursor.next_due_ms,
                &cursor.pending_due_ms,
                &now_ms(),
            ],
        )
        .await
        .map_err(|e| db.err(e))?;
    Ok(n > 0)
}

pub(crate) async fn advance(
    db: &Db,
    name: String,
    expected: Cursor,
    new: Cursor,
    fires: Vec<FireRecord>,
) -> Result<bool, StoreError> {
    let mut client = db.client().await?;
    let tx = client.transaction().await.map_err(|e| db.err(e))?;
    let last_run = fires
        .iter()
        .rev()
        .find_map(|f| f.run_id.as_ref())
        .map(|r| r.as_str());
    let n = tx
        .execute(
            "UPDATE schedules SET next_due_ms = $4, pending_due_ms = $5, \
             last_run_id = coalesce($6, last_run_id), updated_ms = $7 \
             WHERE name = $1 AND NOT paused \
             AND next_due_ms IS NOT DISTINCT FROM $2 AND pending_due_ms IS NOT DISTINCT FROM $3",
            &[
                &name,
                &expected.next_due_ms,
                &expected.pending_due_ms,
                &new.next_due_ms,
                &new.pending_due_ms,
                &last_run,
                &now_ms(),
            ],
        )
        .await
        .map_err(|e| db.err(e))?;
    if n == 0 {
        return Ok(false);
    }
    for f in &fires {
        tx.execute(
            &format!(
                "INSERT INTO schedule_fires ({FIRE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (schedule, due_ms) DO NOTHING"
            ),
            &[
                &f.schedule,
                &f.due_ms,
                &f.decided_ms,
                &f.outcome.as_str(),
                &f.run_id.as_ref().map(|r| r.as_str()),
                &f.detail,
            ],
        )
        .await
        .map_err(|e| db.err(e))?;
    }
    if !fires.is_empty() {
        tx.execute(
            "DELETE FROM schedule_fires WHERE schedule = $1 AND due_ms < \
             (SELECT due_ms FROM schedule_fires WHERE schedule = $1 \
              ORDER BY due_ms DESC LIMIT 1 OFFSET $2)",
            &[&name, &((FIRES_KEPT - 1) as i64)],
        )
        .await
        .map_err(|e| db.err(e))?;
    }
    tx.commit().await.map_err(|e| db.err(e))?;
    Ok(true)
}

pub(crate) async fn update_fire(db: &Db, f: FireRecord) -> Result<(), StoreError> {
    let client = db.client().await?;
    client
        .execute(
            "UPDATE schedule_fires SET outcome = $3, run_id = coalesce($4, run_id), \
             detail = $5, decided_ms = $6 WHERE schedule = $1 AND due_ms = $2",
            &[
                &f.schedule,
                &f.due_ms,
                &f.outcome.as_str(),
                &f.run_id.as_ref().map(|r| r.as_str()),
                &f.detail,
                &f.decided_ms,
            ],
        )
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}

pub(crate) async fn fires(
    db: &Db,
    name: String,
    limit: usize,
) -> Result<Vec<FireRecord>, StoreError> {
    let client = db.client().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule = $1 \
                 ORDER BY due_ms DESC LIMIT $2"
            ),
            &[&name, &(limit.min(i64::MAX as usize) as i64)],
        )
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(fire_row).collect()
}

pub(crate) async fn firing(db: &Db) -> Result<Vec<FireRecord>, StoreError> {
    let client = db.client().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE outcome = 'firing' \
                 ORDER BY schedule, due_ms"
            ),
            &[],
        )
        .await
        .map_err(|e| db.err(e))?;
    rows.iter().map(fire_row).collect()
}
