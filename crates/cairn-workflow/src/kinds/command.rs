//! `command`: runs an argv without a shell.

use super::{has_markup, KindDef, NodeKind};
use crate::parse::{join, Cx, Fields};
use crate::yaml::{Node, Yaml};

/// The `command` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "command",
    fields: &["env", "cwd", "output"],
    shared: &["sandbox"],
    inner: &[],
    body: None,
    misplaced_hints: &[],
    does:
        "runs the argv without a shell, in `cwd` (default: the workflow's folder) with `env` added",
    output: "stdout as `text`, `json` or `lines`",
    example: "command: [git, log, --oneline], output: lines",
    changes_files: true,
    mermaid: ("[", "]"),
    parse,
};

/// The argv: a non-empty list of words, each a template. `env`, `cwd` and
/// `output` are node settings ([`crate::NodeSettings`]), read with the
/// others.
fn parse(cx: &mut Cx, v: &Node, _: &Fields<'_>, field: &str) -> Option<NodeKind> {
    let kf = join(field, DEF.key);
    let Yaml::Seq(items) = &v.value else {
        cx.at_hint(
            v.pos,
            Some(&kf),
            format!("expected a list (the argv), found {}", v.value.type_name()),
            Some("commands run without a shell; write [\"sh\", \"-c\", \"...\"] to use one".into()),
        );
        return None;
    };
    if items.is_empty() {
        cx.at(v.pos, Some(&kf), "the argv is empty");
        return None;
    }
    let mut argv = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let af = format!("{kf}[{i}]");
        let text = cx.text(item, &af)?;
        cx.check_template_at(&text, item.pos, &af);
        argv.push(text);
    }
    Some(NodeKind::Command(argv))
}

/// Whether a word of the argv is a template with markup.
pub(super) fn uses_templates(argv: &[String]) -> bool {
    argv.iter().any(|a| has_markup(a))
}
