//! The bodies of the schedules' routes (`/v1/schedules`) and of a
//! webhook's delivery (`POST /v1/hooks/{name}`).
//!
//! A schedule's definition keeps the triggers file's form (its keys in
//! snake_case, durations as text), so that one can be moved between the
//! file and the API as it is.

use cairn_events::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/schedules`: a schedule as a triggers file declares one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    /// Its name: 1 to 64 lower-case letters, digits, `-` and `_`.
    pub name: String,
    /// A workflow of the server's folder, by name.
    pub workflow: String,
    /// A cron expression: 5 fields (minute first), 6 (seconds first) or 7
    /// (and a year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The cron expression's time zone (IANA); `UTC` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// A fixed interval instead of `cron` (`30s`, `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// The run's input; its strings are templates over `schedule`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// `skip` (the default), `queue_one` or `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// `once` (the default), `skip` or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup: Option<String>,
    /// Most missed due times `catchup: all` fires (10 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup_limit: Option<u32>,
    /// How late a due time may be found and still be on time (`60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<String>,
}

/// One schedule and where its firing stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleView {
    /// Its name.
    pub name: String,
    /// Its definition, every default filled in.
    pub definition: Value,
    /// Declared in the server's triggers file: the file owns it, and the
    /// API may pause it but not delete it.
    pub from_file: bool,
    /// Paused: nothing fires.
    pub paused: bool,
    /// The next due time not decided yet (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due_ms: Option<i64>,
    /// A due time waiting for the going run to end (`queue_one`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_due_ms: Option<i64>,
    /// The run its last fire started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run_id: Option<RunId>,
}

/// `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleList {
    /// Every schedule, by name.
    pub schedules: Vec<ScheduleView>,
}

/// What one due time did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FireView {
    /// The due time (Unix ms); for a fire by hand, when it was asked.
    pub due_ms: i64,
    /// When it was decided or last changed (Unix ms).
    pub decided_ms: i64,
    /// `firing`, `started`, `queued`, `skipped`, `missed` or `failed`.
    pub outcome: String,
    /// Its run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// Why it failed, or how many due times were missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `GET /v1/schedules/{name}/fires`: newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FireList {
    /// The history, newest first.
    pub fires: Vec<FireView>,
}

/// `POST /v1/hooks/{name}`: the run a delivery started, or (`duplicate`)
/// the one an earlier delivery of the same event started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookAccepted {
    /// The run.
    pub run_id: RunId,
    /// The delivery was seen before: no run was started.
    pub duplicate: bool,
}
