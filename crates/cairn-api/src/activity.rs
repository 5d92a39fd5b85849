//! A run's Activity view: `GET /v1/runs/{id}/activity`, `cairn activity`.

use cairn_events::RunId;
use serde::{Deserialize, Serialize};

/// `GET /v1/runs/{id}/activity`: the run's entries, each child run's right
/// after the delegation that started it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityPage {
    /// The run asked about.
    pub run_id: RunId,
    /// Its entries, in order.
    pub activity: Vec<ActivityEntry>,
}

/// One entry of a run's Activity view: [`cairn_events::Activity`] as the
/// API carries it (owned, so that a client can read it back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityEntry {
    /// `<runId>-<seq>` of the event that opened the entry: stable, so
    /// clients can key on it.
    pub id: String,
    /// The run the entry belongs to.
    pub run_id: RunId,
    /// The node the entry belongs to; absent for run-level entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The node's loop pass, for node entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u32>,
    /// The entry before this one in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_activity_id: Option<String>,
    /// The parent run and node, on every entry of a child run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegated_by: Option<DelegatedBy>,
    /// What happened (`command`, `file-read`, `approval`, `delegation`, ...).
    pub kind: String,
    /// One line for people.
    pub title: String,
    /// `running`, `waiting`, `success`, `error`, `cancelled`, `approved`,
    /// `denied` or `answered`.
    pub status: String,
    /// When the opening event was appended, Unix ms.
    pub started_ms: i64,
    /// When the closing event was appended; absent while the entry is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// The seq of the opening event.
    pub seq: u64,
    /// The seq of the last event that changed the entry.
    pub updated_seq: u64,
    /// The error message, for entries that ended in error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The child run a `delegation` entry started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<RunId>,
    /// What the action was about: the file, the command, the pattern, the
    /// child run's workflow, the question, a tool's arguments (cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For an agent's action, the first line of what the model thought (or
    /// said) in the step that asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// The parent run and node of a child run's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelegatedBy {
    /// The parent run.
    pub run_id: RunId,
    /// The parent's node that delegated.
    pub node_id: String,
}

impl From<cairn_events::Activity> for ActivityEntry {
    fn from(a: cairn_events::Activity) -> Self {
        // Every field named, so that a field added to the view is a compile
        // error here rather than one the API silently leaves out.
        let cairn_events::Activity {
            id,
            run_id,
            node_id,
            iteration,
            previous_activity_id,
            delegated_by,
            kind,
            title,
            status,
            started_ms,
            ended_ms,
            seq,
            updated_seq,
            error,
            child_run_id,
            detail,
            reasoning,
        } = a;
        ActivityEntry {
            id,
            run_id,
            node_id: node_id.map(|n| n.to_string()),
            iteration,
            previous_activity_id,
            delegated_by: delegated_by.map(|d| {
                let cairn_events::DelegatedBy { run_id, node_id } = d;
                DelegatedBy { run_id, node_id }
            }),
            kind: kind.to_string(),
            title,
            status: status.to_string(),
            started_ms,
            ended_ms,
            seq,
            updated_seq,
            error,
            child_run_id,
            detail,
            reasoning,
        }
    }
}
