//! The node-kind trait and what a running node may do.
//!
//! Every leaf kind implements [`NodeRunner`] in a module of its own under
//! `kinds/`; [`runner_for`] (`kinds/mod.rs`) maps a workflow's kind to its
//! runner with an exhaustive match. Groups (`loop`, `for_each`) are
//! structure, handled by the driver, not runners.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cairn_events::{
    ErrorInfo, EventKind, NetworkAction, NodePath, OutputStream, RunId, Scope, ToolStatus,
};
use cairn_store::{ProcessRecord, RunLog, StoreError, ToolCallRecord, ToolCallStatus};
use cairn_tools::process::{ProcessObserver, Stream};
use cairn_workflow::{NodeSpec, Templates, Workflow};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use crate::kinds::runner_for;
use crate::plan::Key;
use crate::services::Services;

/// Why a node attempt did not produce an output.
#[derive(Debug, Clone)]
pub struct NodeError {
    /// Boxed: an error travels in every `Result` of a node's code, and
    /// the info is large next to the value it stands beside.
    pub info: Box<ErrorInfo>,
    /// False for failures a retry cannot mend (a denied approval, a bad template).
    pub retryable: bool,
    /// The attempt was stopped by a cancel, not by its own failure.
    pub cancelled: bool,
}

impl NodeError {
    /// A failure that a retry may mend.
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        NodeError {
            info: Box::new(ErrorInfo::new(kind, message)),
            retryable: true,
            cancelled: false,
        }
    }

    /// A failure that a retry cannot mend.
    pub fn fatal(kind: &str, message: impl Into<String>) -> Self {
        NodeError {
            retryable: false,
            ..NodeError::new(kind, message)
        }
    }

    /// The attempt was cancelled.
    pub fn cancelled(reason: impl Into<String>) -> Self {
        NodeError {
            info: Box::new(ErrorInfo::new("cancelled", reason)),
            retryable: false,
            cancelled: true,
        }
    }

    /// The same error with details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.info.details = Some(details);
        self
    }
}

impl From<StoreError> for NodeError {
    fn from(e: StoreError) -> Self {
        NodeError::new("store", e.to_string())
    }
}

/// The error kind of [`NodeError::cancelled`]: a recorded call whose body
/// fails with it was stopped (a child run stopped with the engine), not
/// failed, and the attempt stops with it.
pub(crate) const STOPPED: &str = "cancelled";

/// What [`NodeCtx::recorded_call`] records of a call besides its input.
pub(crate) struct CallInfo<'a> {
    /// The tool's name as the log shows it.
    pub name: &'a str,
    /// The idempotency key; `None` derives it from the call's `toolSeq`.
    pub key: Option<String>,
    /// Whether the call changes anything outside Cairn.
    pub side_effect: bool,
    /// Whether repeating the call is harmless.
    pub idempotent: bool,
    /// The most bytes of its result that are kept (and handed on).
    pub output_limit: usize,
}

/// A person's decision, as an approval node receives it.
#[derive(Debug, Clone)]
pub struct Decision {
    pub approved: bool,
    pub note: Option<String>,
    pub by: Option<String>,
}

/// Requests a running node sends to its run's driver.
pub(crate) enum Ask {
    Approval {
        key: Key,
        message: Option<String>,
        reply: oneshot::Sender<Decision>,
        /// In a replay: the original's decision, recorded at once.
        replayed: Option<Decision>,
    },
    /// A child run of the attempt waits for a person (`Some` with its
    /// status) or goes on again (`None`): the parent waits with it.
    Child {
        key: Key,
        status: Option<cairn_events::RunStatus>,
    },
    /// A question to a person; the answer comes back checked against the
    /// schema.
    Input {
        key: Key,
        request_id: String,
        prompt: String,
        schema: Option<Value>,
        reply: oneshot::Sender<Value>,
        /// In a replay: the original's answer, recorded at once.
        replayed: Option<Value>,
    },
}

/// The request id of a question: the same for the same node pass and
/// `call` whatever the attempt, so that an answer given while the run was
/// down (or to the attempt a crash cut short) reaches the attempt that
/// asks again. Short and safe in a URL path.
pub(crate) fn request_id(node: &str, iteration: u32, call: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((node.len() as u64).to_le_bytes());
    h.update(node.as_bytes());
    h.update(iteration.to_le_bytes());
    h.update(call.unwrap_or("").as_bytes());
    format!("q-{}", &hex::encode(h.finalize())[..16])
}

/// The request id of a hijacked agent's `n`th question to the person at
/// the boundary after step `step` of the conversation begun by attempt
/// `origin`: the same when a resume replays the conversation, so the
/// recorded answer comes back; `h-` tells people's turns from questions.
pub(crate) fn hijack_request_id(
    node: &str,
    iteration: u32,
    origin: u32,
    step: u32,
    n: u32,
) -> String {
    let q = request_id(
        node,
        iteration,
        Some(&format!("hijack:{origin}:{step}:{n}")),
    );
    format!("h-{}", &q[2..])
}

/// `sandbox` with `extra` added to the variables its `bash` calls get (the
/// workflow's `env`, the node's secrets); the same sandbox when there are
/// none.
fn with_process_env(
    sandbox: Arc<cairn_tools::Sandbox>,
    extra: &[(String, String)],
) -> Result<Arc<cairn_tools::Sandbox>, NodeError> {
    if extra.is_empty() {
        return Ok(sandbox);
    }
    let mut env = sandbox.env().to_vec();
    env.extend(extra.iter().cloned());
    let derived = sandbox
        .derive(sandbox.limits())
        .map_err(|e| NodeError::fatal("sandbox", e.to_string()))?
        .with_env(env);
    Ok(Arc::new(derived))
}

/// Everything a node attempt can see and do.
pub struct NodeCtx {
    pub run_id: RunId,
    pub node_id: NodePath,
    pub iteration: u32,
    pub attempt: u32,
    /// The attempt's event scope (node, iteration, attempt, chapter).
    pub scope: Scope,
    /// The template context: input, nodes, iteration, item, index, run, workflow.
    pub vars: Value,
    pub workflow: Arc<Workflow>,
    pub templates: Arc<Templates>,
    /// Cancelled when the run is cancelled or the attempt times out.
    pub cancel: CancellationToken,
    pub timeout: Option<Duration>,
    /// The node's own output limit for tool calls (`max_output_bytes`).
    pub max_output_bytes: Option<usize>,
    pub(crate) services: Arc<Services>,
    pub(crate) log: Arc<RunLog>,
    pub(crate) asks: mpsc::UnboundedSender<Ask>,
    /// What the run has spent on models (the agents' budgets).
    pub(crate) spend: Arc<crate::agent::Spend>,
    /// How many parents the run has: its children are one deeper.
    pub(crate) depth: u32,
    /// The run's budget for child runs its agents start side by side.
    pub(crate) child_slots: Arc<tokio::sync::Semaphore>,
    /// The driver stopped its attempts to wait for a person: children
    /// are left waiting, not cancelled.
    pub(crate) parking: Arc<std::sync::atomic::AtomicBool>,
    /// The run stops when it waits for a person; so do its children.
    pub(crate) exit_on_wait: bool,
    /// The run's MCP servers.
    pub(crate) mcp: Option<Arc<crate::mcp::McpPool>>,
    /// Takes the workspace snapshot before each agent step after the
    /// first, for a node that can change files.
    pub(crate) step_snapshots: Option<crate::driver::Snapshotter>,
    /// Where the run's log was copied from (`cairn fork`): an agent that
    /// continues a conversation begun before the fork names its calls as
    /// the run it was begun in did.
    pub(crate) forked_from: Option<cairn_events::ForkedFrom>,
    /// Raised when a person asks to take the conversation (`cairn
    /// hijack`); an agent looks at it at each step boundary.
    pub(crate) hijack: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Variables every process of the attempt gets besides its own: the
    /// workflow's `env` and the secrets the node names.
    pub(crate) process_env: Vec<(String, String)>,
    /// The run's secrets (a model's `api_key_secret`).
    pub(crate) secrets: Arc<crate::secrets::Secrets>,
    /// For a replay: the original's answers.
    pub(crate) replay: Option<Arc<crate::replay::Replayer>>,
    tool_seq: AtomicU32,
}

impl NodeCtx {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        run_id: RunId,
        key: &Key,
        attempt: u32,
        scope: Scope,
        vars: Value,
        workflow: Arc<Workflow>,
        templates: Arc<Templates>,
        cancel: CancellationToken,
        timeout: Option<Duration>,
        services: Arc<Services>,
        log: Arc<RunLog>,
        asks: mpsc::UnboundedSender<Ask>,
    ) -> Self {
        NodeCtx {
            run_id,
            node_id: key.0.clone(),
            iteration: key.1,
            attempt,
            scope,
            vars,
            workflow,
            templates,
            cancel,
            timeout,
            max_output_bytes: None,
            services,
            log,
            asks,
            spend: Arc::default(),
            depth: 0,
            child_slots: Arc::new(tokio::sync::Semaphore::new(1)),
            parking: Default::default(),
            exit_on_wait: false,
            mcp: None,
            step_snapshots: None,
            forked_from: None,
            hijack: None,
            process_env: Vec::new(),
            secrets: Arc::default(),
            replay: None,
            tool_seq: AtomicU32::new(0),
        }
    }

    /// Logs that the limits of a process this attempt started apply less
    /// than fully (no control group could be made for them).
    pub(crate) fn limits_notice(&self, why: &str) {
        tracing::warn!(run = %self.run_id, node = %self.node_id, "{why}");
        self.emit(EventKind::Diagnostic {
            level: cairn_events::Level::Warn,
            source: "sandbox".into(),
            message: format!("node `{}`: {why}", self.node_id),
        });
    }

    /// Logs that this attempt starts processes without the sandbox, as its
    /// workflow or node asked (`sandbox.isolation: none`).
    pub(crate) fn unconfined_notice(&self) {
        tracing::warn!(run = %self.run_id, node = %self.node_id, "processes run without the sandbox (isolation: none)");
        self.emit(EventKind::Diagnostic {
            level: cairn_events::Level::Warn,
            source: "sandbox".into(),
            message: format!(
                "node `{}` runs its processes without the sandbox (sandbox.isolation: none)",
                self.node_id
            ),
        });
    }

    /// Streams a piece of output (`NodeOutput`).
    pub fn output(&self, stream: OutputStream, text: &str) {
        if text.is_empty() {
            return;
        }
        self.log.append(
            self.scope.clone(),
            EventKind::NodeOutput {
                text: text.to_string(),
                stream,
            },
        );
    }

    /// Appends an attempt-scoped event (tool calls, token usage, network access, ...).
    pub fn emit(&self, kind: EventKind) {
        self.log.append(self.scope.clone(), kind);
    }

    /// Appends an attempt-scoped event and waits until it is durable.
    pub async fn emit_durable(&self, kind: EventKind) -> Result<(), NodeError> {
        self.log.append_durable(self.scope.clone(), kind).await?;
        Ok(())
    }

    /// Renders a template string against this node's context.
    pub fn render(&self, template: &str) -> Result<Value, NodeError> {
        self.templates
            .render(template, &self.vars)
            .map_err(|e| NodeError::fatal("template", e.to_string()))
    }

    /// Renders every string inside a JSON value.
    pub fn render_value(&self, v: &Value) -> Result<Value, NodeError> {
        self.templates
            .render_value(v, &self.vars)
            .map_err(|e| NodeError::fatal("template", e.to_string()))
    }

    /// Asks a person to approve; returns once someone decided (or the
    /// decision already in the log, after a resume).
    pub async fn ask_approval(&self, message: Option<String>) -> Result<Decision, NodeError> {
        let key = (self.node_id.clone(), self.iteration);
        let replayed = match &self.replay {
            Some(r) => match r.decision(&(key.0.to_string(), key.1)) {
                Some(d) => Some(d),
                None => {
                    r.diverged(
                        self,
                        "asks for approval",
                        serde_json::json!({"kind": "approval"}),
                    )?;
                    None
                }
            },
            None => None,
        };
        let (tx, rx) = oneshot::channel();
        self.asks
            .send(Ask::Approval {
                key,
                message,
                reply: tx,
                replayed,
            })
            .map_err(|_| NodeError::cancelled("run stopped"))?;
        tokio::select! {
            d = rx => d.map_err(|_| NodeError::cancelled("run stopped")),
            _ = self.cancel.cancelled() => Err(NodeError::cancelled("cancelled while waiting for approval")),
        }
    }

    /// Asks a person `prompt` and waits for the answer (checked against
    /// `schema` by the driver before it is accepted). `call` tells apart
    /// several questions of one attempt (an agent's parallel `ask_user`
    /// calls); an answer already in the log, after a resume, comes back at
    /// once.
    pub async fn ask_person(
        &self,
        prompt: String,
        schema: Option<Value>,
        call: Option<String>,
    ) -> Result<Value, NodeError> {
        let id = request_id(self.node_id.as_str(), self.iteration, call.as_deref());
        self.ask_person_as(id, prompt, schema).await
    }

    /// [`NodeCtx::ask_person`] with the request id given.
    pub(crate) async fn ask_person_as(
        &self,
        request_id: String,
        prompt: String,
        schema: Option<Value>,
    ) -> Result<Value, NodeError> {
        let replayed = match &self.replay {
            Some(r) => match r.answer(&(self.node_id.to_string(), self.iteration), &prompt) {
                Some(a) => Some(a),
                None => {
                    r.diverged(
                        self,
                        &format!("asks a person {:?}", crate::agent::cut(&prompt, 200)),
                        serde_json::json!({"kind": "question", "requestId": request_id}),
                    )?;
                    None
                }
            },
            None => None,
        };
        let (tx, rx) = oneshot::channel();
        self.asks
            .send(Ask::Input {
                key: (self.node_id.clone(), self.iteration),
                request_id,
                prompt,
                schema,
                reply: tx,
                replayed,
            })
            .map_err(|_| NodeError::cancelled("run stopped"))?;
        tokio::select! {
            a = rx => a.map_err(|_| NodeError::cancelled("run stopped")),
            _ = self.cancel.cancelled() => Err(NodeError::cancelled("cancelled while waiting for an answer")),
        }
    }

    /// Calls a sandboxed tool: records it (`tool_calls` row and
    /// `ToolCallStarted`/`ToolCallFinished`), hands it a stable idempotency key,
    /// and returns its result.
    pub async fn call_tool(&self, name: &str, args: Value) -> Result<Value, NodeError> {
        self.call_tool_in(name, args, &cairn_workflow::NodeSandbox::default())
            .await
    }

    /// [`NodeCtx::call_tool`] with the calling node's own `sandbox:` settings.
    pub async fn call_tool_in(
        &self,
        name: &str,
        args: Value,
        node_sandbox: &cairn_workflow::NodeSandbox,
    ) -> Result<Value, NodeError> {
        let tool = self.services.tools.get(name).ok_or_else(|| {
            NodeError::fatal(
                "tool",
                format!(
                    "no tool named `{name}`; known tools: {}",
                    self.services.tools.names().join(", ")
                ),
            )
        })?;
        let result = self.run_tool(&tool, args, None, node_sandbox).await?;
        match result {
            Ok(v) => Ok(v),
            Err(info) => {
                // A sandbox the kernel cannot build stays unbuildable.
                let retryable = info.kind != "sandbox";
                Err(NodeError {
                    info: Box::new(info),
                    retryable,
                    cancelled: false,
                })
            }
        }
    }

    /// Runs one tool as a recorded call (see [`NodeCtx::recorded_call`]):
    /// the inner result is the tool's own (its value, or its error); the
    /// outer error stops the attempt (a cancel, the store). `key`
    /// overrides the idempotency key derived from the call's place in the
    /// attempt; a call with a key (an agent's) returns its value as the
    /// row keeps it, cut to the output limit, so that what a model reads
    /// is what a resume rebuilds.
    pub(crate) async fn run_tool(
        &self,
        tool: &Arc<dyn cairn_tools::Tool>,
        args: Value,
        key: Option<String>,
        node_sandbox: &cairn_workflow::NodeSandbox,
    ) -> Result<Result<Value, ErrorInfo>, NodeError> {
        let spec = tool.spec();
        let sandbox = self.services.sandbox_for(
            &self.workflow,
            self.max_output_bytes,
            self.timeout,
            node_sandbox,
        )?;
        let sandbox = with_process_env(sandbox, &self.process_env)?;
        let limit = sandbox.limits().max_output_bytes;
        let as_recorded = key.is_some();
        let bash = spec.name == "bash";
        let recorded = self.recorded_result(&spec.name, &args)?;
        let call = CallInfo {
            name: &spec.name,
            key,
            side_effect: spec.side_effect,
            idempotent: spec.idempotent,
            output_limit: limit,
        };
        let result = self
            .recorded_call(call, args.clone(), |tool_seq, key| async move {
                if let Some(result) = recorded {
                    return result;
                }
                let observer = EventObserver::new(self);
                if bash && sandbox.isolation() == cairn_tools::Isolation::None {
                    self.unconfined_notice();
                }
                let tctx = cairn_tools::ToolContext {
                    sandbox: &sandbox,
                    run_id: &self.run_id,
                    node_id: &self.node_id,
                    iteration: self.iteration,
                    attempt: self.attempt,
                    tool_seq,
                    idempotency_key: key,
                    observer: &observer,
                    cancel: self.cancel.clone(),
                };
                tool.call(args, &tctx)
                    .await
                    .map_err(|e| ErrorInfo::new(e.kind(), e.to_string()))
            })
            .await?;
        Ok(match result {
            Ok(v) if as_recorded => Ok(cut_json(&v, limit)),
            other => other,
        })
    }

    /// In a replay whose tools answer from the record: the original's
    /// result of the same call, or a divergence (`Ok(None)` when the replay
    /// is live, which runs the tool).
    fn recorded_result(
        &self,
        tool: &str,
        args: &Value,
    ) -> Result<Option<Result<Value, ErrorInfo>>, NodeError> {
        let Some(r) = self.replay.as_ref().filter(|r| r.recorded_tools()) else {
            return Ok(None);
        };
        let key = (self.node_id.to_string(), self.iteration);
        if let Some(result) = r.take_call(&key, tool, args) {
            return Ok(Some(result));
        }
        r.diverged(
            self,
            &format!("calls tool `{tool}` with arguments"),
            serde_json::json!({"kind": "tool", "tool": tool, "args": args}),
        )?;
        Ok(None)
    }

    /// Records one call of a tool around `body`: its `tool_calls` row
    /// (durable before anything happens, so a resume knows the call may
    /// have taken effect) and `ToolCallStarted` (durable), then, once
    /// `body` returns, the row's result (cut to `output_limit` by
    /// [`cut_json`]) and `ToolCallFinished`. `body` gets the call's
    /// `toolSeq` and idempotency key.
    pub(crate) async fn recorded_call<F, Fut>(
        &self,
        call: CallInfo<'_>,
        input: Value,
        body: F,
    ) -> Result<Result<Value, ErrorInfo>, NodeError>
    where
        F: FnOnce(u32, String) -> Fut,
        Fut: std::future::Future<Output = Result<Value, ErrorInfo>>,
    {
        let tool_seq = self.tool_seq.fetch_add(1, Ordering::SeqCst) + 1;
        let key = call.key.unwrap_or_else(|| {
            cairn_tools::idempotency_key(&self.run_id, &self.node_id, self.iteration, tool_seq)
        });
        let started = now_ms();
        // The row is written beside the log, not through it: masked here,
        // as the log masks events. The result is masked before anyone
        // (a model included) reads it.
        let redactor = self.log.redactor();
        let mut input = input;
        redactor.value(&mut input);
        let mut record = ToolCallRecord {
            run_id: self.run_id.clone(),
            node_id: self.node_id.to_string(),
            iteration: self.iteration,
            attempt: self.attempt,
            tool_seq,
            tool: call.name.to_string(),
            idempotency_key: key.clone(),
            side_effect: call.side_effect,
            idempotent: call.idempotent,
            input,
            output: None,
            started_ms: started,
            finished_ms: None,
            status: ToolCallStatus::Running,
            error: None,
        };
        // Committed with the event below, which is waited for: the row is
        // stored before the tool runs.
        self.log.record_tool_call(record.clone());
        self.emit_durable(EventKind::ToolCallStarted {
            tool_name: call.name.to_string(),
            tool_seq,
            idempotency_key: key.clone(),
            side_effect: call.side_effect,
        })
        .await?;
        let t0 = std::time::Instant::now();
        let result = body(tool_seq, key).await;
        let duration_ms = t0.elapsed().as_millis() as u64;
        record.finished_ms = Some(now_ms());
        let result = match result {
            Ok(mut v) => {
                redactor.value(&mut v);
                record.output = Some(cut_json(&v, call.output_limit));
                record.status = ToolCallStatus::Success;
                Ok(v)
            }
            Err(mut info) => {
                if let Some(m) = redactor.text(&info.message) {
                    info.message = m;
                }
                // A call cut short by a cancel or a stop did not fail on its
                // own: its row says so, and an agent that takes up the
                // conversation treats it as a call that may not have ended.
                record.status = if self.cancel.is_cancelled() || info.kind == STOPPED {
                    ToolCallStatus::Cancelled
                } else {
                    ToolCallStatus::Error
                };
                record.error = Some(serde_json::to_value(&info).unwrap_or(Value::Null));
                Err(info)
            }
        };
        self.log.record_tool_call(record);
        let (status, error) = match &result {
            Ok(_) => (ToolStatus::Success, None),
            Err(info) => (ToolStatus::Error, Some(info.clone())),
        };
        self.emit(EventKind::ToolCallFinished {
            tool_name: call.name.to_string(),
            tool_seq,
            status,
            duration_ms,
            error,
        });
        if let Err(info) = &result {
            if self.cancel.is_cancelled() || info.kind == STOPPED {
                return Err(NodeError::cancelled(info.message.clone()));
            }
        }
        Ok(result)
    }

    /// Side-effecting, non-idempotent tool calls that earlier attempts of this
    /// node already made (so an agent can be warned before repeating them).
    pub fn earlier_side_effects(&self) -> Result<Vec<ToolCallRecord>, NodeError> {
        Ok(crate::earlier_side_effects(
            self.services.journal.backend().as_ref(),
            &self.run_id,
            &self.node_id,
            self.iteration,
            self.attempt,
        )?)
    }
}

/// A JSON value as a tool call's row keeps it: whole up to `limit` bytes,
/// else its head.
pub(crate) fn cut_json(v: &Value, limit: usize) -> Value {
    let s = v.to_string();
    if s.len() <= limit {
        v.clone()
    } else {
        let mut end = limit;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        serde_json::json!({ "truncated": true, "bytes": s.len(), "head": &s[..end] })
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A leaf node kind.
#[async_trait]
pub trait NodeRunner: Send + Sync {
    /// Runs one attempt and returns the node's output.
    async fn run(&self, spec: &NodeSpec, ctx: &NodeCtx) -> Result<Value, NodeError>;
}

/// Turns process and tool callbacks into the attempt's events, and records
/// every process group the attempt starts (commands and `bash` calls alike)
/// so that a resume after a crash of the engine can kill what the dead
/// engine left running. Dropping it forgets the records: the runner has
/// waited for the processes by then.
pub(crate) struct EventObserver<'a> {
    pub ctx: &'a NodeCtx,
    records: Mutex<Vec<u64>>,
    /// Whether output becomes `NodeOutput`: not for a scorer, whose
    /// process runs after the node's attempt ended.
    streams: bool,
}

impl<'a> EventObserver<'a> {
    pub(crate) fn new(ctx: &'a NodeCtx) -> Self {
        EventObserver {
            ctx,
            records: Mutex::new(Vec::new()),
            streams: true,
        }
    }

    /// An observer that records processes and network verdicts but
    /// streams no output.
    pub(crate) fn quiet(ctx: &'a NodeCtx) -> Self {
        EventObserver {
            ctx,
            records: Mutex::new(Vec::new()),
            streams: false,
        }
    }
}

impl Drop for EventObserver<'_> {
    fn drop(&mut self) {
        let backend = self.ctx.services.journal.backend();
        for id in self.records.lock().unwrap().drain(..) {
            let _ = backend.remove_process(id);
        }
    }
}

impl ProcessObserver for EventObserver<'_> {
    fn spawned(&self, pid: u32) {
        let ctx = self.ctx;
        let rec = ProcessRecord {
            id: 0,
            run_id: ctx.run_id.clone(),
            node_id: ctx.node_id.to_string(),
            iteration: ctx.iteration,
            attempt: ctx.attempt,
            pgid: pid,
            started_ms: now_ms(),
        };
        match ctx.services.journal.backend().put_process(&rec) {
            Ok(id) => self.records.lock().unwrap().push(id),
            Err(e) => {
                tracing::warn!(error = %e, pid, "cannot record a process group; a resume after a crash finds it by its environment only")
            }
        }
    }

    fn output(&self, stream: Stream, text: &str) {
        if !self.streams {
            return;
        }
        let stream = match stream {
            Stream::Stdout => OutputStream::Stdout,
            Stream::Stderr => OutputStream::Stderr,
        };
        self.ctx.output(stream, text);
    }

    fn network_refused(&self, target: &str, reason: &str) {
        self.ctx.emit(EventKind::NetworkAccess {
            action: NetworkAction::Blocked,
            target: target.to_string(),
            reason: reason.to_string(),
        });
    }

    fn network_allowed(&self, target: &str, reason: &str) {
        self.ctx.emit(EventKind::NetworkAccess {
            action: NetworkAction::Allowed,
            target: target.to_string(),
            reason: reason.to_string(),
        });
    }

    fn limits_weakened(&self, why: &str) {
        self.ctx.limits_notice(why);
    }
}

impl cairn_tools::ToolObserver for EventObserver<'_> {
    fn network(&self, action: NetworkAction, target: &str, reason: &str) {
        self.ctx.emit(EventKind::NetworkAccess {
            action,
            target: target.to_string(),
            reason: reason.to_string(),
        });
    }
}
