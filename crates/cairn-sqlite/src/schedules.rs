//! Schedules in the SQLite store (version 8): one row per schedule, and
//! its history. One process drives a SQLite store's schedules, but the
//! cursor is compared and set all the same, so that a second `cairn serve`
//! on the same file decides no due time twice.

use rusqlite::{params, OptionalExtension};

use cairn_storage::{
    Cursor, FireOutcome, FireRecord, ScheduleRecord, Schedules, StoreError, FIRES_KEPT,
};

use crate::{run_id_column, typed_column, SqliteBackend};

/// The tables.
pub(crate) const SCHEDULES: &str = r#"
CREATE TABLE schedules (
    name            TEXT PRIMARY KEY,
    definition      TEXT NOT NULL,
    from_file       INTEGER NOT NULL,
    paused          INTEGER NOT NULL,
    next_due_ms     INTEGER,
    pending_due_ms  INTEGER,
    last_run_id     TEXT,
    updated_ms      INTEGER NOT NULL
);
CREATE TABLE schedule_fires (
    schedule    TEXT NOT NULL,
    due_ms      INTEGER NOT NULL,
    decided_ms  INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    run_id      TEXT,
    detail      TEXT,
    PRIMARY KEY (schedule, due_ms)
);
CREATE INDEX schedule_fires_firing ON schedule_fires(outcome) WHERE outcome = 'firing';
"#;

const COLUMNS: &str =
    "name, definition, from_file, paused, next_due_ms, pending_due_ms, last_run_id, updated_ms";
const FIRE_COLUMNS: &str = "schedule, due_ms, decided_ms, outcome, run_id, detail";

fn schedule_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScheduleRecord> {
    let name: String = r.get(0)?;
    let definition: String = r.get(1)?;
    let last: Option<String> = r.get(6)?;
    Ok(ScheduleRecord {
        definition: typed_column(serde_json::from_str(&definition).map_err(|e| {
            StoreError::BadRow {
                run: String::new(),
                detail: format!("schedule `{name}`'s definition is not JSON: {e}"),
            }
        }))?,
        from_file: r.get::<_, i64>(2)? != 0,
        paused: r.get::<_, i64>(3)? != 0,
        cursor: Cursor {
            next_due_ms: r.get(4)?,
            pending_due_ms: r.get(5)?,
        },
        last_run_id: last
            .map(|t| run_id_column(&t, "last_run_id", &t))
            .transpose()?,
        updated_ms: r.get(7)?,
        name,
    })
}

fn fire_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FireRecord> {
    let outcome: String = r.get(3)?;
    let run: Option<String> = r.get(4)?;
    Ok(FireRecord {
        schedule: r.get(0)?,
        due_ms: r.get(1)?,
        decided_ms: r.get(2)?,
        outcome: typed_column(
            FireOutcome::parse(&outcome).ok_or_else(|| StoreError::BadRow {
                run: String::new(),
                detail: format!("`{outcome}` is not a fire's outcome"),
            }),
        )?,
        run_id: run.map(|t| run_id_column(&t, "run_id", &t)).transpose()?,
        detail: r.get(5)?,
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Schedules for SqliteBackend {
    fn put_schedule(&self, rec: &ScheduleRecord, replace: bool) -> Result<bool, StoreError> {
        let verb = if replace {
            "INSERT OR REPLACE"
        } else {
            "INSERT OR IGNORE"
        };
        self.write(|tx| {
            let n = tx
                .execute(
                    &format!(
                        "{verb} INTO schedules ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
                    ),
                    params![
                        rec.name,
                        rec.definition.to_string(),
                        rec.from_file as i64,
                        rec.paused as i64,
                        rec.cursor.next_due_ms,
                        rec.cursor.pending_due_ms,
                        rec.last_run_id.as_ref().map(|r| r.as_str()),
                        rec.updated_ms,
                    ],
                )
                .map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }

    fn get_schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"))?
                .query_row([name], schedule_row)
                .optional()
        })
    }

    fn list_schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM schedules ORDER BY name"))?
                .query_map([], schedule_row)?
                .collect()
        })
    }

    fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        self.write(|tx| {
            tx.execute("DELETE FROM schedule_fires WHERE schedule = ?1", [name])
                .map_err(|e| self.err(e))?;
            let n = tx
                .execute("DELETE FROM schedules WHERE name = ?1", [name])
                .map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }

    fn set_paused(&self, name: &str, paused: bool, cursor: Cursor) -> Result<bool, StoreError> {
        self.write(|tx| {
            let n = tx
                .execute(
                    "UPDATE schedules SET paused = ?2, next_due_ms = ?3, pending_due_ms = ?4, \
                     updated_ms = ?5 WHERE name = ?1",
                    params![
                        name,
                        paused as i64,
                        cursor.next_due_ms,
                        cursor.pending_due_ms,
                        now_ms()
                    ],
                )
                .map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }

    fn advance_schedule(
        &self,
        name: &str,
        expected: Cursor,
        new: Cursor,
        fires: &[FireRecord],
    ) -> Result<bool, StoreError> {
        self.write(|tx| {
            let last_run = fires.iter().rev().find_map(|f| f.run_id.as_ref());
            let n = tx
                .execute(
                    "UPDATE schedules SET next_due_ms = ?4, pending_due_ms = ?5, \
                     last_run_id = coalesce(?6, last_run_id), updated_ms = ?7 \
                     WHERE name = ?1 AND paused = 0 \
                     AND next_due_ms IS ?2 AND pending_due_ms IS ?3",
                    params![
                        name,
                        expected.next_due_ms,
                        expected.pending_due_ms,
                        new.next_due_ms,
                        new.pending_due_ms,
                        last_run.map(|r| r.as_str()),
                        now_ms(),
                    ],
                )
                .map_err(|e| self.err(e))?;
            if n == 0 {
                return Ok(false);
            }
            for f in fires {
                tx.execute(
                    &format!("INSERT OR IGNORE INTO schedule_fires ({FIRE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
                    params![
                        f.schedule,
                        f.due_ms,
                        f.decided_ms,
                        f.outcome.as_str(),
                        f.run_id.as_ref().map(|r| r.as_str()),
                        f.detail,
                    ],
                )
                .map_err(|e| self.err(e))?;
            }
            if !fires.is_empty() {
                tx.execute(
                    "DELETE FROM schedule_fires WHERE schedule = ?1 AND due_ms < \
                     (SELECT due_ms FROM schedule_fires WHERE schedule = ?1 \
                      ORDER BY due_ms DESC LIMIT 1 OFFSET ?2)",
                    params![name, (FIRES_KEPT - 1) as i64],
                )
                .map_err(|e| self.err(e))?;
            }
            Ok(true)
        })
    }

    fn update_fire(&self, f: &FireRecord) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute(
                "UPDATE schedule_fires SET outcome = ?3, run_id = coalesce(?4, run_id), \
                 detail = ?5, decided_ms = ?6 WHERE schedule = ?1 AND due_ms = ?2",
                params![
                    f.schedule,
                    f.due_ms,
                    f.outcome.as_str(),
                    f.run_id.as_ref().map(|r| r.as_str()),
                    f.detail,
                    f.decided_ms,
                ],
            )
            .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    fn fires(&self, name: &str, limit: usize) -> Result<Vec<FireRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule = ?1 \
                 ORDER BY due_ms DESC LIMIT ?2"
            ))?
            .query_map(params![name, limit.min(i64::MAX as usize) as i64], fire_row)?
            .collect()
        })
    }

    fn firing(&self) -> Result<Vec<FireRecord>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE outcome = 'firing' \
                 ORDER BY schedule, due_ms"
            ))?
            .query_map([], fire_row)?
            .collect()
        })
    }
}
