//! Cairn workflow files: the model, parsing and validation, templates and expressions.
//!
//! This crate runs nothing; the engine schedules and renders against run state.

mod duration;
mod error;
pub mod limits;
mod model;
mod parse;
mod templates;
mod yaml;

pub use duration::parse_duration;
pub use error::{InputError, InputViolation, Problem, WorkflowError};
pub use limits::{check_depth, json_depth, DepthError};
pub use model::*;
pub use parse::{
    load, load_data, load_tree, parse, parse_data, read_file, AGENT_ENGINES, AGENT_TOOLS,
};
pub use templates::{Context, NodeEntries, NodeEntry, TemplateError, Templates};
