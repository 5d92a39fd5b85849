//! `workflow`: runs another workflow file as a child run.

use super::{KindDef, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::Node;

/// The `workflow` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "workflow",
    fields: &["input"],
    shared: &[],
    inner: &[],
    body: None,
    misplaced_hints: &[],
    does: "runs another workflow file as a child run with `input`",
    output: "the child run's output",
    example: "workflow: review.yaml, input: {file: \"{{ input.file }}\"}",
    changes_files: false,
    mermaid: ("[", "]"),
    parse,
};

/// The child's path and its `input` (strings inside are templates).
fn parse(cx: &mut Cx, v: &Node, f: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let path = child_path(cx, v, &join(field, DEF.key))?;
    let input = match f.get("input") {
        Some((_, i)) => {
            cx.check_templates_in(i, &join(field, "input"));
            Some(i.to_json())
        }
        None => None,
    };
    Some(NodeKind::Workflow {
        path,
        input: input.map(Box::new),
    })
}

/// The path of a child workflow (`workflow:` and each agent delegate): a
/// plain relative or absolute path, not a template, so that the files a
/// workflow runs are known before it starts.
pub(crate) fn child_path(cx: &mut Cx, node: &Node, field: &str) -> Option<String> {
    let path = cx.string(node, field)?;
    if path.trim().is_empty() {
        cx.at(node.pos, Some(field), "the workflow path is empty");
        return None;
    }
    if super::has_markup(&path) {
        cx.at_hint(
            node.pos,
            Some(field),
            "a child workflow's path cannot be a template",
            Some("name the file; pass what varies as its `input`".into()),
        );
        return None;
    }
    Some(path)
}
