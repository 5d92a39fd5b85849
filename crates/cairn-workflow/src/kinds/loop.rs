//! `loop`: repeats its body until an expression holds, at most so many
//! passes.

use super::{KindDef, LoopSpec, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::Node;

/// The `loop` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "loop",
    fields: &[],
    shared: &[],
    inner: &["until", "max_iterations", "nodes"],
    body: Some("loop.nodes"),
    misplaced_hints: &[("nodes", "a loop's nodes go inside `loop:`")],
    does: "repeats its `nodes` until `until` holds after a pass, at most `max_iterations` passes",
    output: "the last pass's outputs",
    example: "loop: {until: \"nodes.check.output.ok\", max_iterations: 5, nodes: [{id: check, value: {ok: true}}]}",
    changes_files: false,
    mermaid: ("[", "]"),
    parse,
};

/// `{until, max_iterations, nodes}`, all required.
fn parse(cx: &mut Cx, v: &Node, _: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let kf = join(field, DEF.key);
    let lf = cx.fields(v, &kf, DEF.inner, "in loop")?;
    let until = match lf.get("until") {
        Some((_, u)) => cx.expr(u, &join(&kf, "until")),
        None => {
            cx.at(
                v.pos,
                Some(&join(&kf, "until")),
                "missing required field `until` (the expression that ends the loop)",
            );
            None
        }
    };
    let max_iterations = match lf.get("max_iterations") {
        Some((_, m)) => cx.uint(m, &join(&kf, "max_iterations"), 1).and_then(|n| {
            u32::try_from(n).ok().or_else(|| {
                cx.at(m.pos, Some(&join(&kf, "max_iterations")), "too large");
                None
            })
        }),
        None => {
            cx.at(
                v.pos,
                Some(&join(&kf, "max_iterations")),
                "missing required field `max_iterations` (the most passes the loop makes)",
            );
            None
        }
    };
    let nodes = match lf.get("nodes") {
        Some((_, n)) => cx.nodes(n, &join(&kf, "nodes")),
        None => {
            cx.at(
                v.pos,
                Some(&join(&kf, "nodes")),
                "missing required field `nodes` (the loop's body)",
            );
            Vec::new()
        }
    };
    Some(NodeKind::Loop(Box::new(LoopSpec {
        until: until?,
        max_iterations: max_iterations?,
        nodes,
    })))
}
