//! The runner of each leaf node kind, one module each.
//!
//! A kind's definition (its settings, parsing, templated parts, whether it
//! changes files) is `cairn-workflow`'s (`cairn_workflow::KINDS`); what an
//! attempt of it does is here. [`runner_for`] chooses by an exhaustive
//! match, so a new variant of `NodeKind` does not build until it has a
//! runner, or is a group that the driver mounts instead.

mod agent;
mod approval;
mod ask;
mod command;
pub(crate) mod switch;
mod tool;
mod value;
mod workflow;

use cairn_workflow::NodeKind;

use crate::node::NodeRunner;

pub(crate) use command::run_command;

/// The runner of a workflow node kind. Groups (`loop`, `for_each`) return
/// `None`: the driver mounts their children instead.
pub fn runner_for(kind: &NodeKind) -> Option<&'static dyn NodeRunner> {
    match kind {
        NodeKind::Command(_) => Some(&command::CommandNode),
        NodeKind::Value(_) => Some(&value::ValueNode),
        NodeKind::Approval(_) => Some(&approval::ApprovalNode),
        NodeKind::Tool { .. } => Some(&tool::ToolNode),
        NodeKind::Ask { .. } => Some(&ask::AskNode),
        NodeKind::Agent(_) => Some(&agent::AgentNode),
        NodeKind::Workflow { .. } => Some(&workflow::WorkflowNode),
        NodeKind::Switch(_) => Some(&switch::SwitchNode),
        NodeKind::Loop { .. } | NodeKind::ForEach { .. } => None,
    }
}
