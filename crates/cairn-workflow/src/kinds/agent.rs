//! `agent`: runs an agent loop (a model and the tools it may call, until
//! it answers), or an external agent CLI.

use std::collections::BTreeMap;

use super::{KindDef, NodeKind};
use crate::model::{McpServerDef, NodeSpec};
use crate::parse::{closest, is_node_id, join, unknown_model_hint, Cx, Fields};
use crate::yaml::{Node, Pos, Yaml};
use cairn_models::ModelConfig;

/// The `agent` kind.
pub(super) static DEF: KindDef = KindDef {
    key: "agent",
    fields: &[],
    shared: &[],
    inner: &[
        "model",
        "engine",
        "system",
        "prompt",
        "tools",
        "delegates",
        "max_steps",
        "output_schema",
        "schema_retries",
        "max_cost_usd",
        "engine_command",
    ],
    body: None,
    misplaced_hints: &[],
    does: "runs an agent loop: a model, the tools it may call, until it answers",
    output: "its final answer (text, or JSON when `output_schema` is set)",
    example: "agent: {model: m, prompt: \"Fix {{ input.file }}\", tools: [read, edit]}",
    changes_files: true,
    mermaid: ("[", "]"),
    parse,
};

/// The external agent CLIs an agent node may run instead of a model.
pub const AGENT_ENGINES: &[&str] = &["claude-code", "codex"];
/// The tools an agent may name: the built-in sandbox tools and `ask_user`.
pub const AGENT_TOOLS: &[&str] = &["read", "write", "edit", "grep", "bash", "ask_user"];
/// The built-in tools that write in the sandbox root.
pub const WRITING_TOOLS: &[&str] = &["write", "edit", "bash"];

/// An `agent` node's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// The model's name in `models`.
    pub model: Option<String>,
    /// An external agent CLI instead of a model (`claude-code`, `codex`).
    pub engine: Option<String>,
    /// The argv that starts the engine's CLI, before the arguments Cairn
    /// adds (default: `claude` or `codex` from `PATH`).
    pub engine_command: Option<Vec<String>>,
    /// The system prompt (template).
    pub system: Option<String>,
    /// The task (template).
    pub prompt: String,
    /// The tools the agent may call.
    pub tools: Vec<String>,
    /// Child workflows the agent may start, by tool name.
    pub delegates: BTreeMap<String, String>,
    /// Most model calls.
    pub max_steps: u32,
    /// JSON Schema the final answer must match.
    pub output_schema: Option<serde_json::Value>,
    /// How often a non-conforming answer is sent back.
    pub schema_retries: u32,
    /// Most this node may spend on models, in USD.
    pub max_cost_usd: Option<f64>,
}

/// Whether an attempt may change files: an external CLI works in the root
/// with tools of its own; an MCP server's tool (`server.tool`) may write
/// there too.
pub(super) fn may_change_files(a: &AgentSpec) -> bool {
    a.engine.is_some()
        || a.tools
            .iter()
            .any(|t| WRITING_TOOLS.contains(&t.as_str()) || t.contains('.'))
}

fn parse(cx: &mut Cx, v: &Node, _: &Fields<'_>, field: &str) -> Option<NodeKind> {
    agent(cx, v, &join(field, DEF.key)).map(|a| NodeKind::Agent(Box::new(a)))
}

/// The mapping under `agent:`.
fn agent(cx: &mut Cx, node: &Node, field: &str) -> Option<AgentSpec> {
    let f = cx.fields(node, field, DEF.inner, "in agent")?;
    let model = f
        .get("model")
        .and_then(|(_, v)| cx.string(v, &join(field, "model")));
    let engine = match f.get("engine") {
        Some((_, v)) => Some(engine(cx, v, &f, field)?),
        None => None,
    };
    let engine_command = match f.get("engine_command") {
        Some((k, v)) => {
            let cf = join(field, "engine_command");
            if engine.is_none() {
                cx.at(k.pos, Some(&cf), "`engine_command` needs an `engine`");
                return None;
            }
            Some(engine_command(cx, v, &cf)?)
        }
        None => None,
    };
    let delegates = match f.get("delegates") {
        Some((_, v)) => delegates(cx, v, &join(field, "delegates"))?,
        None => BTreeMap::new(),
    };
    if model.is_none() && engine.is_none() {
        cx.at(
            node.pos,
            Some(&join(field, "model")),
            "missing required field `model` (a name from `models`)",
        );
    }
    let system = f
        .get("system")
        .and_then(|(_, v)| cx.template(v, &join(field, "system")));
    let prompt = match f.get("prompt") {
        Some((_, v)) => cx.template(v, &join(field, "prompt")),
        None => {
            cx.at(
                node.pos,
                Some(&join(field, "prompt")),
                "missing required field `prompt` (the agent's task)",
            );
            None
        }
    };
    let tools = match f.get("tools") {
        Some((_, v)) => tools(cx, v, &join(field, "tools")),
        None => Vec::new(),
    };
    let max_steps = match f.get("max_steps") {
        Some((_, v)) => cx
            .uint(v, &join(field, "max_steps"), 1)
            .map(|n| n.min(100_000) as u32),
        None => Some(40),
    };
    let output_schema = match f.get("output_schema") {
        Some((_, v)) => Some(cx.json_schema(v, &join(field, "output_schema"))?),
        None => None,
    };
    let schema_retries = match f.get("schema_retries") {
        Some((_, v)) => cx
            .uint(v, &join(field, "schema_retries"), 0)
            .map(|n| n.min(100) as u32),
        None => Some(2),
    };
    let max_cost_usd = match f.get("max_cost_usd") {
        Some((_, v)) => Some(cx.positive(v, &join(field, "max_cost_usd"))?),
        None => None,
    };
    Some(AgentSpec {
        model,
        engine,
        engine_command,
        system,
        prompt: prompt?,
        tools,
        delegates,
        max_steps: max_steps?,
        output_schema,
        schema_retries: schema_retries?,
        max_cost_usd,
    })
}

/// `engine`: one of [`AGENT_ENGINES`], and none of the settings of Cairn's
/// own loop beside it.
fn engine(cx: &mut Cx, v: &Node, f: &Fields<'_>, field: &str) -> Option<String> {
    let ef = join(field, "engine");
    let engine = cx.string(v, &ef)?;
    if !AGENT_ENGINES.contains(&engine.as_str()) {
        cx.at_hint(
            v.pos,
            Some(&ef),
            format!("unknown agent engine `{engine}`"),
            Some(format!("the engines are: {}", AGENT_ENGINES.join(", "))),
        );
        return None;
    }
    // An external CLI brings its own tools and loop.
    for key in ["tools", "delegates", "max_steps", "schema_retries"] {
        if let Some((k, _)) = f.get(key) {
            cx.at_hint(
                k.pos,
                Some(&join(field, key)),
                format!("`{key}` does not apply to an agent run by `engine: {engine}`"),
                Some("the CLI uses its own tools and loop".into()),
            );
            return None;
        }
    }
    Some(engine)
}

/// `engine_command`: a non-empty argv of strings.
fn engine_command(cx: &mut Cx, v: &Node, cf: &str) -> Option<Vec<String>> {
    let Yaml::Seq(items) = &v.value else {
        cx.at(
            v.pos,
            Some(cf),
            format!(
                "expected a list (the argv before the CLI's own arguments), found {}",
                v.value.type_name()
            ),
        );
        return None;
    };
    let argv: Vec<String> = items
        .iter()
        .enumerate()
        .filter_map(|(i, it)| cx.string(it, &format!("{cf}[{i}]")))
        .collect();
    if argv.is_empty() || argv.len() != items.len() {
        cx.at(v.pos, Some(cf), "the argv is empty");
        return None;
    }
    Some(argv)
}

/// `tools`: built-in tool names and MCP tools (`server.tool`, `server.*`),
/// each once; the servers are checked once the file is read
/// ([`check_mcp_tools`]).
fn tools(cx: &mut Cx, v: &Node, tf: &str) -> Vec<String> {
    let mut tools = Vec::new();
    let Yaml::Seq(items) = &v.value else {
        cx.at(
            v.pos,
            Some(tf),
            format!(
                "expected a list of tool names, found {}",
                v.value.type_name()
            ),
        );
        return tools;
    };
    for (i, item) in items.iter().enumerate() {
        let itf = format!("{tf}[{i}]");
        let Some(name) = cx.string(item, &itf) else {
            continue;
        };
        if tools.contains(&name) {
            cx.at(
                item.pos,
                Some(&itf),
                format!("tool `{name}` is listed twice"),
            );
        } else if AGENT_TOOLS.contains(&name.as_str()) {
            tools.push(name);
        } else if let Some((server, tool)) = name.split_once('.') {
            if is_node_id(server) && !tool.is_empty() && !tool.contains('.') {
                tools.push(name);
            } else {
                cx.at_hint(
                    item.pos,
                    Some(&itf),
                    format!("`{name}` is not an MCP tool name"),
                    Some("write `server.tool`, or `server.*` for all of a server's tools".into()),
                );
            }
        } else {
            let mut hint = String::new();
            if let Some(c) = closest(&name, AGENT_TOOLS.iter().copied()) {
                hint.push_str(&format!("did you mean `{c}`? "));
            }
            hint.push_str(&format!("the tools are: {}", AGENT_TOOLS.join(", ")));
            cx.at_hint(
                item.pos,
                Some(&itf),
                format!("unknown tool `{name}`"),
                Some(hint),
            );
        }
    }
    tools
}

/// An agent's `delegates`: tool names to child workflow paths. The names
/// become tools the model calls, so they follow the tools' rule and must
/// not hide a built-in tool.
fn delegates(cx: &mut Cx, node: &Node, field: &str) -> Option<BTreeMap<String, String>> {
    let Yaml::Map(entries) = &node.value else {
        cx.at(
            node.pos,
            Some(field),
            format!(
                "expected a mapping of tool names to workflow files, found {}",
                node.value.type_name()
            ),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (k, v) in entries {
        let name = k.key_text();
        let ef = join(field, &name);
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            cx.at_hint(
                k.pos,
                Some(&ef),
                format!("`{name}` is not a valid delegate name"),
                Some("use 1 to 64 letters, digits, `_` and `-`: it is the tool's name".into()),
            );
            ok = false;
            continue;
        }
        if AGENT_TOOLS.contains(&name.as_str()) {
            cx.at_hint(
                k.pos,
                Some(&ef),
                format!("delegate `{name}` has the name of a built-in tool"),
                Some("give the delegate another name".into()),
            );
            ok = false;
            continue;
        }
        match super::child_path(cx, v, &ef) {
            Some(p) => {
                out.insert(name, p);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Every agent names a model the workflow declares (checked once the
/// whole file is read: `models` may come after `nodes`).
pub(crate) fn check_models(
    cx: &mut Cx,
    nodes: &[NodeSpec],
    field: &str,
    models: &BTreeMap<String, ModelConfig>,
) {
    for (i, n) in nodes.iter().enumerate() {
        let nf = format!("{field}[{i}]");
        if let NodeKind::Agent(a) = &n.kind {
            if let Some(m) = &a.model {
                if !models.contains_key(m) {
                    let hint = unknown_model_hint(models);
                    cx.at_hint(
                        Pos {
                            line: n.line,
                            col: 1,
                        },
                        Some(&format!("{nf}.agent.model")),
                        format!(
                            "node `{}` names model `{m}`, which `models` does not declare",
                            n.id
                        ),
                        Some(hint),
                    );
                }
            }
        }
        if let Some((body, nodes)) = n.kind.body() {
            check_models(cx, nodes, &format!("{nf}.{body}"), models);
        }
    }
}

/// Every agent's `server.tool` names a server of `mcp_servers` (checked
/// once the whole file is read).
pub(crate) fn check_mcp_tools(
    cx: &mut Cx,
    nodes: &[NodeSpec],
    field: &str,
    servers: &BTreeMap<String, McpServerDef>,
) {
    for (i, n) in nodes.iter().enumerate() {
        let nf = format!("{field}[{i}]");
        if let NodeKind::Agent(a) = &n.kind {
            for t in &a.tools {
                let Some((server, _)) = t.split_once('.') else {
                    continue;
                };
                if !servers.contains_key(server) {
                    let hint = if servers.is_empty() {
                        "declare it under `mcp_servers:` at the top level".to_string()
                    } else {
                        format!(
                            "the workflow's MCP servers are: {}",
                            servers.keys().cloned().collect::<Vec<_>>().join(", ")
                        )
                    };
                    cx.at_hint(
                        Pos { line: n.line, col: 1 },
                        Some(&format!("{nf}.agent.tools")),
                        format!("tool `{t}` names MCP server `{server}`, which `mcp_servers` does not declare"),
                        Some(hint),
                    );
                }
            }
        }
        if let Some((body, nodes)) = n.kind.body() {
            check_mcp_tools(cx, nodes, &format!("{nf}.{body}"), servers);
        }
    }
}
