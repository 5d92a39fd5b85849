//! The journal: per-run sequencers, the group-committing writer thread, the
//! NDJSON mirror and live fan-out.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_events::{Event, EventKind, Scope};

use crate::backend::{Backend, StoreError, StoredEvent};

/// How a journal mirrors events to files.
#[derive(Debug, Clone, Default)]
pub struct JournalOptions {
    /// Where `<runId>/events.ndjson` mirrors go; `None` disables the mirror.
    pub log_dir: Option<PathBuf>,
}

struct Inner {
    backend: Arc<dyn Backend>,
}

/// The store as the engine, CLI and server use it. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

impl Journal {
    /// Starts a journal (and its writer thread) over a backend.
    pub fn open(backend: Arc<dyn Backend>, opts: JournalOptions) -> Result<Journal, StoreError> {
        let _ = (backend, opts);
        todo!()
    }

    /// Opens the SQLite store at `path` and starts a journal over it.
    pub fn open_sqlite(path: &Path, opts: JournalOptions) -> Result<Journal, StoreError> {
        let _ = (path, opts);
        todo!()
    }

    /// The backend, for run rows, controls and tool calls.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Takes the run's lease (`Busy` if held elsewhere) and returns its
    /// sequencer, continuing from the store's last seq. Only one `RunLog`
    /// per run exists at a time.
    pub fn run_log(&self, run_id: &str) -> Result<RunLog, StoreError> {
        let _ = run_id;
        todo!()
    }

    /// Events of a run after `after`: first from the store, then live, with
    /// no gap or duplicate at the switch-over (guarantee 3).
    pub fn subscribe(&self, run_id: &str, after: u64) -> Result<Subscription, StoreError> {
        let _ = (run_id, after);
        todo!()
    }

    /// Every event committed by this process from now on, of every run.
    pub fn subscribe_all(&self) -> tokio::sync::broadcast::Receiver<Arc<StoredEvent>> {
        todo!()
    }

    /// Rewrites `<log_dir>/<run>/events.ndjson` from the store.
    pub fn export(&self, run_id: &str, log_dir: &Path) -> Result<PathBuf, StoreError> {
        let _ = (run_id, log_dir);
        todo!()
    }

    /// Waits until everything appended so far is committed, then stops the
    /// writer.
    pub fn close(&self) {
        todo!()
    }
}

/// A run's sequencer. Send + Sync; share it as `Arc<RunLog>`.
pub struct RunLog {
    run_id: String,
}

impl RunLog {
    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The seq of the latest appended event (committed or not).
    pub fn last_seq(&self) -> u64 {
        todo!()
    }

    /// Stamps, sequences and enqueues one event and returns it. Never blocks
    /// on I/O.
    pub fn append(&self, scope: Scope, kind: EventKind) -> Event {
        let _ = (scope, kind);
        todo!()
    }

    /// Appends and waits until the event is committed.
    pub async fn append_durable(&self, scope: Scope, kind: EventKind) -> Result<Event, StoreError> {
        let _ = (scope, kind);
        todo!()
    }

    /// Waits until every event appended so far on this log is committed.
    pub async fn sync(&self) -> Result<(), StoreError> {
        todo!()
    }

    /// Blocking form of [`RunLog::sync`].
    pub fn sync_blocking(&self) -> Result<(), StoreError> {
        todo!()
    }

    /// Sets the in-process callback that receives every event in seq order.
    pub fn set_observer(&self, f: Box<dyn Fn(&Event) + Send + Sync>) {
        let _ = f;
        todo!()
    }
}

/// Why a subscription ended early.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The subscriber fell too far behind the live stream; it has seen
    /// everything up to `last_seq` and should resubscribe from there.
    #[error(
        "subscriber lagged behind the live stream after seq {last_seq}; resubscribe from there"
    )]
    Lagged {
        /// The last seq delivered.
        last_seq: u64,
    },
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A run's events in seq order: replay, then live.
pub struct Subscription {
    stop_at_terminal: bool,
}

impl Subscription {
    /// The next event; `None` after the run's terminal event when stopping
    /// at terminal events (the default).
    pub async fn next(&mut self) -> Option<Result<Arc<StoredEvent>, SubscribeError>> {
        todo!()
    }

    /// Whether to end at terminal events (default true). With `false` the
    /// subscription keeps going across resumes.
    pub fn stop_at_terminal(mut self, yes: bool) -> Self {
        self.stop_at_terminal = yes;
        self
    }
}
