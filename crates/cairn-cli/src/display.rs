//! What `cairn run` and `cairn resume` show while a run goes on.
//!
//! Three modes: NDJSON (each stored event line as it is), a terminal table
//! redrawn in place (one line per node: state, attempt, elapsed), and plain
//! appended lines when stdout is not a terminal, so logs of CI jobs stay
//! readable.

use std::collections::HashMap;
use std::io::Write;

use cairn_engine::RunOutcome;
use cairn_events::{Event, EventKind, NodeCounts, NodeTiming, RunStatus, TokenTotals};
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

/// A person's decision the display asks for.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The approval node's path.
    pub node_id: String,
    /// The rendered message.
    pub message: String,
}

#[derive(Debug, Clone)]
struct Row {
    node_id: String,
    iteration: u32,
    status: &'static str,
    attempt: u32,
    started_ms: Option<i64>,
    ended_ms: Option<i64>,
    duration_ms: Option<u64>,
    error: Option<String>,
    /// The seq of the latest change, to keep recent rows on a short screen.
    changed: u64,
}

impl Row {
    fn label(&self) -> String {
        if self.iteration > 0 {
            format!("{}#{}", self.node_id, self.iteration)
        } else {
            self.node_id.clone()
        }
    }

    fn elapsed(&self, now_ms: i64) -> Option<u64> {
        if let Some(d) = self.duration_ms {
            return Some(d);
        }
        let start = self.started_ms?;
        let end = self.ended_ms.unwrap_or(now_ms);
        Some(end.saturating_sub(start).max(0) as u64)
    }

    fn active(&self) -> bool {
        matches!(
            self.status,
            "running" | "retrying" | "waiting-approval" | "waiting-input" | "failed"
        )
    }
}

/// The summary `RunSummary` carries.
struct Summary {
    duration_ms: u64,
    nodes: NodeCounts,
    tokens: TokenTotals,
    cost_usd: Option<f64>,
    timings: Vec<NodeTiming>,
}

/// The run as the display knows it, folded from the events it was given.
pub struct Progress {
    mode: Mode,
    color: bool,
    run_id: String,
    /// Events at or below this seq update the table but print nothing
    /// (a resume's earlier history).
    quiet_until: u64,
    workflow: String,
    status: Option<RunStatus>,
    started_ms: Option<i64>,
    rows: Vec<Row>,
    index: HashMap<(String, u32), usize>,
    summary: Option<Summary>,
    last_seq: u64,
    /// Lines of the table currently on screen (TTY mode).
    drawn: usize,
    /// While a question is on screen, the table is not redrawn.
    paused: bool,
    dirty: bool,
    /// An undecodable event was reported already.
    warned: bool,
    out: std::io::Stdout,
}

impl Progress {
    /// A display for one run; events up to `quiet_until` only build state.
    pub fn new(mode: Mode, run_id: &str, quiet_until: u64) -> Progress {
        let color = mode == Mode::Tty && std::env::var_os("NO_COLOR").is_none();
        Progress {
            mode,
            color,
            run_id: run_id.to_string(),
            quiet_until,
            workflow: String::new(),
            status: None,
            started_ms: None,
            rows: Vec::new(),
            index: HashMap::new(),
            summary: None,
            last_seq: 0,
            drawn: 0,
            paused: false,
            dirty: true,
            warned: false,
            out: std::io::stdout(),
        }
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
        if loud && self.mode == Mode::Json {
            let mut out = self.out.lock();
            let _ = out.write_all(stored.json.as_bytes());
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
        let ev = match stored.decode() {
            Ok(ev) => ev,
            Err(e) => {
                // The run goes on; only this display misses the event.
                if !self.warned {
                    self.warned = true;
                    eprintln!(
                        "warning: run {}: cannot show event {} ({e}); `cairn logs --json` has it",
                        self.run_id, stored.seq
                    );
                }
                return None;
            }
        };
        let ev = &ev;
        self.dirty = true;
        let ts = ev.timestamp_ms;
        match &ev.kind {
            EventKind::RunStarted {
                workflow, resumed, ..
            } => {
                self.workflow = workflow.clone();
                if self.started_ms.is_none() || *resumed {
                    self.started_ms = Some(ts);
                }
                self.status = Some(RunStatus::Running);
                if loud && self.mode == Mode::Plain {
                    self.plain(&format!(
                        "run {} {} workflow {}",
                        self.run_id,
                        if *resumed { "resumed:" } else { "started:" },
                        workflow
                    ));
                }
            }
            EventKind::RunStatusChanged { status } => {
                self.status = Some(*status);
            }
            EventKind::RunFinished { .. } => self.status = Some(RunStatus::Finished),
            EventKind::RunFailed { .. } => self.status = Some(RunStatus::Failed),
            EventKind::RunCancelled { .. } => self.status = Some(RunStatus::Cancelled),
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
                })
            }
            EventKind::NodePending { .. } => {
                self.row(ev, "pending", loud);
            }
            EventKind::NodeStarted {} => {
                let attempt = ev.scope.attempt.unwrap_or(1);
                let r = self.row_mut(ev);
                r.attempt = attempt;
                r.started_ms = Some(ts);
                r.ended_ms = None;
                r.duration_ms = None;
                r.error = None;
                self.row(ev, "running", loud);
            }
            EventKind::NodeFinished { duration_ms, .. } => {
                let r = self.row_mut(ev);
                r.ended_ms = Some(ts);
                r.duration_ms = Some(*duration_ms);
                self.row(ev, "finished", loud);
            }
            EventKind::NodeFailed { error, will_retry } => {
                let r = self.row_mut(ev);
                r.ended_ms = Some(ts);
                r.error = Some(error.message.clone());
                self.row(ev, if *will_retry { "retrying" } else { "failed" }, loud);
            }
            EventKind::NodeRetrying { .. } => {
                self.row(ev, "retrying", false);
            }
            EventKind::NodeSkipped { reason } => {
                self.row_mut(ev).error = Some(reason.clone());
                self.row(ev, "skipped", loud);
            }
            EventKind::NodeCancelled { .. } => {
                let r = self.row_mut(ev);
                if r.started_ms.is_some() && r.ended_ms.is_none() {
                    r.ended_ms = Some(ts);
                }
                self.row(ev, "cancelled", loud);
            }
            EventKind::NodeWaitingApproval {} => {
                self.row(ev, "waiting-approval", loud);
            }
            EventKind::NodeWaitingInput { .. } => {
                self.row(ev, "waiting-input", loud);
            }
            EventKind::ApprovalRequested { message } => {
                if let Some(node) = &ev.scope.node_id {
                    return Some(Ask {
                        node_id: node.clone(),
                        message: message.clone().unwrap_or_default(),
                    });
                }
            }
            _ => {}
        }
        None
    }

    fn row_mut(&mut self, ev: &Event) -> &mut Row {
        let node = ev.scope.node_id.clone().unwrap_or_default();
        let it = ev.scope.iteration.unwrap_or(0);
        let key = (node.clone(), it);
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                self.rows.push(Row {
                    node_id: node,
                    iteration: it,
                    status: "pending",
                    attempt: 0,
                    started_ms: None,
                    ended_ms: None,
                    duration_ms: None,
                    error: None,
                    changed: ev.seq,
                });
                self.index.insert(key, self.rows.len() - 1);
                self.rows.len() - 1
            }
        };
        &mut self.rows[i]
    }

    /// Sets a row's status and, in plain mode, prints the change.
    fn row(&mut self, ev: &Event, status: &'static str, loud: bool) {
        let seq = ev.seq;
        let r = self.row_mut(ev);
        r.status = status;
        r.changed = seq;
        let row = r.clone();
        if loud && self.mode == Mode::Plain && status != "pending" {
            let since = self
                .started_ms
                .map(|s| duration_ms(ev.timestamp_ms.saturating_sub(s).max(0) as u64))
                .unwrap_or_default();
            let mut line = format!("{since:>8}  {:<24} {:<16}", row.label(), status);
            if row.attempt > 0 {
                line.push_str(&format!(" attempt {}", row.attempt));
            }
            if matches!(status, "finished" | "failed" | "cancelled") {
                if let Some(d) = row.elapsed(ev.timestamp_ms) {
                    line.push_str(&format!("  {}", duration_ms(d)));
                }
            }
            if let Some(e) = &row.error {
                if matches!(status, "failed" | "retrying" | "skipped") {
                    line.push_str(&format!("  {}", truncate(e, 200)));
                }
            }
            self.plain(line.trim_end());
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
        let running = self.rows.iter().any(|r| r.status == "running");
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
        let done = self
            .rows
            .iter()
            .filter(|r| matches!(r.status, "finished" | "skipped" | "failed" | "cancelled"))
            .count();
        let elapsed = self
            .started_ms
            .map(|s| duration_ms(now_ms.saturating_sub(s).max(0) as u64))
            .unwrap_or_default();
        let status = self.status.map(|s| s.as_str()).unwrap_or("starting");
        let header = format!(
            "run {} · {} · {} · {}/{} nodes done · {}",
            self.run_id,
            self.workflow,
            status,
            done,
            self.rows.len(),
            elapsed
        );
        let mut lines = vec![truncate(&header, width.saturating_sub(1))];
        // Keep active rows, then the most recently changed ones, in file order.
        let budget = height.saturating_sub(3).max(3);
        let mut shown: Vec<usize> = (0..self.rows.len()).collect();
        if shown.len() > budget {
            let mut by_rank: Vec<usize> = shown.clone();
            by_rank.sort_by_key(|&i| {
                let r = &self.rows[i];
                (!r.active(), std::cmp::Reverse(r.changed))
            });
            by_rank.truncate(budget);
            by_rank.sort_unstable();
            shown = by_rank;
        }
        let name_w = shown
            .iter()
            .map(|&i| self.rows[i].label().chars().count())
            .max()
            .unwrap_or(0)
            .clamp(8, 40);
        for &i in &shown {
            let r = &self.rows[i];
            let (mark, code) = match r.status {
                "finished" => ("✓", "32"),
                "failed" => ("✗", "31"),
                "running" => ("▶", "36"),
                "retrying" => ("↻", "33"),
                "waiting-approval" | "waiting-input" => ("?", "33"),
                "skipped" => ("-", "2"),
                "cancelled" => ("■", "2"),
                _ => ("·", "2"),
            };
            let attempt = if r.attempt > 0 {
                format!("attempt {}", r.attempt)
            } else {
                String::new()
            };
            let elapsed = r.elapsed(now_ms).map(duration_ms).unwrap_or_default();
            let mut text = format!(
                "{:<name_w$}  {:<16} {:<10} {:>8}",
                truncate(&r.label(), name_w),
                r.status,
                attempt,
                elapsed
            );
            if let Some(e) = r.error.as_ref().filter(|_| r.status == "failed") {
                text.push_str("  ");
                text.push_str(e);
            }
            let text = truncate(&text, width.saturating_sub(4));
            lines.push(format!("  {} {}", self.paint(code, mark), text));
        }
        let hidden = self.rows.len() - shown.len();
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
                lines.push(format!("? run {id} is waiting for a person"));
                for r in self.rows.iter().filter(|r| r.status == "waiting-approval") {
                    lines.push(format!(
                        "  decide: cairn approve {id} {n}   (or: cairn deny {id} {n})",
                        n = r.node_id
                    ));
                }
                lines.push(format!("  then:   cairn resume {id}"));
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
        eprintln!(
            "waiting for approval of {n}: {m}\n  decide from another shell: cairn approve {id} {n}   (or: cairn deny {id} {n})",
            n = ask.node_id,
            m = short_value(&serde_json::Value::String(ask.message.clone()), 200),
            id = self.run_id
        );
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
