//! The `agent` node kind: a model asked in a loop, with the sandbox's tools.
//!
//! One step is one model call: `AgentStepStarted` (durable before the
//! request goes out), the streamed text as `NodeOutput`, one
//! `TokenUsageReported`, then `AgentStepFinished` with the model's whole
//! message (durable before any of the step's tool calls runs). The tool
//! calls run as recorded calls (`ToolCallStarted`/`ToolCallFinished`, a row
//! each), reads side by side and side effects one after another; a call
//! that cannot run (an unknown tool, arguments that are not JSON, a refused
//! path) is a result the model reads, not the node's failure.
//!
//! A crash costs at most the step that was streaming: the attempt that
//! takes the conversation up ([`History`]) rebuilds it from the log (the
//! messages) and the store (the tools' results), byte for byte, asks no
//! step again whose message was committed and runs no call again whose
//! result was; a side-effecting call that started and never finished is
//! not repeated blindly, the model is told it may have happened.
//!
//! The wire formats, retries and prices are `cairn-agent`'s; this module
//! knows the engine's side: events, tools, people, budgets.

mod history;
pub(crate) mod models;
mod toolbox;

use std::sync::Mutex;

use cairn_agent::{
    AssistantMessage, Conversation, Message, ModelClient, ModelRequest, StreamEvent, ToolResult,
};
use cairn_events::{ErrorInfo, EventKind, OutputStream};
use cairn_workflow::AgentSpec;
use serde_json::{json, Value};

use crate::node::{NodeCtx, NodeError};
use history::History;

mod engines;
pub(crate) use engines::hands_over;
use toolbox::Toolbox;

/// What a run has spent on models: the USD total (seeded from the log when
/// the run's driver starts, checked against the workflow's
/// `max_cost_usd`), and the tokens and cost of this session's model calls,
/// which the agents' attempts log themselves, so that the run's summary
/// counts them (the driver's own state folds only what it appends).
#[derive(Debug, Default)]
pub(crate) struct Spend(Mutex<SpendInner>);

#[derive(Debug, Default)]
struct SpendInner {
    total_usd: f64,
    session_usd: Option<f64>,
    session_tokens: cairn_events::TokenTotals,
}

impl Spend {
    /// A tally that starts at what the log shows spent already.
    pub(crate) fn new(spent: f64) -> Spend {
        Spend(Mutex::new(SpendInner {
            total_usd: spent,
            ..SpendInner::default()
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpendInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one model call.
    pub(crate) fn add(&self, usage: &cairn_agent::Usage, usd: Option<f64>) {
        let mut s = self.lock();
        if let Some(c) = usd {
            s.total_usd += c;
            *s.session_usd.get_or_insert(0.0) += c;
        }
        let t = &mut s.session_tokens;
        t.input += usage.input_tokens;
        t.output += usage.output_tokens;
        t.cache_read += usage.cache_read_tokens.unwrap_or(0);
        t.cache_write += usage.cache_write_tokens.unwrap_or(0);
        t.reasoning += usage.reasoning_tokens.unwrap_or(0);
    }

    fn get(&self) -> f64 {
        self.lock().total_usd
    }

    /// This session's tokens and cost, to add to what the log held before.
    pub(crate) fn session(&self) -> (cairn_events::TokenTotals, Option<f64>) {
        let s = self.lock();
        (s.session_tokens.clone(), s.session_usd)
    }
}

/// One attempt of an agent node (`kinds::agent`): its external CLI's, or
/// Cairn's own loop.
pub(crate) async fn run(agent: &AgentSpec, ctx: &NodeCtx) -> Result<Value, NodeError> {
    if let Some(engine) = &agent.engine {
        return engines::run(agent, ctx, engine).await;
    }
    Agent::new(agent, ctx).await?.run().await
}

/// Most bytes of one turn a person writes to a hijacked agent.
const HIJACK_TURN_MAX: usize = 64 * 1024;

/// The conversation as an attempt goes through it.
struct Talk<'h> {
    history: &'h History,
    convo: Conversation,
    /// The steps the log holds, replayed before the model is asked.
    replay: std::iter::Peekable<std::slice::Iter<'h, (u32, AssistantMessage)>>,
    /// The latest step taken.
    step: u32,
    /// What this node spent on models.
    spent: f64,
    /// Hijack sessions this attempt went through (replayed ones too).
    sessions: u32,
}

/// One attempt of an agent node.
struct Agent<'a> {
    spec: &'a AgentSpec,
    ctx: &'a NodeCtx,
    client: std::sync::Arc<dyn ModelClient>,
    tools: Toolbox<'a>,
    schema: Option<jsonschema::Validator>,
}

impl<'a> Agent<'a> {
    async fn new(spec: &'a AgentSpec, ctx: &'a NodeCtx) -> Result<Agent<'a>, NodeError> {
        let client = models::client(ctx, spec)?;
        let tools = Toolbox::new(ctx, &spec.tools, &spec.delegates).await?;
        let schema = match &spec.output_schema {
            Some(s) => Some(jsonschema::validator_for(s).map_err(|e| {
                NodeError::fatal(
                    "schema",
                    format!("output_schema is not a valid JSON Schema: {e}"),
                )
            })?),
            None => None,
        };
        Ok(Agent {
            spec,
            ctx,
            client,
            tools,
            schema,
        })
    }

    async fn run(&self) -> Result<Value, NodeError> {
        let ctx = self.ctx;
        let history = History::load(ctx).await?;
        let convo = Conversation {
            system: match &self.spec.system {
                Some(t) => Some(render_text(ctx, t)?),
                None => None,
            },
            messages: vec![Message::User {
                text: self.prompt(&history).await?,
            }],
        };
        let mut t = Talk {
            history: &history,
            convo,
            replay: history.steps.iter().peekable(),
            step: 0,
            spent: history.spent_usd,
            sessions: 0,
        };
        let mut schema_failures = 0u32;
        loop {
            if t.step > 0 && self.hijack_due(&t) {
                if let Some(text) = self.hijack_session(&mut t).await? {
                    return self.answer(&text).map_err(|errors| {
                        NodeError::fatal(
                            "schema",
                            format!(
                                "the answer the hijack ended with does not match output_schema: {}",
                                errors.join("; ")
                            ),
                        )
                    });
                }
            }
            let message = self.next_message(&mut t).await?;
            if message.tool_calls.is_empty() {
                if self.hijack_due(&t) {
                    // A person takes the conversation before its answer is
                    // taken as the node's.
                    t.convo.messages.push(Message::Assistant(message));
                    continue;
                }
                let text = message.text.clone().unwrap_or_default();
                match self.answer(&text) {
                    Ok(v) => return Ok(v),
                    Err(errors) if schema_failures < self.spec.schema_retries => {
                        schema_failures += 1;
                        t.convo.messages.push(Message::Assistant(message));
                        t.convo.messages.push(Message::User {
                            text: schema_feedback(&errors),
                        });
                        continue;
                    }
                    Err(errors) => {
                        return Err(NodeError::fatal(
                            "schema",
                            format!(
                                "the answer does not match output_schema after {} corrections: {}",
                                schema_failures,
                                errors.join("; ")
                            ),
                        )
                        .with_details(json!({ "answer": cut(&text, 4096), "errors": errors })))
                    }
                }
            }
            self.take_calls(&mut t, message).await?;
        }
    }

    /// The next step's message: the log's, for a step an earlier attempt
    /// of the conversation finished, else the model's.
    async fn next_message(&self, t: &mut Talk<'_>) -> Result<AssistantMessage, NodeError> {
        t.step += 1;
        let step = t.step;
        if let Some((_, m)) = t.replay.next_if(|(s, _)| *s == step) {
            return Ok(m.clone());
        }
        if step > self.spec.max_steps {
            return Err(NodeError::fatal(
                "max_steps",
                format!(
                    "the agent did not answer within max_steps ({})",
                    self.spec.max_steps
                ),
            ));
        }
        let interrupted = t.history.unanswered == Some(step);
        let (message, cost) = self.ask_model(&t.convo, step, interrupted).await?;
        t.spent += cost;
        self.check_budget(t.spent)?;
        Ok(message)
    }

    /// Runs a message's tool calls and adds both to the conversation.
    async fn take_calls(
        &self,
        t: &mut Talk<'_>,
        message: AssistantMessage,
    ) -> Result<(), NodeError> {
        let results = self
            .tools
            .run_calls(t.history, t.step, &message.tool_calls)
            .await?;
        t.convo.messages.push(Message::Assistant(message));
        t.convo.messages.push(Message::ToolResults(results));
        Ok(())
    }

    /// Whether a person takes the conversation at this step boundary: the
    /// log says one did (a replay), or, past what the log holds, one asked.
    fn hijack_due(&self, t: &Talk<'_>) -> bool {
        let Some(flag) = &self.ctx.hijack else {
            return false;
        };
        let ctx = self.ctx;
        let first = crate::node::hijack_request_id(
            ctx.node_id.as_str(),
            ctx.iteration,
            t.history.origin,
            t.step,
            0,
        );
        if t.history.hijack_asked.contains(&first) {
            return true;
        }
        t.replay.len() == 0 && flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A person has the conversation: each of their turns is a question
    /// answered (in the log, so a replay gets it back), then the model's
    /// steps until it answers without tools. Returns `None` when handed
    /// back (`/back`), the last answer when the person ends it (`/done`).
    async fn hijack_session(&self, t: &mut Talk<'_>) -> Result<Option<String>, NodeError> {
        let ctx = self.ctx;
        let boundary = t.step;
        let mut n = 0u32;
        loop {
            let id = crate::node::hijack_request_id(
                ctx.node_id.as_str(),
                ctx.iteration,
                t.history.origin,
                boundary,
                n,
            );
            let prompt = if n == 0 {
                format!(
                    "You have the conversation of agent `{}` (paused after step {boundary}): \
                     write to it; /back hands it back, /done ends the node with its last answer.",
                    ctx.node_id
                )
            } else {
                "Your turn: /back hands the conversation back, /done ends the node.".to_string()
            };
            n += 1;
            let schema = json!({"type": "string", "minLength": 1, "maxLength": HIJACK_TURN_MAX});
            let answer = ctx.ask_person_as(id, prompt, Some(schema)).await?;
            let text = match answer {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let command = text.trim();
            if command == "/back" || command == "/done" {
                let resumed = command == "/back";
                if t.sessions >= t.history.hijacks_ended {
                    ctx.emit_durable(EventKind::RunHijacked {
                        engine: "cairn".into(),
                        mode: "interactive".into(),
                        resumed,
                    })
                    .await?;
                }
                t.sessions += 1;
                if let Some(f) = &ctx.hijack {
                    f.store(false, std::sync::atomic::Ordering::SeqCst);
                }
                if resumed {
                    return Ok(None);
                }
                let last = t.convo.messages.iter().rev().find_map(|m| match m {
                    Message::Assistant(a) => a.text.clone(),
                    _ => None,
                });
                return Ok(Some(last.unwrap_or_default()));
            }
            t.convo.messages.push(Message::User { text });
            loop {
                let message = self.next_message(t).await?;
                if message.tool_calls.is_empty() {
                    t.convo.messages.push(Message::Assistant(message));
                    break;
                }
                self.take_calls(t, message).await?;
            }
        }
    }

    /// The first user message: the rendered prompt, and in a conversation
    /// that a retry after a failure begins, the calls with side effects that
    /// the earlier attempts made, so that the model does not repeat them
    /// blindly.
    async fn prompt(&self, history: &History) -> Result<String, NodeError> {
        let ctx = self.ctx;
        let mut text = render_text(ctx, &self.spec.prompt)?;
        if history.origin == ctx.attempt && ctx.attempt > 1 {
            let backend = ctx.services.journal.backend().clone();
            let (run, node) = (ctx.run_id.clone(), ctx.node_id.clone());
            let (iteration, attempt) = (ctx.iteration, ctx.attempt);
            let earlier = tokio::task::spawn_blocking(move || {
                crate::earlier_side_effects(backend.as_ref(), &run, &node, iteration, attempt)
            })
            .await
            .map_err(|e| NodeError::new("internal", e.to_string()))??;
            if !earlier.is_empty() {
                text.push_str(
                    "\n\nEarlier attempts at this task already made these calls, which change \
                     things and are not safe to repeat; check their effects before repeating any:\n",
                );
                for rec in earlier {
                    text.push_str(&format!(
                        "- {} {} (idempotency key {}, {})\n",
                        rec.tool,
                        cut(&rec.input.to_string(), 300),
                        rec.idempotency_key,
                        rec.status
                    ));
                }
            }
        }
        Ok(text)
    }

    /// One step: the model call between its two events. Returns the
    /// model's message and what the call cost.
    async fn ask_model(
        &self,
        convo: &Conversation,
        step: u32,
        interrupted: bool,
    ) -> Result<(AssistantMessage, f64), NodeError> {
        let ctx = self.ctx;
        // The files the earlier steps' calls left, where a fork in the
        // middle of the conversation starts from (the first step's are
        // the attempt's own snapshot).
        let snapshot = match (&ctx.step_snapshots, step > 1) {
            (Some(s), true) => s.take().await,
            _ => None,
        };
        ctx.emit_durable(EventKind::AgentStepStarted {
            step,
            model: self.client.model().to_string(),
            snapshot,
        })
        .await?;
        if interrupted {
            ctx.emit(EventKind::AgentGenerationRetried {
                step,
                reason: "interrupted".into(),
            });
        }
        let req = ModelRequest {
            conversation: convo,
            tools: self.tools.defs(),
        };
        let mut stream = Streamer::new(ctx);
        let mut on = |ev: StreamEvent<'_>| match ev {
            StreamEvent::Text(t) => stream.push(OutputStream::Text, t),
            StreamEvent::Reasoning(t) => stream.push(OutputStream::Reasoning, t),
            StreamEvent::Retrying { reason, .. } => {
                stream.flush();
                ctx.emit(EventKind::AgentGenerationRetried { step, reason });
            }
        };
        let response = tokio::select! {
            r = self.client.complete(&req, &mut on) => r,
            _ = ctx.cancel.cancelled() => {
                return Err(NodeError::cancelled("cancelled while the model answered"));
            }
        };
        stream.flush();
        let response = response.map_err(|e| {
            let kind = e.kind.as_str();
            let retryable = !matches!(kind, "config" | "auth" | "bad_request");
            NodeError {
                info: Box::new(ErrorInfo::new(
                    kind,
                    format!("model `{}`: {e}", self.client.model()),
                )),
                retryable,
                cancelled: false,
            }
        })?;
        let usage = &response.usage;
        ctx.emit(EventKind::TokenUsageReported {
            provider: self.client.provider().to_string(),
            model: self.client.model().to_string(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: response.cost_usd,
        });
        let message = response.message;
        ctx.emit_durable(EventKind::AgentStepFinished {
            step,
            tool_calls: message.tool_calls.len() as u32,
            finish_reason: response.finish_reason.as_str().to_string(),
            message: serde_json::to_value(&message)
                .map_err(|e| NodeError::new("internal", e.to_string()))?,
        })
        .await?;
        ctx.spend.add(&response.usage, response.cost_usd);
        Ok((message, response.cost_usd.unwrap_or(0.0)))
    }

    /// Fails the node once it, or its run, spent more than its budget.
    fn check_budget(&self, node_spent: f64) -> Result<(), NodeError> {
        if let Some(limit) = self.spec.max_cost_usd {
            if node_spent > limit {
                return Err(NodeError::fatal(
                    "budget",
                    format!("the node spent ${node_spent:.4} on models, over its max_cost_usd of ${limit}"),
                )
                .with_details(json!({ "scope": "node", "spentUsd": node_spent, "maxCostUsd": limit })));
            }
        }
        if let Some(limit) = self.ctx.workflow.max_cost_usd {
            let run_spent = self.ctx.spend.get();
            if run_spent > limit {
                return Err(NodeError::fatal(
                    "budget",
                    format!("the run spent ${run_spent:.4} on models, over the workflow's max_cost_usd of ${limit}"),
                )
                .with_details(json!({ "scope": "run", "spentUsd": run_spent, "maxCostUsd": limit })));
            }
        }
        Ok(())
    }

    /// The node's output from the model's final text: the text itself, or
    /// with `output_schema` the JSON it holds, checked. The errors say what
    /// to correct.
    fn answer(&self, text: &str) -> Result<Value, Vec<String>> {
        let Some(schema) = &self.schema else {
            return Ok(Value::String(text.to_string()));
        };
        let value: Value = serde_json::from_str(strip_fence(text))
            .map_err(|e| vec![format!("the answer is not JSON: {e}")])?;
        let errors = crate::schema_errors(schema, &value, 20);
        if errors.is_empty() {
            Ok(value)
        } else {
            Err(errors)
        }
    }
}

/// The message that sends a non-conforming answer back to the model.
fn schema_feedback(errors: &[String]) -> String {
    let mut text = String::from(
        "Your answer does not match the required JSON Schema. Answer again with only the \
         corrected JSON. Problems:\n",
    );
    for e in errors {
        text.push_str("- ");
        text.push_str(e);
        text.push('\n');
    }
    text
}

/// The JSON inside a Markdown code fence, which models add unasked.
pub(crate) fn strip_fence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// A template rendered to text (a non-string result as its JSON).
fn render_text(ctx: &NodeCtx, template: &str) -> Result<String, NodeError> {
    Ok(match ctx.render(template)? {
        Value::String(s) => s,
        other => other.to_string(),
    })
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Streams a model's text to the log in pieces of a line or a few hundred
/// bytes, not one event per token.
struct Streamer<'a> {
    ctx: &'a NodeCtx,
    stream: OutputStream,
    buf: String,
}

impl<'a> Streamer<'a> {
    fn new(ctx: &'a NodeCtx) -> Self {
        Streamer {
            ctx,
            stream: OutputStream::Text,
            buf: String::new(),
        }
    }

    fn push(&mut self, stream: OutputStream, text: &str) {
        if stream != self.stream {
            self.flush();
            self.stream = stream;
        }
        self.buf.push_str(text);
        if self.buf.len() >= 512 || text.contains('\n') {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.buf.is_empty() {
            self.ctx.output(self.stream, &self.buf);
            self.buf.clear();
        }
    }
}

/// The content a model reads for a tool call's result.
pub(crate) fn result_text(result: &Result<Value, ErrorInfo>) -> (String, bool) {
    match result {
        Ok(Value::String(s)) => (s.clone(), false),
        Ok(v) => (v.to_string(), false),
        Err(e) => (format!("error ({}): {}", e.kind, e.message), true),
    }
}

/// A tool result for the conversation.
fn tool_result(call_id: &str, name: &str, result: &Result<Value, ErrorInfo>) -> ToolResult {
    let (content, is_error) = result_text(result);
    ToolResult {
        call_id: call_id.to_string(),
        name: name.to_string(),
        content,
        is_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_taken_off_json_answers() {
        assert_eq!(strip_fence("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(strip_fence("  {\"a\": 1} "), "{\"a\": 1}");
        assert_eq!(strip_fence("```\n[1]\n```\n"), "[1]");
    }

    #[test]
    fn tool_results_read_the_same_from_a_value_and_from_its_row() {
        let v = json!({"path": "a.txt", "lines": ["x"]});
        let row: Value = serde_json::from_str(&v.to_string()).unwrap();
        assert_eq!(result_text(&Ok(v)), result_text(&Ok(row)));
        let (text, err) = result_text(&Err(ErrorInfo::new("tool", "no such file")));
        assert!(err);
        assert_eq!(text, "error (tool): no such file");
    }
}
