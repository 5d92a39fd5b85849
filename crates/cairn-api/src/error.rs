//! The one error shape of the API: `{"error": {"code", "message", ...}}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every failure's body, whatever the route (and a WebSocket reply's
/// `error`, an SSE `error` event's data).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorInfo,
}

/// What went wrong: a stable machine code, a message for people, and for
/// some codes details in a shape of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// Stable and machine-readable (`not_found`, `invalid_workflow`, ...).
    pub code: String,
    /// For people.
    pub message: String,
    /// `invalid_workflow`: [`ProblemLocation`]s; `invalid_input`:
    /// [`InputViolation`]s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// Where a workflow problem is, without what it says (which can quote the
/// file): an `invalid_workflow` error's details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemLocation {
    /// The file, as the request named it.
    pub file: String,
    /// Its line, from 1; `null` when unknown.
    pub line: Option<usize>,
    /// Its column, from 1; `null` when unknown.
    pub column: Option<usize>,
    /// The field's path, cut to the workflow format's own names; `null`
    /// when not even the first key is one.
    pub field: Option<String>,
}

/// Where a run's input breaks its workflow's input schema: an
/// `invalid_input` error's details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputViolation {
    /// A JSON Pointer into the input.
    pub pointer: String,
    /// What is wrong there.
    pub message: String,
}
