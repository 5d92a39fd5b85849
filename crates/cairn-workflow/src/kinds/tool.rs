//! `tool`: calls one sandboxed tool with `args`, templates rendered.

use super::{KindDef, NodeKind, WRITING_TOOLS};
use crate::parse::{join, Cx, Fields};
use crate::yaml::{Node, Yaml};

/// The `tool` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "tool",
    fields: &["args"],
    shared: &["max_output_bytes", "sandbox"],
    inner: &[],
    body: None,
    misplaced_hints: &[],
    does: "calls one sandboxed tool (`read`, `write`, `edit`, `grep`, `bash`, or a registered custom tool) with `args`, templates rendered",
    output: "the tool's result",
    example: "tool: grep, args: {pattern: TODO, path: src}",
    changes_files: true,
    mermaid: ("[", "]"),
    parse,
};

/// The tool's name and its `args` (a mapping whose strings are templates).
fn parse(cx: &mut Cx, v: &Node, f: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let kf = join(field, DEF.key);
    let tool = cx.string(v, &kf)?;
    if tool.trim().is_empty() {
        cx.at(v.pos, Some(&kf), "the tool name is empty");
        return None;
    }
    let args = match f.get("args") {
        Some((_, a)) => {
            let af = join(field, "args");
            if !matches!(a.value, Yaml::Map(_)) {
                cx.at(
                    a.pos,
                    Some(&af),
                    format!(
                        "expected a mapping of arguments, found {}",
                        a.value.type_name()
                    ),
                );
                return None;
            }
            if !cx.shallow(a, &af) {
                return None;
            }
            cx.check_templates_in(a, &af);
            a.to_json()
        }
        None => serde_json::Value::Object(Default::default()),
    };
    Some(NodeKind::Tool {
        tool,
        args: Box::new(args),
    })
}

/// Whether calling `tool` may change files: the built-in tools that write.
pub(super) fn may_change_files(tool: &str) -> bool {
    WRITING_TOOLS.contains(&tool)
}
