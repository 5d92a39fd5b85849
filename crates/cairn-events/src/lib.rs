//! Cairn's events: the typed form of every entry of a run's log, its JSON
//! form as the event contract fixes it, and the reducer that folds a log into
//! the state every command, endpoint and resume reads.
//!
//! This crate does no I/O, so that every layer above it (store, engine, CLI,
//! server) can depend on it and agree on one meaning of the log.

mod activity;
mod command;
pub mod comparison;
mod contract;
mod event;
mod ids;
mod metrics;
mod output;
mod redact;
mod reducer;
mod tree;

pub use activity::{activity, Activity, ActivityFolder, DelegatedBy};
pub use command::{InboxReply, RunCommand, INBOX_SOURCE};
pub use contract::check_log;
pub use event::{
    CancelMechanism, DecodeError, ErrorInfo, Event, EventKind, EventType, ForkedFrom, Level,
    NetworkAction, NodeCounts, NodeTiming, OutputStream, ReplayOf, ReplayTools, RunStatus, Scope,
    SnapshotAt, StepPrompt, TokenTotals, ToolDigest, ToolStatus, Trigger, TriggerKind,
    UnknownEventType, EVENT_TYPES, MAX_EVENT_DEPTH,
};
pub use ids::{
    InvalidNodePath, InvalidRunId, NodePath, RunId, Seq, MAX_NODE_PATH_LEN, MAX_RUN_ID_LEN,
};
pub use metrics::{Histogram, Metrics, DURATION_BUCKETS};
pub use output::{Output, OUTPUT_TEXT_MAX};
pub use redact::{Redactor, MASK, MIN_SECRET_LEN};
pub use reducer::{
    AgentProgress, AttemptSnapshot, AttemptState, AttemptStatus, ChildRun, Decision, NodeNotes,
    NodeState, NodeStatus, OpenRevert, Question, RunState, ScoreState,
};
pub use tree::check_tree;
