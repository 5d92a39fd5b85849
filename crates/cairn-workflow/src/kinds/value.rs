//! `value`: does nothing; its value, templates in strings rendered, is the
//! output.

use super::{KindDef, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::Node;

/// The `value` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "value",
    fields: &[],
    shared: &[],
    inner: &[],
    body: None,
    misplaced_hints: &[],
    does: "nothing; its value is the output, with templates in strings rendered",
    output: "the rendered value",
    example: "value: {entries: \"{{ input.n }}\"}",
    changes_files: false,
    mermaid: ("[", "]"),
    parse,
};

/// Any value, not nested too deep; its strings are templates.
fn parse(cx: &mut Cx, v: &Node, _: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let kf = join(field, DEF.key);
    if !cx.shallow(v, &kf) {
        return None;
    }
    cx.check_templates_in(v, &kf);
    Some(NodeKind::Value(v.to_json().into()))
}
