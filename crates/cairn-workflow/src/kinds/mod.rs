//! Node kinds, each defined once.
//!
//! A kind is one module here: the settings it holds (its variant of
//! [`NodeKind`] and the types inside), how it is read from a file (the keys
//! a node of it may have, their checks and messages), which of its parts
//! are templates, whether it can change files, and its line in the docs.
//! [`KINDS`] lists the kinds' [`KindDef`]s, and everything that enumerates
//! kinds is derived from that list: the parser's kind keys, the fields a
//! node may have, the message for a field of another kind, the `did you
//! mean` hints, the format's field names ([`crate::field_names`]) and the
//! table in docs/kinds.md (checked by a test). The questions the rest of
//! Cairn asks of a node's kind are methods here, each an exhaustive match,
//! so a new variant is a compile error wherever something must be decided
//! about it (the engine runs each kind in a module of its own, chosen the
//! same way).

use crate::model::NodeSpec;
use crate::parse::{Cx, Fields};
use crate::yaml::Node;

mod agent;
mod approval;
mod ask;
mod command;
mod for_each;
mod r#loop;
mod switch;
mod tool;
mod value;
mod workflow;

pub(crate) use agent::{check_mcp_tools, check_models};
pub use agent::{AgentSpec, AGENT_ENGINES, AGENT_TOOLS, WRITING_TOOLS};
pub(crate) use workflow::child_path;

/// Every node kind, in the order messages and the docs list them.
pub static KINDS: &[&KindDef] = &[
    &command::DEF,
    &value::DEF,
    &approval::DEF,
    &r#loop::DEF,
    &for_each::DEF,
    &tool::DEF,
    &ask::DEF,
    &agent::DEF,
    &workflow::DEF,
    &switch::DEF,
];

/// What is known of a node kind before any node of it is read: the one
/// entry a kind adds to [`KINDS`].
#[derive(Debug)]
pub struct KindDef {
    /// The key that names the kind on a node (`command`).
    pub key: &'static str,
    /// The node's other keys that belong to this kind alone, in the order
    /// hints list them: a node of another kind that has one is told which
    /// kind it is for.
    pub fields: &'static [&'static str],
    /// Node keys this kind allows that some other kinds allow too
    /// (`sandbox`); on a node of a kind that does not allow one, it is an
    /// unknown field.
    pub shared: &'static [&'static str],
    /// The keys of the mapping under the kind key, for a kind whose value
    /// is a mapping (`loop: {until, max_iterations, nodes}`).
    pub inner: &'static [&'static str],
    /// Where a group's body is, below the node (`nodes`, `loop.nodes`).
    pub body: Option<&'static str>,
    /// Hints for a field of another kind found on a node of this one.
    pub misplaced_hints: &'static [(&'static str, &'static str)],
    /// What a node of this kind does (the docs' table).
    pub does: &'static str,
    /// What its output is (the docs' table).
    pub output: &'static str,
    /// A node of this kind, as it is written inside `{id: a, ...}`: the
    /// docs show it, and a test reads it back into this kind.
    pub example: &'static str,
    /// Whether its attempts can change files in the sandbox root: a
    /// snapshot is taken before them and `on_retry: revert` applies
    /// ([`NodeKind::may_change_files`] says it of one node).
    pub changes_files: bool,
    /// How a Mermaid flowchart draws a node of this kind (its opening and
    /// closing marks), when it is not a group.
    pub mermaid: (&'static str, &'static str),
    /// Reads the kind's settings: `value` is the node's value under the
    /// kind key, `fields` the node's checked fields, `field` its path.
    pub(crate) parse: ParseFn,
}

/// How a kind reads its settings ([`KindDef::parse`]).
pub(crate) type ParseFn = fn(&mut Cx, &Node, &Fields<'_>, &str) -> Option<NodeKind>;

/// The kind of a node and its kind-specific settings.
///
/// A node's kind is inline in its [`NodeSpec`], and a workflow of 100,000
/// nodes holds as many: every variant is kept to a few words (settings
/// larger than that are boxed), so that a kind is 40 bytes, not the 104
/// a value node's `Value` inline made it.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// Runs an argv (templates) without a shell.
    Command(Vec<String>),
    /// Its rendered value is the output: kept as the output it is when it
    /// has no templates (shared by every instance, not copied per node).
    Value(cairn_events::Output),
    /// Waits for a person; the string is the message template.
    Approval(String),
    /// Repeats a body until a condition holds.
    Loop(Box<LoopSpec>),
    /// Mounts a body once per element of a list.
    ForEach(Box<ForEachSpec>),
    /// Calls one sandboxed tool.
    Tool {
        /// The tool's name.
        tool: String,
        /// Arguments; strings inside are templates.
        args: Box<serde_json::Value>,
    },
    /// Asks a person a question and waits for the answer.
    Ask {
        /// The question (template).
        prompt: String,
        /// JSON Schema the answer must match.
        schema: Option<Box<serde_json::Value>>,
    },
    /// Runs an agent loop (boxed: it is the largest kind).
    Agent(Box<AgentSpec>),
    /// Runs another workflow file as a child run and ends with its result.
    Workflow {
        /// The child's file, relative to this workflow's folder.
        path: String,
        /// The child's input; strings inside are templates.
        input: Option<Box<serde_json::Value>>,
    },
    /// Chooses one of named branches.
    Switch(Box<SwitchSpec>),
}

/// A `switch`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchSpec {
    /// The expression whose value names the case.
    pub on: String,
    /// Each case's label and the sibling ids its branch enables, in the
    /// order written.
    pub cases: Vec<(String, Vec<String>)>,
    /// The ids enabled when no case matches; without it, no match fails
    /// the node.
    pub default: Option<Vec<String>>,
}

impl SwitchSpec {
    /// The label `value` chooses: the case whose label is the value (a
    /// string, or a number or boolean as written), else `default` when
    /// there is one.
    pub fn choose(&self, value: &serde_json::Value) -> Option<&str> {
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(_) | serde_json::Value::Bool(_) => value.to_string(),
            _ => String::new(),
        };
        self.cases
            .iter()
            .find(|(label, _)| *label == text)
            .map(|(label, _)| label.as_str())
            .or_else(|| self.default.as_ref().map(|_| "default"))
    }

    /// Every label, `default` last when there is one.
    pub fn labels(&self) -> Vec<String> {
        let mut out: Vec<String> = self.cases.iter().map(|(l, _)| l.clone()).collect();
        if self.default.is_some() {
            out.push("default".into());
        }
        out
    }

    /// The ids the branch `label` enables.
    pub fn branch(&self, label: &str) -> &[String] {
        if label == "default" {
            return self.default.as_deref().unwrap_or_default();
        }
        self.cases
            .iter()
            .find(|(l, _)| l == label)
            .map_or(&[], |(_, ids)| ids.as_slice())
    }

    /// Whether any branch lists `id`.
    pub fn lists(&self, id: &str) -> bool {
        self.cases
            .iter()
            .map(|(_, ids)| ids)
            .chain(self.default.as_ref())
            .any(|ids| ids.iter().any(|i| i == id))
    }
}

/// A `loop`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopSpec {
    /// Expression checked after each pass.
    pub until: String,
    /// Upper bound on passes.
    pub max_iterations: u32,
    /// The body.
    pub nodes: Vec<NodeSpec>,
}

/// A `for_each`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ForEachSpec {
    /// Expression yielding the list.
    pub list: String,
    /// Name the element is bound to besides `item`.
    pub as_name: Option<String>,
    /// The body.
    pub nodes: Vec<NodeSpec>,
}

impl NodeKind {
    /// The kind's definition.
    pub fn def(&self) -> &'static KindDef {
        match self {
            NodeKind::Command(_) => &command::DEF,
            NodeKind::Value(_) => &value::DEF,
            NodeKind::Approval(_) => &approval::DEF,
            NodeKind::Loop { .. } => &r#loop::DEF,
            NodeKind::ForEach { .. } => &for_each::DEF,
            NodeKind::Tool { .. } => &tool::DEF,
            NodeKind::Ask { .. } => &ask::DEF,
            NodeKind::Agent(_) => &agent::DEF,
            NodeKind::Workflow { .. } => &workflow::DEF,
            NodeKind::Switch(_) => &switch::DEF,
        }
    }

    /// The kind key as written in files: `command`, `value`, `approval`, `loop`, `for_each`,
    /// `tool`, `ask`, `agent`, `workflow`.
    pub fn name(&self) -> &'static str {
        self.def().key
    }

    /// The body of a group node (`loop`, `for_each`); `None` for leaves.
    pub fn children(&self) -> Option<&[NodeSpec]> {
        self.group().map(|g| g.nodes())
    }

    /// The body of a group node, to change in place; `None` for leaves.
    pub fn children_mut(&mut self) -> Option<&mut Vec<NodeSpec>> {
        match self {
            NodeKind::Loop(l) => Some(&mut l.nodes),
            NodeKind::ForEach(f) => Some(&mut f.nodes),
            NodeKind::Command(_)
            | NodeKind::Value(_)
            | NodeKind::Approval(_)
            | NodeKind::Tool { .. }
            | NodeKind::Ask { .. }
            | NodeKind::Agent(_)
            | NodeKind::Workflow { .. }
            | NodeKind::Switch(_) => None,
        }
    }

    /// The node as a group (`loop`, `for_each`), for code that handles
    /// groups only; `None` for a leaf.
    pub fn group(&self) -> Option<Group<'_>> {
        match self {
            NodeKind::Loop(l) => Some(Group::Loop {
                until: &l.until,
                max_iterations: l.max_iterations,
                nodes: &l.nodes,
            }),
            NodeKind::ForEach(f) => Some(Group::ForEach {
                list: &f.list,
                as_name: f.as_name.as_deref(),
                nodes: &f.nodes,
            }),
            NodeKind::Command(_)
            | NodeKind::Value(_)
            | NodeKind::Approval(_)
            | NodeKind::Tool { .. }
            | NodeKind::Ask { .. }
            | NodeKind::Agent(_)
            | NodeKind::Workflow { .. }
            | NodeKind::Switch(_) => None,
        }
    }

    /// Whether an attempt of this node may change files in the sandbox
    /// root (and so gets a snapshot before it starts): never for a kind
    /// that cannot ([`KindDef::changes_files`]), and for a `tool` or an
    /// `agent` only with a tool that writes. A `command` with a fixed
    /// `cwd` outside the root does not either; only the engine knows the
    /// root, so it checks that itself.
    pub fn may_change_files(&self) -> bool {
        match self {
            NodeKind::Tool { tool, .. } => tool::may_change_files(tool),
            NodeKind::Agent(a) => agent::may_change_files(a),
            NodeKind::Command(_)
            | NodeKind::Value(_)
            | NodeKind::Approval(_)
            | NodeKind::Ask { .. }
            | NodeKind::Workflow { .. }
            | NodeKind::Switch(_)
            | NodeKind::Loop { .. }
            | NodeKind::ForEach { .. } => self.def().changes_files,
        }
    }

    /// Whether the kind's own settings are rendered with the template
    /// context: a template with markup, an expression (a group's), or a
    /// prompt (an agent renders its prompts in its attempt, with `nodes`).
    pub fn uses_templates(&self) -> bool {
        match self {
            NodeKind::Command(argv) => command::uses_templates(argv),
            NodeKind::Value(v) => output_has_markup(v),
            NodeKind::Approval(message) => has_markup(message),
            NodeKind::Tool { args, .. } => value_has_markup(args),
            NodeKind::Ask { prompt, .. } => has_markup(prompt),
            NodeKind::Agent(_) => true,
            NodeKind::Workflow { input, .. } => input.as_deref().is_some_and(value_has_markup),
            NodeKind::Loop { .. } | NodeKind::ForEach { .. } | NodeKind::Switch(_) => true,
        }
    }

    /// The child workflow files the node itself names (a `workflow`
    /// node's path, an agent's `delegates`), not those of a group's body.
    pub fn child_workflows(&self) -> Vec<&str> {
        match self {
            NodeKind::Workflow { path, .. } => vec![path.as_str()],
            NodeKind::Agent(a) => a.delegates.values().map(String::as_str).collect(),
            NodeKind::Command(_)
            | NodeKind::Value(_)
            | NodeKind::Approval(_)
            | NodeKind::Tool { .. }
            | NodeKind::Ask { .. }
            | NodeKind::Switch(_)
            | NodeKind::Loop { .. }
            | NodeKind::ForEach { .. } => Vec::new(),
        }
    }

    /// A group's body with its field path below the node (`loop.nodes`,
    /// `nodes`), for checks that walk the whole tree.
    pub(crate) fn body(&self) -> Option<(&'static str, &[NodeSpec])> {
        let nodes = self.children()?;
        Some((self.def().body.unwrap_or("nodes"), nodes))
    }
}

/// A group node's settings, borrowed ([`NodeKind::group`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Group<'a> {
    /// `loop`: repeats `nodes` until `until` holds, at most
    /// `max_iterations` passes.
    Loop {
        /// Expression checked after each pass.
        until: &'a str,
        /// Upper bound on passes.
        max_iterations: u32,
        /// The body.
        nodes: &'a [NodeSpec],
    },
    /// `for_each`: mounts `nodes` once per element of the list `list`
    /// yields.
    ForEach {
        /// Expression yielding the list.
        list: &'a str,
        /// Name the element is bound to besides `item`.
        as_name: Option<&'a str>,
        /// The body.
        nodes: &'a [NodeSpec],
    },
}

impl<'a> Group<'a> {
    /// The group's body.
    pub fn nodes(&self) -> &'a [NodeSpec] {
        match self {
            Group::Loop { nodes, .. } | Group::ForEach { nodes, .. } => nodes,
        }
    }
}

/// Whether a string holds template markup: only `{{` opens any (see
/// [`crate::Templates`]).
pub fn has_markup(s: &str) -> bool {
    s.contains("{{")
}

/// Whether any string inside a JSON value holds template markup.
fn value_has_markup(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => has_markup(s),
        serde_json::Value::Array(a) => a.iter().any(value_has_markup),
        serde_json::Value::Object(o) => o.values().any(value_has_markup),
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {
            false
        }
    }
}

/// Whether any string inside a value node's value holds template markup.
/// Most values are kept as JSON text, and markup in a string shows in its
/// text as it is (JSON escapes none of `{`, `%` and `#`): a text without
/// any is answered without parsing it, one with some is parsed, since the
/// markup may be in an object's key, which is not rendered.
fn output_has_markup(v: &cairn_events::Output) -> bool {
    match v.as_text() {
        Some(text) if !has_markup(text) => false,
        _ => value_has_markup(&v.value()),
    }
}

/// The kind a key names.
pub fn kind_named(key: &str) -> Option<&'static KindDef> {
    KINDS.iter().copied().find(|d| d.key == key)
}

/// The one kind a node key belongs to, when it is some kind's alone
/// ([`KindDef::fields`]).
pub(crate) fn owner_of(field: &str) -> Option<&'static KindDef> {
    KINDS.iter().copied().find(|d| d.fields.contains(&field))
}

/// The kind keys joined with `, ` (the hint of a node without a kind).
pub(crate) fn keys_list() -> String {
    KINDS.iter().map(|d| d.key).collect::<Vec<_>>().join(", ")
}

/// The keys a node may have besides the common ones: its kind's key and
/// fields, or, for a node whose kind is not known, every kind's (so that
/// only true typos show).
pub(crate) fn node_fields(kind: Option<&KindDef>) -> Vec<&'static str> {
    match kind {
        Some(d) => std::iter::once(d.key)
            .chain(d.fields.iter().copied())
            .chain(d.shared.iter().copied())
            .collect(),
        None => {
            let mut out: Vec<&'static str> = KINDS.iter().map(|d| d.key).collect();
            let rest = KINDS.iter().flat_map(|d| d.fields.iter());
            for f in rest.chain(KINDS.iter().flat_map(|d| d.shared.iter())) {
                if !out.contains(f) {
                    out.push(f);
                }
            }
            out
        }
    }
}

/// Whether a node key leads to a group's body mapping (`loop`, whose
/// `nodes` is the body): the YAML reader streams those lists.
pub(crate) fn body_under(key: &str) -> bool {
    KINDS
        .iter()
        .any(|d| d.body.and_then(|b| b.strip_suffix(".nodes")) == Some(key))
}

/// The kinds whose attempts can change files, as prose: "`agent`,
/// `command` and `tool`".
pub(crate) fn file_changing_kinds() -> String {
    let mut keys: Vec<String> = KINDS
        .iter()
        .filter(|d| d.changes_files)
        .map(|d| format!("`{}`", d.key))
        .collect();
    keys.sort();
    match keys.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// The Markdown table of the node kinds that docs/kinds.md holds.
pub fn docs_table() -> String {
    let mut out = String::from(
        "| kind key | what the node does | its output | its other keys | changes files | example |\n\
         |---|---|---|---|---|---|\n",
    );
    for d in KINDS {
        let keys: Vec<String> = d
            .fields
            .iter()
            .chain(d.shared.iter())
            .map(|k| format!("`{k}`"))
            .chain(d.inner.iter().map(|k| format!("`{}.{k}`", d.key)))
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | `{}` |\n",
            d.key,
            d.does,
            d.output,
            if keys.is_empty() {
                "".to_string()
            } else {
                keys.join(", ")
            },
            if d.changes_files { "yes" } else { "no" },
            d.example.replace('|', "\\|"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_fits_40_bytes() {
        // Inline in every node of a file: a larger variant makes every
        // node of a 100,000-node workflow larger (the kind took 104 bytes
        // with a value inline, and its node 168).
        assert!(std::mem::size_of::<NodeKind>() <= 40);
        assert!(std::mem::size_of::<NodeSpec>() <= 104);
    }

    #[test]
    fn keys_and_fields_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for d in KINDS {
            assert!(seen.insert(d.key), "kind `{}` listed twice", d.key);
            assert!(!crate::parse::COMMON_NODE_FIELDS.contains(&d.key));
        }
        for d in KINDS {
            for f in d.fields {
                let owners: Vec<_> = KINDS.iter().filter(|o| o.fields.contains(f)).collect();
                assert_eq!(owners.len(), 1, "field `{f}` belongs to several kinds");
                assert!(!seen.contains(f), "field `{f}` is also a kind key");
            }
        }
    }

    #[test]
    fn each_example_reads_back_into_its_kind() {
        for d in KINDS {
            // Nodes after `a` for an example that names its siblings (a
            // switch's branches).
            let text = format!(
                "name: t\nmodels: {{m: {{provider: scripted, script: m.yaml}}}}\nnodes:\n  - {{id: a, {}}}\n\
                 {}",
                d.example,
                ["fix", "plan", "triage"]
                    .map(|id| format!("  - {{id: {id}, needs: [a], value: 1}}\n"))
                    .concat()
            );
            let wf = crate::parse(&text, std::path::Path::new("/w/t.yaml"))
                .unwrap_or_else(|e| panic!("example of `{}`: {e}", d.key));
            let kind = &wf.nodes[0].kind;
            assert!(std::ptr::eq(kind.def(), *d), "example of `{}`", d.key);
            assert_eq!(kind.children().is_some(), d.body.is_some(), "{}", d.key);
        }
    }

    #[test]
    fn docs_table_is_the_registrys() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kinds.md");
        let doc = std::fs::read_to_string(path).expect("docs/kinds.md");
        let table = docs_table();
        assert!(
            doc.contains(&table),
            "docs/kinds.md does not hold the kinds' table as cairn-workflow's KINDS gives it; \
             replace its table with:\n\n{table}"
        );
    }
}
