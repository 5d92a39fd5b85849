//! The Activity view: the human-sized story of a run, derived from its log
//! and never stored as events.
//!
//! The log says everything at machine grain (every output chunk, heartbeat,
//! layer). People watching a run want one line per meaningful action: a
//! command ran, a file was read or edited, an approval was asked and decided,
//! a child run was delegated, a node completed, something failed, the run
//! ended. [`ActivityFolder`] turns events into those entries; entries that
//! span time (a command, a tool call, an approval) are opened by one event and
//! closed by a later one, so an entry's `status` and `endedMs` change while
//! the run goes on, but its `id` and its place in the chain do not.

use std::collections::HashMap;

use serde::Serialize;

use crate::event::{ErrorInfo, Event, EventKind, OutputStream, ToolStatus};
use crate::ids::{NodePath, RunId};

/// The parent run and node of a child run, so a child's activity can be shown
/// under the delegation that started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DelegatedBy {
    /// The parent run.
    pub run_id: RunId,
    /// The parent's node that delegated.
    pub node_id: String,
}

/// One entry of a run's activity.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    /// `<runId>-<seq>`, where `seq` is the event that opened the entry: stable
    /// across recomputations of the view, so clients can key on it.
    pub id: String,
    /// The run the entry belongs to.
    pub run_id: RunId,
    /// The node the entry belongs to; absent for run-level entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodePath>,
    /// The node's loop pass, for node entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u32>,
    /// The entry before this one in the run: the entries form one chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_activity_id: Option<String>,
    /// Set on every entry of a child run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegated_by: Option<DelegatedBy>,
    /// What happened: `run`, `command`, `file-read`, `file-written`,
    /// `file-edited`, `search`, `tool`, `approval`, `input`, `delegation`,
    /// `completion` or `error`.
    pub kind: &'static str,
    /// One line for people.
    pub title: String,
    /// `running`, `waiting`, `success`, `error`, `cancelled`, `approved`,
    /// `denied` or `answered`.
    pub status: &'static str,
    /// When the opening event was appended.
    pub started_ms: i64,
    /// When the closing event was appended; absent while the entry is open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// The `seq` of the opening event.
    pub seq: u64,
    /// The `seq` of the last event that changed the entry.
    pub updated_seq: u64,
    /// The error message, for entries that ended in error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The child run a `delegation` entry started: its entries follow it
    /// in a tree's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<RunId>,
    /// What the action was about: the file, the command, the pattern, the
    /// child run's workflow, the question, the tool's arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For an agent's action, the first line of what the model thought or
    /// said in the step that asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// The Activity view of a whole log.
///
/// ```
/// use cairn_events::{activity, Event, EventKind, RunId, Scope, Seq};
/// let ev = |seq: u64, scope, kind| Event { run_id: RunId::parse("r").unwrap(), seq: Seq(seq), timestamp_ms: seq as i64, scope, kind };
/// let log = [
///     ev(1, Scope::node("build", 0).with_attempt(1), EventKind::NodeStarted { snapshot: None }),
///     ev(2, Scope::node("build", 0).with_attempt(1),
///        EventKind::NodeFinished { duration_ms: 1, output: None, cached: None, snapshot: None }),
/// ];
/// let story = activity(&log);
/// assert_eq!(story.len(), 1);
/// assert_eq!(story[0].kind, "completion");
/// ```
pub fn activity(events: &[Event]) -> Vec<Activity> {
    let mut f = ActivityFolder::new();
    for e in events {
        f.apply(e);
    }
    f.into_entries()
}

type AttemptKey = (NodePath, u32, u32);

/// Folds events one by one into the Activity view, for callers that keep the
/// view up to date while a run goes on.
#[derive(Debug, Default, Clone)]
pub struct ActivityFolder {
    entries: Vec<Activity>,
    node_kinds: HashMap<String, String>,
    delegated_by: Option<DelegatedBy>,
    /// Each node attempt still running: (start ts, start seq, made tool calls).
    attempts: HashMap<AttemptKey, (i64, u64, bool)>,
    /// The command entry of a running attempt.
    commands: HashMap<AttemptKey, usize>,
    /// Open tool-call entries by (node, iteration, attempt, toolSeq).
    tools: HashMap<(NodePath, u32, u32, u32), usize>,
    /// Open approval entries by (node, iteration).
    waits: HashMap<(NodePath, u32), usize>,
    /// Open questions by request id (an agent asks several at once).
    questions: HashMap<String, usize>,
    /// Open delegations by child run id.
    delegations: HashMap<RunId, usize>,
    /// The tool calls an agent's latest step asked for, not started yet,
    /// by attempt: where a call's entry finds its arguments.
    asked: HashMap<AttemptKey, Vec<(String, String)>>,
    /// The first line of each agent attempt's latest step's reasoning.
    thought: HashMap<AttemptKey, String>,
}

impl ActivityFolder {
    /// A folder with no events yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the folder each node's kind (`command`, `value`, `tool`, ...) by
    /// node id, as the workflow declares it. The log does not name node
    /// kinds; without this hint a command node is recognised only once it
    /// writes to stdout or stderr.
    pub fn with_node_kinds(mut self, kinds: HashMap<String, String>) -> Self {
        self.node_kinds = kinds;
        self
    }

    /// The entries so far, oldest first.
    pub fn entries(&self) -> &[Activity] {
        &self.entries
    }

    /// The entries, oldest first.
    pub fn into_entries(self) -> Vec<Activity> {
        self.entries
    }

    fn is_command_node(&self, node_id: &str) -> bool {
        // Loop and for_each children are named by path (`review.fix`,
        // `per_line[3].show`); the hint map may hold either form.
        if let Some(k) = self.node_kinds.get(node_id) {
            return k == "command";
        }
        let generic = strip_indices(node_id);
        self.node_kinds
            .get(&generic)
            .is_some_and(|k| k == "command")
    }

    fn push(
        &mut self,
        ev: &Event,
        kind: &'static str,
        title: String,
        status: &'static str,
    ) -> usize {
        self.push_at(ev, ev.timestamp_ms, ev.seq.get(), kind, title, status)
    }

    fn push_at(
        &mut self,
        ev: &Event,
        started_ms: i64,
        seq: u64,
        kind: &'static str,
        title: String,
        status: &'static str,
    ) -> usize {
        let previous_activity_id = self.entries.last().map(|a| a.id.clone());
        self.entries.push(Activity {
            id: format!("{}-{}", ev.run_id, seq),
            run_id: ev.run_id.clone(),
            node_id: ev.scope.node_id.clone(),
            iteration: ev
                .scope
                .node_id
                .as_ref()
                .map(|_| ev.scope.iteration.unwrap_or(0)),
            previous_activity_id,
            delegated_by: self.delegated_by.clone(),
            kind,
            title,
            status,
            started_ms,
            ended_ms: None,
            seq,
            updated_seq: ev.seq.get(),
            error: None,
            child_run_id: None,
            detail: None,
            reasoning: None,
        });
        self.entries.len() - 1
    }

    fn close(&mut self, idx: usize, ev: &Event, status: &'static str, error: Option<String>) {
        let a = &mut self.entries[idx];
        a.status = status;
        a.ended_ms = Some(ev.timestamp_ms);
        a.updated_seq = ev.seq.get();
        if error.is_some() {
            a.error = error;
        }
    }

    fn open_command(&mut self, ev: &Event, key: &AttemptKey) {
        if self.commands.contains_key(key) {
            return;
        }
        let (ts, seq, _) =
            self.attempts
                .get(key)
                .copied()
                .unwrap_or((ev.timestamp_ms, ev.seq.get(), false));
        let title = format!("Ran command `{}`", key.0);
        let idx = self.push_at(ev, ts, seq, "command", title, "running");
        self.commands.insert(key.clone(), idx);
    }

    /// Folds one event.
    ///
    /// Every event type has its arm: a new type does not compile until it
    /// says whether it tells people something.
    pub fn apply(&mut self, ev: &Event) {
        use EventKind as K;
        match &ev.kind {
            K::RunStarted {
                workflow,
                resumed,
                parent_run_id,
                parent_node_id,
                ..
            } => {
                if let (Some(r), Some(n)) = (parent_run_id, parent_node_id) {
                    self.delegated_by = Some(DelegatedBy {
                        run_id: r.clone(),
                        node_id: n.clone(),
                    });
                }
                let verb = if *resumed { "Resumed" } else { "Started" };
                self.instant(ev, "run", format!("{verb} run of {workflow}"), "success");
            }
            K::NodeStarted { .. } => self.attempt_started(ev),
            K::NodeOutput { stream, .. } => self.output(ev, *stream),
            K::NodeFinished {
                duration_ms,
                cached,
                ..
            } => self.node_finished(ev, *duration_ms, *cached == Some(true)),
            K::NodeFailed {
                error, will_retry, ..
            } => self.node_failed(ev, &error.message, *will_retry),
            K::NodeCancelled { .. } => self.node_cancelled(ev),
            K::ToolCallStarted {
                tool_name,
                tool_seq,
                ..
            } => self.tool_started(ev, tool_name, *tool_seq),
            K::AgentStepFinished { message, .. } => self.step_finished(ev, message),
            K::ToolCallFinished {
                tool_seq,
                status,
                error,
                ..
            } => self.tool_finished(ev, *tool_seq, *status, error.as_ref()),
            K::ApprovalRequested { message } => self.approval_requested(ev, message.as_deref()),
            K::ApprovalGranted { decided_by, note } => self.decided(ev, true, decided_by, note),
            K::ApprovalDenied { decided_by, note } => self.decided(ev, false, decided_by, note),
            K::InputRequested {
                prompt, request_id, ..
            } => self.input_requested(ev, prompt, request_id),
            K::InputReceived {
                answered_by,
                request_id,
                ..
            } => self.input_received(ev, request_id, answered_by.as_deref()),
            K::DelegationStarted {
                child_run_id,
                agent,
                workflow,
            } => self.delegation_started(ev, child_run_id, agent, workflow),
            K::DelegationFinished {
                child_run_id,
                status,
            } => self.delegation_finished(ev, child_run_id, status),
            K::RunFinished { duration_ms, .. } => {
                self.close_all(ev);
                let title = format!("Run finished in {}", human_ms(*duration_ms));
                self.instant(ev, "completion", title, "success");
            }
            K::RunFailed { error } => {
                self.close_all(ev);
                let title = format!("Run failed: {}", error.message);
                let idx = self.instant(ev, "error", title, "error");
                self.entries[idx].error = Some(error.message.clone());
            }
            K::RunCancelled { reason } => {
                self.close_all(ev);
                let title = match reason {
                    Some(r) => format!("Run cancelled: {r}"),
                    None => "Run cancelled".to_string(),
                };
                self.instant(ev, "completion", title, "cancelled");
            }
            // Machine grain: nothing a person follows a run by.
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
            | K::NodeHeartbeat { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::AgentStepStarted { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
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
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {}
        }
    }

    /// An entry that begins and ends with `ev`.
    fn instant(
        &mut self,
        ev: &Event,
        kind: &'static str,
        title: String,
        status: &'static str,
    ) -> usize {
        let idx = self.push(ev, kind, title, status);
        self.entries[idx].ended_ms = Some(ev.timestamp_ms);
        idx
    }

    /// The attempt an attempt's event is of.
    fn attempt_key(ev: &Event) -> Option<AttemptKey> {
        let node = ev.scope.node_id.clone()?;
        Some((
            node,
            ev.scope.iteration.unwrap_or(0),
            ev.scope.attempt.unwrap_or(0),
        ))
    }

    fn attempt_started(&mut self, ev: &Event) {
        let Some(key) = Self::attempt_key(ev) else {
            return;
        };
        self.attempts
            .insert(key.clone(), (ev.timestamp_ms, ev.seq.get(), false));
        if self.is_command_node(&key.0) {
            self.open_command(ev, &key);
        }
    }

    fn output(&mut self, ev: &Event, stream: OutputStream) {
        let Some(key) = Self::attempt_key(ev) else {
            return;
        };
        // Output from a node that calls tools is the tools' output
        // (a bash call), already told by the tool entry.
        if matches!(stream, OutputStream::Stdout | OutputStream::Stderr)
            && self.attempts.get(&key).is_some_and(|a| !a.2)
        {
            self.open_command(ev, &key);
        }
    }

    fn node_finished(&mut self, ev: &Event, duration_ms: u64, cached: bool) {
        let Some(key) = Self::attempt_key(ev) else {
            return;
        };
        let started = self.attempts.remove(&key);
        self.forget_steps(&key);
        if let Some(idx) = self.commands.remove(&key) {
            self.close(idx, ev, "success", None);
            return;
        }
        let cached = if cached { " (cached)" } else { "" };
        let title = format!("{} completed in {}{cached}", key.0, human_ms(duration_ms));
        // A completion is told when it happens, so it is named
        // after the finishing event, but spans the whole attempt.
        let idx = self.instant(ev, "completion", title, "success");
        if let Some((ts, _, _)) = started {
            self.entries[idx].started_ms = ts;
        }
    }

    fn node_failed(&mut self, ev: &Event, message: &str, will_retry: bool) {
        let Some(key) = Self::attempt_key(ev) else {
            return;
        };
        self.attempts.remove(&key);
        self.forget_steps(&key);
        if let Some(idx) = self.commands.remove(&key) {
            self.close(idx, ev, "error", Some(message.to_string()));
        }
        self.close_tools_of(&key, ev, "error");
        let retry = if will_retry { " (will retry)" } else { "" };
        let title = format!("{} failed: {message}{retry}", key.0);
        let idx = self.instant(ev, "error", title, "error");
        self.entries[idx].error = Some(message.to_string());
    }

    fn node_cancelled(&mut self, ev: &Event) {
        let Some(node) = ev.scope.node_id.clone() else {
            return;
        };
        let iteration = ev.scope.iteration.unwrap_or(0);
        let keys: Vec<AttemptKey> = self
            .attempts
            .keys()
            .filter(|k| k.0 == node && k.1 == iteration)
            .cloned()
            .collect();
        for key in keys {
            self.attempts.remove(&key);
            self.forget_steps(&key);
            if let Some(idx) = self.commands.remove(&key) {
                self.close(idx, ev, "cancelled", None);
            }
            self.close_tools_of(&key, ev, "cancelled");
        }
        if let Some(idx) = self.waits.remove(&(node, iteration)) {
            self.close(idx, ev, "cancelled", None);
        }
    }

    fn tool_started(&mut self, ev: &Event, tool_name: &str, tool_seq: u32) {
        let Some(key) = Self::attempt_key(ev) else {
            return;
        };
        if let Some(a) = self.attempts.get_mut(&key) {
            a.2 = true;
        }
        // The call's arguments, from the step that asked for it (calls of
        // one name start in the model's order).
        let args = self.asked.get_mut(&key).and_then(|asked| {
            let i = asked.iter().position(|(name, _)| name == tool_name)?;
            Some(asked.remove(i).1)
        });
        let detail = args.as_deref().and_then(|a| about(tool_name, a));
        let (kind, title) = tool_story(tool_name, &key.0, detail.as_deref());
        let idx = self.push(ev, kind, title, "running");
        self.entries[idx].detail = detail;
        self.entries[idx].reasoning = self.thought.get(&key).cloned();
        let (node, iteration, attempt) = key;
        self.tools.insert((node, iteration, attempt, tool_seq), idx);
    }

    /// The latest reasoning of the attempt `ev` is of.
    fn thought_of(&self, ev: &Event) -> Option<String> {
        self.thought.get(&Self::attempt_key(ev)?).cloned()
    }

    /// An attempt ended: what was kept of its steps goes.
    fn forget_steps(&mut self, key: &AttemptKey) {
        self.asked.remove(key);
        self.thought.remove(key);
    }

    /// An agent's step: the calls it asked for, and the first line of
    /// its reasoning (or, without any, of its text).
    fn step_finished(&mut self, ev: &Event, message: &serde_json::Value) {
        let Some(key) = Self::attempt_key(ev) else {
            return;
        };
        let calls = message["toolCalls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        let name = c["name"].as_str().unwrap_or_default().to_string();
                        (name, c["args"].as_str().unwrap_or_default().to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.asked.insert(key.clone(), calls);
        let line = [&message["reasoning"], &message["text"]]
            .into_iter()
            .filter_map(|v| v.as_str())
            .find_map(|t| t.lines().map(str::trim).find(|l| !l.is_empty()))
            .map(|l| clip(l, 160));
        match line {
            Some(l) => self.thought.insert(key, l),
            None => self.thought.remove(&key),
        };
    }

    fn tool_finished(
        &mut self,
        ev: &Event,
        tool_seq: u32,
        status: ToolStatus,
        error: Option<&ErrorInfo>,
    ) {
        let Some((node, iteration, attempt)) = Self::attempt_key(ev) else {
            return;
        };
        if let Some(idx) = self.tools.remove(&(node, iteration, attempt, tool_seq)) {
            let st = match status {
                ToolStatus::Success => "success",
                ToolStatus::Error => "error",
            };
            self.close(idx, ev, st, error.map(|e| e.message.clone()));
        }
    }

    fn approval_requested(&mut self, ev: &Event, message: Option<&str>) {
        let Some(node) = ev.scope.node_id.clone() else {
            return;
        };
        let title = match message {
            Some(m) => format!("Asked for approval: {m}"),
            None => format!("Asked for approval of {node}"),
        };
        let idx = self.push(ev, "approval", title, "waiting");
        self.entries[idx].detail = message.map(|m| clip(m, 300));
        self.waits
            .insert((node, ev.scope.iteration.unwrap_or(0)), idx);
    }

    /// `ApprovalGranted` (`granted`) or `ApprovalDenied`.
    fn decided(
        &mut self,
        ev: &Event,
        granted: bool,
        decided_by: &Option<String>,
        note: &Option<String>,
    ) {
        let Some(node) = ev.scope.node_id.clone() else {
            return;
        };
        let iteration = ev.scope.iteration.unwrap_or(0);
        let idx = match self.waits.remove(&(node.clone(), iteration)) {
            Some(i) => i,
            None => self.push(ev, "approval", format!("Approval of {node}"), "waiting"),
        };
        let verb = if granted { "Approved" } else { "Denied" };
        let mut title = format!("{verb} {node}");
        if let Some(by) = decided_by {
            title.push_str(&format!(" by {by}"));
        }
        if let Some(n) = note {
            title.push_str(&format!(": {n}"));
        }
        self.entries[idx].title = title;
        self.close(idx, ev, if granted { "approved" } else { "denied" }, None);
    }

    fn input_requested(&mut self, ev: &Event, prompt: &str, request_id: &str) {
        // A question asked again by the attempt after a crash is the
        // same question, still open.
        if ev.scope.node_id.is_none() || self.questions.contains_key(request_id) {
            return;
        }
        let idx = self.push(ev, "input", format!("Asked for input: {prompt}"), "waiting");
        self.entries[idx].detail = Some(clip(prompt, 300));
        self.entries[idx].reasoning = self.thought_of(ev);
        self.questions.insert(request_id.to_string(), idx);
    }

    fn input_received(&mut self, ev: &Event, request_id: &str, answered_by: Option<&str>) {
        if let Some(idx) = self.questions.remove(request_id) {
            if let Some(by) = answered_by {
                let t = format!("{} (answered by {by})", self.entries[idx].title);
                self.entries[idx].title = t;
            }
            self.close(idx, ev, "answered", None);
        }
    }

    fn delegation_started(
        &mut self,
        ev: &Event,
        child_run_id: &RunId,
        agent: &str,
        workflow: &str,
    ) {
        // Taken up again after a crash: the same entry goes on.
        if self.delegations.contains_key(child_run_id) {
            return;
        }
        let title = format!("Delegated to {agent} ({workflow}, run {child_run_id})");
        let idx = self.push(ev, "delegation", title, "running");
        self.entries[idx].child_run_id = Some(child_run_id.clone());
        self.entries[idx].detail = Some(format!("{workflow} as run {child_run_id}"));
        self.entries[idx].reasoning = self.thought_of(ev);
        self.delegations.insert(child_run_id.clone(), idx);
    }

    fn delegation_finished(&mut self, ev: &Event, child_run_id: &RunId, status: &str) {
        if let Some(idx) = self.delegations.remove(child_run_id) {
            let st = match status {
                "finished" | "success" => "success",
                "cancelled" => "cancelled",
                _ => "error",
            };
            self.close(idx, ev, st, None);
        }
    }

    fn close_tools_of(&mut self, key: &AttemptKey, ev: &Event, status: &'static str) {
        let open: Vec<_> = self
            .tools
            .keys()
            .filter(|t| t.0 == key.0 && t.1 == key.1 && t.2 == key.2)
            .cloned()
            .collect();
        for t in open {
            if let Some(idx) = self.tools.remove(&t) {
                self.close(idx, ev, status, None);
            }
        }
    }

    /// A run that ends leaves nothing running; whatever is still open was cut
    /// short by the end.
    fn close_all(&mut self, ev: &Event) {
        let mut open: Vec<usize> = self.commands.drain().map(|(_, i)| i).collect();
        open.extend(self.tools.drain().map(|(_, i)| i));
        open.extend(self.waits.drain().map(|(_, i)| i));
        open.extend(self.questions.drain().map(|(_, i)| i));
        open.extend(self.delegations.drain().map(|(_, i)| i));
        self.attempts.clear();
        self.asked.clear();
        self.thought.clear();
        for idx in open {
            if self.entries[idx].ended_ms.is_none() {
                self.close(idx, ev, "cancelled", None);
            }
        }
    }
}

/// `per_line[3].show` -> `per_line.show`, the form a workflow declares.
fn strip_indices(node_id: &str) -> String {
    let mut out = String::with_capacity(node_id.len());
    let mut depth = 0;
    for c in node_id.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The kind and title of a tool call's entry, naming what it was about
/// when the log says.
fn tool_story(tool: &str, node: &str, detail: Option<&str>) -> (&'static str, String) {
    let kind = match tool {
        "read" => "file-read",
        "write" => "file-written",
        "edit" => "file-edited",
        "grep" => "search",
        "bash" => "command",
        _ => "tool",
    };
    let title = match (tool, detail) {
        ("read", Some(d)) => format!("Read {d} ({node})"),
        ("write", Some(d)) => format!("Wrote {d} ({node})"),
        ("edit", Some(d)) => format!("Edited {d} ({node})"),
        ("grep", Some(d)) => format!("Searched for {d} ({node})"),
        ("bash", Some(d)) => format!("Ran `{d}` ({node})"),
        (other, Some(d)) => format!("Called tool {other}: {d} ({node})"),
        ("read", None) => format!("Read a file ({node})"),
        ("write", None) => format!("Wrote a file ({node})"),
        ("edit", None) => format!("Edited a file ({node})"),
        ("grep", None) => format!("Searched files ({node})"),
        ("bash", None) => format!("Ran a shell command ({node})"),
        (other, None) => format!("Called tool {other} ({node})"),
    };
    (kind, title)
}

/// What a call with these arguments is about, in a few words: the path,
/// the command line, the pattern and where, the question, else the
/// arguments themselves (cut). Arguments that are not JSON are shown as
/// they are, cut.
fn about(tool: &str, args: &str) -> Option<String> {
    let Ok(serde_json::Value::Object(a)) = serde_json::from_str::<serde_json::Value>(args) else {
        let t = args.trim();
        return (!t.is_empty()).then(|| clip(t, 120));
    };
    let text = |k: &str| a.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let out = match tool {
        "read" | "write" | "edit" => text("path"),
        "grep" => text("pattern").map(|p| match text("path") {
            Some(at) => format!("`{p}` in {at}"),
            None => format!("`{p}`"),
        }),
        "bash" => a.get("argv").and_then(|v| v.as_array()).map(|argv| {
            argv.iter()
                .map(|x| {
                    let s = x.as_str().map_or_else(|| x.to_string(), str::to_string);
                    if s.is_empty() || s.contains(char::is_whitespace) {
                        format!("'{s}'")
                    } else {
                        s
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        }),
        "ask_user" => text("question"),
        _ => None,
    };
    let out = out.unwrap_or_else(|| serde_json::Value::Object(a).to_string());
    (!out.is_empty()).then(|| clip(&out, 160))
}

/// At most `max` bytes of one line of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> String {
    let s = s.replace(['\n', '\r'], " ");
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn human_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ErrorInfo, Scope};

    fn ev(seq: u64, scope: Scope, kind: EventKind) -> Event {
        Event {
            run_id: crate::RunId::parse("r").unwrap(),
            seq: crate::Seq(seq),
            timestamp_ms: 1000 + seq as i64,
            scope,
            kind,
        }
    }

    fn started(seq: u64, parent: Option<(&str, &str)>) -> Event {
        ev(
            seq,
            Scope::run(),
            EventKind::RunStarted {
                workflow: "wf".into(),
                workflow_hash: "h".into(),
                input: None,
                resumed: false,
                parent_run_id: parent.map(|p| RunId::parse(p.0).unwrap()),
                parent_node_id: parent.map(|p| p.1.to_string()),
                depth: parent.map_or(0, |_| 1),
                forked_from: None,
                trigger: None,
                replay_of: None,
            },
        )
    }

    fn a(node: &str, attempt: u32) -> Scope {
        Scope::node(node, 0).with_attempt(attempt)
    }

    #[test]
    fn command_tools_approval_and_end_make_one_chain() {
        let log = vec![
            started(1, None),
            ev(
                2,
                Scope::node("build", 0),
                EventKind::NodePending {
                    layer_index: Some(0),
                },
            ),
            ev(3, a("build", 1), EventKind::NodeStarted { snapshot: None }),
            ev(
                4,
                a("build", 1),
                EventKind::NodeOutput {
                    text: "ok\n".into(),
                    stream: OutputStream::Stdout,
                },
            ),
            ev(
                5,
                a("build", 1),
                EventKind::NodeOutput {
                    text: "more\n".into(),
                    stream: OutputStream::Stdout,
                },
            ),
            ev(
                6,
                a("build", 1),
                EventKind::NodeFinished {
                    duration_ms: 1500,
                    output: None,
                    cached: None,
                    snapshot: None,
                },
            ),
            ev(7, a("fix", 1), EventKind::NodeStarted { snapshot: None }),
            ev(
                8,
                a("fix", 1),
                EventKind::ToolCallStarted {
                    tool_name: "read".into(),
                    tool_seq: 1,
                    idempotency_key: "k1".into(),
                    side_effect: false,
                },
            ),
            ev(
                9,
                a("fix", 1),
                EventKind::ToolCallFinished {
                    tool_name: "read".into(),
                    tool_seq: 1,
                    status: ToolStatus::Success,
                    duration_ms: 2,
                    error: None,
                },
            ),
            ev(
                10,
                a("fix", 1),
                EventKind::ToolCallStarted {
                    tool_name: "edit".into(),
                    tool_seq: 2,
                    idempotency_key: "k2".into(),
                    side_effect: true,
                },
            ),
            ev(
                11,
                a("fix", 1),
                EventKind::ToolCallFinished {
                    tool_name: "edit".into(),
                    tool_seq: 2,
                    status: ToolStatus::Error,
                    duration_ms: 2,
                    error: Some(ErrorInfo::new("patch", "hunk 1 does not apply")),
                },
            ),
            ev(
                12,
                a("fix", 1),
                EventKind::NodeFinished {
                    duration_ms: 20,
                    output: None,
                    cached: None,
                    snapshot: None,
                },
            ),
            ev(
                13,
                Scope::node("gate", 0),
                EventKind::NodeWaitingApproval {},
            ),
            ev(
                14,
                Scope::node("gate", 0),
                EventKind::ApprovalRequested {
                    message: Some("Ship it?".into()),
                },
            ),
            ev(
                15,
                Scope::node("gate", 0),
                EventKind::ApprovalGranted {
                    decided_by: Some("ana".into()),
                    note: None,
                },
            ),
            ev(
                16,
                Scope::run(),
                EventKind::RunFinished {
                    output: None,
                    duration_ms: 2000,
                },
            ),
        ];
        let story = activity(&log);
        let kinds: Vec<_> = story.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            [
                "run",
                "command",
                "file-read",
                "file-edited",
                "completion",
                "approval",
                "completion"
            ]
        );
        let cmd = &story[1];
        assert_eq!(cmd.id, "r-3", "a command is named after its NodeStarted");
        assert_eq!(
            (cmd.status, cmd.ended_ms, cmd.updated_seq),
            ("success", Some(1006), 6)
        );
        assert_eq!(story[3].status, "error");
        assert_eq!(story[3].error.as_deref(), Some("hunk 1 does not apply"));
        assert_eq!(story[4].title, "fix completed in 20ms");
        assert_eq!(story[5].status, "approved");
        assert_eq!(story[5].title, "Approved gate by ana");
        assert_eq!(story[6].title, "Run finished in 2.0s");
        assert_eq!(story[0].previous_activity_id, None);
        for w in story.windows(2) {
            assert_eq!(w[1].previous_activity_id.as_deref(), Some(w[0].id.as_str()));
        }
        let mut ids: Vec<_> = story.iter().map(|a| &a.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), story.len(), "ids are unique");
    }

    #[test]
    fn an_agents_calls_say_what_they_were_about_and_why() {
        let call = |seq, tool: &str, n| {
            ev(
                seq,
                a("fix", 1),
                EventKind::ToolCallStarted {
                    tool_name: tool.into(),
                    tool_seq: n,
                    idempotency_key: format!("k{n}"),
                    side_effect: tool == "bash",
                },
            )
        };
        let log = vec![
            started(1, None),
            ev(2, a("fix", 1), EventKind::NodeStarted { snapshot: None }),
            ev(
                3,
                a("fix", 1),
                EventKind::AgentStepFinished {
                    step: 1,
                    tool_calls: 5,
                    finish_reason: "tool_calls".into(),
                    message: serde_json::json!({
                        "reasoning": "\n  The failing test reads the config first.\nSo look there.",
                        "text": "Let me look.",
                        "toolCalls": [
                            {"id": "1", "name": "read", "args": "{\"path\": \"src/config.rs\"}"},
                            {"id": "2", "name": "grep", "args": "{\"pattern\": \"fn load\", \"path\": \"src\"}"},
                            {"id": "3", "name": "read", "args": "{\"path\": \"Cargo.toml\"}"},
                            {"id": "4", "name": "bash", "args": "{\"argv\": [\"cargo\", \"test\", \"config loads\"]}"},
                            {"id": "5", "name": "docs.search", "args": "{\"query\": \"serde\"}"},
                        ],
                    }),
                },
            ),
            call(4, "grep", 1),
            call(5, "read", 2),
            call(6, "read", 3),
            call(7, "bash", 4),
            call(8, "docs.search", 5),
        ];
        let story = activity(&log);
        let told: Vec<(&str, Option<&str>)> = story[1..]
            .iter()
            .map(|e| (e.title.as_str(), e.detail.as_deref()))
            .collect();
        assert_eq!(
            told,
            [
                (
                    "Searched for `fn load` in src (fix)",
                    Some("`fn load` in src")
                ),
                ("Read src/config.rs (fix)", Some("src/config.rs")),
                ("Read Cargo.toml (fix)", Some("Cargo.toml")),
                (
                    "Ran `cargo test 'config loads'` (fix)",
                    Some("cargo test 'config loads'")
                ),
                (
                    "Called tool docs.search: {\"query\":\"serde\"} (fix)",
                    Some("{\"query\":\"serde\"}")
                ),
            ]
        );
        for e in &story[1..] {
            assert_eq!(
                e.reasoning.as_deref(),
                Some("The failing test reads the config first.")
            );
        }
        // A tool node's calls (no step asked for them) keep the plain titles.
        let plain = activity(&[started(1, None), call(2, "read", 1)]);
        assert_eq!(plain[1].title, "Read a file (fix)");
        assert_eq!(plain[1].detail, None);
        assert_eq!(plain[1].reasoning, None);
    }

    #[test]
    fn node_kind_hint_opens_a_silent_command_at_start() {
        let log = vec![
            started(1, None),
            ev(
                2,
                a("per_line[2].show", 1),
                EventKind::NodeStarted { snapshot: None },
            ),
        ];
        let kinds = HashMap::from([("per_line.show".to_string(), "command".to_string())]);
        let mut f = ActivityFolder::new().with_node_kinds(kinds);
        for e in &log {
            f.apply(e);
        }
        let last = f.entries().last().unwrap();
        assert_eq!(
            (last.kind, last.status, last.ended_ms),
            ("command", "running", None)
        );
        assert_eq!(last.node_id.as_deref(), Some("per_line[2].show"));
    }

    #[test]
    fn failures_retries_and_run_failure_are_errors() {
        let fail = |seq, attempt, retry| {
            ev(
                seq,
                a("t", attempt),
                EventKind::NodeFailed {
                    error: ErrorInfo::new("exit", "exit code 2"),
                    will_retry: retry,
                    snapshot: None,
                },
            )
        };
        let log = vec![
            started(1, None),
            ev(2, a("t", 1), EventKind::NodeStarted { snapshot: None }),
            ev(
                3,
                a("t", 1),
                EventKind::NodeOutput {
                    text: "x".into(),
                    stream: OutputStream::Stderr,
                },
            ),
            fail(4, 1, true),
            ev(5, a("t", 2), EventKind::NodeRetrying { delay_ms: 10 }),
            ev(6, a("t", 2), EventKind::NodeStarted { snapshot: None }),
            fail(7, 2, false),
            ev(
                8,
                Scope::run(),
                EventKind::RunFailed {
                    error: ErrorInfo::new("node", "t failed"),
                },
            ),
        ];
        let story = activity(&log);
        let got: Vec<_> = story.iter().map(|a| (a.kind, a.status)).collect();
        assert_eq!(
            got,
            [
                ("run", "success"),
                ("command", "error"),
                ("error", "error"),
                ("error", "error"),
                ("error", "error")
            ]
        );
        assert_eq!(story[2].title, "t failed: exit code 2 (will retry)");
        assert_eq!(story[3].title, "t failed: exit code 2");
        assert_eq!(story[4].title, "Run failed: t failed");
    }

    #[test]
    fn child_runs_carry_their_delegator_and_cancel_closes_open_entries() {
        let log = vec![
            started(1, Some(("parent", "agent"))),
            ev(2, a("w", 1), EventKind::NodeStarted { snapshot: None }),
            ev(
                3,
                a("w", 1),
                EventKind::ToolCallStarted {
                    tool_name: "bash".into(),
                    tool_seq: 1,
                    idempotency_key: "k".into(),
                    side_effect: true,
                },
            ),
            ev(
                4,
                a("w", 1),
                EventKind::DelegationStarted {
                    child_run_id: RunId::parse("c1").unwrap(),
                    agent: "coder".into(),
                    workflow: "coder.yaml".into(),
                },
            ),
            ev(
                5,
                Scope::run(),
                EventKind::RunCancelled {
                    reason: Some("stop".into()),
                },
            ),
        ];
        let story = activity(&log);
        assert!(story.iter().all(|a| a.delegated_by
            == Some(DelegatedBy {
                run_id: RunId::parse("parent").unwrap(),
                node_id: "agent".into()
            })));
        assert_eq!(story[1].kind, "command");
        assert_eq!(story[1].status, "cancelled");
        assert_eq!(story[2].kind, "delegation");
        assert_eq!(story[2].status, "cancelled");
        assert_eq!(
            (story[3].kind, story[3].status),
            ("completion", "cancelled")
        );
        let json = serde_json::to_value(&story[0]).unwrap();
        assert_eq!(json["delegatedBy"]["runId"], "parent");
        assert_eq!(json["runId"], "r");
        assert!(json.get("previousActivityId").is_none());
        assert_eq!(
            serde_json::to_value(&story[1]).unwrap()["previousActivityId"],
            "r-1"
        );
    }

    #[test]
    fn parallel_questions_are_entries_of_their_own() {
        let ask = |seq, rid: &str| {
            ev(
                seq,
                Scope::node("a", 0),
                EventKind::InputRequested {
                    request_id: rid.into(),
                    prompt: format!("question {rid}"),
                    schema: None,
                },
            )
        };
        let answer = |seq, rid: &str| {
            ev(
                seq,
                Scope::node("a", 0),
                EventKind::InputReceived {
                    request_id: rid.into(),
                    answer: serde_json::json!(rid),
                    answered_by: Some("ana".into()),
                },
            )
        };
        let log = [
            started(1, None),
            ask(2, "q1"),
            ask(3, "q2"),
            ask(4, "q1"),
            answer(5, "q2"),
            answer(6, "q1"),
        ];
        let mut f = ActivityFolder::new();
        for e in &log {
            f.apply(e);
        }
        let inputs: Vec<(String, &str)> = f
            .into_entries()
            .into_iter()
            .filter(|a| a.kind == "input")
            .map(|a| (a.title, a.status))
            .collect();
        assert_eq!(
            inputs,
            vec![
                (
                    "Asked for input: question q1 (answered by ana)".to_string(),
                    "answered"
                ),
                (
                    "Asked for input: question q2 (answered by ana)".to_string(),
                    "answered"
                ),
            ]
        );
    }
}
