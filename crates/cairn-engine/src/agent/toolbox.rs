//! The tools an agent may call, and how one step's calls run: each a
//! recorded call with the idempotency key of its place in the
//! conversation, reads side by side, side effects one at a time, and
//! whatever the model gets wrong (an unknown tool, arguments that are not
//! JSON) a result it reads rather than the node's failure.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_agent::{ToolCall, ToolDef, ToolResult};
use cairn_events::ErrorInfo;
use cairn_tools::Tool;
use serde_json::{json, Value};

use super::history::{outcome, History};
use super::tool_result;
use crate::child::{child_run_id, ChildSpec};
use crate::node::{CallInfo, NodeCtx, NodeError};

/// The name of the tool that asks a person.
const ASK_USER: &str = "ask_user";

/// Longest question a model may ask a person.
const MAX_QUESTION_BYTES: usize = 4096;

/// What an agent may call.
pub(super) struct Toolbox<'a> {
    ctx: &'a NodeCtx,
    builtin: Vec<Arc<dyn Tool>>,
    ask_user: bool,
    /// Delegates: tool name to child workflow path.
    delegates: BTreeMap<String, String>,
    /// MCP tools by the name the model knows them by.
    mcp: BTreeMap<String, McpTool>,
    defs: Vec<ToolDef>,
}

/// An MCP server's tool as an agent has it.
struct McpTool {
    /// `server.tool`, as the log names it.
    log_name: String,
    /// The tool's name on its server.
    tool: String,
    server: String,
    conn: Arc<cairn_mcp::Connection>,
    read_only: bool,
    idempotent: bool,
}

/// How one call of a step is to be carried out.
enum Plan<'c> {
    /// Its result is in the store already.
    Known(Result<Value, ErrorInfo>),
    /// It started before a crash and may have taken effect.
    Unknown,
    /// It is to run now.
    Run(&'c ToolCall, bool),
}

impl<'a> Toolbox<'a> {
    /// The tools `names` names (built-in sandbox tools and `ask_user`),
    /// and one tool per delegate. The workflow was validated, so an
    /// unknown name is the engine's mistake (or a kind of tool this build
    /// does not have).
    pub(super) async fn new(
        ctx: &'a NodeCtx,
        names: &[String],
        delegates: &BTreeMap<String, String>,
    ) -> Result<Toolbox<'a>, NodeError> {
        let mut builtin = Vec::new();
        let mut ask_user = false;
        let mut defs = Vec::new();
        let mut mcp = BTreeMap::new();
        for name in names {
            if let Some((server, pattern)) = name.split_once('.') {
                add_mcp_tools(ctx, server, pattern, &mut mcp, &mut defs).await?;
                continue;
            }
            if name == ASK_USER {
                ask_user = true;
                defs.push(ToolDef {
                    name: ASK_USER.into(),
                    description: "Ask the person running this workflow a question and wait for \
                                  the answer. Use it when you need a decision or information \
                                  that only they have."
                        .into(),
                    parameters: json!({
                        "type": "object",
                        "properties": {
                            "question": {"type": "string", "description": "The question."},
                            "schema": {"type": "object", "description": "Optional JSON Schema the answer must match."}
                        },
                        "required": ["question"],
                        "additionalProperties": false
                    }),
                });
                continue;
            }
            let Some(tool) = ctx.services.tools.get(name) else {
                return Err(NodeError::fatal(
                    "unsupported",
                    format!("the agent's tool `{name}` is not available in this build of Cairn"),
                ));
            };
            let spec = tool.spec();
            defs.push(ToolDef {
                name: spec.name.clone(),
                description: spec.description.clone(),
                parameters: spec.args_schema.clone(),
            });
            builtin.push(tool);
        }
        for (name, path) in delegates {
            defs.push(delegate_def(ctx, name, path)?);
        }
        Ok(Toolbox {
            ctx,
            builtin,
            ask_user,
            delegates: delegates.clone(),
            mcp,
            defs,
        })
    }

    /// The tools as the model is told of them.
    pub(super) fn defs(&self) -> &[ToolDef] {
        &self.defs
    }

    fn find(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.builtin.iter().find(|t| t.spec().name == name)
    }

    /// Whether a call may run beside others, and again after a crash cut
    /// it short: reads, questions (the answer is kept), and delegations (a
    /// call takes up the child run it started).
    fn reads_only(&self, name: &str) -> bool {
        if (name == ASK_USER && self.ask_user) || self.delegates.contains_key(name) {
            return true;
        }
        if let Some(t) = self.mcp.get(name) {
            return t.read_only;
        }
        self.find(name).is_some_and(|t| !t.spec().side_effect)
    }

    /// Carries out the calls of step `step` in the model's order, taking
    /// from `history` what an earlier attempt of the conversation already
    /// did, and returns their results in that order.
    pub(super) async fn run_calls(
        &self,
        history: &History,
        step: u32,
        calls: &[ToolCall],
    ) -> Result<Vec<ToolResult>, NodeError> {
        let ctx = self.ctx;
        let keys: Vec<String> = (0..calls.len())
            .map(|i| {
                cairn_tools::agent_call_key(
                    &history.key_run,
                    ctx.node_id.as_str(),
                    ctx.iteration,
                    history.origin,
                    step,
                    i as u32,
                )
            })
            .collect();
        let plans: Vec<Plan> = calls
            .iter()
            .zip(&keys)
            .map(|(call, key)| match history.calls.get(key) {
                None => Plan::Run(call, self.reads_only(&call.name)),
                Some(rec) => match outcome(rec) {
                    Some(result) => Plan::Known(result),
                    // A read is harmless to run again; a side effect is not,
                    // unless its tool says repeating it is harmless.
                    None if self.reads_only(&call.name) => Plan::Run(call, true),
                    None if self.mcp.get(&call.name).is_some_and(|t| t.idempotent) => {
                        Plan::Run(call, false)
                    }
                    None => Plan::Unknown,
                },
            })
            .collect();
        let mut results: Vec<Option<Result<Value, ErrorInfo>>> = vec![None; calls.len()];
        let mut i = 0;
        while i < plans.len() {
            match &plans[i] {
                Plan::Known(r) => {
                    results[i] = Some(r.clone());
                    i += 1;
                }
                Plan::Unknown => {
                    results[i] = Some(Err(ErrorInfo::new(
                        "interrupted",
                        format!(
                            "this call was started before Cairn stopped and may or may not have \
                             taken effect (idempotency key {}); check its effect before \
                             repeating it",
                            keys[i]
                        ),
                    )));
                    i += 1;
                }
                Plan::Run(call, false) => {
                    results[i] = Some(self.run_one(call, &keys[i]).await?);
                    i += 1;
                }
                Plan::Run(_, true) => {
                    // A run of reads: side by side.
                    let mut j = i;
                    let mut batch = Vec::new();
                    while let Some(Plan::Run(call, true)) = plans.get(j) {
                        batch.push((j, self.run_one(call, &keys[j])));
                        j += 1;
                    }
                    let (at, futs): (Vec<usize>, Vec<_>) = batch.into_iter().unzip();
                    for (k, r) in at.into_iter().zip(futures::future::join_all(futs).await) {
                        results[k] = Some(r?);
                    }
                    i = j;
                }
            }
        }
        Ok(calls
            .iter()
            .zip(results)
            .map(|(call, r)| {
                let r = r.unwrap_or_else(|| Err(ErrorInfo::new("internal", "not run")));
                tool_result(&call.id, &call.name, &r)
            })
            .collect())
    }

    /// Runs one call as a recorded call. What the model got wrong is the
    /// inner error; the outer one stops the attempt.
    async fn run_one(
        &self,
        call: &ToolCall,
        key: &str,
    ) -> Result<Result<Value, ErrorInfo>, NodeError> {
        let ctx = self.ctx;
        let args = parse_args(&call.args);
        let input = args
            .clone()
            .unwrap_or_else(|_| Value::String(call.args.clone()));
        if call.name == ASK_USER && self.ask_user {
            let info = CallInfo {
                name: ASK_USER,
                key: Some(key.to_string()),
                side_effect: false,
                idempotent: true,
                output_limit: usize::MAX,
            };
            return ctx
                .recorded_call(info, input, |_, key| async move {
                    let args = args?;
                    let question = args
                        .get("question")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ErrorInfo::new("arguments", "`question` must be a string"))?
                        .to_string();
                    if question.len() > MAX_QUESTION_BYTES {
                        return Err(ErrorInfo::new(
                            "arguments",
                            format!("`question` is longer than {MAX_QUESTION_BYTES} bytes"),
                        ));
                    }
                    let schema = args.get("schema").cloned().filter(|s| !s.is_null());
                    // A schema no answer could be checked against would
                    // leave the question open for ever.
                    if let Some(s) = &schema {
                        if let Err(e) = jsonschema::validator_for(s) {
                            return Err(ErrorInfo::new(
                                "arguments",
                                format!("`schema` is not a valid JSON Schema: {e}"),
                            ));
                        }
                    }
                    ctx.ask_person(question, schema, Some(key))
                        .await
                        .map_err(|e| *e.info)
                })
                .await
                .and_then(diverged_fails_the_node);
        }
        if let Some(path) = self.delegates.get(&call.name) {
            return self.delegate(call, key, path, args, input).await;
        }
        if let Some(tool) = self.mcp.get(&call.name) {
            return self.call_mcp(tool, key, args, input).await;
        }
        match self.find(&call.name) {
            Some(tool) => match args {
                Ok(args) => {
                    ctx.run_tool(tool, args, Some(key.to_string()), &Default::default())
                        .await
                }
                Err(e) => self.refuse(call, key, input, e).await,
            },
            None => {
                let known: Vec<&str> = self.defs.iter().map(|d| d.name.as_str()).collect();
                let e = ErrorInfo::new(
                    "unknown_tool",
                    format!(
                        "there is no tool `{}`; the tools are: {}",
                        call.name,
                        known.join(", ")
                    ),
                );
                self.refuse(call, key, input, e).await
            }
        }
    }

    /// Runs a delegate: a child run of its workflow with the call's
    /// arguments as input, whose output (or error) is the result. The
    /// child's id comes from the call's key, so the call made again after
    /// a crash waits for the same child. At most the run's concurrency of
    /// children go at once.
    async fn delegate(
        &self,
        call: &ToolCall,
        key: &str,
        path: &str,
        args: Result<Value, ErrorInfo>,
        input: Value,
    ) -> Result<Result<Value, ErrorInfo>, NodeError> {
        let ctx = self.ctx;
        let info = CallInfo {
            name: &call.name,
            key: Some(key.to_string()),
            side_effect: true,
            idempotent: true,
            output_limit: ctx.services.sandbox_limit(&ctx.workflow),
        };
        let name = call.name.clone();
        let result = ctx
            .recorded_call(info, input, |_, key| async move {
                let args = args?;
                let _slot = ctx
                    .child_slots
                    .acquire()
                    .await
                    .map_err(|_| ErrorInfo::new(crate::node::STOPPED, "the run stopped"))?;
                ctx.run_child(ChildSpec {
                    run_id: child_run_id(&ctx.run_id, ctx.depth, &key),
                    path: path.to_string(),
                    agent: name,
                    input: args,
                })
                .await
                .map_err(|e| *e.info)
            })
            .await?;
        let limit = ctx.services.sandbox_limit(&ctx.workflow);
        Ok(result.map(|v| crate::node::cut_json(&v, limit)))
    }

    /// Calls an MCP server's tool as a recorded call, named `server.tool`
    /// in the log, with the call's idempotency key in the request.
    async fn call_mcp(
        &self,
        tool: &McpTool,
        key: &str,
        args: Result<Value, ErrorInfo>,
        input: Value,
    ) -> Result<Result<Value, ErrorInfo>, NodeError> {
        let ctx = self.ctx;
        let limit = ctx.services.sandbox_limit(&ctx.workflow);
        let info = CallInfo {
            name: &tool.log_name,
            key: Some(key.to_string()),
            side_effect: !tool.read_only,
            idempotent: tool.idempotent,
            output_limit: limit,
        };
        let timeout = ctx
            .mcp
            .as_ref()
            .map_or(std::time::Duration::from_secs(60), |p| {
                p.timeout(&tool.server)
            });
        let result = ctx
            .recorded_call(info, input, |_, key| async move {
                let args = args?;
                tokio::select! {
                    r = tool.conn.call(&tool.tool, args, &key, timeout) => match r {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(message)) => Err(ErrorInfo::new("tool", message)),
                        Err(e) => Err(ErrorInfo::new("mcp", format!("MCP server `{}`: {e}", tool.server))),
                    },
                    _ = ctx.cancel.cancelled() => {
                        Err(ErrorInfo::new(crate::node::STOPPED, "the call was cancelled"))
                    }
                }
            })
            .await?;
        Ok(result.map(|v| crate::node::cut_json(&v, limit)))
    }

    /// Records a call that cannot run, with the reason as its result.
    async fn refuse(
        &self,
        call: &ToolCall,
        key: &str,
        input: Value,
        error: ErrorInfo,
    ) -> Result<Result<Value, ErrorInfo>, NodeError> {
        let info = CallInfo {
            name: &call.name,
            key: Some(key.to_string()),
            side_effect: false,
            idempotent: true,
            output_limit: usize::MAX,
        };
        self.ctx
            .recorded_call(info, input, |_, _| async move { Err(error) })
            .await
    }
}

/// The model-facing name of an MCP tool: providers allow only letters,
/// digits, `_` and `-` (at most 64), so `server.tool` becomes
/// `server__tool`, other characters `_`.
fn mcp_tool_name(server: &str, tool: &str) -> String {
    let mut name: String = format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(64);
    name
}

/// Connects to `server` (started on first use) and adds the tools that
/// `pattern` (`*` or a tool's name) names.
async fn add_mcp_tools(
    ctx: &NodeCtx,
    server: &str,
    pattern: &str,
    out: &mut BTreeMap<String, McpTool>,
    defs: &mut Vec<ToolDef>,
) -> Result<(), NodeError> {
    let pool = ctx
        .mcp
        .as_ref()
        .ok_or_else(|| NodeError::fatal("mcp", "MCP servers are not available here"))?;
    let conn = pool
        .connect(server, &ctx.process_env)
        .await
        .map_err(|e| NodeError::new("mcp", format!("MCP server `{server}`: {e}")))?;
    let mut found = false;
    for t in conn.tools() {
        if pattern != "*" && t.name != pattern {
            continue;
        }
        found = true;
        let name = mcp_tool_name(server, &t.name);
        if out.contains_key(&name) || defs.iter().any(|d| d.name == name) {
            continue;
        }
        defs.push(ToolDef {
            name: name.clone(),
            description: t.description.clone(),
            parameters: t.input_schema.clone(),
        });
        out.insert(
            name,
            McpTool {
                log_name: format!("{server}.{}", t.name),
                tool: t.name.clone(),
                server: server.to_string(),
                conn: conn.clone(),
                read_only: t.read_only,
                idempotent: t.idempotent,
            },
        );
    }
    if !found {
        let have: Vec<&str> = conn
            .tools()
            .iter()
            .map(|t| t.name.as_str())
            .take(30)
            .collect();
        return Err(NodeError::fatal(
            "mcp",
            format!(
                "MCP server `{server}` has no tool `{pattern}`; it has: {}",
                have.join(", ")
            ),
        ));
    }
    Ok(())
}

/// How a delegate is shown to the model: its workflow's description and
/// input schema (an object schema, as providers require of tools).
fn delegate_def(ctx: &NodeCtx, name: &str, path: &str) -> Result<ToolDef, NodeError> {
    let wf = ctx
        .workflow
        .child(&ctx.workflow.resolve(path))
        .map_err(|e| NodeError::fatal("workflow", format!("delegate `{name}`: {e}")))?;
    let parameters = match &wf.input_schema {
        Some(s) if s.get("type").and_then(Value::as_str) == Some("object") => s.clone(),
        _ => json!({"type": "object"}),
    };
    let about = wf
        .description
        .clone()
        .unwrap_or_else(|| format!("Runs the workflow `{}`.", wf.name));
    Ok(ToolDef {
        name: name.to_string(),
        description: format!(
            "{about} Starts it as a child run with the arguments as its input and \
             returns its output once it has finished. Several calls run side by side."
        ),
        parameters,
    })
}

/// A call's arguments as the model wrote them: a JSON object (an empty
/// string is no arguments).
fn parse_args(raw: &str) -> Result<Value, ErrorInfo> {
    if raw.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(ErrorInfo::new(
            "arguments",
            "the arguments must be a JSON object",
        )),
        Err(e) => Err(ErrorInfo::new(
            "arguments",
            format!("the arguments are not valid JSON: {e}"),
        )),
    }
}

/// A question a replay's original never asked stops the node, rather than
/// being a result the model reads and answers around.
fn diverged_fails_the_node(
    r: Result<Value, ErrorInfo>,
) -> Result<Result<Value, ErrorInfo>, NodeError> {
    match r {
        Err(info) if info.kind == crate::replay::DIVERGED => Err(NodeError {
            info: Box::new(info),
            retryable: false,
            cancelled: false,
        }),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    #[test]
    fn arguments_must_be_a_json_object() {
        assert!(parse_args("").unwrap().as_object().unwrap().is_empty());
        assert!(parse_args("{\"path\": \"a\"}").is_ok());
        assert_eq!(parse_args("[1]").unwrap_err().kind, "arguments");
        assert!(parse_args("{\"path\": ")
            .unwrap_err()
            .message
            .contains("not valid JSON"));
    }
}
