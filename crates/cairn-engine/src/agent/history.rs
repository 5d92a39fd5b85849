//! What the log and the store hold of an agent's conversation, so that an
//! attempt that continues an interrupted one rebuilds it exactly: the
//! model's messages from `AgentStepFinished`, the tools' results from the
//! calls' rows.

use std::collections::{HashMap, HashSet};

use cairn_agent::AssistantMessage;
use cairn_events::{ErrorInfo, Event, EventKind, EventType, NodePath};
use cairn_store::{EventQuery, ToolCallRecord, ToolCallStatus};
use serde_json::Value;

use crate::node::{NodeCtx, NodeError};

/// The conversation an attempt takes up, as the log left it.
#[derive(Debug)]
pub(super) struct History {
    /// The attempt that began the conversation: this one, unless the
    /// attempts before it were interrupted by a crash (then the first of
    /// them). Part of every tool call's idempotency key.
    pub origin: u32,
    /// The finished steps in order, with the model's message of each.
    pub steps: Vec<(u32, AssistantMessage)>,
    /// The step that was asked for and never answered when the process
    /// died: asked again, the one repeat a crash costs.
    pub unanswered: Option<u32>,
    /// The conversation's tool calls by idempotency key (the latest row
    /// when a call was made twice).
    pub calls: HashMap<String, ToolCallRecord>,
    /// What this node has spent on models in every attempt of this pass.
    pub spent_usd: f64,
    /// The run whose id the conversation's calls are keyed by: this one,
    /// or for a conversation a fork took up, the run it was begun in (the
    /// fork's log and rows are copies, keys and all).
    pub key_run: cairn_events::RunId,
    /// The request ids of the questions a hijack of this node asked the
    /// person (`h-…`): where a replay of the conversation finds that a
    /// person took it, and at which step.
    pub hijack_asked: HashSet<String>,
    /// How many hijacks of this conversation ended (`RunHijacked`): a
    /// replay does not log them again.
    pub hijacks_ended: u32,
    /// The compactions of the conversation in the log's order: the step
    /// each came before, its strategy, and a summary's text.
    pub compactions: Vec<(u32, String, Option<String>)>,
}

impl History {
    /// Reads the history of `ctx`'s node and pass. The first attempt has
    /// none, and reads nothing.
    pub(super) async fn load(ctx: &NodeCtx) -> Result<History, NodeError> {
        if ctx.attempt <= 1 {
            return Ok(History {
                origin: ctx.attempt.max(1),
                steps: Vec::new(),
                unanswered: None,
                calls: HashMap::new(),
                spent_usd: 0.0,
                key_run: ctx.run_id.clone(),
                hijack_asked: HashSet::new(),
                hijacks_ended: 0,
                compactions: Vec::new(),
            });
        }
        let backend = ctx.services.journal.backend().clone();
        let run_id = ctx.run_id.clone();
        let node = ctx.node_id.to_string();
        let iteration = ctx.iteration;
        let (events, records) = tokio::task::spawn_blocking(move || {
            let events = backend.read_events(
                &run_id,
                &EventQuery {
                    node: Some(node.clone()),
                    types: Seen::TYPES.to_vec(),
                    ..EventQuery::default()
                },
            )?;
            let records = backend.tool_calls(&run_id, &NodePath::from(&node), iteration)?;
            Ok::<_, cairn_store::StoreError>((events, records))
        })
        .await
        .map_err(|e| NodeError::new("internal", e.to_string()))??;

        let mut seen = Seen::default();
        for stored in &events {
            let Ok(ev) = stored.decode() else { continue };
            if ev.scope.iteration == Some(iteration) {
                seen.fold(ev);
            }
        }
        let Seen {
            failed,
            started_at,
            hijack_asked,
            hijacked,
            started,
            finished,
            spent,
            compacted,
        } = seen;
        // The attempts before this one that a crash cut short belong to
        // this conversation; the first one that ended otherwise does not.
        let mut origin = ctx.attempt;
        while origin > 1 && failed.get(&(origin - 1)).map(String::as_str) == Some("interrupted") {
            origin -= 1;
        }
        let ours = |a: u32| a >= origin && a < ctx.attempt;
        let key_run = match (&ctx.forked_from, started_at.get(&origin)) {
            (Some(f), Some(&seq)) if seq <= f.seq => {
                let backend = ctx.services.journal.backend().clone();
                let f = f.clone();
                tokio::task::spawn_blocking(move || key_run_of(backend.as_ref(), f, seq))
                    .await
                    .map_err(|e| NodeError::new("internal", e.to_string()))??
            }
            _ => ctx.run_id.clone(),
        };
        let steps = steps_of(finished, ours)?;
        let unanswered = started
            .iter()
            .filter(|(a, s)| ours(*a) && !steps.iter().any(|(f, _)| f == s))
            .map(|(_, s)| *s)
            .max();
        Ok(History {
            origin,
            steps,
            unanswered,
            calls: calls_of(records, ours),
            spent_usd: spent,
            key_run,
            hijacks_ended: hijacked.iter().filter(|a| ours(**a)).count() as u32,
            hijack_asked,
            compactions: compacted
                .into_iter()
                .filter(|(a, ..)| ours(*a))
                .map(|(_, step, strategy, message)| (step, strategy, message))
                .collect(),
        })
    }
}

/// The finished steps of the conversation's attempts (`ours`), in order,
/// once each, with the model's message read back.
fn steps_of(
    finished: Vec<(u32, u32, Value)>,
    ours: impl Fn(u32) -> bool,
) -> Result<Vec<(u32, AssistantMessage)>, NodeError> {
    let mut steps: Vec<(u32, AssistantMessage)> = Vec::new();
    for (attempt, step, message) in finished {
        if !ours(attempt) || steps.iter().any(|(s, _)| *s == step) {
            continue;
        }
        let message: AssistantMessage = serde_json::from_value(message).map_err(|e| {
            NodeError::fatal(
                "agent",
                format!("the log's message of step {step} cannot be read back: {e}"),
            )
        })?;
        steps.push((step, message));
    }
    steps.sort_by_key(|(s, _)| *s);
    Ok(steps)
}

/// The tool calls of the conversation's attempts (`ours`) by idempotency
/// key, the latest attempt's when a call was made twice.
fn calls_of(
    records: Vec<ToolCallRecord>,
    ours: impl Fn(u32) -> bool,
) -> HashMap<String, ToolCallRecord> {
    let mut calls: HashMap<String, ToolCallRecord> = HashMap::new();
    for rec in records {
        if !ours(rec.attempt) {
            continue;
        }
        match calls.get(&rec.idempotency_key) {
            Some(old) if old.attempt > rec.attempt => {}
            _ => {
                calls.insert(rec.idempotency_key.clone(), rec);
            }
        }
    }
    calls
}

/// What the log's events of one node pass say of its conversation, by
/// attempt.
#[derive(Default)]
struct Seen {
    /// The kind of error each failed attempt ended with.
    failed: HashMap<u32, String>,
    /// The seq of each attempt's `NodeStarted`.
    started_at: HashMap<u32, u64>,
    /// The request ids of hijacks' questions.
    hijack_asked: HashSet<String>,
    /// The attempts in which a hijack ended, once per end.
    hijacked: Vec<u32>,
    /// (attempt, step) of each step asked for.
    started: Vec<(u32, u32)>,
    /// (attempt, step, the model's message) of each step answered.
    finished: Vec<(u32, u32, Value)>,
    /// What the model calls cost.
    spent: f64,
    /// (attempt, step, strategy, summary) of each compaction, in order.
    compacted: Vec<(u32, u32, String, Option<String>)>,
}

impl Seen {
    /// The event types [`Seen::fold`] reads: the query asks for these only.
    const TYPES: [EventType; 8] = [
        EventType::NodeStarted,
        EventType::NodeFailed,
        EventType::AgentStepStarted,
        EventType::AgentStepFinished,
        EventType::TokenUsageReported,
        EventType::InputRequested,
        EventType::RunHijacked,
        EventType::AgentContextCompacted,
    ];

    /// Folds one event of the pass. Every event type has its arm: a new
    /// one does not compile until it says whether a conversation taken
    /// up again needs it (and then it joins [`Seen::TYPES`]).
    fn fold(&mut self, ev: Event) {
        use EventKind as K;
        let attempt = ev.scope.attempt.unwrap_or(0);
        match ev.kind {
            K::NodeStarted { .. } => {
                self.started_at.entry(attempt).or_insert(ev.seq.get());
            }
            K::NodeFailed { error, .. } => {
                self.failed.insert(attempt, error.kind);
            }
            K::AgentStepStarted { step, .. } => self.started.push((attempt, step)),
            K::AgentStepFinished { step, message, .. } => {
                self.finished.push((attempt, step, message))
            }
            K::TokenUsageReported { cost_usd, .. } => self.spent += cost_usd.unwrap_or(0.0),
            // The id names the conversation and the step: no attempt
            // to check (a question is the node's, not an attempt's).
            K::InputRequested { request_id, .. } => {
                if request_id.starts_with("h-") {
                    self.hijack_asked.insert(request_id);
                }
            }
            K::RunHijacked { .. } => self.hijacked.push(attempt),
            K::AgentContextCompacted {
                step,
                strategy,
                message,
                ..
            } => self.compacted.push((attempt, step, strategy, message)),
            // Not part of the conversation (and not read).
            K::RunStarted { .. }
            | K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::RunFinished { .. }
            | K::RunFailed { .. }
            | K::RunCancelled { .. }
            | K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeFinished { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeCancelled { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::ApprovalGranted { .. }
            | K::ApprovalDenied { .. }
            | K::InputReceived { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::ToolCallStarted { .. }
            | K::ToolCallFinished { .. }
            | K::DelegationStarted { .. }
            | K::DelegationFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::NetworkAccess { .. }
            | K::Diagnostic { .. }
            | K::RevertStarted { .. }
            | K::RevertFinished { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. }
            | K::RunHijackRequested { .. } => {}
        }
    }
}

/// The run a conversation begun at `seq` of a fork of `from` was begun in:
/// `from`'s run, or further back when that run is a fork too and `seq`
/// comes before its own copy's end (seqs are the same in a copy).
fn key_run_of(
    backend: &dyn cairn_store::Backend,
    mut from: cairn_events::ForkedFrom,
    seq: u64,
) -> Result<cairn_events::RunId, cairn_store::StoreError> {
    // Each step goes one fork back; a chain longer than this is a loop.
    for _ in 0..64 {
        let first = backend.read_events(
            &from.run_id,
            &EventQuery {
                limit: Some(1),
                ..EventQuery::default()
            },
        )?;
        let earlier = first
            .first()
            .and_then(|e| e.decode().ok())
            .and_then(|e| match e.kind {
                EventKind::RunStarted { forked_from, .. } => forked_from,
                _ => None,
            });
        match earlier {
            Some(f) if seq <= f.seq => from = f,
            _ => return Ok(from.run_id),
        }
    }
    Ok(from.run_id)
}

/// How a recorded call ended: `None` when it started and never finished
/// (the process died while it ran, or a cancel or a stop cut it short),
/// else its result as the model saw it.
pub(crate) fn outcome(rec: &ToolCallRecord) -> Option<Result<Value, ErrorInfo>> {
    match rec.status {
        ToolCallStatus::Success => Some(Ok(rec.output.clone().unwrap_or(Value::Null))),
        ToolCallStatus::Error => Some(Err(rec
            .error
            .clone()
            .and_then(|e| serde_json::from_value(e).ok())
            .unwrap_or_else(|| ErrorInfo::new("tool", "the call failed")))),
        ToolCallStatus::Running | ToolCallStatus::Cancelled => None,
    }
}
