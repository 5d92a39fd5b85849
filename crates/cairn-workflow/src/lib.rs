//! Cairn workflow files: the model, parsing and validation, templates and expressions.
//!
//! This crate runs nothing; the engine schedules and renders against run state.

mod check;
mod duration;
mod error;
mod kinds;
pub mod limits;
mod model;
mod parse;
pub mod refs;
mod templates;
pub mod triggers;
mod yaml;

pub use cairn_models::{
    ApiKey, Backoff, Limits, ModelConfig, Price, ProviderKind, RetryPolicy, DEFAULT_RETRY_DELAY,
    DEFAULT_RETRY_MAX_DELAY,
};
pub use duration::parse_duration;
pub use error::{InputError, InputViolation, Problem, WorkflowError};
pub use kinds::{
    docs_table, has_markup, kind_named, AgentSpec, ForEachSpec, Group, KindDef, LoopSpec, NodeKind,
    SwitchSpec, AGENT_ENGINES, AGENT_TOOLS, KINDS, WRITING_TOOLS,
};
pub use limits::{check_depth, json_depth, DepthError};
pub use model::*;
pub use parse::{
    field_names, load, load_data, load_tree, load_triggers, parse, parse_data, parse_schedule,
    parse_triggers, read_file,
};
pub use templates::{
    Context, NeedsEnded, NodeEntries, NodeEntry, TemplateError, Templates, STATUS_FUNCTIONS,
};
