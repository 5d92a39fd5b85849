//! What an original run's log and rows hold that a replay answers from.

use std::collections::{BTreeMap, HashMap};

use cairn_events::{Event, EventKind, OutputStream, RunId, StepPrompt};
use cairn_store::{Backend, EventQuery, ToolCallRecord};
use serde_json::Value;

use super::Key;
use crate::EngineError;

/// One answered model step of the original.
#[derive(Debug, Clone)]
pub(crate) struct RecStep {
    /// The attempt and step it was, in the original.
    pub attempt: u32,
    pub step: u32,
    /// Its request's hash (logs written before hashes were kept have none,
    /// and match nothing).
    pub hash: Option<String>,
    /// What the model answered, as `AgentStepFinished` holds it.
    pub message: Value,
    pub finish_reason: String,
    /// Its `TokenUsageReported`, as logged.
    pub usage: Option<EventKind>,
    /// Its streamed text, in the pieces it was logged in.
    pub pieces: Vec<(OutputStream, String)>,
}

/// A node pass's end in the original.
#[derive(Debug, Clone)]
pub(crate) struct RecEnd {
    /// The attempt that ended it.
    pub attempt: u32,
    /// `finished`, `failed`, `skipped` or `cancelled`.
    pub status: &'static str,
    pub output: Option<Value>,
    pub error: Option<Value>,
}

/// The original run, as a replay reads it.
#[derive(Debug, Default)]
pub(crate) struct Recording {
    /// Answered model steps by node pass, in the log's order.
    pub steps: HashMap<Key, Vec<RecStep>>,
    /// The prompts of the conversations, by node pass and attempt.
    pub prompts: HashMap<Key, BTreeMap<u32, StepPrompt>>,
    /// Summaries that compacted a conversation, by node pass and the step
    /// they came before.
    pub summaries: HashMap<(Key, u32), Vec<String>>,
    /// The decision at each gate.
    pub decisions: HashMap<Key, crate::node::Decision>,
    /// Questions answered, by node pass in the order asked: the prompt
    /// and the answer. (Not by request id: an agent's questions are named
    /// after its calls' keys, which name the run.)
    pub answers: HashMap<Key, Vec<(String, Value)>>,
    /// Tool calls by node pass, by attempt then `toolSeq`.
    pub calls: HashMap<Key, Vec<ToolCallRecord>>,
    /// Each pass's streamed output per attempt (a command's stdout).
    pub pieces: HashMap<(Key, u32), Vec<(OutputStream, String)>>,
    /// How each node pass ended (its latest attempt).
    pub ends: BTreeMap<Key, RecEnd>,
    /// The child runs each pass started, in order.
    pub children: HashMap<Key, Vec<RunId>>,
    /// The snapshot of the root before the first attempt that could change
    /// files: what a replay's copy of the root starts as.
    pub first_snapshot: Option<String>,
    /// The original's run output.
    pub output: Option<Value>,
}

impl Recording {
    /// Reads `run_id`'s log and its tool calls' rows.
    pub(crate) fn read(backend: &dyn Backend, run_id: &RunId) -> Result<Recording, EngineError> {
        Ok(Recording::read_with_log(backend, run_id)?.1)
    }

    /// [`Recording::read`], with the log it was read from.
    pub(crate) fn read_with_log(
        backend: &dyn Backend,
        run_id: &RunId,
    ) -> Result<(Vec<Event>, Recording), EngineError> {
        let stored = backend.read_events(run_id, &EventQuery::default())?;
        let mut events = Vec::with_capacity(stored.len());
        for s in &stored {
            events.push(crate::decode_row(run_id, s)?);
        }
        let mut rec = Recording::fold(&events);
        let passes: Vec<Key> = rec.ends.keys().cloned().collect();
        for key in passes {
            let rows = backend.tool_calls(run_id, &cairn_events::NodePath::from(&key.0), key.1)?;
            if !rows.is_empty() {
                rec.calls.insert(key, rows);
            }
        }
        Ok((events, rec))
    }

    /// What the events hold (no rows).
    pub(crate) fn fold(events: &[Event]) -> Recording {
        use EventKind as K;
        let mut rec = Recording::default();
        // The step each attempt has open: what its pieces and usage belong to.
        let mut open: HashMap<(Key, u32), RecStep> = HashMap::new();
        let mut asked: HashMap<String, (Key, String)> = HashMap::new();
        for ev in events {
            let key = ev.node_key().map(|(n, i)| (n.to_string(), i));
            let attempt = ev.scope.attempt.unwrap_or(0);
            match (&ev.kind, key) {
                (K::RunFinished { output, .. }, _) => rec.output = output.clone(),
                (K::NodeStarted { snapshot }, Some(key)) => {
                    if rec.first_snapshot.is_none() {
                        rec.first_snapshot = snapshot.clone();
                    }
                    rec.ends.entry(key).or_insert(RecEnd {
                        attempt,
                        status: "running",
                        output: None,
                        error: None,
                    });
                }
                (
                    K::AgentStepStarted {
                        step,
                        request_hash,
                        prompt,
                        ..
                    },
                    Some(key),
                ) => {
                    if let Some(p) = prompt {
                        rec.prompts
                            .entry(key.clone())
                            .or_default()
                            .insert(attempt, (**p).clone());
                    }
                    open.insert(
                        (key, attempt),
                        RecStep {
                            attempt,
                            step: *step,
                            hash: request_hash.clone(),
                            message: Value::Null,
                            finish_reason: String::new(),
                            usage: None,
                            pieces: Vec::new(),
                        },
                    );
                }
                (K::NodeOutput { text, stream }, Some(key)) => {
                    match open.get_mut(&(key.clone(), attempt)) {
                        Some(s) => s.pieces.push((*stream, text.clone())),
                        None => rec
                            .pieces
                            .entry((key, attempt))
                            .or_default()
                            .push((*stream, text.clone())),
                    }
                }
                (K::TokenUsageReported { .. }, Some(key)) => {
                    if let Some(s) = open.get_mut(&(key, attempt)) {
                        s.usage = Some(ev.kind.clone());
                    }
                }
                (
                    K::AgentStepFinished {
                        step,
                        finish_reason,
                        message,
                        ..
                    },
                    Some(key),
                ) => {
                    if let Some(mut s) = open.remove(&(key.clone(), attempt)) {
                        if s.step == *step {
                            s.message = message.clone();
                            s.finish_reason = finish_reason.clone();
                            rec.steps.entry(key).or_default().push(s);
                        }
                    }
                }
                (
                    K::AgentContextCompacted {
                        step,
                        message: Some(summary),
                        ..
                    },
                    Some(key),
                ) => rec
                    .summaries
                    .entry((key, *step))
                    .or_default()
                    .push(summary.clone()),
                (K::ApprovalGranted { decided_by, note }, Some(key)) => {
                    rec.decisions.insert(key, decision(true, note, decided_by));
                }
                (K::ApprovalDenied { decided_by, note }, Some(key)) => {
                    rec.decisions.insert(key, decision(false, note, decided_by));
                }
                (
                    K::InputRequested {
                        request_id, prompt, ..
                    },
                    Some(key),
                ) => {
                    asked.insert(request_id.clone(), (key, prompt.clone()));
                }
                (
                    K::InputReceived {
                        request_id, answer, ..
                    },
                    _,
                ) => {
                    if let Some((key, prompt)) = asked.get(request_id) {
                        rec.answers
                            .entry(key.clone())
                            .or_default()
                            .push((prompt.clone(), answer.clone()));
                    }
                }
                (K::DelegationStarted { child_run_id, .. }, Some(key)) => {
                    let started = rec.children.entry(key).or_default();
                    if !started.contains(child_run_id) {
                        started.push(child_run_id.clone());
                    }
                }
                (K::NodeFinished { output, .. }, Some(key)) => {
                    rec.ends.insert(
                        key,
                        RecEnd {
                            attempt,
                            status: "finished",
                            output: output.as_ref().map(|o| o.to_value()),
                            error: None,
                        },
                    );
                }
                (K::NodeFailed { error, .. }, Some(key)) => {
                    rec.ends.insert(
                        key,
                        RecEnd {
                            attempt,
                            status: "failed",
                            output: None,
                            error: serde_json::to_value(error).ok(),
                        },
                    );
                }
                (K::NodeSkipped { .. }, Some(key)) => {
                    rec.ends.insert(
                        key,
                        RecEnd {
                            attempt,
                            status: "skipped",
                            output: None,
                            error: None,
                        },
                    );
                }
                (K::NodeCancelled { .. }, Some(key)) => {
                    rec.ends.insert(
                        key,
                        RecEnd {
                            attempt,
                            status: "cancelled",
                            output: None,
                            error: None,
                        },
                    );
                }
                _ => {}
            }
        }
        rec
    }
}

fn decision(approved: bool, note: &Option<String>, by: &Option<String>) -> crate::node::Decision {
    crate::node::Decision {
        approved,
        note: note.clone(),
        by: by.clone(),
    }
}
