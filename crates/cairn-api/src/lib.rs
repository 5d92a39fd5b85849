//! The bodies of Cairn's HTTP API: what `cairn serve` answers and accepts,
//! as serde types shared by the server (which builds them), the HTTP client
//! (which reads them) and the CLI (which prints them, from a server or
//! from its own store).
//!
//! Each type serializes to exactly the JSON the API has always sent, field
//! for field and in the same order; the OpenAPI document ([`OPENAPI`]) lives
//! here beside them, and this crate's tests hold each type to its schema
//! both ways (a field the type has and the document lacks fails, and so
//! does one the document has and the type never sends).
//!
//! A run's state as `GET /v1/runs/{id}` and `cairn status --json` show it
//! is built in one place: [`RunDetail::new`].
//!
//! The store's rows are not known here: the server maps them (a run's
//! record into [`RunMeta`] and [`RunSummary`], a tool call's row into
//! [`ToolCall`], the scorers' report into [`ScoreReport`]).

mod activity;
mod bodies;
mod error;
mod events;
mod files;
mod nodes;
mod runs;
mod scores;
mod triggers;

pub use activity::{ActivityEntry, ActivityPage, DelegatedBy};
pub use bodies::{
    AnswerBody, Answered, CancelBody, CancelMechanism, Cancelled, DecideBody, Decided, Health,
    HijackBody, HijackRequested, LoginBody, ResumeBody, RunAccepted, Session, StartBody,
};
pub use error::{ErrorBody, ErrorInfo, InputViolation, ProblemLocation};
pub use events::{events_page_json, EventsPage};
pub use files::{FileConflict, FilesPlan, ForkBody, Forked, RevertBody, Reverted};
pub use nodes::{Plan, PlanCase, PlanNode, ToolCall, ToolCalls};
pub use runs::{RunDetail, RunList, RunMeta, RunSummary};
pub use scores::{GenerationScores, ScoreReport, ScorerStats, WorkflowScores};
pub use triggers::{FireList, FireView, HookAccepted, ScheduleBody, ScheduleList, ScheduleView};

/// The OpenAPI 3.1 document of the HTTP API, as `cairn serve` serves it at
/// `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");
