//! The storage contract: what the journal needs from a database, whatever
//! the database is.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use cairn_events::{DecodeError, Event, NodePath, RunCommand};

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file exists but is not a Cairn database, or is damaged.
    #[error("the store {path} is not a Cairn database or is damaged ({detail}); move it aside or point --store elsewhere")]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What SQLite (or the schema check) said.
        detail: String,
    },
    /// Another process kept the database locked beyond the busy timeout.
    #[error("the store {path} is locked by another process; try again when it is done")]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// The database was written by a newer Cairn.
    #[error("the store {path} has schema version {found}, newer than this Cairn understands ({supported}); upgrade Cairn")]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// The version found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// No run with this id.
    #[error("no run `{0}` in the store")]
    NotFound(String),
    /// No inbox command or process record with this id.
    #[error("no {what} {id} in the store")]
    RecordNotFound {
        /// `command` or `process`.
        what: &'static str,
        /// The id asked for.
        id: u64,
    },
    /// A run id that cannot name a run (it is also a file name).
    #[error("invalid run id `{0}`: use 1-128 letters, digits, `-`, `_`, `.` or `:`, not starting with `.`")]
    InvalidRunId(String),
    /// The database file could not be opened.
    #[error("cannot open the store {path}: {detail}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What the database said.
        detail: String,
    },
    /// The disk (or the quota) holding the store is full; nothing of the
    /// failed write was committed.
    #[error("the disk holding the store {path} is full; free some space and try again")]
    DiskFull {
        /// The database file.
        path: PathBuf,
    },
    /// The store can be read but not written (permissions, a read-only
    /// mount).
    #[error("the store {path} cannot be written ({detail}); check its permissions")]
    ReadOnly {
        /// The database file.
        path: PathBuf,
        /// What the database said.
        detail: String,
    },
    /// A run with this id already exists.
    #[error("a run `{0}` already exists in the store")]
    RunExists(String),
    /// The run is being written by another process (or another log in this one).
    #[error("run `{run}` is in use by another Cairn process")]
    Busy {
        /// The run id.
        run: String,
    },
    /// A stored row could not be read back.
    #[error("run `{run}`: stored data is invalid: {detail}")]
    BadRow {
        /// The run id.
        run: String,
        /// What was wrong.
        detail: String,
    },
    /// Any other failure the database reported, in its own words.
    #[error("store error: {0}")]
    Database(String),
    /// A file system error, with the path it concerns.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The journal was closed (or its writer stopped) before the request ran.
    #[error("the store is closed")]
    Closed,
    /// A commit failed; the message is the original error's, shared by every
    /// waiter of the failed batch.
    #[error("commit failed: {0}")]
    Commit(Arc<str>),
}

impl StoreError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

/// The first 8 bytes of a digest in hex: enough to tell stores apart.
pub fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Checks that a run id is usable as a key and as a file name (the NDJSON
/// mirror's directory and the run's lock file are named after it).
pub fn validate_run_id(run_id: &str) -> Result<(), StoreError> {
    cairn_events::RunId::parse(run_id)
        .map(|_| ())
        .map_err(|e| StoreError::InvalidRunId(e.0))
}

/// One event as stored: its JSON text (exactly what the NDJSON mirror and
/// every channel repeat) and the columns that index it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// The run it belongs to.
    pub run_id: String,
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
    pub types: Vec<String>,
    /// Only events of this node.
    pub node: Option<String>,
    /// At most this many events (the lowest seqs).
    pub limit: Option<usize>,
}

/// A run's row: what was started, with what, and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The run id.
    pub run_id: String,
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
    /// `RunStatus::as_str` of the latest status, or `"pending"` before the
    /// first event.
    pub status: String,
    /// When the run was created (Unix ms).
    pub created_ms: i64,
    /// When the run's status or log last changed (Unix ms).
    pub updated_ms: i64,
    /// The run that delegated this one, if any.
    pub parent_run_id: Option<String>,
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
    pub run_id: String,
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
    pub status: Option<String>,
    /// Only runs of this workflow (by name).
    pub workflow: Option<String>,
    /// At most this many runs.
    pub limit: Option<usize>,
    /// Skip this many runs first.
    pub offset: Option<usize>,
    /// Only the child runs of this run.
    pub parent: Option<String>,
}

/// A command waiting in a run's inbox, as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    /// Assigned by the store, increasing: the order commands are applied in.
    pub id: u64,
    /// The run it is for.
    pub run_id: String,
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
    pub run_id: String,
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
}

impl Topic<'_> {
    /// A stable text key for the topic.
    pub fn key(&self) -> String {
        match self {
            Topic::Inbox(run) => format!("inbox:{run}"),
            Topic::Events(run) => format!("events:{run}"),
        }
    }
}

/// One registration for wake-ups of a [`Topic`]; dropping it unregisters.
pub trait Listener: Send + Sync {
    /// Resolves at the next wake-up since the previous call (at once if one
    /// already came). A wake-up says "look again", nothing more: callers
    /// read the store for what changed, and poll slowly as a fallback.
    fn wait(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// One tool call of an agent attempt, kept so that a resume can tell which
/// side effects already happened.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRecord {
    /// The run.
    pub run_id: String,
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
    /// `running`, `success` or `error`.
    pub status: String,
    /// The error object when it failed.
    pub error: Option<serde_json::Value>,
}

/// Exclusive ownership of a run across processes. Released when dropped, and
/// by the operating system when the owning process dies.
pub trait RunLease: Send + Sync {}

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
}

/// A database that keeps Cairn's runs. Every method is synchronous and may
/// block on I/O; the journal calls them from its writer thread or from
/// blocking contexts, several threads at a time.
///
/// `cairn_store::conformance` (feature `conformance`) checks an implementation
/// against what these docs promise.
pub trait Backend: Send + Sync + 'static {
    /// Commits a batch of events, of one run or several, in one transaction:
    /// all of it or none. A `(run, seq)` already stored fails the batch with
    /// [`StoreError::BadRow`] naming the run. Sequencing is the journal's
    /// work; the backend keeps what it is given, byte for byte.
    ///
    /// It keeps each run row's `status`/`updated_ms` in step with the batch:
    /// `updated_ms` becomes the larger of itself and the run's latest event
    /// timestamp, and the run's last lifecycle event in the batch sets its
    /// status (`RunStarted` → running, `RunStatusChanged` → its status,
    /// `RunFinished`/`RunFailed`/`RunCancelled` → finished/failed/cancelled).
    /// Events of a run that has no row are stored all the same; no row is
    /// made for them.
    fn append(&self, batch: &[StoredEvent]) -> Result<(), StoreError>;
    /// A run's events in seq order, as the query selects them (every field
    /// applies; `limit` keeps the lowest seqs). An unknown run has none.
    fn read_events(&self, run_id: &str, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError>;
    /// The highest committed seq of a run (0 when it has none).
    fn last_seq(&self, run_id: &str) -> Result<u64, StoreError>;
    /// Moves whatever the database keeps beside its main file (SQLite's
    /// write-ahead log) into it, so that the store's data is where a copy of
    /// the store would look for it. Best effort and brief: it gives up rather
    /// than wait for another process's readers or writers. The journal calls
    /// it when it closes and when this process stops writing runs. The
    /// default does nothing, for databases that need no such step.
    fn checkpoint(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Inserts a run row; `RunExists` if the id is taken, `InvalidRunId` if
    /// [`validate_run_id`] refuses it.
    fn create_run(&self, rec: &RunRecord) -> Result<(), StoreError>;
    /// Removes the row of a run whose start was cut short before its first
    /// event was written (a `create_run` followed by a failure), so no run
    /// stays `pending` with an empty log. A run with events is left alone.
    /// True when a row was removed.
    fn discard_unstarted_run(&self, run_id: &str) -> Result<bool, StoreError>;
    /// A run's row, if it exists.
    fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;
    /// Runs matching the filter, newest first (by `created_ms`; of runs
    /// created in the same millisecond, the one created last comes first),
    /// `offset` skipped, at most `limit` kept.
    fn list_runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError>;
    /// Deletes finished, failed and cancelled runs last updated before
    /// `cutoff_ms` (their events, tool calls, inbox, process records,
    /// workflow generations and row) and returns their ids. A run whose lease is held (being resumed)
    /// is left alone.
    fn delete_finished_before(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError>;
    /// Takes the run's lease; `None` when another process (or another lease
    /// in this process) holds it, `InvalidRunId` for an id
    /// [`validate_run_id`] refuses. Dropping the lease, on any thread,
    /// releases it.
    fn try_lock_run(&self, run_id: &str) -> Result<Option<Box<dyn RunLease>>, StoreError>;
    /// Who holds the run's lease now, when the backend can tell: `None`
    /// when the lease is free, held by this backend, or would be taken at
    /// once by [`Backend::try_lock_run`] (its holder is known to be dead).
    /// For people deciding whether to wait; [`Backend::try_lock_run`] alone
    /// decides. The default tells nothing, which suits a lease the operating
    /// system drops when its holder dies (SQLite's lock): a held one
    /// belongs to a live process.
    fn lease_holder(&self, run_id: &str) -> Result<Option<LeaseHolder>, StoreError> {
        let _ = run_id;
        Ok(None)
    }
    /// Inserts or replaces a tool call, keyed by (run, node, iteration,
    /// attempt, tool_seq); `NotFound` when the run has no row.
    fn put_tool_call(&self, rec: &ToolCallRecord) -> Result<(), StoreError>;
    /// The tool calls of one node pass, by attempt then tool_seq.
    fn tool_calls(
        &self,
        run_id: &str,
        node_id: &str,
        iteration: u32,
    ) -> Result<Vec<ToolCallRecord>, StoreError>;
    /// Records a command in the run's inbox durably and returns its id;
    /// `NotFound` for an unknown run.
    fn put_command(&self, run_id: &str, command: &RunCommand) -> Result<u64, StoreError>;
    /// The run's commands not yet taken, oldest first.
    fn pending_commands(&self, run_id: &str) -> Result<Vec<InboxEntry>, StoreError>;
    /// Marks a command taken, with what became of it (`applied`, or why it
    /// was refused). Taking one twice keeps the first outcome.
    fn take_command(&self, id: u64, outcome: &str) -> Result<(), StoreError>;
    /// Stores a generation of a run's workflow, replacing one with the same
    /// (run, generation): a generation written by a reload that a crash cut
    /// short before its `WorkflowReloaded` was committed is no generation
    /// of the run, and the next reload reuses its number. `NotFound` when
    /// the run has no row. Durable when it returns, since the reload's
    /// event follows it.
    fn put_generation(&self, rec: &GenerationRecord) -> Result<(), StoreError>;
    /// One generation of a run's workflow, if stored.
    fn generation(
        &self,
        run_id: &str,
        generation: u64,
    ) -> Result<Option<GenerationRecord>, StoreError>;
    /// Records a process group a node attempt started; returns its id.
    fn put_process(&self, rec: &ProcessRecord) -> Result<u64, StoreError>;
    /// Forgets a process group that ended.
    fn remove_process(&self, id: u64) -> Result<(), StoreError>;
    /// The process groups recorded for a run and not forgotten.
    fn processes(&self, run_id: &str) -> Result<Vec<ProcessRecord>, StoreError>;
    /// Wakes the listeners of a topic, in this process and others. Best
    /// effort: listeners also poll, slowly.
    fn notify(&self, topic: Topic<'_>);
    /// Registers for wake-ups of a topic.
    fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError>;
    /// A name for this store, the same in every process that opens it and
    /// different for another store: the engine marks the processes it
    /// starts with it, so that a resume kills only its own store's
    /// leftovers. The default hashes the first of [`Backend::files`] (its
    /// canonical path); a backend without files must say who it is.
    fn store_id(&self) -> String {
        use sha2::{Digest, Sha256};
        let first = self.files().into_iter().next().unwrap_or_default();
        let path = first.canonicalize().unwrap_or(first);
        hex_prefix(&Sha256::digest(path.as_os_str().as_encoded_bytes()))
    }
    /// Files and folders this backend keeps on the local disk (database,
    /// journals, locks, wake-up markers), so the engine can hide them from
    /// the processes it starts. A remote backend has none.
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
}
