//! `approval`: waits for a person to grant or deny.

use super::{KindDef, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::Node;

/// The `approval` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "approval",
    fields: &[],
    shared: &[],
    inner: &[],
    body: None,
    misplaced_hints: &[],
    does: "waits for a person to grant or deny; the string is the message",
    output: "`{approved, note, by}`",
    example: "approval: \"Publish {{ input.n }} entries?\"",
    changes_files: false,
    mermaid: ("{{", "}}"),
    parse,
};

/// The message, a template.
fn parse(cx: &mut Cx, v: &Node, _: &Fields<'_>, field: &str) -> Option<NodeKind> {
    cx.template(v, &join(field, DEF.key))
        .map(NodeKind::Approval)
}
