//! `ask`: asks a person a question and waits for the answer.

use super::{KindDef, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::Node;

/// The `ask` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "ask",
    fields: &["schema"],
    shared: &[],
    inner: &[],
    body: None,
    misplaced_hints: &[],
    does: "asks a person a question and waits for the answer",
    output: "the answer (JSON; checked against `schema` when given)",
    example: "ask: \"Which branch?\", schema: {type: string}",
    changes_files: false,
    mermaid: ("[", "]"),
    parse,
};

/// The question (a template) and the answer's JSON Schema.
fn parse(cx: &mut Cx, v: &Node, f: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let prompt = cx.template(v, &join(field, DEF.key))?;
    let schema = match f.get("schema") {
        Some((_, sch)) => Some(cx.json_schema(sch, &join(field, "schema"))?),
        None => None,
    };
    Some(NodeKind::Ask {
        prompt,
        schema: schema.map(Box::new),
    })
}
