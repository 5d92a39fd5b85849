//! Cairn's event store.
//!
//! The store keeps every run's event log and the few tables the engine needs
//! beside it (runs, control requests, tool calls). Storage sits behind the
//! [`Backend`] trait so that SQLite (here) and PostgreSQL (later) serve the
//! same [`Journal`]: the per-run sequencer ([`RunLog`]), one writer thread that
//! commits in groups, the NDJSON mirror and live [`Subscription`]s.
//!
//! With the `conformance` feature, `cairn_store::conformance` holds the
//! checks every backend must pass; this crate's tests run them on SQLite.

mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
mod journal;
mod mirror;
mod scores;
mod sqlite;
mod wake;

pub use backend::{
    hex_prefix, validate_run_id, Backend, EventQuery, GenerationRecord, InboxEntry, LeaseHolder,
    Listener, PinnedFile, ProcessRecord, RunFilter, RunLease, RunRecord, StoreError, StoredEvent,
    ToolCallRecord, Topic,
};
pub use journal::{Journal, JournalOptions, RunLog, SubscribeError, Subscription};
pub use scores::{
    aggregate_scores, GenerationScores, ScoreFilter, ScoreReport, ScorerStats, WorkflowScores,
};
pub use sqlite::SqliteBackend;
