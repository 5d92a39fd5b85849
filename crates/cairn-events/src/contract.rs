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

/// What the log has said so far of the run.
struct Log<'a> {
    run: &'a str,
    passes: BTreeMap<(String, u32), Pass>,
    /// A terminal event came, and no resume after it.
    ended: bool,
    /// (node, pass, attempt, snapshot) of a revert started and not finished.
    open_revert: Option<(String, u32, u32, String)>,
    /// Nodes a person asked to take over, whose hijack has not ended.
    hijacks: BTreeSet<String>,
}

/// Checks `events`, one run's whole log in seq order. Returns the first
/// rule broken, with the seq where it broke.
pub fn check_log(events: &[Event]) -> Result<(), String> {
    let Some(first) = events.first() else {
        return Ok(());
    };
    if !matches!(first.kind, EventKind::RunStarted { resumed: false, .. }) {
        return Err(format!(
            "seq {}: the log does not open with RunStarted",
            first.seq
        ));
    }
    let mut log = Log {
        run: first.run_id.as_str(),
        passes: BTreeMap::new(),
        ended: false,
        open_revert: None,
        hijacks: BTreeSet::new(),
    };
    for (i, ev) in events.iter().enumerate() {
        log.check(i as u64 + 1, ev)
            .map_err(|msg| format!("seq {} ({}): {msg}", ev.seq, ev.kind.type_name()))?;
    }
    Ok(())
}

impl Log<'_> {
    /// Checks the event at position `seq` of the log.
    fn check(&mut self, seq: u64, ev: &Event) -> Result<(), String> {
        use EventKind as K;
        if ev.seq != crate::Seq(seq) {
            return Err(format!("expected seq {seq}"));
        }
        if ev.run_id != self.run {
            return Err(format!(
                "run id `{}` in the log of `{}`",
                ev.run_id, self.run
            ));
        }
        // A revert restores files, not the run: `cairn revert` may log one
        // after the run ended.
        let revert = matches!(ev.kind, K::RevertStarted { .. } | K::RevertFinished { .. });
        let resume = matches!(ev.kind, K::RunStarted { resumed: true, .. });
        if self.ended && !revert && !resume {
            return Err("an event after the run's terminal event".into());
        }
        match &ev.kind {
            K::RevertStarted { snapshot } => self.revert(ev, snapshot, true),
            K::RevertFinished { snapshot, .. } => self.revert(ev, snapshot, false),
            K::RunStarted { .. } => {
                self.ended = false;
                Ok(())
            }
            K::RunHijackRequested { node_id, .. } => {
                self.hijacks.insert(node_id.clone());
                Ok(())
            }
            K::RunHijacked { .. } => {
                let node = ev.scope.node_id.as_deref().unwrap_or_default();
                if !self.hijacks.remove(node) {
                    return Err(format!(
                        "node `{node}` hijacked without a RunHijackRequested"
                    ));
                }
                self.node_event(ev)
            }
            K::RunFinished { .. } | K::RunFailed { .. } | K::RunCancelled { .. } => {
                self.run_ended()
            }
            // The rules of their node pass, when they are a node's.
            K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeStarted { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeFinished { .. }
            | K::NodeFailed { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeCancelled { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::ApprovalGranted { .. }
            | K::ApprovalDenied { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepStarted { .. }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
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
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. } => self.node_event(ev),
        }
    }

    /// `RevertStarted` (`start`) or `RevertFinished`: it names an attempt
    /// that started, and one is open at a time.
    fn revert(&mut self, ev: &Event, snapshot: &str, start: bool) -> Result<(), String> {
        let (Some(node), Some(it), Some(a)) =
            (&ev.scope.node_id, ev.scope.iteration, ev.scope.attempt)
        else {
            return Err("a revert that names no attempt".into());
        };
        let this = (node.to_string(), it, a, snapshot.to_string());
        if !start {
            if self.open_revert.take() != Some(this) {
                return Err("RevertFinished without its RevertStarted".into());
            }
            return Ok(());
        }
        if self.open_revert.is_some() {
            return Err("a revert started while another is open".into());
        }
        if !self
            .passes
            .get(&(node.to_string(), it))
            .is_some_and(|p| p.attempts.contains_key(&a))
        {
            return Err(format!(
                "a revert to attempt {a} of node `{node}`, which never started"
            ));
        }
        self.open_revert = Some(this);
        Ok(())
    }

    /// The run's terminal event: no scorer or revert may be left open.
    fn run_ended(&mut self) -> Result<(), String> {
        let open = self.passes.iter().find_map(|((node, _), p)| {
            let id = p.scorers.iter().find(|(_, ended)| !**ended)?.0;
            Some(format!("scorer `{id}` of node `{node}`"))
        });
        if let Some(open) = open {
            return Err(format!("the run ended with {open} open"));
        }
        if let Some((node, ..)) = &self.open_revert {
            return Err(format!("the run ended with a revert of node `{node}` open"));
        }
        self.ended = true;
        Ok(())
    }

    /// The rules of the node pass an event is of (none for a run's event).
    fn node_event(&mut self, ev: &Event) -> Result<(), String> {
        let (Some(node), Some(iteration)) = (&ev.scope.node_id, ev.scope.iteration) else {
            return Ok(());
        };
        let pass = self
            .passes
            .entry((node.to_string(), iteration))
            .or_default();
        pass.check(ev, node, iteration)
    }
}

/// The attempt `a` of a pass, which must have started and not ended.
fn open<'p>(
    attempts: &'p mut BTreeMap<u32, Attempt>,
    a: u32,
    node: &str,
) -> Result<&'p mut Attempt, String> {
    let Some(t) = attempts.get_mut(&a) else {
        return Err(format!(
            "attempt {a} of node `{node}` before its NodeStarted"
        ));
    };
    if t.ended {
        return Err(format!("attempt {a} of node `{node}` after it ended"));
    }
    Ok(t)
}

impl Pass {
    /// Checks one event of this pass. An event that names an attempt
    /// happens inside it; gates, questions and scorers are the pass's.
    fn check(&mut self, ev: &Event, node: &str, iteration: u32) -> Result<(), String> {
        use EventKind as K;
        let a = ev.scope.attempt;
        if !self.pending && !matches!(ev.kind, K::NodePending { .. }) {
            return Err(format!(
                "node `{node}` pass {iteration} before its NodePending"
            ));
        }
        match &ev.kind {
            K::NodePending { .. } => {
                if self.pending {
                    return Err("NodePending twice".into());
                }
                self.pending = true;
            }
            K::NodeStarted { .. } => {
                if let Some(a) = a {
                    self.start(a)?;
                }
            }
            K::NodeRetrying { .. } => {
                if let Some(a) = a {
                    self.retry(a)?;
                }
            }
            K::NodeCancelled { .. } => match a {
                Some(a) => self.cancel(a)?,
                None => self.end_unstarted()?,
            },
            K::NodeSkipped { .. } => self.end_unstarted()?,
            K::NodeFinished { .. } => {
                if let Some(a) = a {
                    open(&mut self.attempts, a, node)?.ended = true;
                    self.finished = true;
                    self.succeeded = true;
                }
            }
            K::NodeFailed { will_retry, .. } => {
                if let Some(a) = a {
                    open(&mut self.attempts, a, node)?.ended = true;
                    if !will_retry {
                        self.finished = true;
                    }
                }
            }
            K::ToolCallStarted { tool_seq, .. } => {
                if let Some(a) = a {
                    let t = open(&mut self.attempts, a, node)?;
                    if !t.tools_started.insert(*tool_seq) {
                        return Err(format!("toolSeq {tool_seq} started twice"));
                    }
                }
            }
            K::ToolCallFinished { tool_seq, .. } => {
                if let Some(a) = a {
                    open(&mut self.attempts, a, node)?.tool_finished(*tool_seq)?;
                }
            }
            K::AgentStepStarted { step, .. } => {
                if let Some(a) = a {
                    let t = open(&mut self.attempts, a, node)?;
                    if t.steps_finished.contains(step) {
                        return Err(format!("step {step} asked again after it finished"));
                    }
                    t.steps_started.insert(*step);
                }
            }
            K::AgentStepFinished { step, .. } => {
                if let Some(a) = a {
                    open(&mut self.attempts, a, node)?.step_finished(*step)?;
                }
            }
            K::InputRequested { request_id, .. } => {
                if self.of_pass(a, node)? {
                    self.asked.insert(request_id.clone());
                }
            }
            K::InputReceived { request_id, .. } => {
                if self.of_pass(a, node)? && !self.asked.contains(request_id) {
                    return Err(format!("an answer to `{request_id}`, which was not asked"));
                }
            }
            K::ScorerStarted { scorer_id, .. } => {
                if self.of_pass(a, node)? {
                    self.scorer_started(scorer_id)?;
                }
            }
            K::ScorerFinished { scorer_id, .. } | K::ScorerFailed { scorer_id, .. } => {
                if self.of_pass(a, node)? {
                    match self.scorers.get_mut(scorer_id) {
                        None => {
                            return Err(format!("scorer `{scorer_id}` ended before it started"))
                        }
                        Some(true) => return Err(format!("scorer `{scorer_id}` ended twice")),
                        Some(ended) => *ended = true,
                    }
                }
            }
            K::ApprovalRequested { .. } => {
                if self.of_pass(a, node)? {
                    self.gate = true;
                }
            }
            K::ApprovalGranted { .. } | K::ApprovalDenied { .. } => {
                if self.of_pass(a, node)? && !self.gate {
                    return Err("a decision on a gate that was not asked".into());
                }
            }
            // No rule of their own: inside their attempt, if they name one.
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
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
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
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {
                if let Some(a) = a {
                    open(&mut self.attempts, a, node)?;
                }
            }
        }
        Ok(())
    }

    /// Whether an event of a gate, a question or a scorer is the pass's
    /// (it names no attempt); one that names an attempt happens inside it.
    fn of_pass(&mut self, a: Option<u32>, node: &str) -> Result<bool, String> {
        match a {
            None => Ok(true),
            Some(a) => open(&mut self.attempts, a, node).map(|_| false),
        }
    }

    /// `NodeStarted` of attempt `a`: one attempt at a time, a retry
    /// announced, none after the pass ended.
    fn start(&mut self, a: u32) -> Result<(), String> {
        if self.finished {
            return Err("an attempt started after the node finished".into());
        }
        if self.attempts.contains_key(&a) {
            return Err(format!("attempt {a} started twice"));
        }
        if let Some(open) = self.attempts.iter().find(|(_, t)| !t.ended) {
            return Err(format!(
                "attempt {a} started while attempt {} is open",
                open.0
            ));
        }
        if a > 1 && self.attempts.contains_key(&(a - 1)) && self.announced != Some(a) {
            return Err(format!("attempt {a} started without its NodeRetrying"));
        }
        self.announced = None;
        self.attempts.insert(a, Attempt::default());
        Ok(())
    }

    /// `NodeRetrying` for attempt `a`, after attempt `a - 1` ended.
    fn retry(&mut self, a: u32) -> Result<(), String> {
        let prev = a.checked_sub(1).and_then(|p| self.attempts.get(&p));
        if !prev.is_some_and(|p| p.ended) {
            return Err(format!(
                "NodeRetrying for attempt {a} before attempt {} ended",
                a.saturating_sub(1)
            ));
        }
        self.announced = Some(a);
        Ok(())
    }

    /// `NodeCancelled` of attempt `a`: the attempt that runs, or
    /// (cancelled between retries) the last one that ran.
    fn cancel(&mut self, a: u32) -> Result<(), String> {
        let Some(t) = self.attempts.get_mut(&a) else {
            return Err(format!(
                "NodeCancelled names attempt {a}, which never started"
            ));
        };
        t.ended = true;
        if self.attempts.values().any(|t| !t.ended) {
            return Err("a node cancelled while another attempt is open".into());
        }
        self.finished = true;
        Ok(())
    }

    /// `NodeSkipped`, or `NodeCancelled` without an attempt.
    fn end_unstarted(&mut self) -> Result<(), String> {
        if self.attempts.values().any(|t| !t.ended) {
            return Err("a node ended without an attempt while one is open".into());
        }
        self.finished = true;
        Ok(())
    }

    /// `ScorerStarted`: after the pass's `NodeFinished`, once.
    fn scorer_started(&mut self, scorer_id: &str) -> Result<(), String> {
        if !self.succeeded {
            return Err(format!(
                "scorer `{scorer_id}` started before the node's NodeFinished"
            ));
        }
        if self.scorers.insert(scorer_id.to_string(), false).is_some() {
            return Err(format!("scorer `{scorer_id}` started twice"));
        }
        Ok(())
    }
}

impl Attempt {
    fn tool_finished(&mut self, tool_seq: u32) -> Result<(), String> {
        if !self.tools_started.contains(&tool_seq) {
            return Err(format!("toolSeq {tool_seq} finished before it started"));
        }
        if !self.tools_finished.insert(tool_seq) {
            return Err(format!("toolSeq {tool_seq} finished twice"));
        }
        Ok(())
    }

    fn step_finished(&mut self, step: u32) -> Result<(), String> {
        if !self.steps_started.contains(&step) {
            return Err(format!("step {step} finished before it started"));
        }
        if !self.steps_finished.insert(step) {
            return Err(format!("step {step} finished twice"));
        }
        Ok(())
    }
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
                run_id: crate::RunId::parse("r").unwrap(),
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
            trigger: None,
            replay_of: None,
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
