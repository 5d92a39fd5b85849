//! Checks one run's log against the rules of the event contract that the
//! log alone can show (`EVENTS.md`, "Envelope", "Guarantees" and "Ordering
//! rules for one node"): seqs from 1 without gaps, one run id, a first
//! `RunStarted`, nothing after a terminal event but a resume, and per node
//! pass: `NodePending` first and once, each attempt opened by `NodeStarted`
//! before anything of it and closed once, a retry announced between the
//! failure and the next start, tool calls and agent steps started before
//! they finish and finished once, questions and gates asked before they
//! are answered, scorers started after the pass's `NodeFinished` and ended
//! once, and none left open when the run ends; reverts of attempts that
//! started, one at a time, finished before the run ends (a revert may come
//! after the run's end: it changes files, not the run), and a hijack's end
//! after its request.
//!
//! Pure, like [`crate::check_tree`]: tests that make logs (crash tests,
//! children, agents, engines) run every log they make through it.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Event, EventKind};

/// What the log has said so far of one attempt.
#[derive(Default)]
struct Attempt {
    ended: bool,
    tools_started: BTreeSet<u32>,
    tools_finished: BTreeSet<u32>,
    steps_started: BTreeSet<u32>,
    steps_finished: BTreeSet<u32>,
}

/// What the log has said so far of one node pass.
#[derive(Default)]
struct Pass {
    pending: bool,
    finished: bool,
    attempts: BTreeMap<u32, Attempt>,
    /// The attempt a `NodeRetrying` announced, not started yet.
    announced: Option<u32>,
    asked: BTreeSet<String>,
    gate: bool,
    /// The pass ended with `NodeFinished` (it has an output to score).
    succeeded: bool,
    /// Scorers started, by id, with whether they ended.
    scorers: BTreeMap<String, bool>,
}

/// Checks `events`, one run's whole log in seq order. Returns the first
/// rule broken, with the seq where it broke.
pub fn check_log(events: &[Event]) -> Result<(), String> {
    let Some(first) = events.first() else {
        return Ok(());
    };
    let run = first.run_id.as_str();
    if !matches!(first.kind, EventKind::RunStarted { resumed: false, .. }) {
        return Err(format!(
            "seq {}: the log does not open with RunStarted",
            first.seq
        ));
    }
    let mut passes: BTreeMap<(String, u32), Pass> = BTreeMap::new();
    let mut ended = false;
    // (node, pass, attempt, snapshot) of a revert started and not finished.
    let mut open_revert: Option<(String, u32, u32, String)> = None;
    // Nodes a person asked to take over, whose hijack has not ended.
    let mut hijacks: BTreeSet<String> = BTreeSet::new();
    for (i, ev) in events.iter().enumerate() {
        let at = |msg: String| Err(format!("seq {} ({}): {msg}", ev.seq, ev.kind.type_name()));
        if ev.seq != crate::Seq(i as u64 + 1) {
            return at(format!("expected seq {}", i + 1));
        }
        if ev.run_id != run {
            return at(format!("run id `{}` in the log of `{run}`", ev.run_id));
        }
        // A revert restores files, not the run: `cairn revert` may log one
        // after the run ended. It names an attempt that started, and one
        // is open at a time.
        if let EventKind::RevertStarted { snapshot } | EventKind::RevertFinished { snapshot, .. } =
            &ev.kind
        {
            let (Some(node), Some(it), Some(a)) =
                (&ev.scope.node_id, ev.scope.iteration, ev.scope.attempt)
            else {
                return at("a revert that names no attempt".into());
            };
            let this = (node.to_string(), it, a, snapshot.clone());
            if matches!(ev.kind, EventKind::RevertStarted { .. }) {
                if open_revert.is_some() {
                    return at("a revert started while another is open".into());
                }
                if !passes
                    .get(&(node.to_string(), it))
                    .is_some_and(|p| p.attempts.contains_key(&a))
                {
                    return at(format!(
                        "a revert to attempt {a} of node `{node}`, which never started"
                    ));
                }
                open_revert = Some(this);
            } else if open_revert.take() != Some(this) {
                return at("RevertFinished without its RevertStarted".into());
            }
            continue;
        }
        if ended && !matches!(ev.kind, EventKind::RunStarted { resumed: true, .. }) {
            return at("an event after the run's terminal event".into());
        }
        match &ev.kind {
            EventKind::RunStarted { .. } => {
                ended = false;
                continue;
            }
            EventKind::RunHijackRequested { node_id, .. } => {
                hijacks.insert(node_id.clone());
                continue;
            }
            EventKind::RunHijacked { .. } => {
                let node = ev.scope.node_id.as_deref().unwrap_or_default();
                if !hijacks.remove(node) {
                    return at(format!(
                        "node `{node}` hijacked without a RunHijackRequested"
                    ));
                }
            }
            EventKind::RunFinished { .. }
            | EventKind::RunFailed { .. }
            | EventKind::RunCancelled { .. } => {
                let open = passes.iter().find_map(|((node, _), p)| {
                    let id = p.scorers.iter().find(|(_, ended)| !**ended)?.0;
                    Some(format!("scorer `{id}` of node `{node}`"))
                });
                if let Some(open) = open {
                    return at(format!("the run ended with {open} open"));
                }
                if let Some((node, ..)) = &open_revert {
                    return at(format!("the run ended with a revert of node `{node}` open"));
                }
                ended = true;
                continue;
            }
            _ => {}
        }
        let (Some(node), Some(iteration)) = (&ev.scope.node_id, ev.scope.iteration) else {
            continue;
        };
        let pass = passes.entry((node.to_string(), iteration)).or_default();
        if let EventKind::NodePending { .. } = ev.kind {
            if pass.pending {
                return at("NodePending twice".into());
            }
            pass.pending = true;
            continue;
        }
        if !pass.pending {
            return at(format!(
                "node `{node}` pass {iteration} before its NodePending"
            ));
        }
        match (&ev.kind, ev.scope.attempt) {
            (EventKind::NodeStarted { .. }, Some(a)) => {
                if pass.finished {
                    return at("an attempt started after the node finished".into());
                }
                if pass.attempts.contains_key(&a) {
                    return at(format!("attempt {a} started twice"));
                }
                if let Some(open) = pass.attempts.iter().find(|(_, t)| !t.ended) {
                    return at(format!(
                        "attempt {a} started while attempt {} is open",
                        open.0
                    ));
                }
                if a > 1 && pass.attempts.contains_key(&(a - 1)) && pass.announced != Some(a) {
                    return at(format!("attempt {a} started without its NodeRetrying"));
                }
                pass.announced = None;
                pass.attempts.insert(a, Attempt::default());
            }
            (EventKind::NodeRetrying { .. }, Some(a)) => {
                let prev = a.checked_sub(1).and_then(|p| pass.attempts.get(&p));
                if !prev.is_some_and(|p| p.ended) {
                    return at(format!(
                        "NodeRetrying for attempt {a} before attempt {} ended",
                        a.saturating_sub(1)
                    ));
                }
                pass.announced = Some(a);
            }
            (EventKind::NodeCancelled { .. }, Some(a)) => {
                // The attempt that runs, or (cancelled between retries)
                // the last one that ran.
                let Some(t) = pass.attempts.get_mut(&a) else {
                    return at(format!(
                        "NodeCancelled names attempt {a}, which never started"
                    ));
                };
                t.ended = true;
                if pass.attempts.values().any(|t| !t.ended) {
                    return at("a node cancelled while another attempt is open".into());
                }
                pass.finished = true;
            }
            (EventKind::NodeSkipped { .. }, _) | (EventKind::NodeCancelled { .. }, None) => {
                if pass.attempts.values().any(|t| !t.ended) {
                    return at("a node ended without an attempt while one is open".into());
                }
                pass.finished = true;
            }
            (_, Some(a)) => {
                let Some(t) = pass.attempts.get_mut(&a) else {
                    return at(format!(
                        "attempt {a} of node `{node}` before its NodeStarted"
                    ));
                };
                if t.ended {
                    return at(format!("attempt {a} of node `{node}` after it ended"));
                }
                match &ev.kind {
                    EventKind::NodeFinished { .. } => {
                        t.ended = true;
                        pass.finished = true;
                        pass.succeeded = true;
                    }
                    EventKind::NodeFailed { will_retry, .. } => {
                        t.ended = true;
                        if !will_retry {
                            pass.finished = true;
                        }
                    }
                    EventKind::ToolCallStarted { tool_seq, .. }
                        if !t.tools_started.insert(*tool_seq) =>
                    {
                        return at(format!("toolSeq {tool_seq} started twice"));
                    }
                    EventKind::ToolCallFinished { tool_seq, .. } => {
                        if !t.tools_started.contains(tool_seq) {
                            return at(format!("toolSeq {tool_seq} finished before it started"));
                        }
                        if !t.tools_finished.insert(*tool_seq) {
                            return at(format!("toolSeq {tool_seq} finished twice"));
                        }
                    }
                    EventKind::AgentStepStarted { step, .. } => {
                        if t.steps_finished.contains(step) {
                            return at(format!("step {step} asked again after it finished"));
                        }
                        t.steps_started.insert(*step);
                    }
                    EventKind::AgentStepFinished { step, .. } => {
                        if !t.steps_started.contains(step) {
                            return at(format!("step {step} finished before it started"));
                        }
                        if !t.steps_finished.insert(*step) {
                            return at(format!("step {step} finished twice"));
                        }
                    }
                    _ => {}
                }
            }
            (EventKind::InputRequested { request_id, .. }, None) => {
                pass.asked.insert(request_id.clone());
            }
            (EventKind::InputReceived { request_id, .. }, None)
                if !pass.asked.contains(request_id) =>
            {
                return at(format!("an answer to `{request_id}`, which was not asked"));
            }
            (EventKind::ScorerStarted { scorer_id, .. }, None) => {
                if !pass.succeeded {
                    return at(format!(
                        "scorer `{scorer_id}` started before the node's NodeFinished"
                    ));
                }
                if pass.scorers.insert(scorer_id.clone(), false).is_some() {
                    return at(format!("scorer `{scorer_id}` started twice"));
                }
            }
            (
                EventKind::ScorerFinished { scorer_id, .. }
                | EventKind::ScorerFailed { scorer_id, .. },
                None,
            ) => match pass.scorers.get_mut(scorer_id) {
                None => return at(format!("scorer `{scorer_id}` ended before it started")),
                Some(true) => return at(format!("scorer `{scorer_id}` ended twice")),
                Some(ended) => *ended = true,
            },
            (EventKind::ApprovalRequested { .. }, None) => pass.gate = true,
            (EventKind::ApprovalGranted { .. } | EventKind::ApprovalDenied { .. }, None)
                if !pass.gate =>
            {
                return at("a decision on a gate that was not asked".into());
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorInfo, Scope, Seq};

    fn log(kinds: Vec<(Scope, EventKind)>) -> Vec<Event> {
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, (scope, kind))| Event {
                run_id: "r".into(),
                seq: Seq(i as u64 + 1),
                timestamp_ms: 0,
                scope,
                kind,
            })
            .collect()
    }

    fn started() -> EventKind {
        EventKind::RunStarted {
            workflow: "w".into(),
            workflow_hash: "h".into(),
            input: None,
            resumed: false,
            parent_run_id: None,
            parent_node_id: None,
            depth: 0,
            forked_from: None,
        }
    }

    fn revert(done: bool) -> EventKind {
        if done {
            EventKind::RevertFinished {
                snapshot: "s".into(),
                success: true,
                error: None,
            }
        } else {
            EventKind::RevertStarted {
                snapshot: "s".into(),
            }
        }
    }

    /// A run whose node `a` ran one attempt, then ended.
    fn ran() -> Vec<(Scope, EventKind)> {
        let a = || Scope::node("a", 0);
        vec![
            (Scope::run(), started()),
            (a(), EventKind::NodePending { layer_index: None }),
            (
                a().with_attempt(1),
                EventKind::NodeStarted {
                    snapshot: Some("s".into()),
                },
            ),
            (
                a().with_attempt(1),
                EventKind::NodeFailed {
                    error: ErrorInfo::new("exit", "1"),
                    will_retry: false,
                    snapshot: None,
                },
            ),
            (
                Scope::run(),
                EventKind::RunFailed {
                    error: ErrorInfo::new("node", "a"),
                },
            ),
        ]
    }

    #[test]
    fn a_revert_may_follow_the_runs_end() {
        let mut l = ran();
        l.push((Scope::node("a", 0).with_attempt(1), revert(false)));
        l.push((Scope::node("a", 0).with_attempt(1), revert(true)));
        check_log(&log(l)).unwrap();
    }

    #[test]
    fn reverts_name_an_attempt_that_started_one_at_a_time() {
        let mut l = ran();
        l.push((Scope::node("a", 0).with_attempt(2), revert(false)));
        assert!(check_log(&log(l)).unwrap_err().contains("never started"));

        let mut l = ran();
        l.push((Scope::node("a", 0).with_attempt(1), revert(false)));
        l.push((Scope::node("a", 0).with_attempt(1), revert(false)));
        assert!(check_log(&log(l)).unwrap_err().contains("another is open"));

        let mut l = ran();
        l.push((Scope::node("a", 0).with_attempt(1), revert(true)));
        assert!(check_log(&log(l))
            .unwrap_err()
            .contains("without its RevertStarted"));
    }

    #[test]
    fn a_hijack_ends_after_its_request() {
        let a = || Scope::node("a", 0);
        let hijacked = || EventKind::RunHijacked {
            engine: "cairn".into(),
            mode: "interactive".into(),
            resumed: true,
        };
        let start = vec![
            (Scope::run(), started()),
            (a(), EventKind::NodePending { layer_index: None }),
            (
                a().with_attempt(1),
                EventKind::NodeStarted { snapshot: None },
            ),
        ];
        let mut l = start.clone();
        l.push((a().with_attempt(1), hijacked()));
        assert!(check_log(&log(l))
            .unwrap_err()
            .contains("without a RunHijackRequested"));
        let mut l = start;
        l.push((
            Scope::run(),
            EventKind::RunHijackRequested {
                node_id: "a".into(),
                requested_by: None,
            },
        ));
        l.push((a().with_attempt(1), hijacked()));
        check_log(&log(l.clone())).unwrap();
        // A second end needs a second request.
        l.push((a().with_attempt(1), hijacked()));
        assert!(check_log(&log(l)).is_err());
    }

    #[test]
    fn a_run_does_not_end_with_a_revert_open() {
        let mut l = ran();
        let end = l.pop().unwrap();
        l.push((Scope::node("a", 0).with_attempt(1), revert(false)));
        l.push(end);
        assert!(check_log(&log(l))
            .unwrap_err()
            .contains("revert of node `a` open"));
    }
}
