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

mod compact;
pub(crate) mod history;
pub(crate) mod models;
mod toolbox;

use std::sync::Mutex;

use cairn_agent::{AssistantMessage, Conversation, Message, ModelRequest, StreamEvent, ToolResult};
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
    /// The conversation's key for the provider's prompt cache.
    cache_key: String,
    /// The first message as the prompt rendered it (a summary of older
    /// turns joins it).
    task: String,
    /// The compactions the log holds, replayed before their steps.
    compactions: std::iter::Peekable<std::slice::Iter<'h, (u32, String, Option<String>)>>,
}

/// One attempt of an agent node.
struct Agent<'a> {
    spec: &'a AgentSpec,
    ctx: &'a NodeCtx,
    model: models::Model,
    tools: Toolbox<'a>,
    schema: Option<jsonschema::Validator>,
}

impl<'a> Agent<'a> {
    async fn new(spec: &'a AgentSpec, ctx: &'a NodeCtx) -> Result<Agent<'a>, NodeError> {
        let model = models::client(ctx, spec)?;
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
            model,
            tools,
            schema,
        })
    }

    async fn run(&self) -> Result<Value, NodeError> {
        let ctx = self.ctx;
        let history = History::load(ctx).await?;
        let task = self.prompt(&history).await?;
        let convo = Conversation {
            system: match &self.spec.system {
                Some(t) => Some(render_text(ctx, t)?),
                None => None,
            },
            messages: vec![Message::User { text: task.clone() }],
        };
        let mut t = Talk {
            history: &history,
            convo,
            replay: history.steps.iter().peekable(),
            step: 0,
            spent: history.spent_usd,
            sessions: 0,
            cache_key: cache_key(ctx, &history),
            task,
            compactions: history.compactions.iter().peekable(),
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
        while let Some((_, strategy, summary)) = t.compactions.next_if(|(s, ..)| *s == step) {
            replay_compaction(t, strategy, summary.as_deref());
        }
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
        self.fit(t).await?;
        let interrupted = t.history.unanswered == Some(step);
        let (message, cost) = self
            .ask_model(&t.convo, &t.cache_key, step, interrupted)
            .await?;
        t.spent += cost;
        self.check_budget(t.spent)?;
        Ok(message)
    }

    /// Makes the conversation fit the model's context window before step
    /// `t.step` is asked: old tool results cut first, then older turns
    /// summarised; each logged. A conversation that fits no matter what
    /// fails the node (`context`).
    async fn fit(&self, t: &mut Talk<'_>) -> Result<(), NodeError> {
        let Some(window) = self.model.context_window else {
            return Ok(());
        };
        let budget = compact::budget(window, self.model.max_tokens);
        let tools = self.tools.defs();
        let mut before = t.convo.estimated_tokens(tools);
        if before <= budget {
            return Ok(());
        }
        if compact::truncate_tool_results(&mut t.convo) {
            let after = t.convo.estimated_tokens(tools);
            self.ctx
                .emit_durable(EventKind::AgentContextCompacted {
                    step: t.step,
                    strategy: compact::TRUNCATE.into(),
                    tokens_before: before,
                    tokens_after: after,
                    message: None,
                })
                .await?;
            if after <= budget {
                return Ok(());
            }
            before = after;
        }
        let too_long = |why: &str| {
            NodeError::fatal(
                "context",
                format!(
                    "the conversation holds about {before} tokens, more than model `{}`'s \
                     context window of {window} leaves for it ({budget}), and {why}",
                    self.model.name
                ),
            )
        };
        let Some(cut) = compact::summary_cut(&t.convo) else {
            return Err(too_long("has no older turns to summarise"));
        };
        let summary = self.summarize(t, cut, budget).await?;
        compact::apply_summary(&mut t.convo, &t.task, cut, &summary);
        let after = t.convo.estimated_tokens(tools);
        self.ctx
            .emit_durable(EventKind::AgentContextCompacted {
                step: t.step,
                strategy: compact::SUMMARIZE.into(),
                tokens_before: before,
                tokens_after: after,
                message: Some(summary),
            })
            .await?;
        if after > budget {
            return Err(too_long("a summary of its older turns is still too long"));
        }
        Ok(())
    }

    /// Asks the model for a summary of the turns before `cut`; its usage
    /// is reported and counted like a step's, its text not streamed.
    async fn summarize(
        &self,
        t: &mut Talk<'_>,
        cut: usize,
        budget: u64,
    ) -> Result<String, NodeError> {
        let max_bytes = usize::try_from(budget.saturating_mul(3)).unwrap_or(usize::MAX);
        let convo = Conversation {
            system: Some(compact::SUMMARY_SYSTEM.to_string()),
            messages: vec![Message::User {
                text: compact::transcript(&t.convo, &t.task, cut, max_bytes),
            }],
        };
        let req = ModelRequest {
            conversation: &convo,
            tools: &[],
            cache_key: None,
        };
        if let Some(r) = &self.ctx.replay {
            let key = (self.ctx.node_id.to_string(), self.ctx.iteration);
            if let Some(summary) = r.summary(&key, t.step) {
                return Ok(summary);
            }
            r.diverged(
                self.ctx,
                &format!(
                    "asks for a summary of its conversation before step {}",
                    t.step
                ),
                json!({"kind": "request", "step": t.step}),
            )?;
        }
        let estimate = convo.estimated_tokens(&[]);
        let model = &self.model;
        let response = self
            .call(model, &req, t.step, estimate, false)
            .await?
            .map_err(|e| model_error(model, e))?;
        self.report_usage(model, &response);
        self.ctx.spend.add(&response.usage, response.cost_usd);
        t.spent += response.cost_usd.unwrap_or(0.0);
        self.check_budget(t.spent)?;
        match response.message.text.filter(|s| !s.trim().is_empty()) {
            Some(s) => Ok(s),
            None => Err(NodeError::new(
                "context",
                format!(
                    "model `{}` answered the request for a summary with no text",
                    model.name
                ),
            )),
        }
    }

    /// Logs one call's tokens and cost, under the model that answered.
    fn report_usage(&self, model: &models::Model, response: &cairn_agent::ModelResponse) {
        let usage = &response.usage;
        self.ctx.emit(EventKind::TokenUsageReported {
            provider: model.client.provider().to_string(),
            model: model.client.model().to_string(),
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: response.cost_usd,
        });
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
        cache_key: &str,
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
        let req = ModelRequest {
            conversation: convo,
            tools: self.tools.defs(),
            cache_key: Some(cache_key),
        };
        let client = &self.model.client;
        let hash = cairn_agent::request_hash(client.provider(), client.model(), &req);
        ctx.emit_durable(EventKind::AgentStepStarted {
            step,
            model: client.model().to_string(),
            snapshot,
            request_hash: Some(hash.clone()),
            prompt: opening_prompt(convo, self.tools.defs()),
        })
        .await?;
        if let Some(r) = &ctx.replay {
            let key = (ctx.node_id.to_string(), ctx.iteration);
            if let Some(recorded) = r.take_step(&key, &hash) {
                return self.replayed_step(step, recorded).await;
            }
            r.diverged(
                ctx,
                &format!("asks model `{}` a request at step {step}", client.model()),
                json!({"kind": "request", "step": step, "requestHash": hash}),
            )?;
        }
        if interrupted {
            ctx.emit(EventKind::AgentGenerationRetried {
                step,
                reason: "interrupted".into(),
            });
        }
        let estimate = convo.estimated_tokens(self.tools.defs());
        let mut fallbacks = self.model.fallback.iter();
        let mut instead: Option<models::Model> = None;
        let (model, response) = loop {
            let model = instead.as_ref().unwrap_or(&self.model);
            let e = match self.call(model, &req, step, estimate, true).await? {
                Ok(r) => break (model, r),
                Err(e) => e,
            };
            let next = match fallbacks.next() {
                Some(next) if e.kind.falls_back() => next,
                _ => return Err(model_error(model, e)),
            };
            // The log says which model answers the step in its stead.
            ctx.emit(EventKind::AgentGenerationRetried {
                step,
                reason: format!(
                    "model `{}` failed ({}): asking `{next}` instead",
                    model.name,
                    cut(&e.message, 300)
                ),
            });
            instead = Some(models::model(ctx, next)?);
        };
        self.report_usage(model, &response);
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

    /// A step a replay answers with the original's: its text streamed in
    /// the pieces the original logged, its usage and its message as they
    /// were. No request leaves the process.
    async fn replayed_step(
        &self,
        step: u32,
        recorded: crate::replay::RecStep,
    ) -> Result<(AssistantMessage, f64), NodeError> {
        let ctx = self.ctx;
        for (stream, text) in &recorded.pieces {
            ctx.output(*stream, text);
        }
        let mut cost = 0.0;
        if let Some(usage @ EventKind::TokenUsageReported { .. }) = recorded.usage {
            if let EventKind::TokenUsageReported {
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cache_write_tokens,
                reasoning_tokens,
                cost_usd,
                ..
            } = &usage
            {
                let u = cairn_agent::Usage {
                    input_tokens: *input_tokens,
                    output_tokens: *output_tokens,
                    cache_read_tokens: *cache_read_tokens,
                    cache_write_tokens: *cache_write_tokens,
                    reasoning_tokens: *reasoning_tokens,
                };
                ctx.spend.add(&u, *cost_usd);
                cost = cost_usd.unwrap_or(0.0);
            }
            ctx.emit(usage);
        }
        let message: AssistantMessage =
            serde_json::from_value(recorded.message.clone()).map_err(|e| {
                NodeError::fatal(
                    "replay",
                    format!(
                        "the original's answer at step {} is unreadable: {e}",
                        recorded.step
                    ),
                )
            })?;
        ctx.emit_durable(EventKind::AgentStepFinished {
            step,
            tool_calls: message.tool_calls.len() as u32,
            finish_reason: recorded.finish_reason,
            message: recorded.message,
        })
        .await?;
        Ok((message, cost))
    }

    /// One call of one model: its share of the model's shared budget
    /// (waits logged as `AgentWaiting`), then the streamed answer, its
    /// text logged as it comes. The outer error is the node's (a cancel,
    /// the log), the inner the model's.
    async fn call(
        &self,
        model: &models::Model,
        req: &ModelRequest<'_>,
        step: u32,
        estimate: u64,
        show: bool,
    ) -> Result<Result<cairn_agent::ModelResponse, cairn_agent::ModelError>, NodeError> {
        let ctx = self.ctx;
        let name = model.client.model().to_string();
        let waited = |why: &str, d: Option<std::time::Duration>| {
            ctx.emit(EventKind::AgentWaiting {
                step,
                model: name.clone(),
                reason: why.to_string(),
                wait_ms: d.map(|d| d.as_millis().min(u64::MAX as u128) as u64),
            });
        };
        let mut on_wait = |why: cairn_agent::WaitReason, d| waited(why.as_str(), d);
        let mut permit = tokio::select! {
            p = model.gate.acquire(estimate, &mut on_wait) => p,
            _ = ctx.cancel.cancelled() => {
                return Err(NodeError::cancelled("cancelled while waiting for the model"));
            }
        };
        let mut shared = self.shared_slot(model, estimate, &waited).await?;
        let stream = std::sync::Mutex::new(Streamer::new(ctx));
        let armed = tokio::sync::Notify::new();
        let lock = || stream.lock().unwrap_or_else(|e| e.into_inner());
        let gate = &model.gate;
        let mut on = |ev: StreamEvent<'_>| match ev {
            StreamEvent::Text(t) if show => lock().push(OutputStream::Text, t, &armed),
            StreamEvent::Reasoning(t) if show => lock().push(OutputStream::Reasoning, t, &armed),
            StreamEvent::Text(_) | StreamEvent::Reasoning(_) => {}
            StreamEvent::Retrying { reason, delay, .. } => {
                lock().flush();
                if reason == "http 429" {
                    // Every agent on the model keeps the wait the
                    // provider asked this one for.
                    gate.pause(delay);
                }
                ctx.emit(EventKind::AgentGenerationRetried { step, reason });
            }
        };
        let call = model.client.complete(req, &mut on);
        tokio::pin!(call);
        // Pieces wait in the streamer at most `STREAM_HOLD`: a timer armed
        // when the first piece of a batch arrives flushes it even while the
        // provider is silent. The timer and the cancel's future live across
        // the loop: made anew per piece, they were a timer-wheel insert and
        // removal for every token of a thousand streams.
        let cancelled = ctx.cancel.cancelled();
        tokio::pin!(cancelled);
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        let mut set_for = None;
        let response = loop {
            let due = lock().due();
            if let Some(d) = due {
                if set_for != Some(d) {
                    timer.as_mut().reset(d);
                    set_for = Some(d);
                }
            }
            tokio::select! {
                r = &mut call => break r,
                _ = &mut cancelled => {
                    return Err(NodeError::cancelled("cancelled while the model answered"));
                }
                _ = armed.notified(), if due.is_none() => {}
                _ = &mut timer, if due.is_some() => {
                    set_for = None;
                    lock().flush();
                }
            }
        };
        lock().flush();
        if let Ok(r) = &response {
            let used = r.usage.input_tokens + r.usage.output_tokens;
            permit.settle(used);
            if let Some(s) = &mut shared {
                s.tokens = used;
            }
        }
        Ok(response)
    }

    /// A place in the model's budget that every process on the store
    /// shares (a PostgreSQL store's), when the model sets limits: waits,
    /// logging why, until the store lets the call begin. `None` where the
    /// store keeps no shared budgets (each process keeps its own gate).
    async fn shared_slot(
        &self,
        model: &models::Model,
        estimate: u64,
        waited: &(dyn Fn(&str, Option<std::time::Duration>) + Sync),
    ) -> Result<Option<SharedCall>, NodeError> {
        let ctx = self.ctx;
        let backend = ctx.services.journal.backend().clone();
        if !model.limits.any() || backend.model_budgets().is_none() {
            return Ok(None);
        }
        let limits = cairn_store::BudgetLimits {
            max_concurrency: model.limits.max_concurrency,
            requests_per_minute: model.limits.requests_per_minute,
            tokens_per_minute: model.limits.tokens_per_minute,
        };
        let mut last: Option<&'static str> = None;
        loop {
            let (b, key, lease) = (backend.clone(), model.budget_key.clone(), model.lease);
            let asked = tokio::task::spawn_blocking(move || match b.model_budgets() {
                Some(budgets) => budgets.begin_call(&key, &limits, estimate, lease),
                None => Ok(Ok(0)),
            })
            .await
            .map_err(|e| NodeError::new("internal", e.to_string()))??;
            let wait = match asked {
                Ok(id) => {
                    return Ok(Some(SharedCall {
                        backend,
                        id,
                        tokens: estimate,
                    }))
                }
                Err(w) => w,
            };
            if last != Some(wait.reason) {
                waited(wait.reason, wait.wait);
                last = Some(wait.reason);
            }
            let pause = wait
                .wait
                .unwrap_or(std::time::Duration::from_millis(200))
                .min(std::time::Duration::from_secs(5));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = ctx.cancel.cancelled() => {
                    return Err(NodeError::cancelled("cancelled while waiting for the model"));
                }
            }
        }
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

/// The key of a conversation for the provider's prompt cache: the same for
/// every step of it, across a crash and in a fork that takes it up (whose
/// prefix is the same), and different for every other conversation, so
/// that the provider routes its requests to where the prefix is cached.
fn cache_key(ctx: &NodeCtx, history: &History) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(history.key_run.as_str().as_bytes());
    h.update([0]);
    h.update(ctx.node_id.as_str().as_bytes());
    h.update([0]);
    h.update(ctx.iteration.to_le_bytes());
    h.update(history.origin.to_le_bytes());
    format!("cairn-{}", hex::encode(&h.finalize()[..12]))
}

/// What a request that opens a conversation was asked
/// (`AgentStepStarted.prompt`): every later request of it follows from this
/// and the log, so a replay's report can rebuild any of them.
fn opening_prompt(
    convo: &Conversation,
    tools: &[cairn_agent::ToolDef],
) -> Option<Box<cairn_events::StepPrompt>> {
    let [Message::User { text }] = convo.messages.as_slice() else {
        return None;
    };
    Some(Box::new(cairn_events::StepPrompt {
        system: convo.system.clone(),
        user: text.clone(),
        tools: tools
            .iter()
            .map(|t| cairn_events::ToolDigest {
                name: t.name.clone(),
                hash: cairn_agent::tool_hash(t),
            })
            .collect(),
    }))
}

/// Applies a compaction the log holds to the conversation being rebuilt.
fn replay_compaction(t: &mut Talk<'_>, strategy: &str, summary: Option<&str>) {
    match (strategy, summary) {
        (compact::SUMMARIZE, Some(summary)) => {
            if let Some(cut) = compact::summary_cut(&t.convo) {
                compact::apply_summary(&mut t.convo, &t.task, cut, summary);
            }
        }
        _ => {
            compact::truncate_tool_results(&mut t.convo);
        }
    }
}

/// A call's place in a budget the store keeps for every process: given
/// back when the call ends, however it ends (its tokens then counted).
struct SharedCall {
    backend: std::sync::Arc<dyn cairn_store::Backend>,
    id: u64,
    tokens: u64,
}

impl Drop for SharedCall {
    fn drop(&mut self) {
        let (backend, id, tokens) = (self.backend.clone(), self.id, self.tokens);
        // The store is not waited for: a place not given back is swept
        // when its lease runs out.
        tokio::task::spawn_blocking(move || {
            if let Some(b) = backend.model_budgets() {
                if let Err(e) = b.end_call(id, tokens) {
                    tracing::warn!("a model's shared budget: {e}");
                }
            }
        });
    }
}

/// A model's failure as the node's: retried unless no retry can mend it.
fn model_error(model: &models::Model, e: cairn_agent::ModelError) -> NodeError {
    let kind = e.kind.as_str();
    let retryable = !matches!(kind, "config" | "auth" | "bad_request");
    NodeError {
        info: Box::new(ErrorInfo::new(
            kind,
            format!("model `{}`: {e}", model.client.model()),
        )),
        retryable,
        cancelled: false,
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
pub(crate) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Longest a piece of streamed text waits before it is logged: watchers see
/// text within this of its arrival, and a step that streams for a minute
/// logs at most a few tens of events a second, not one per token.
const STREAM_HOLD: std::time::Duration = std::time::Duration::from_millis(50);

/// Most bytes logged as one piece: a fast model's text is cut at this size
/// even within [`STREAM_HOLD`].
const STREAM_PIECE: usize = 4096;

/// Streams a model's text to the log in pieces gathered over
/// [`STREAM_HOLD`] (or up to [`STREAM_PIECE`] bytes), in the order it came.
struct Streamer<'a> {
    ctx: &'a NodeCtx,
    stream: OutputStream,
    buf: String,
    /// When the oldest piece in `buf` arrived.
    since: Option<tokio::time::Instant>,
}

impl<'a> Streamer<'a> {
    fn new(ctx: &'a NodeCtx) -> Self {
        Streamer {
            ctx,
            stream: OutputStream::Text,
            buf: String::new(),
            since: None,
        }
    }

    /// Takes a piece; `armed` is told when it starts a batch, so that the
    /// caller's timer is set for it.
    fn push(&mut self, stream: OutputStream, text: &str, armed: &tokio::sync::Notify) {
        if stream != self.stream {
            self.flush();
            self.stream = stream;
        }
        self.buf.push_str(text);
        let now = tokio::time::Instant::now();
        match self.since {
            None => {
                self.since = Some(now);
                armed.notify_one();
            }
            Some(t) if now.duration_since(t) >= STREAM_HOLD => self.flush(),
            Some(_) => {}
        }
        if self.buf.len() >= STREAM_PIECE {
            self.flush();
        }
    }

    /// When the text held now must be logged.
    fn due(&self) -> Option<tokio::time::Instant> {
        self.since.map(|t| t + STREAM_HOLD)
    }

    fn flush(&mut self) {
        self.since = None;
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
