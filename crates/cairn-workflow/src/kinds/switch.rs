//! `switch`: an expression chooses one of named branches; the nodes listed
//! under the others are skipped (WORKFLOW.md, "Branches: `switch`").

use super::{KindDef, NodeKind, SwitchSpec};
use crate::parse::{is_node_id, join, Cx, Fields};
use crate::yaml::{Node, Yaml};

/// The `switch` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "switch",
    fields: &[],
    shared: &[],
    inner: &["on", "cases", "default"],
    body: None,
    misplaced_hints: &[("cases", "a switch's cases go inside `switch:`")],
    does: "evaluates `on` and enables the nodes of the case it names (or of `default`); the nodes of the other cases are skipped",
    output: "the chosen label",
    example: "switch: {on: \"input.kind\", cases: {bug: [fix], feature: [plan]}, default: [triage]}",
    changes_files: false,
    mermaid: ("{", "}"),
    parse,
};

/// `{on, cases, default?}`: `cases` maps each label to the ids of the
/// nodes its branch enables.
fn parse(cx: &mut Cx, v: &Node, _: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let kf = join(field, DEF.key);
    let sf = cx.fields(v, &kf, DEF.inner, "in switch")?;
    let on = match sf.get("on") {
        Some((_, e)) => cx.expr(e, &join(&kf, "on")),
        None => {
            cx.at(
                v.pos,
                Some(&join(&kf, "on")),
                "missing required field `on` (the expression whose value names the case)",
            );
            None
        }
    };
    let cases = match sf.get("cases") {
        Some((_, c)) => cases(cx, c, &join(&kf, "cases")),
        None => {
            cx.at(
                v.pos,
                Some(&join(&kf, "cases")),
                "missing required field `cases` (label: [the nodes its branch enables])",
            );
            None
        }
    };
    let default = sf
        .get("default")
        .and_then(|(_, d)| ids(cx, d, &join(&kf, "default")));
    Some(NodeKind::Switch(Box::new(SwitchSpec {
        on: on?,
        cases: cases?,
        default,
    })))
}

fn cases(cx: &mut Cx, node: &Node, field: &str) -> Option<Vec<(String, Vec<String>)>> {
    let Yaml::Map(entries) = &node.value else {
        cx.at(
            node.pos,
            Some(field),
            format!(
                "expected a mapping of labels to node lists, found {}",
                node.value.type_name()
            ),
        );
        return None;
    };
    if entries.is_empty() {
        cx.at(node.pos, Some(field), "a switch needs at least one case");
        return None;
    }
    let mut out: Vec<(String, Vec<String>)> = Vec::with_capacity(entries.len());
    let mut ok = true;
    for (k, v) in entries {
        let label = k.key_text();
        let lf = join(field, &label);
        if label.is_empty() || label == "default" {
            cx.at(
                k.pos,
                Some(&lf),
                "a case's label cannot be empty or `default` (that is `switch.default`)",
            );
            ok = false;
            continue;
        }
        if out.iter().any(|(l, _)| *l == label) {
            cx.at(k.pos, Some(&lf), format!("duplicate case `{label}`"));
            ok = false;
            continue;
        }
        match ids(cx, v, &lf) {
            Some(ids) => out.push((label, ids)),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// A list of node ids (one id alone is accepted as a list of one).
fn ids(cx: &mut Cx, node: &Node, field: &str) -> Option<Vec<String>> {
    let items: Vec<&Node> = match &node.value {
        Yaml::Seq(items) => items.iter().collect(),
        Yaml::Str(_) => vec![node],
        other => {
            cx.at(
                node.pos,
                Some(field),
                format!("expected a list of node ids, found {}", other.type_name()),
            );
            return None;
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let f = format!("{field}[{i}]");
        let id = cx.string(item, &f)?;
        if !is_node_id(&id) {
            cx.at(item.pos, Some(&f), format!("`{id}` is not a node id"));
            return None;
        }
        out.push(id);
    }
    Some(out)
}
