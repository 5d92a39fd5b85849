//! What `cairn run` and `cairn resume` show while a run goes on.
//!
//! Three modes: NDJSON (each stored event line as it is), a terminal table
//! redrawn in place (one line per node: state, attempt, elapsed), and plain
//! appended lines when stdout is not a terminal, so logs of CI jobs stay
//! readable. What a node's row says comes from the reducer's
//! [`RunState`], the same fold `cairn status` and the server show.

use std::collections::HashMap;
use std::io::Write;

use cairn_engine::RunOutcome;
use cairn_events::{
    Event, EventKind, NodeCounts, NodeState, NodeStatus, NodeTiming, RunId, RunState, TokenTotals,
};
use cairn_store::StoredEvent;

use crate::format::{duration_ms, short_value, truncate};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Stored JSON lines on stdout; people's messages go to stderr.
    Json,
    /// A table redrawn in place with ANSI escapes.
    Tty,
    /// One appended line per node state change.
    Plain,
}

/// A person's decision the display asks for: an approval, or an answer.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The node's path.
    pub node_id: String,
    /// The rendered message (the question).
    pub message: String,
    /// For a question: its request id and the schema its answer must match.
    pub question: Option<(String, Option<serde_json::Value>)>,
}

/// A node pass's name on screen: its id, with `#iteration` for loop passes
/// after the first.
fn label(n: &NodeState) -> String {
    if n.iteration > 0 {
        format!("{}#{}", n.node_id, n.iteration)
    } else {
        n.node_id.to_string()
    }
}

/// How long the node's current attempt has run (or the reported duration,
/// once it finished).
fn elapsed(n: &NodeState, now_ms: i64) -> Option<u64> {
    if n.status == NodeStatus::Finished {
        if let Some(d) = n.duration_ms {
            return Some(d);
        }
    }
    let a = n.attempts.last()?;
    let end = a.ended_ms.unwrap_or(now_ms);
    Some(end.saturating_sub(a.started_ms).max(0) as u64)
}

/// An agent's progress in a few words: step, tool calls, tokens, cost.
pub fn agent_summary(a: &cairn_events::AgentProgress) -> String {
    let mut s = format!(
        "step {} · {} tool call{} · {} tokens",
        a.step,
        a.tool_calls,
        if a.tool_calls == 1 { "" } else { "s" },
        a.input_tokens + a.output_tokens
    );
    if let Some(c) = a.cost_usd {
        s.push_str(&format!(" · ${c:.4}"));
    }
    s
}

/// The text after a node's line: why it failed, or why it was skipped.
fn problem(n: &NodeState) -> Option<&str> {
    match n.status {
        NodeStatus::Skipped => n.reason(),
        _ => n.error().map(|e| e.message.as_str()),
    }
}

/// Rows worth keeping on a short screen whatever their age.
fn active(n: &NodeState) -> bool {
    matches!(
        n.status,
        NodeStatus::Running
            | NodeStatus::Retrying
            | NodeStatus::WaitingApproval
            | NodeStatus::WaitingInput
            | NodeStatus::Failed
    )
}

/// Node passes the display holds in full; in a larger run it holds only
/// what it may still show (see [`Progress::compact`]), so that `cairn run`
/// of 100,000 nodes does not keep a second state of every node beside the
/// engine's.
const HOLD_ALL_UP_TO: usize = 2_000;

/// Ended passes a large run's display keeps, the most recently changed: more
/// rows than a terminal shows.
const KEEP_ENDED: usize = 1_024;

/// The summary `RunSummary` carries.
struct Summary {
    duration_ms: u64,
    nodes: NodeCounts,
    tokens: TokenTotals,
    cost_usd: Option<f64>,
    timings: Vec<NodeTiming>,
}

/// The display of one run: the reducer's state of the events it was given,
/// and what it has drawn.
pub struct Progress {
    mode: Mode,
    color: bool,
    run_id: RunId,
    /// Events at or below this seq update the table but print nothing
    /// (a resume's earlier history).
    quiet_until: u64,
    /// The run as the one reducer folds it.
    state: RunState,
    /// The seq that last changed each node pass, to keep recent rows on a
    /// short screen.
    changed: HashMap<(cairn_events::NodePath, u32), u64>,
    /// Pending passes counted but not held (a large run's display).
    pending_only: usize,
    /// Ended passes let go of (a large run's display), by whether they
    /// count as done: all of them do.
    forgotten: usize,
    /// The number of held passes at which the display next lets go of
    /// what it no longer shows.
    compact_at: usize,
    summary: Option<Summary>,
    last_seq: u64,
    /// Lines of the table currently on screen (TTY mode).
    drawn: usize,
    /// While a question is on screen, the table is not redrawn.
    paused: bool,
    dirty: bool,
    /// An undecodable event was reported already.
    warned: bool,
    out: Out,
    /// The server that drives the run, when not this process.
    server: Option<String>,
}

impl Progress {
    /// A display for one run; events up to `quiet_until` only build state.
    pub fn new(mode: Mode, run_id: &RunId, quiet_until: u64) -> Progress {
        let color = mode == Mode::Tty && std::env::var_os("NO_COLOR").is_none();
        Progress {
            mode,
            color,
            run_id: run_id.clone(),
            quiet_until,
            state: RunState::new(run_id.clone()),
            changed: HashMap::new(),
            pending_only: 0,
            forgotten: 0,
            compact_at: HOLD_ALL_UP_TO,
            summary: None,
            last_seq: 0,
            drawn: 0,
            paused: false,
            dirty: true,
            warned: false,
            out: Out::Stdout(std::io::stdout()),
            server: None,
        }
    }

    /// The run is driven by the `cairn serve` at `url`: the commands the
    /// display suggests go through it, and a wait needs no resume there.
    pub fn through_server(mut self, url: &str) -> Progress {
        self.server = Some(url.to_string());
        self
    }

    /// ` --server URL` when the run is a server's, for the commands shown.
    fn via(&self) -> String {
        self.server
            .as_deref()
            .map(|u| format!(" --server {u}"))
            .unwrap_or_default()
    }

    /// The highest seq seen.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Takes one committed event. Returns an approval to ask about when the
    /// event requests one.
    pub fn on_event(&mut self, stored: &StoredEvent) -> Option<Ask> {
        self.last_seq = self.last_seq.max(stored.seq);
        let loud = stored.seq > self.quiet_until;
        let ev = self.decoded(stored, loud)?;
        self.dirty = true;
        let before = self.node_of(&ev).map(|n| n.status);
        if before.is_none() && ev.node_key().is_some() && !self.takes_new_pass(&ev.kind) {
            return None;
        }
        self.state.apply(&ev);
        if self.state.nodes.len() >= self.compact_at {
            self.compact();
        }
        let loud_plain = loud && self.mode == Mode::Plain;
        if let Some(ask) = self.on_run_event(&ev, loud_plain) {
            return Some(ask);
        }
        if loud {
            if let Some(line) = crate::reload::reload_line(&ev.kind) {
                self.announce(&line);
            }
        }
        // Plain mode tells each change a node's own lifecycle event makes;
        // a decision or an answer shows in the next one.
        let told = matches!(
            ev.kind,
            EventKind::NodeStarted { snapshot: None }
                | EventKind::NodeFinished { .. }
                | EventKind::NodeFailed { .. }
                | EventKind::NodeSkipped { .. }
                | EventKind::NodeCancelled { .. }
                | EventKind::NodeWaitingApproval {}
                | EventKind::NodeWaitingInput { .. }
        );
        let n = self.node_of(&ev)?;
        // What ranks rows on a short screen: a change of status, or an event
        // of the node's lifecycle even when the status stays.
        if told
            || matches!(
                ev.kind,
                EventKind::NodePending { .. } | EventKind::NodeRetrying { .. }
            )
            || before != Some(n.status)
        {
            let key = (n.node_id.clone(), n.iteration);
            self.changed.insert(key, ev.seq.get());
        }
        if told && loud_plain {
            let line = self.plain_line(&ev);
            self.plain(&line);
        }
        if loud_plain {
            if let Some(line) = self.agent_line(&ev) {
                self.plain(&line);
            }
        }
        None
    }

    /// The event, echoed first in JSON mode; `None` (said once) when it
    /// does not decode: the run goes on, only this display misses it.
    fn decoded(&mut self, stored: &StoredEvent, loud: bool) -> Option<Event> {
        if loud && self.mode == Mode::Json {
            let mut out = self.out.lock();
            let _ = out.write_all(stored.json.as_bytes());
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
        match stored.decode() {
            Ok(ev) => Some(ev),
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    eprintln!(
                        "warning: run {}: cannot show event {} ({e}); `cairn logs --json` has it",
                        self.run_id, stored.seq
                    );
                }
                None
            }
        }
    }

    /// What the display does with the run's start, its summary and a
    /// person's gates: an approval or a question to ask about.
    fn on_run_event(&mut self, ev: &Event, loud_plain: bool) -> Option<Ask> {
        match &ev.kind {
            EventKind::RunStarted {
                workflow, resumed, ..
            } if loud_plain => {
                let line = format!(
                    "run {} {} workflow {}",
                    self.run_id,
                    if *resumed { "resumed:" } else { "started:" },
                    workflow
                );
                self.plain(&line);
                None
            }
            EventKind::RunSummary {
                duration_ms,
                nodes,
                tokens,
                cost_usd,
                timings,
            } => {
                self.summary = Some(Summary {
                    duration_ms: *duration_ms,
                    nodes: nodes.clone(),
                    tokens: tokens.clone(),
                    cost_usd: *cost_usd,
                    timings: timings.clone(),
                });
                None
            }
            EventKind::ApprovalRequested { message } => {
                let node = ev.scope.node_id.as_ref()?;
                Some(Ask {
                    node_id: node.to_string(),
                    message: message.clone().unwrap_or_default(),
                    question: None,
                })
            }
            EventKind::InputRequested {
                request_id,
                prompt,
                schema,
            } => {
                let node = ev.scope.node_id.as_ref()?;
                Some(Ask {
                    node_id: node.to_string(),
                    message: prompt.clone(),
                    question: Some((request_id.clone(), schema.clone())),
                })
            }
            _ => None,
        }
    }

    /// Whether an event about a node pass the display does not hold
    /// starts holding it. A small run's display holds every pass. A large
    /// one counts a pass that is only pending without holding it, holds it
    /// from the event that follows (its start, skip, cancel or gate), and
    /// leaves out what comes after a pass ended and was let go (a scorer's
    /// or a revert's events), which would otherwise fold into a new pending
    /// pass.
    fn takes_new_pass(&mut self, kind: &EventKind) -> bool {
        if self.state.nodes.len() + self.pending_only + self.forgotten < HOLD_ALL_UP_TO {
            return true;
        }
        match kind {
            EventKind::NodePending { .. } => {
                self.pending_only += 1;
                false
            }
            EventKind::NodeStarted { .. }
            | EventKind::NodeSkipped { .. }
            | EventKind::NodeCancelled { .. }
            | EventKind::NodeWaitingApproval {}
            | EventKind::NodeWaitingInput { .. }
            | EventKind::ApprovalRequested { .. }
            | EventKind::InputRequested { .. }
                if self.pending_only > 0 =>
            {
                self.pending_only -= 1;
                true
            }
            _ => false,
        }
    }

    /// Lets go of the ended passes the display no longer shows: all but the
    /// failed ones (kept on screen whatever their age) and the
    /// [`KEEP_ENDED`] most recently changed. They stay counted.
    fn compact(&mut self) {
        let changed = &self.changed;
        let seq_of = |n: &NodeState| {
            changed
                .get(&(n.node_id.clone(), n.iteration))
                .copied()
                .unwrap_or(n.first_seq)
        };
        let mut ended: Vec<u64> = self
            .state
            .nodes
            .iter()
            .filter(|n| n.status.is_done() && !active(n))
            .map(seq_of)
            .collect();
        if ended.len() > KEEP_ENDED {
            let cut = ended.len() - KEEP_ENDED;
            let (_, &mut oldest_kept, _) = ended.select_nth_unstable(cut);
            let mut gone = Vec::new();
            let went = self.state.forget_nodes(|n| {
                let keep = !n.status.is_done() || active(n) || seq_of(n) >= oldest_kept;
                if !keep {
                    gone.push((n.node_id.clone(), n.iteration));
                }
                keep
            });
            for key in &gone {
                self.changed.remove(key);
            }
            self.changed.shrink_to_fit();
            self.forgotten += went;
        }
        self.compact_at = (2 * self.state.nodes.len()).max(HOLD_ALL_UP_TO);
    }

    /// An agent's step or tool call as an appended line: a step's text
    /// folded to one line, a call's tool and status.
    fn agent_line(&self, ev: &Event) -> Option<String> {
        let n = self.node_of(ev)?;
        let since = self
            .state
            .session_started_ms()
            .map(|s| duration_ms(ev.timestamp_ms.saturating_sub(s).max(0) as u64))
            .unwrap_or_default();
        let what = match &ev.kind {
            EventKind::AgentStepFinished {
                step,
                message,
                tool_calls,
                ..
            } => {
                let text = message["text"].as_str().unwrap_or("");
                let folded: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
                let calls = if *tool_calls > 0 {
                    format!(
                        " [{tool_calls} tool call{}]",
                        if *tool_calls == 1 { "" } else { "s" }
                    )
                } else {
                    String::new()
                };
                format!("step {step}: {}{calls}", truncate(&folded, 160))
            }
            EventKind::ToolCallFinished {
                tool_name,
                status,
                error,
                ..
            } => {
                n.agent()?;
                let status = match status {
                    cairn_events::ToolStatus::Success => "success",
                    cairn_events::ToolStatus::Error => "error",
                };
                match error {
                    Some(e) => format!("tool {tool_name} {status}: {}", truncate(&e.message, 120)),
                    None => format!("tool {tool_name} {status}"),
                }
            }
            _ => return None,
        };
        Some(format!("{since:>8}  {:<24} {what}", label(n)))
    }

    /// The node pass an event is about, as the state holds it.
    fn node_of(&self, ev: &Event) -> Option<&NodeState> {
        let (id, it) = ev.node_key()?;
        self.state.node(id, it)
    }

    /// A node's change as an appended line: time into the session, node,
    /// status, attempt, and how long it took or why it failed.
    fn plain_line(&self, ev: &Event) -> String {
        let Some(n) = self.node_of(ev) else {
            return String::new();
        };
        let status = n.status.as_str();
        let since = self
            .state
            .session_started_ms()
            .map(|s| duration_ms(ev.timestamp_ms.saturating_sub(s).max(0) as u64))
            .unwrap_or_default();
        let mut line = format!("{since:>8}  {:<24} {:<16}", label(n), status);
        if n.attempt > 0 {
            line.push_str(&format!(" attempt {}", n.attempt));
        }
        if matches!(
            n.status,
            NodeStatus::Finished | NodeStatus::Failed | NodeStatus::Cancelled
        ) {
            if let Some(d) = elapsed(n, ev.timestamp_ms) {
                line.push_str(&format!("  {}", duration_ms(d)));
            }
        }
        if matches!(
            n.status,
            NodeStatus::Failed | NodeStatus::Retrying | NodeStatus::Skipped
        ) {
            if let Some(e) = problem(n) {
                line.push_str(&format!("  {}", truncate(e, 200)));
            }
        }
        line.trim_end().to_string()
    }

    /// A line that stays, whatever the mode: above the table on a
    /// terminal (which is drawn again below it), appended in plain mode,
    /// on stderr beside NDJSON.
    fn announce(&mut self, line: &str) {
        match self.mode {
            Mode::Plain => self.plain(line),
            Mode::Json => eprintln!("{line}"),
            Mode::Tty => {
                let mut out = self.out.lock();
                if self.drawn > 0 && !self.paused {
                    let _ = write!(out, "\x1b[{}A\r\x1b[J", self.drawn);
                }
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                drop(out);
                self.drawn = 0;
                self.dirty = true;
            }
        }
    }

    fn plain(&mut self, line: &str) {
        let mut out = self.out.lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// Draws the table as it stands, then stops redrawing while a question
    /// is on screen.
    pub fn pause(&mut self) {
        self.dirty = true;
        self.tick(now_ms());
        self.paused = true;
    }

    /// Redraws from the current cursor line on (below whatever was asked).
    pub fn resume_drawing(&mut self) {
        self.paused = false;
        self.drawn = 0;
        self.dirty = true;
    }

    /// Redraws the table when something changed or time passed (TTY mode).
    pub fn tick(&mut self, now_ms: i64) {
        if self.mode != Mode::Tty || self.paused {
            return;
        }
        let running = self
            .state
            .nodes
            .iter()
            .any(|n| n.status == NodeStatus::Running);
        if !self.dirty && !running {
            return;
        }
        self.dirty = false;
        let (width, height) = terminal_size();
        let lines = self.table(now_ms, width, height);
        let mut buf = String::new();
        if self.drawn > 0 {
            buf.push_str(&format!("\x1b[{}A", self.drawn));
        }
        for l in &lines {
            buf.push_str("\r\x1b[2K");
            buf.push_str(l);
            buf.push('\n');
        }
        buf.push_str("\x1b[J");
        self.drawn = lines.len();
        let mut out = self.out.lock();
        let _ = out.write_all(buf.as_bytes());
        let _ = out.flush();
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn table(&self, now_ms: i64, width: usize, height: usize) -> Vec<String> {
        let nodes = &self.state.nodes;
        // Passes a large run's display counts without holding: the ended
        // ones it let go of are done.
        let done = nodes.iter().filter(|n| n.status.is_done()).count() + self.forgotten;
        let total = nodes.len() + self.pending_only + self.forgotten;
        let took = self
            .state
            .session_started_ms()
            .map(|s| duration_ms(now_ms.saturating_sub(s).max(0) as u64))
            .unwrap_or_default();
        let status = self.state.status.map(|s| s.as_str()).unwrap_or("starting");
        let header = format!(
            "run {} · {} · {} · {}/{} nodes done · {}",
            self.run_id,
            self.state.workflow.as_deref().unwrap_or_default(),
            status,
            done,
            total,
            took
        );
        let mut lines = vec![truncate(&header, width.saturating_sub(1))];
        // Keep active rows, then the most recently changed ones, in file order.
        let budget = height.saturating_sub(3).max(3);
        let mut shown: Vec<usize> = (0..nodes.len()).collect();
        if shown.len() > budget {
            let mut by_rank: Vec<usize> = shown.clone();
            by_rank.sort_by_key(|&i| {
                let n = &nodes[i];
                let changed = self
                    .changed
                    .get(&(n.node_id.clone(), n.iteration))
                    .copied()
                    .unwrap_or(n.first_seq);
                (!active(n), std::cmp::Reverse(changed))
            });
            by_rank.truncate(budget);
            by_rank.sort_unstable();
            shown = by_rank;
        }
        let name_w = shown
            .iter()
            .map(|&i| label(&nodes[i]).chars().count())
            .max()
            .unwrap_or(0)
            .clamp(8, 40);
        for &i in &shown {
            let n = &nodes[i];
            let (mark, code) = match n.status {
                NodeStatus::Finished => ("✓", "32"),
                NodeStatus::Failed => ("✗", "31"),
                NodeStatus::Running => ("▶", "36"),
                NodeStatus::Retrying => ("↻", "33"),
                NodeStatus::WaitingApproval | NodeStatus::WaitingInput => ("?", "33"),
                NodeStatus::Skipped => ("-", "2"),
                NodeStatus::Cancelled => ("■", "2"),
                NodeStatus::Pending => ("·", "2"),
            };
            let attempt = if n.attempt > 0 {
                format!("attempt {}", n.attempt)
            } else {
                String::new()
            };
            let spent = elapsed(n, now_ms).map(duration_ms).unwrap_or_default();
            let mut text = format!(
                "{:<name_w$}  {:<16} {:<10} {:>8}",
                truncate(&label(n), name_w),
                n.status.as_str(),
                attempt,
                spent
            );
            if let Some(a) = n.agent() {
                text.push_str(&format!("  {}", agent_summary(a)));
            }
            if let Some(e) = problem(n).filter(|_| n.status == NodeStatus::Failed) {
                text.push_str("  ");
                text.push_str(e);
            }
            let text = truncate(&text, width.saturating_sub(4));
            lines.push(format!("  {} {}", self.paint(code, mark), text));
            // A running agent's latest words, under its row.
            if let Some(a) = n.agent().filter(|_| n.status == NodeStatus::Running) {
                if !a.last_line.trim().is_empty() {
                    let said = truncate(a.last_line.trim(), width.saturating_sub(8));
                    lines.push(format!("      {}", self.paint("2", &said)));
                }
            }
        }
        let hidden = total - shown.len();
        if hidden > 0 {
            lines.push(format!("  … {hidden} more nodes"));
        }
        lines
    }

    /// The end of the run, for people: counts, slowest nodes, output or
    /// error, and what to do next. On stdout, or stderr in JSON mode.
    pub fn finish(&mut self, outcome: &RunOutcome) {
        if self.mode == Mode::Tty {
            self.paused = false;
            self.dirty = true;
            self.tick(now_ms());
        }
        let id = &self.run_id;
        let mut lines = Vec::new();
        let counts = self.summary.as_ref().map(|s| {
            format!(
                "{} finished, {} failed, {} skipped, {} cancelled",
                s.nodes.finished, s.nodes.failed, s.nodes.skipped, s.nodes.cancelled
            )
        });
        let took = self
            .summary
            .as_ref()
            .map(|s| format!(" in {}", duration_ms(s.duration_ms)))
            .unwrap_or_default();
        match outcome {
            RunOutcome::Finished(output) => {
                lines.push(format!(
                    "{} run {id} finished{took}{}",
                    self.paint("32", "✓"),
                    counts.map(|c| format!(": {c}")).unwrap_or_default()
                ));
                self.summary_details(&mut lines);
                if let Some(o) = output {
                    let text = match o {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    lines.push(format!("output: {text}"));
                }
            }
            RunOutcome::Failed(e) => {
                lines.push(format!(
                    "{} run {id} failed{took}{}",
                    self.paint("31", "✗"),
                    counts.map(|c| format!(": {c}")).unwrap_or_default()
                ));
                self.summary_details(&mut lines);
                lines.push(format!("error: {}: {}", e.kind, e.message));
            }
            RunOutcome::Cancelled => {
                lines.push(format!(
                    "■ run {id} cancelled{took}{}",
                    counts.map(|c| format!(": {c}")).unwrap_or_default()
                ));
            }
            RunOutcome::Waiting => {
                let via = self.via();
                lines.push(format!("? run {id} is waiting for a person"));
                let waiting = self
                    .state
                    .nodes
                    .iter()
                    .filter(|n| n.status == NodeStatus::WaitingApproval);
                for n in waiting {
                    lines.push(format!(
                        "  decide: cairn approve {id} {n}{via}   (or: cairn deny {id} {n}{via})",
                        n = n.node_id
                    ));
                }
                for (rid, q) in self
                    .state
                    .questions
                    .iter()
                    .filter(|(_, q)| q.answer.is_none())
                {
                    lines.push(format!(
                        "  answer: cairn answer {id} {rid} '<answer>'{via}   ({}: {})",
                        q.node_id,
                        truncate(&q.prompt, 80)
                    ));
                }
                if self.server.is_some() {
                    // The server keeps the run and goes on once answered.
                    lines.push(format!("  then:   cairn logs {id} --follow{via}"));
                } else {
                    lines.push(format!("  then:   cairn resume {id}"));
                }
            }
            RunOutcome::Interrupted if self.server.is_some() => {
                lines.push(format!(
                    "the server stopped before run {id} ended; it goes on when the server starts again (`cairn logs {id} --follow{}`)",
                    self.via()
                ));
            }
            RunOutcome::Interrupted => {
                lines.push(format!(
                    "run {id} was interrupted; `cairn resume {id}` continues it"
                ));
            }
        }
        let text = lines.join("\n");
        if self.mode == Mode::Json {
            eprintln!("{text}");
        } else {
            self.plain(&text);
        }
    }

    fn summary_details(&self, lines: &mut Vec<String>) {
        let Some(s) = &self.summary else { return };
        if !s.timings.is_empty() {
            let slow: Vec<String> = s
                .timings
                .iter()
                .take(3)
                .map(|t| {
                    let it = if t.iteration > 0 {
                        format!("#{}", t.iteration)
                    } else {
                        String::new()
                    };
                    format!("{}{it} {}", t.node_id, duration_ms(t.duration_ms))
                })
                .collect();
            lines.push(format!("slowest: {}", slow.join(", ")));
        }
        let t = &s.tokens;
        if t.input + t.output > 0 {
            let cost = s.cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default();
            lines.push(format!("tokens: {} in, {} out{cost}", t.input, t.output));
        }
    }

    /// Tells people (on stderr) that the run waits for someone elsewhere.
    pub fn note_waiting_elsewhere(&self, ask: &Ask) {
        let via = self.via();
        if let Some((rid, _)) = &ask.question {
            eprintln!(
                "{n} asks: {m}\n  answer from another shell: cairn answer {id} {rid} '<answer>'{via}",
                n = ask.node_id,
                m = short_value(&serde_json::Value::String(ask.message.clone()), 200),
                id = self.run_id
            );
            return;
        }
        eprintln!(
            "waiting for approval of {n}: {m}\n  decide from another shell: cairn approve {id} {n}{via}   (or: cairn deny {id} {n}{via})",
            n = ask.node_id,
            m = short_value(&serde_json::Value::String(ask.message.clone()), 200),
            id = self.run_id
        );
    }
}

/// Where the display writes: stdout, or a buffer a test reads back.
enum Out {
    Stdout(std::io::Stdout),
    #[cfg(test)]
    Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

impl Out {
    fn lock(&self) -> Box<dyn Write + '_> {
        match self {
            Out::Stdout(s) => Box::new(s.lock()),
            #[cfg(test)]
            Out::Buffer(b) => Box::new(BufferWriter(b)),
        }
    }
}

#[cfg(test)]
struct BufferWriter<'a>(&'a std::sync::Mutex<Vec<u8>>);

#[cfg(test)]
impl Write for BufferWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Columns and rows of the terminal on stdout (80x24 when unknown).
fn terminal_size() -> (usize, usize) {
    // SAFETY: TIOCGWINSZ only writes a winsize into the struct we pass.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) == 0
            && ws.ws_col > 0
            && ws.ws_row > 0
        {
            return (ws.ws_col as usize, ws.ws_row as usize);
        }
    }
    (80, 24)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{ErrorInfo, RunStatus, Scope};
    use std::sync::{Arc, Mutex};

    fn ev(seq: u64, ts: i64, scope: Scope, kind: EventKind) -> StoredEvent {
        StoredEvent::from_event(&Event {
            run_id: cairn_events::RunId::parse("r1").unwrap(),
            seq: cairn_events::Seq(seq),
            timestamp_ms: ts,
            scope,
            kind,
        })
    }

    fn started(seq: u64, ts: i64, resumed: bool) -> StoredEvent {
        ev(
            seq,
            ts,
            Scope::run(),
            EventKind::RunStarted {
                workflow: "ship".into(),
                workflow_hash: "h".into(),
                input: None,
                resumed,
                parent_run_id: None,
                parent_node_id: None,
                depth: 0,
                forked_from: None,
                trigger: None,
                replay_of: None,
            },
        )
    }

    fn node(id: &str) -> Scope {
        Scope::node(id, 0)
    }

    /// A run with a retry, a skip, a failure, an approval across a resume
    /// and a cancelled loop pass, in two parts: up to the wait, then on.
    fn log() -> (Vec<StoredEvent>, Vec<StoredEvent>) {
        let pending = |seq, id: &str| {
            ev(
                seq,
                1_000 + seq as i64,
                node(id),
                EventKind::NodePending {
                    layer_index: Some(0),
                },
            )
        };
        let first = vec![
            started(1, 1_000, false),
            pending(2, "a"),
            pending(3, "b"),
            pending(4, "c"),
            pending(5, "d"),
            ev(
                6,
                2_000,
                node("a").with_attempt(1),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                7,
                2_400,
                node("a").with_attempt(1),
                EventKind::NodeFailed {
                    error: ErrorInfo::new("exit", "boom"),
                    will_retry: true,
                    snapshot: None,
                },
            ),
            ev(
                8,
                2_400,
                node("a").with_attempt(2),
                EventKind::NodeRetrying { delay_ms: 100 },
            ),
            ev(
                9,
                2_500,
                node("a").with_attempt(2),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                10,
                4_000,
                node("a").with_attempt(2),
                EventKind::NodeFinished {
                    duration_ms: 1_500,
                    output: None,
                    cached: None,
                    snapshot: None,
                },
            ),
            ev(
                11,
                4_100,
                node("b"),
                EventKind::NodeSkipped {
                    reason: "when is false".into(),
                },
            ),
            ev(
                12,
                4_200,
                node("c").with_attempt(1),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                13,
                4_300,
                node("c").with_attempt(1),
                EventKind::NodeWaitingApproval {},
            ),
            ev(
                14,
                4_300,
                node("c").with_attempt(1),
                EventKind::ApprovalRequested {
                    message: Some("ship it?".into()),
                },
            ),
            ev(
                15,
                4_400,
                node("d").with_attempt(1),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                16,
                5_400,
                node("d").with_attempt(1),
                EventKind::NodeFailed {
                    error: ErrorInfo::new("exit", "bad exit"),
                    will_retry: false,
                    snapshot: None,
                },
            ),
            ev(
                17,
                5_500,
                Scope::run(),
                EventKind::RunStatusChanged {
                    status: RunStatus::WaitingApproval,
                },
            ),
        ];
        let second = vec![
            started(18, 60_000, true),
            ev(
                19,
                61_000,
                node("c").with_attempt(1),
                EventKind::ApprovalGranted {
                    decided_by: Some("ann".into()),
                    note: None,
                },
            ),
            ev(
                20,
                61_300,
                node("c").with_attempt(1),
                EventKind::NodeFinished {
                    duration_ms: 57_100,
                    output: None,
                    cached: None,
                    snapshot: None,
                },
            ),
            ev(
                21,
                61_400,
                Scope::node("e", 1).with_attempt(1),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                22,
                62_000,
                Scope::node("e", 1).with_attempt(1),
                EventKind::NodeCancelled {
                    reason: Some("stop".into()),
                },
            ),
            ev(
                23,
                62_100,
                Scope::run(),
                EventKind::RunFailed {
                    error: ErrorInfo::new("node", "d failed"),
                },
            ),
        ];
        (first, second)
    }

    /// Feeds events to a plain display that writes into a buffer.
    fn plain_display() -> (Progress, Arc<Mutex<Vec<u8>>>) {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let mut p = Progress::new(Mode::Plain, &RunId::parse("r1").unwrap(), 0);
        p.out = Out::Buffer(buf.clone());
        (p, buf)
    }

    fn written(buf: &Mutex<Vec<u8>>) -> String {
        String::from_utf8(std::mem::take(&mut *buf.lock().unwrap())).unwrap()
    }

    #[test]
    fn plain_lines_tell_each_node_change_with_the_session_time() {
        let (mut p, buf) = plain_display();
        let (first, second) = log();
        let asks: Vec<String> = first
            .iter()
            .filter_map(|e| p.on_event(e))
            .map(|a| a.node_id)
            .collect();
        assert_eq!(asks, ["c"]);
        p.finish(&RunOutcome::Waiting);
        assert_eq!(
            written(&buf),
            "run r1 started: workflow ship
   1.00s  a                        running          attempt 1
   1.40s  a                        retrying         attempt 1  boom
   1.50s  a                        running          attempt 2
   3.00s  a                        finished         attempt 2  1.50s
   3.10s  b                        skipped           when is false
   3.20s  c                        running          attempt 1
   3.30s  c                        waiting-approval attempt 1
   3.40s  d                        running          attempt 1
   4.40s  d                        failed           attempt 1  1.00s  bad exit
? run r1 is waiting for a person
  decide: cairn approve r1 c   (or: cairn deny r1 c)
  then:   cairn resume r1
"
        );
        for e in &second {
            p.on_event(e);
        }
        p.finish(&RunOutcome::Failed(ErrorInfo::new("node", "d failed")));
        // Times restart with the resume: the resumed session's own clock.
        assert_eq!(
            written(&buf),
            "run r1 resumed: workflow ship
   1.30s  c                        finished         attempt 1  57.10s
   1.40s  e#1                      running          attempt 1
   2.00s  e#1                      cancelled        attempt 1  600ms
✗ run r1 failed
error: node: d failed
"
        );
    }

    #[test]
    fn the_table_shows_the_reducers_state() {
        let (mut p, _buf) = plain_display();
        let (first, second) = log();
        for e in &first {
            p.on_event(e);
        }
        let table: Vec<String> = p
            .table(10_000, 100, 40)
            .iter()
            .map(|l| l.trim_end().to_string())
            .collect();
        assert_eq!(
            table,
            [
                "run r1 · ship · waiting-approval · 3/4 nodes done · 9.00s",
                "  ✓ a         finished         attempt 2     1.50s",
                "  - b         skipped",
                "  ? c         waiting-approval attempt 1     5.80s",
                "  ✗ d         failed           attempt 1     1.00s  bad exit",
            ]
        );
        // On a short screen, the rows that need attention and the latest
        // changes stay.
        let short = p.table(10_000, 100, 6);
        assert_eq!(short.len(), 5, "{short:?}");
        assert!(short[1].contains(" b "), "{short:?}");
        assert_eq!(short[4], "  … 1 more nodes");
        // A decision shows at once, before the node's next lifecycle event.
        p.on_event(&second[0]);
        p.on_event(&second[1]);
        let table = p.table(61_000, 100, 40);
        assert!(
            table[3].starts_with("  ▶ c         running          attempt 1"),
            "{table:?}"
        );
        for e in &second[2..] {
            p.on_event(e);
        }
        let table = p.table(63_000, 100, 40);
        assert_eq!(table[0], "run r1 · ship · failed · 5/5 nodes done · 3.00s");
        assert_eq!(
            table[3],
            "  ✓ c         finished         attempt 1    57.10s"
        );
        assert_eq!(
            table[5],
            "  ■ e#1       cancelled        attempt 1     600ms"
        );
    }

    /// The events of a fan-out of `n` value nodes: each pending at once,
    /// then started and finished one after the other, with one failure.
    fn fan_out(n: u64) -> Vec<StoredEvent> {
        let mut evs = vec![started(1, 1_000, false)];
        let mut seq = 1;
        let mut next = || {
            seq += 1;
            seq
        };
        for i in 0..n {
            let s = next();
            evs.push(ev(
                s,
                1_000,
                node(&format!("n{i}")),
                EventKind::NodePending {
                    layer_index: Some(1),
                },
            ));
        }
        for i in 0..n {
            let id = format!("n{i}");
            let s = next();
            evs.push(ev(
                s,
                2_000,
                node(&id).with_attempt(1),
                EventKind::NodeStarted { snapshot: None },
            ));
            let s = next();
            let end = if i == 7 {
                EventKind::NodeFailed {
                    error: ErrorInfo::new("exit", "seven"),
                    will_retry: false,
                    snapshot: None,
                }
            } else {
                EventKind::NodeFinished {
                    duration_ms: 3,
                    output: None,
                    cached: None,
                    snapshot: None,
                }
            };
            evs.push(ev(s, 2_003, node(&id).with_attempt(1), end));
            // A scorer that ends after its node: a pass let go stays gone.
            if i == 9 {
                let s = next();
                evs.push(ev(
                    s,
                    2_004,
                    node(&id).with_attempt(1),
                    EventKind::ScorerFinished {
                        scorer_id: "s".into(),
                        scorer_name: "s".into(),
                        score: 1.0,
                        reason: None,
                    },
                ));
            }
        }
        evs
    }

    #[test]
    fn a_large_runs_display_holds_what_it_may_show_and_counts_the_rest() {
        let n = 10 * HOLD_ALL_UP_TO as u64;
        let (mut p, buf) = plain_display();
        for e in &fan_out(n) {
            p.on_event(e);
        }
        // Every change is told as in a small run.
        let text = written(&buf);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() as u64, 1 + 2 * n, "{:?}", &lines[..3]);
        assert_eq!(
            lines[1],
            "   1.00s  n0                       running          attempt 1"
        );
        assert_eq!(
            lines[2],
            "   1.00s  n0                       finished         attempt 1  3ms"
        );
        assert_eq!(
            lines[16],
            "   1.00s  n7                       failed           attempt 1  3ms  seven"
        );
        // It holds the failed pass and the latest ended ones, not every pass.
        assert!(
            p.state.nodes.len() <= 2 * KEEP_ENDED + 2,
            "{} held",
            p.state.nodes.len()
        );
        assert!(p.state.node("n7", 0).is_some());
        assert!(p.state.node("n9", 0).is_none());
        assert!(p.state.node(&format!("n{}", n - 1), 0).is_some());
        let table = p.table(3_000, 100, 8);
        assert_eq!(
            table[0],
            format!("run r1 · ship · running · {n}/{n} nodes done · 2.00s")
        );
        assert!(table[1].contains(" n7 "), "{table:?}");
        assert_eq!(
            table.last().unwrap(),
            &format!("  … {} more nodes", n as usize - (table.len() - 2))
        );
    }

    #[test]
    fn a_decided_approval_is_not_offered_again() {
        let (mut p, buf) = plain_display();
        let (first, second) = log();
        for e in first.iter().chain(&second[..2]) {
            p.on_event(e);
        }
        written(&buf);
        p.finish(&RunOutcome::Waiting);
        assert_eq!(
            written(&buf),
            "? run r1 is waiting for a person\n  then:   cairn resume r1\n"
        );
    }
}
