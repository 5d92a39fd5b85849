//! Where a replay and its original part, read from their two logs: the
//! first request or question the original never made, how that request
//! differs from the original's at the same place (a diff of its messages
//! and of its tools), and every node's outcome side by side.
//!
//! Everything comes from the logs and the tool calls' rows, so a report
//! can be made of any two runs at any time (`cairn replay`, `cairn test`,
//! the web page), not only by the process that drove the replay. A request
//! is rebuilt from its conversation's `AgentStepStarted.prompt`, the
//! model's answers and the tools' results; a turn the log does not hold
//! (a correction asked for by `output_schema`) shows as a placeholder on
//! both sides.

use std::collections::BTreeMap;

use cairn_agent::AssistantMessage;
use cairn_events::{Event, EventKind, RunId};
use cairn_store::{Backend, ToolCallRecord};
use serde_json::Value;

use super::record::{RecStep, Recording};
use super::Key;
use super::DIVERGED;
use crate::EngineError;

pub use cairn_events::comparison::{
    Comparison as Report, Divergence, MessageDiff, NodeCompared, RequestDiff, Side,
};

/// A run read whole: its log folded, with its events and rows kept for
/// rebuilding requests.
struct Read {
    id: RunId,
    events: Vec<Event>,
    rec: Recording,
}

impl Read {
    fn new(backend: &dyn Backend, id: &RunId) -> Result<Read, EngineError> {
        let (events, rec) = Recording::read_with_log(backend, id)?;
        Ok(Read {
            id: id.clone(),
            events,
            rec,
        })
    }
}

/// Compares `replay` with `original` (read from `backend`).
pub fn report(
    backend: &dyn Backend,
    original: &RunId,
    replay: &RunId,
) -> Result<Report, EngineError> {
    let o = Read::new(backend, original)?;
    let r = Read::new(backend, replay)?;
    Ok(compare(&o, &r))
}

fn compare(o: &Read, r: &Read) -> Report {
    let mut steps_replayed = 0;
    let mut steps_new = 0;
    let mut first_new: Option<(u64, Key, u32, u32, String)> = None;
    for ev in &r.events {
        let EventKind::AgentStepStarted {
            step, request_hash, ..
        } = &ev.kind
        else {
            continue;
        };
        let Some((node, iteration)) = ev.node_key() else {
            continue;
        };
        let key = (node.to_string(), iteration);
        let known = request_hash.as_ref().is_some_and(|h| {
            o.rec
                .steps
                .get(&key)
                .is_some_and(|ss| ss.iter().any(|s| s.hash.as_ref() == Some(h)))
        });
        if known {
            steps_replayed += 1;
        } else {
            steps_new += 1;
            if first_new.is_none() {
                let attempt = ev.scope.attempt.unwrap_or(1);
                first_new = Some((
                    ev.seq.get(),
                    key,
                    attempt,
                    *step,
                    request_hash.clone().unwrap_or_default(),
                ));
            }
        }
    }
    let failed = first_divergence_failure(&r.events);
    let stopped = failed.is_some();
    // The first of: a node that failed on what the original never asked
    // (a question, a tool call, ...), and a request the original never made.
    let divergence = match (failed, first_new) {
        (Some((seq, d)), new) if d.kind != "request" && new.as_ref().is_none_or(|n| n.0 > seq) => {
            Some(d)
        }
        (Some((_, d)), None) => Some(d),
        (_, Some((_, key, attempt, step, _))) => Some(Divergence {
            message: format!(
                "node `{}` asked the model a request at step {step} that the original never made",
                key.0
            ),
            request: Some(request_diff(o, r, &key, attempt, step)),
            node_id: key.0,
            iteration: key.1,
            attempt: Some(attempt),
            step: Some(step),
            kind: "request".into(),
        }),
        (None, None) => None,
    };
    let mut keys: Vec<&Key> = o.rec.ends.keys().chain(r.rec.ends.keys()).collect();
    keys.sort();
    keys.dedup();
    let nodes = keys
        .into_iter()
        .map(|k| {
            let side = |rec: &Recording| {
                rec.ends
                    .get(k)
                    .map_or(("absent".to_string(), None, None), |e| {
                        (e.status.to_string(), e.output.clone(), e.error.clone())
                    })
            };
            let (os, oo, oe) = side(&o.rec);
            let (rs, ro, re) = side(&r.rec);
            NodeCompared {
                node_id: k.0.clone(),
                iteration: k.1,
                same: os == rs && oo == ro,
                status: Side {
                    original: os,
                    replay: rs,
                },
                output: Side {
                    original: oo,
                    replay: ro,
                },
                error: Side {
                    original: oe,
                    replay: re,
                },
            }
        })
        .collect();
    Report {
        original: o.id.to_string(),
        replay: r.id.to_string(),
        steps_replayed,
        steps_new,
        divergence,
        stopped,
        nodes,
        same_output: o.rec.output == r.rec.output,
        output: Side {
            original: o.rec.output.clone(),
            replay: r.rec.output.clone(),
        },
    }
}

/// The first node of the replay that failed because it diverged.
fn first_divergence_failure(events: &[Event]) -> Option<(u64, Divergence)> {
    events.iter().find_map(|ev| {
        let EventKind::NodeFailed { error, .. } = &ev.kind else {
            return None;
        };
        if error.kind != DIVERGED {
            return None;
        }
        let (node, iteration) = ev.node_key()?;
        let details = error.details.clone().unwrap_or(Value::Null);
        let kind = details
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("request")
            .to_string();
        Some((
            ev.seq.get(),
            Divergence {
                node_id: node.to_string(),
                iteration,
                attempt: ev.scope.attempt,
                step: details
                    .get("step")
                    .and_then(Value::as_u64)
                    .map(|s| s as u32),
                kind,
                message: error.message.clone(),
                request: None,
            },
        ))
    })
}

/// The replay's request at (`attempt`, `step`) of pass `key` against the
/// original's at the same place: in the conversation whose earlier steps
/// the replay took its answers from, else the original's last.
fn request_diff(o: &Read, r: &Read, key: &Key, attempt: u32, step: u32) -> RequestDiff {
    let mine = origin_of(r, key, attempt).and_then(|origin| rebuild(r, key, origin, step));
    let theirs = matching_origin(o, r, key, attempt, step).and_then(|a| rebuild(o, key, a, step));
    let mine = mine.unwrap_or_default();
    let original_found = theirs.is_some();
    let theirs = theirs.unwrap_or_default();
    let mut messages = Vec::new();
    let n = mine.messages.len().max(theirs.messages.len());
    for i in 0..n {
        let a = theirs.messages.get(i);
        let b = mine.messages.get(i);
        if a == b {
            continue;
        }
        let text = |m: Option<&(String, String)>| m.map(|(_, t)| t.clone());
        let role = |m: Option<&(String, String)>| m.map(|(r, _)| r.clone());
        messages.push(MessageDiff {
            index: i,
            diff: line_diff(
                a.map_or("", |(_, t)| t.as_str()),
                b.map_or("", |(_, t)| t.as_str()),
            ),
            role: Side {
                original: role(a),
                replay: role(b),
            },
            text: Side {
                original: text(a),
                replay: text(b),
            },
        });
    }
    let names = |tools: &[cairn_events::ToolDigest]| -> BTreeMap<String, String> {
        tools
            .iter()
            .map(|t| (t.name.clone(), t.hash.clone()))
            .collect()
    };
    let (ot, rt) = (names(&theirs.tools), names(&mine.tools));
    let (tools_added, tools_removed, tools_changed) = if original_found {
        (
            rt.keys()
                .filter(|k| !ot.contains_key(*k))
                .cloned()
                .collect(),
            ot.keys()
                .filter(|k| !rt.contains_key(*k))
                .cloned()
                .collect(),
            rt.iter()
                .filter(|(k, h)| ot.get(*k).is_some_and(|oh| oh != *h))
                .map(|(k, _)| k.clone())
                .collect(),
        )
    } else {
        Default::default()
    };
    RequestDiff {
        original_found,
        system: (theirs.system != mine.system).then(|| Side {
            original: theirs.system.clone(),
            replay: mine.system.clone(),
        }),
        messages,
        tools_added,
        tools_removed,
        tools_changed,
    }
}

/// The attempt that began the conversation `attempt` of pass `key` is
/// part of: the latest attempt up to it whose first request has a prompt
/// (an attempt taken up after a crash goes on with its predecessor's).
fn origin_of(run: &Read, key: &Key, attempt: u32) -> Option<u32> {
    run.rec
        .prompts
        .get(key)?
        .range(..=attempt)
        .next_back()
        .map(|(a, _)| *a)
}

/// The original's conversation to compare a replay's step with: the one
/// whose step answered the replay's step before it, else the original's
/// latest conversation of the pass.
fn matching_origin(o: &Read, r: &Read, key: &Key, attempt: u32, step: u32) -> Option<u32> {
    if step > 1 {
        let origin = origin_of(r, key, attempt)?;
        let before = r
            .rec
            .steps
            .get(key)?
            .iter()
            .rev()
            .find(|s| s.attempt >= origin && s.attempt <= attempt && s.step == step - 1)?;
        let hash = before.hash.as_ref()?;
        let theirs = o
            .rec
            .steps
            .get(key)?
            .iter()
            .find(|s| s.hash.as_ref() == Some(hash))?;
        return origin_of(o, key, theirs.attempt);
    }
    o.rec
        .prompts
        .get(key)
        .and_then(|p| p.keys().next_back().copied())
}

/// A request as rebuilt for display: the system prompt, each message as
/// its role and text, the tools.
#[derive(Debug, Default)]
struct Rebuilt {
    system: Option<String>,
    messages: Vec<(String, String)>,
    tools: Vec<cairn_events::ToolDigest>,
}

/// The request of step `step` of the conversation begun by attempt
/// `origin` of pass `key`, from its prompt, its earlier answers and their
/// calls' results. `None` when the log has no such request.
fn rebuild(run: &Read, key: &Key, origin: u32, step: u32) -> Option<Rebuilt> {
    let prompts = run.rec.prompts.get(key)?;
    let prompt = prompts.get(&origin)?;
    // The conversation runs until the next attempt that begins one.
    let end = prompts
        .range(origin + 1..)
        .next()
        .map_or(u32::MAX, |(a, _)| *a);
    let ours = |a: u32| a >= origin && a < end;
    // A step asked again after a crash: its latest answer is the one.
    let mut steps: BTreeMap<u32, &RecStep> = BTreeMap::new();
    for s in run.rec.steps.get(key).into_iter().flatten() {
        if ours(s.attempt) {
            steps.insert(s.step, s);
        }
    }
    let asked = run.events.iter().any(|ev| {
        ev.scope.attempt.is_some_and(ours)
            && ev.node_key() == Some((key.0.as_str(), key.1))
            && matches!(&ev.kind, EventKind::AgentStepStarted { step: s, .. } if *s == step)
    });
    if !asked {
        return None;
    }
    let rows = run.rec.calls.get(key);
    let mut out = Rebuilt {
        system: prompt.system.clone(),
        messages: vec![("user".into(), prompt.user.clone())],
        tools: prompt.tools.clone(),
    };
    for s in steps.range(..step).map(|(_, s)| *s) {
        let message: AssistantMessage =
            serde_json::from_value(s.message.clone()).unwrap_or_default();
        out.messages
            .push(("assistant".into(), assistant_text(&message)));
        if message.tool_calls.is_empty() {
            out.messages.push((
                "user".into(),
                "[a turn the log does not hold: a correction output_schema asked for, or a person's]"
                    .into(),
            ));
            continue;
        }
        let mut text = String::new();
        for (i, call) in message.tool_calls.iter().enumerate() {
            let result = rows
                .and_then(|rows| call_row(rows, &run.id, key, origin, s.step, i as u32))
                .and_then(crate::agent::history::outcome);
            let body = match result {
                Some(r) => crate::agent::result_text(&r).0,
                None => "[no result recorded]".to_string(),
            };
            text.push_str(&format!("{} ({}): {body}\n", call.name, call.id));
        }
        out.messages.push(("tool results".into(), text));
    }
    Some(out)
}

/// The row of call `index` of `step` in the conversation begun by
/// attempt `origin`.
fn call_row<'a>(
    rows: &'a [ToolCallRecord],
    run: &RunId,
    key: &Key,
    origin: u32,
    step: u32,
    index: u32,
) -> Option<&'a ToolCallRecord> {
    let k = cairn_tools::agent_call_key(run.as_str(), &key.0, key.1, origin, step, index);
    rows.iter().rev().find(|r| r.idempotency_key == k)
}

/// A model's message as one text: its words, then each call it asked for.
fn assistant_text(m: &AssistantMessage) -> String {
    let mut text = m.text.clone().unwrap_or_default();
    for c in &m.tool_calls {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("call {} {}", c.name, c.args));
    }
    text
}

/// `-` lines of `a`, `+` lines of `b`, and a line of context each side of
/// a change.
pub fn line_diff(a: &str, b: &str) -> String {
    let diff = similar::TextDiff::from_lines(a, b);
    let mut out = String::new();
    for group in diff.grouped_ops(1) {
        for op in group {
            for change in diff.iter_changes(&op) {
                let sign = match change.tag() {
                    similar::ChangeTag::Delete => '-',
                    similar::ChangeTag::Insert => '+',
                    similar::ChangeTag::Equal => ' ',
                };
                out.push(sign);
                out.push_str(change.value());
                if !change.value().ends_with('\n') {
                    out.push('\n');
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_diff_marks_what_each_side_has() {
        let d = line_diff("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(d, " a\n-b\n+B\n c\n");
        assert_eq!(line_diff("same\n", "same\n"), "");
    }
}
