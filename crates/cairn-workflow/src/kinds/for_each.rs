//! `for_each`: mounts its body once for each element of a list.

use super::{ForEachSpec, KindDef, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::Node;

/// The `for_each` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "for_each",
    fields: &["as", "nodes"],
    shared: &[],
    inner: &[],
    body: Some("nodes"),
    misplaced_hints: &[],
    does: "mounts its `nodes` once for each element of the list the expression yields",
    output: "a list, one entry per element",
    example: "for_each: input.files, as: file, nodes: [{id: show, value: \"{{ file }}\"}]",
    changes_files: false,
    mermaid: ("[", "]"),
    parse,
};

/// Names the engine puts in the template context; an `as` name must not
/// hide them.
const RESERVED_NAMES: &[&str] = &["input", "nodes", "iteration", "index", "run", "workflow"];

/// The list's expression, the `as` name and the body.
fn parse(cx: &mut Cx, v: &Node, f: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let list = cx.expr(v, &join(field, DEF.key));
    let mut as_ok = true;
    let as_name = match f.get("as") {
        Some((_, a)) => {
            let af = join(field, "as");
            let name = cx.string(a, &af);
            match name {
                Some(name) if !is_identifier(&name) => {
                    cx.at(
                        a.pos,
                        Some(&af),
                        format!("`{name}` is not a valid name; use letters, digits and `_`, not starting with a digit"),
                    );
                    as_ok = false;
                    None
                }
                Some(name) if RESERVED_NAMES.contains(&name.as_str()) => {
                    cx.at(
                        a.pos,
                        Some(&af),
                        format!("`{name}` is already a name in templates; choose another"),
                    );
                    as_ok = false;
                    None
                }
                Some(name) => Some(name),
                None => {
                    as_ok = false;
                    None
                }
            }
        }
        None => None,
    };
    let nodes = match f.get("nodes") {
        Some((_, n)) => cx.nodes(n, &join(field, "nodes")),
        None => {
            cx.at(
                v.pos,
                Some(&join(field, "nodes")),
                "missing required field `nodes` (mounted once per element)",
            );
            Vec::new()
        }
    };
    if !as_ok {
        return None;
    }
    Some(NodeKind::ForEach(Box::new(ForEachSpec {
        list: list?,
        as_name,
        nodes,
    })))
}

fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
