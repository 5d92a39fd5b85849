//! Schedules as the store keeps them: each one's definition and where its
//! firing stands, and the history of what each due time did.
//!
//! Deciding a due time moves the schedule's cursor with a compare-and-set
//! ([`Schedules::advance_schedule`]), so that of every instance of a
//! shared store that finds a due time, one decides it; a run it starts has
//! an id made from the schedule and the due time, so that a decision taken
//! again after a crash starts no second run.

use cairn_events::RunId;

use crate::StoreError;

/// Most history rows kept per schedule; older ones are dropped as new
/// ones are written.
pub const FIRES_KEPT: usize = 1000;

/// A schedule's row.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    /// Its name.
    pub name: String,
    /// Its definition, in the triggers file's form.
    pub definition: serde_json::Value,
    /// Declared in the server's triggers file (the file, not the API, owns it).
    pub from_file: bool,
    /// Paused: no due time is decided.
    pub paused: bool,
    /// Where its firing stands.
    pub cursor: Cursor,
    /// The run its last fire started.
    pub last_run_id: Option<RunId>,
    /// When the row last changed (Unix ms).
    pub updated_ms: i64,
}

/// Where a schedule's firing stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// The first due time not decided yet; `None` when never due again.
    pub next_due_ms: Option<i64>,
    /// A due time waiting for the schedule's going run to end
    /// (`overlap: queue_one`).
    pub pending_due_ms: Option<i64>,
}

/// What one due time did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireOutcome {
    /// Decided, its run not yet started (a crash here is taken up again).
    Firing,
    /// Its run started.
    Started,
    /// Waiting for the schedule's going run to end.
    Queued,
    /// Not run: a run of the schedule was going.
    Skipped,
    /// Not run: found late, after downtime, and the catch-up policy left it.
    Missed,
    /// Its run could not start (the reason is in `detail`).
    Failed,
}

impl FireOutcome {
    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            FireOutcome::Firing => "firing",
            FireOutcome::Started => "started",
            FireOutcome::Queued => "queued",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Missed => "missed",
            FireOutcome::Failed => "failed",
        }
    }

    /// From its stored text.
    pub fn parse(s: &str) -> Option<FireOutcome> {
        Some(match s {
            "firing" => FireOutcome::Firing,
            "started" => FireOutcome::Started,
            "queued" => FireOutcome::Queued,
            "skipped" => FireOutcome::Skipped,
            "missed" => FireOutcome::Missed,
            "failed" => FireOutcome::Failed,
            _ => return None,
        })
    }
}

/// One row of a schedule's history.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRecord {
    /// The schedule.
    pub schedule: String,
    /// The due time (Unix ms); a fire by hand has the time it was asked.
    pub due_ms: i64,
    /// When it was decided or last changed (Unix ms).
    pub decided_ms: i64,
    /// What it did.
    pub outcome: FireOutcome,
    /// Its run, when it has one.
    pub run_id: Option<RunId>,
    /// Why, for a failure; how many, for missed due times.
    pub detail: Option<String>,
}

/// The schedules of a store.
pub trait Schedules: Send + Sync {
    /// Writes a schedule's row: a new one, or (with `replace`) over the one
    /// of that name. Returns false, writing nothing, when the name is taken
    /// and `replace` is false.
    fn put_schedule(&self, rec: &ScheduleRecord, replace: bool) -> Result<bool, StoreError>;
    /// A schedule's row.
    fn get_schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError>;
    /// Every schedule's row, by name.
    fn list_schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError>;
    /// Deletes a schedule and its history; false when there was none.
    fn delete_schedule(&self, name: &str) -> Result<bool, StoreError>;
    /// Pauses or resumes a schedule; a resume sets its cursor (due times
    /// passed while paused are not caught up). False when there is none.
    fn set_paused(&self, name: &str, paused: bool, cursor: Cursor) -> Result<bool, StoreError>;
    /// Moves a schedule's cursor from `expected` to `new` and writes `fires`
    /// (a row already there for a due time is left as it is) in one
    /// transaction; the schedule's last run becomes that of the last of
    /// `fires` that has one. False, writing nothing, when the cursor was not
    /// `expected` or the schedule is paused or gone: someone else decided.
    fn advance_schedule(
        &self,
        name: &str,
        expected: Cursor,
        new: Cursor,
        fires: &[FireRecord],
    ) -> Result<bool, StoreError>;
    /// Records what a due time's fire came to.
    fn update_fire(&self, fire: &FireRecord) -> Result<(), StoreError>;
    /// A schedule's history, newest first, at most `limit` rows.
    fn fires(&self, name: &str, limit: usize) -> Result<Vec<FireRecord>, StoreError>;
    /// Fires decided whose run was not started yet, of every schedule.
    fn firing(&self) -> Result<Vec<FireRecord>, StoreError>;
}
