//! The rows a store keeps beside each run's log, and the queries over them.

use std::sync::Arc;

use cairn_events::{DecodeError, Event, NodePath, RunCommand, RunId, RunStatus};

use crate::error::StoreError;

/// One event as stored: its JSON text (exactly what the NDJSON mirror and
/// every channel repeat) and the columns that index it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// The run it belongs to.
    pub run_id: RunId,
    /// Its position in the run's log.
    pub seq: u64,
    /// The event's `type`.
    pub type_name: String,
    /// `nodeId` for node-scoped events.
    pub node_id: Option<NodePath>,
    /// `timestampMs`.
    pub timestamp_ms: i64,
    /// The event's JSON, shared so fan-out does not copy it per subscriber.
    pub json: Arc<str>,
}

impl StoredEvent {
    /// Serializes an event once, in the contract's field order.
    pub fn from_event(e: &Event) -> Self {
        StoredEvent {
            run_id: e.run_id.clone(),
            seq: e.seq.get(),
            type_name: e.type_name().to_string(),
            node_id: e.scope.node_id.clone(),
            timestamp_ms: e.timestamp_ms,
            json: Arc::from(e.to_json()),
        }
    }

    /// Parses the stored JSON back into an event.
    pub fn decode(&self) -> Result<Event, DecodeError> {
        Event::from_json(&self.json)
    }

    /// Whether this event ends the run (until a resume).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.type_name.as_str(),
            "RunFinished" | "RunFailed" | "RunCancelled"
        )
    }
}

/// Which events of a run to read. The default reads all of them.
#[derive(Debug, Default, Clone)]
pub struct EventQuery {
    /// Only events with `seq > after`.
    pub after: u64,
    /// Only these types (empty = all).
    pub types: Vec<cairn_events::EventType>,
    /// Only events of this node.
    pub node: Option<String>,
    /// At most this many events (the lowest seqs).
    pub limit: Option<usize>,
}

/// A run's row: what was started, with what, and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The run id.
    pub run_id: RunId,
    /// The workflow's name.
    pub workflow: String,
    /// The workflow file's path as given when the run was started.
    pub workflow_path: String,
    /// SHA-256 of the workflow source.
    pub workflow_hash: String,
    /// The workflow file's text, so that resume runs what was started.
    pub workflow_source: String,
    /// The run's input.
    pub input: serde_json::Value,
    /// Where the run stands: its log's latest status, or not started yet.
    pub status: RecordStatus,
    /// When the run was created (Unix ms).
    pub created_ms: i64,
    /// When the run's status or log last changed (Unix ms).
    pub updated_ms: i64,
    /// The run that delegated this one, if any.
    pub parent_run_id: Option<RunId>,
}

/// A run id read back from a row's `column` (`run_id`, `parent_run_id`):
/// [`StoreError::BadRow`] naming the row's run (`run`, the text its
/// `run_id` holds) when the text is no run id, never a panic. A run id is
/// checked where text becomes one; a row written by hand or damaged is
/// such text.
pub fn run_id_from_row(run: &str, column: &str, text: &str) -> Result<RunId, StoreError> {
    RunId::parse(text).map_err(|e| StoreError::BadRow {
        run: run.chars().take(cairn_events::MAX_RUN_ID_LEN + 8).collect(),
        detail: format!("column `{column}` holds `{}`, not a run id", e.0),
    })
}

/// Where a run's row says the run stands. Stored as text: `pending`,
/// `queued`, `forking` or [`RunStatus::as_str`]; a row whose text is none of them is
/// [`StoreError::BadRow`] when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordStatus {
    /// Created, no event written yet.
    Pending,
    /// Written as work for any instance of a shared store to claim
    /// ([`crate::Claims`]): no event yet; the instance that claims it
    /// writes its `RunStarted`.
    Queued,
    /// A fork's copy of its source's log is under way (`cairn fork`): the
    /// row exists so the id is taken, the log is not yet the run's.
    Forking,
    /// The status the run's latest lifecycle event reported.
    Run(RunStatus),
}

impl RecordStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Pending => "pending",
            RecordStatus::Queued => "queued",
            RecordStatus::Forking => "forking",
            RecordStatus::Run(s) => s.as_str(),
        }
    }

    /// Parses the form [`RecordStatus::as_str`] writes.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(RecordStatus::Pending),
            "queued" => Some(RecordStatus::Queued),
            "forking" => Some(RecordStatus::Forking),
            _ => RunStatus::parse(text).map(RecordStatus::Run),
        }
    }

    /// A row's text, read back: [`StoreError::BadRow`] naming the run when
    /// it is no status.
    pub fn from_row(run_id: &str, text: &str) -> Result<Self, StoreError> {
        RecordStatus::parse(text).ok_or_else(|| StoreError::BadRow {
            run: run_id.to_string(),
            detail: format!("column `status` holds `{text}`, not a run status"),
        })
    }

    /// Finished, failed or cancelled: the run does nothing until resumed.
    pub fn is_terminal(self) -> bool {
        matches!(self, RecordStatus::Run(s) if s.is_terminal())
    }
}

impl From<RunStatus> for RecordStatus {
    fn from(s: RunStatus) -> Self {
        RecordStatus::Run(s)
    }
}

impl PartialEq<RunStatus> for RecordStatus {
    fn eq(&self, other: &RunStatus) -> bool {
        *self == RecordStatus::Run(*other)
    }
}

impl std::fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One generation of a run's workflow: the text a reload of the run adopted
/// (the log's `WorkflowReloaded` with the same `generation`), kept so that a
/// resume runs the definition the run had last, with the texts of the files
/// it refers to as they were pinned. Generation 0, the text the run started
/// with, is the run's record ([`RunRecord::workflow_source`]); a row for
/// generation 0 holds the same text and the files pinned at the run's start.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRecord {
    /// The run.
    pub run_id: RunId,
    /// 1 for the first reload, then 2, 3, ...
    pub generation: u64,
    /// SHA-256 hex of `workflow_source`.
    pub workflow_hash: String,
    /// The workflow file's text of this generation.
    pub workflow_source: String,
    /// The files the workflow refers to (child workflows, model scripts),
    /// as read once when the generation began: what the run uses instead
    /// of the disk, which a node may have changed since.
    pub files: Vec<PinnedFile>,
    /// When it was stored (Unix ms).
    pub created_ms: i64,
}

/// What [`Runs::start_run`](crate::Runs::start_run) writes for a new run, in
/// one transaction: nothing of it when any part fails, so that no run is
/// left with a row and an empty log.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    /// The run's row; `None` when it exists already (a child whose row a
    /// crash left without its first event).
    pub record: Option<&'a RunRecord>,
    /// The run's generation 0 with the files it pinned, when it pinned any.
    pub pinned: Option<&'a GenerationRecord>,
    /// The run's first event (`RunStarted`), stored as
    /// [`EventLog::append`](crate::EventLog::append) stores it: the row's
    /// status and `updated_ms` follow it.
    pub first: &'a StoredEvent,
}

/// A file a run's workflow refers to, read once and kept with the
/// generation that uses it ([`GenerationRecord::files`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PinnedFile {
    /// The absolute path the workflow's reference resolves to.
    pub path: String,
    /// SHA-256 hex of `text`.
    pub hash: String,
    /// The file's text.
    pub text: String,
}

impl PinnedFile {
    /// The files as stored: a JSON array.
    pub fn encode_all(files: &[PinnedFile]) -> String {
        serde_json::to_string(files).unwrap_or_else(|_| "[]".into())
    }

    /// The files of [`PinnedFile::encode_all`]'s text.
    pub fn decode_all(text: &str) -> Result<Vec<PinnedFile>, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// Which runs to list; results come newest first.
#[derive(Debug, Default, Clone)]
pub struct RunFilter {
    /// Only runs with this status.
    pub status: Option<RecordStatus>,
    /// Only runs of this workflow (by name).
    pub workflow: Option<String>,
    /// At most this many runs.
    pub limit: Option<usize>,
    /// Skip this many runs first.
    pub offset: Option<usize>,
    /// Only the child runs of this run.
    pub parent: Option<RunId>,
}

/// A command waiting in a run's inbox, as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    /// Assigned by the store, increasing: the order commands are applied in.
    pub id: u64,
    /// The run it is for.
    pub run_id: RunId,
    /// What is asked.
    pub command: RunCommand,
    /// When it was recorded (Unix ms).
    pub created_ms: i64,
}

/// A process group a node attempt started, recorded before it can do
/// anything, so that a resume after a crash can kill what the dead engine
/// left running.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessRecord {
    /// Assigned by the store on insert (ignored by `put_process`).
    pub id: u64,
    /// The run.
    pub run_id: RunId,
    /// The node that started it.
    pub node_id: String,
    /// The node's loop pass.
    pub iteration: u32,
    /// The attempt.
    pub attempt: u32,
    /// The process group id (the leader's pid).
    pub pgid: u32,
    /// When it was started (Unix ms).
    pub started_ms: i64,
}

/// What a wake-up is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic<'a> {
    /// A run's inbox got a command; its driver listens.
    Inbox(&'a str),
    /// A run's log got events; subscribers in other processes listen.
    Events(&'a str),
    /// Runs may be waiting for someone to drive them (an instance gave its
    /// runs back as it stopped); every instance that takes runs over listens.
    Released,
    /// Runs were queued, or capacity was freed: every instance that claims
    /// runs ([`crate::Claims`]) listens.
    Queued,
}

impl Topic<'_> {
    /// A stable text key for the topic.
    pub fn key(&self) -> String {
        match self {
            Topic::Inbox(run) => format!("inbox:{run}"),
            Topic::Events(run) => format!("events:{run}"),
            Topic::Released => "work".to_string(),
            Topic::Queued => "queued".to_string(),
        }
    }
}

/// One tool call of an agent attempt, kept so that a resume can tell which
/// side effects already happened.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRecord {
    /// The run.
    pub run_id: RunId,
    /// The node.
    pub node_id: String,
    /// The node's loop pass.
    pub iteration: u32,
    /// The attempt.
    pub attempt: u32,
    /// The call's position within the attempt, from 1.
    pub tool_seq: u32,
    /// The tool's name.
    pub tool: String,
    /// The key that identifies this call across retries and resumes.
    pub idempotency_key: String,
    /// Whether the tool changes anything outside Cairn.
    pub side_effect: bool,
    /// Whether repeating the call is harmless.
    pub idempotent: bool,
    /// The call's input.
    pub input: serde_json::Value,
    /// The call's output once it finished successfully.
    pub output: Option<serde_json::Value>,
    /// When it started (Unix ms).
    pub started_ms: i64,
    /// When it ended (Unix ms).
    pub finished_ms: Option<i64>,
    /// Running, or how it ended.
    pub status: ToolCallStatus,
    /// The error object when it failed.
    pub error: Option<serde_json::Value>,
}

/// Where a tool call stands. Stored as text (`running`, `success`,
/// `error`, `cancelled`); a row whose text is none of them is [`StoreError::BadRow`]
/// when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallStatus {
    /// Started, not ended (or cut short by a crash).
    Running,
    /// Ended with an output.
    Success,
    /// Ended with an error.
    Error,
    /// Cut short by a cancel or a stop: it may or may not have had its
    /// effect.
    Cancelled,
}

impl ToolCallStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallStatus::Running => "running",
            ToolCallStatus::Success => "success",
            ToolCallStatus::Error => "error",
            ToolCallStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the form [`ToolCallStatus::as_str`] writes.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => ToolCallStatus::Running,
            "success" => ToolCallStatus::Success,
            "error" => ToolCallStatus::Error,
            "cancelled" => ToolCallStatus::Cancelled,
            _ => return None,
        })
    }

    /// A row's text, read back: [`StoreError::BadRow`] naming the run when
    /// it is no status.
    pub fn from_row(run_id: &str, text: &str) -> Result<Self, StoreError> {
        ToolCallStatus::parse(text).ok_or_else(|| StoreError::BadRow {
            run: run_id.to_string(),
            detail: format!("column `status` of a tool call holds `{text}`"),
        })
    }
}

impl std::fmt::Display for ToolCallStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Who holds a run's lease, as far as the store can tell
/// ([`Backend::lease_holder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// Who, for people: e.g. `pid 4242 on build-3`.
    pub holder: String,
    /// How long the lease lasts unless its holder renews it first; `None`
    /// for a lease that lasts exactly as long as its holder.
    pub expires_in: Option<std::time::Duration>,
    /// The holder is a process seen running on this machine: the run is
    /// being driven, and waiting for the lease to expire is pointless.
    pub alive_here: bool,
    /// The instance that holds it, by its name (`--instance-name`), when
    /// the holder gave one.
    pub instance: Option<String>,
}

/// The name an instance goes by when none is given: the machine's host
/// name and the process id (`build-3-4242`), unique while the process runs.
pub fn default_instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(64)
        .collect();
    if host.is_empty() {
        format!("pid-{}", std::process::id())
    } else {
        format!("{host}-{}", std::process::id())
    }
}

/// Checks an instance name: 1 to 100 ASCII letters, digits, `.`, `-`,
/// `_` and `:`, which every backend can keep and every page show as is.
pub fn check_instance_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "instance name `{name}`: use 1 to 100 letters, digits, `.`, `-`, `_` or `:`"
        ))
    }
}
