//! The tool trait, the call context, the registry and idempotency keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_events::NetworkAction;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::error::ToolError;
use crate::process::{ProcessObserver, Stream};
use crate::sandbox::Sandbox;

/// What a tool is and what calling it may do to the world.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The name workflows call it by.
    pub name: String,
    /// Whether a call changes something outside Cairn (files, processes,
    /// remote APIs). The engine warns an agent before repeating such calls.
    pub side_effect: bool,
    /// Whether repeating a call with the same arguments is harmless.
    pub idempotent: bool,
    /// One line for people and models.
    pub description: String,
    /// JSON Schema of the arguments.
    pub args_schema: Value,
}

/// Hears about a tool call while it runs: its process (through
/// [`ProcessObserver`]) and its network decisions, which the engine turns into
/// `NetworkAccess` events.
pub trait ToolObserver: ProcessObserver {
    /// A network access was allowed or blocked, with its target (URL, host or
    /// program) and the rule that decided.
    fn network(&self, action: NetworkAction, target: &str, reason: &str) {
        let _ = (action, target, reason);
    }
}

impl ToolObserver for crate::process::NoopObserver {}

/// Lets a `&dyn ToolObserver` be handed to the process runner.
pub(crate) struct AsProcessObserver<'a>(pub &'a dyn ToolObserver);

impl ProcessObserver for AsProcessObserver<'_> {
    fn spawned(&self, pid: u32) {
        self.0.spawned(pid)
    }
    fn output(&self, stream: Stream, text: &str) {
        self.0.output(stream, text)
    }
    fn network_refused(&self, target: &str, reason: &str) {
        self.0.network(NetworkAction::Blocked, target, reason)
    }
    fn network_allowed(&self, target: &str, reason: &str) {
        self.0.network(NetworkAction::Allowed, target, reason)
    }
    fn limits_weakened(&self, why: &str) {
        self.0.limits_weakened(why)
    }
}

/// Everything a call knows about where it runs.
pub struct ToolContext<'a> {
    /// The root, network policy, limits and environment.
    pub sandbox: &'a Sandbox,
    /// The run making the call.
    pub run_id: &'a str,
    /// The node (path) making the call.
    pub node_id: &'a str,
    /// The loop pass, 0 outside loops.
    pub iteration: u32,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The call's position within the attempt, from 1 (`toolSeq`).
    pub tool_seq: u32,
    /// Stable across retries and resumes; see [`idempotency_key`]. Tools that
    /// call external APIs pass it on so a repeated call is recognised.
    pub idempotency_key: String,
    /// Where output and network decisions go.
    pub observer: &'a dyn ToolObserver,
    /// Cancels the call (a running process is killed).
    pub cancel: CancellationToken,
}

impl<'a> ToolContext<'a> {
    /// A context whose idempotency key is derived from run, node, iteration
    /// and `tool_seq` (the call index), so a retry's n-th call gets the same
    /// key as the first attempt's n-th call.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sandbox: &'a Sandbox,
        run_id: &'a str,
        node_id: &'a str,
        iteration: u32,
        attempt: u32,
        tool_seq: u32,
        observer: &'a dyn ToolObserver,
        cancel: CancellationToken,
    ) -> Self {
        ToolContext {
            sandbox,
            run_id,
            node_id,
            iteration,
            attempt,
            tool_seq,
            idempotency_key: idempotency_key(run_id, node_id, iteration, tool_seq),
            observer,
            cancel,
        }
    }
}

/// A tool: built-in or custom, registered once in a [`ToolRegistry`].
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// Name, side-effect class and argument schema.
    fn spec(&self) -> ToolSpec;
    /// Runs one call. `args` is the JSON object the workflow (or agent) gave.
    async fn call(&self, args: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError>;
}

/// The tools a run may call, by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// `read`, `write`, `edit`, `grep` and `bash`.
    pub fn builtin() -> Self {
        let mut r = Self::new();
        r.register(Arc::new(crate::fs::ReadTool));
        r.register(Arc::new(crate::fs::WriteTool));
        r.register(Arc::new(crate::edit::EditTool));
        r.register(Arc::new(crate::grep::GrepTool));
        r.register(Arc::new(crate::bash::BashTool));
        r
    }

    /// Adds a tool; one with the same name is replaced (so a deployment can
    /// swap a built-in for its own).
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name, tool);
    }

    /// The tool of that name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// All names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// All specs, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }

    /// Looks the tool up and calls it.
    pub async fn call(
        &self,
        name: &str,
        args: Value,
        ctx: &ToolContext<'_>,
    ) -> Result<Value, ToolError> {
        let tool = self
            .get(name)
            .ok_or_else(|| ToolError::UnknownTool(name.to_string()))?;
        tool.call(args, ctx).await
    }
}

/// The idempotency key of a call: `ck_` and the SHA-256 (hex) of run, node,
/// iteration and call index. The attempt is deliberately left out, so the
/// same call in a retry or after a resume carries the same key. Fields are
/// length-prefixed so that no two tuples hash the same input.
pub fn idempotency_key(run_id: &str, node_id: &str, iteration: u32, call_index: u32) -> String {
    let mut h = Sha256::new();
    for part in [run_id.as_bytes(), node_id.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(iteration.to_le_bytes());
    h.update(call_index.to_le_bytes());
    format!("ck_{}", hex::encode(h.finalize()))
}

/// The idempotency key of the `index`th tool call (from 0) that step `step`
/// of an agent's conversation asked for: the same however often a crash
/// cuts the conversation short and a resume takes it up, and different in
/// the fresh conversation a retry after a failure begins (`conversation` is
/// the attempt that began it).
pub fn agent_call_key(
    run_id: &str,
    node_id: &str,
    iteration: u32,
    conversation: u32,
    step: u32,
    index: u32,
) -> String {
    let mut h = Sha256::new();
    h.update(b"agent-call\0");
    for part in [run_id.as_bytes(), node_id.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    for n in [iteration, conversation, step, index] {
        h.update(n.to_le_bytes());
    }
    format!("ck_{}", hex::encode(h.finalize()))
}

/// Reads tool arguments field by field so that every error names its field.
pub(crate) struct Args<'a> {
    tool: &'static str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    pub(crate) fn new(
        tool: &'static str,
        args: &'a Value,
        allowed: &[&str],
    ) -> Result<Self, ToolError> {
        let map = args.as_object().ok_or_else(|| {
            ToolError::bad_args(
                tool,
                "args",
                format!("expected an object, got {}", type_name(args)),
            )
        })?;
        for key in map.keys() {
            if !allowed.contains(&key.as_str()) {
                return Err(ToolError::bad_args(
                    tool,
                    key,
                    format!("unknown argument (expected one of: {})", allowed.join(", ")),
                ));
            }
        }
        Ok(Args { tool, map })
    }

    fn present(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    pub(crate) fn err(&self, field: &str, message: impl Into<String>) -> ToolError {
        ToolError::bad_args(self.tool, field, message)
    }

    pub(crate) fn opt_str(&self, field: &str) -> Result<Option<&'a str>, ToolError> {
        match self.present(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(field, format!("expected a string, got {}", type_name(v)))),
        }
    }

    pub(crate) fn str(&self, field: &str) -> Result<&'a str, ToolError> {
        self.opt_str(field)?
            .ok_or_else(|| self.err(field, "is required"))
    }

    pub(crate) fn opt_u64(&self, field: &str) -> Result<Option<u64>, ToolError> {
        match self.present(field) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.err(field, format!("expected a non-negative integer, got {v}"))
            }),
        }
    }

    pub(crate) fn opt_bool(&self, field: &str) -> Result<Option<bool>, ToolError> {
        match self.present(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(
                field,
                format!("expected true or false, got {}", type_name(v)),
            )),
        }
    }

    pub(crate) fn opt(&self, field: &str) -> Option<&'a Value> {
        self.present(field)
    }
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
