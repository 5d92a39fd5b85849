//! The Metrics view: Prometheus counters and histograms folded from events.
//!
//! Metrics are a view of the log like every other (contract: "Views derived
//! from the log"), so they are computed by folding events rather than by
//! counters sprinkled through the engine: whatever the log says happened is
//! exactly what the metrics count.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::event::{Event, EventKind, ToolStatus};
use crate::ids::RunId;

/// Upper bounds, in seconds, of the duration histograms' buckets: from a
/// quick tool call to an hour-long build.
pub const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// A Prometheus histogram with [`DURATION_BUCKETS`].
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last slot is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; DURATION_BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    /// Records one duration, in seconds.
    pub fn observe(&mut self, seconds: f64) {
        let i = DURATION_BUCKETS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(DURATION_BUCKETS.len());
        self.counts[i] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of the recorded durations, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// Counters and histograms folded from events, any number of runs mixed.
///
/// ```
/// use cairn_events::{Event, EventKind, Metrics, RunId, Scope, Seq};
/// let mut m = Metrics::new();
/// m.apply(&Event { run_id: RunId::parse("r").unwrap(), seq: Seq(1), timestamp_ms: 0,
///     scope: Scope::node("a", 0).with_attempt(1), kind: EventKind::NodeStarted { snapshot: None } });
/// assert!(m.render_prometheus().contains("cairn_nodes_started_total 1\n"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Runs started (resumes are not new runs).
    pub runs: u64,
    /// Runs resumed.
    pub runs_resumed: u64,
    /// Runs that ended, by final status (`finished`, `failed`, `cancelled`).
    pub runs_ended: BTreeMap<String, u64>,
    /// Node attempts started.
    pub nodes_started: u64,
    /// Node attempts finished.
    pub nodes_finished: u64,
    /// Node attempts failed, retried ones included, so that started =
    /// finished + failed + cancelled once everything has ended.
    pub nodes_failed: u64,
    /// Approval decisions by `granted` / `denied`.
    pub approvals: BTreeMap<String, u64>,
    /// Tool calls by (tool, status).
    pub tool_calls: BTreeMap<(String, String), u64>,
    /// Tokens by (kind, model); kind is `input`, `output`, `cache_read`,
    /// `cache_write` or `reasoning`.
    pub tokens: BTreeMap<(String, String), u64>,
    /// Node attempt durations.
    pub node_duration: Histogram,
    /// Tool call durations by tool.
    pub tool_duration: BTreeMap<String, Histogram>,
    /// Start time of node attempts still running, to time failed attempts
    /// (`NodeFailed` carries no duration).
    open_attempts: HashMap<(RunId, String, u32, u32), i64>,
}

impl Metrics {
    /// Zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event.
    pub fn apply(&mut self, ev: &Event) {
        use EventKind as K;
        match &ev.kind {
            K::RunStarted { resumed: true, .. } => self.runs_resumed += 1,
            K::RunStarted { resumed: false, .. } => self.runs += 1,
            K::RunFinished { .. } => self.run_ended("finished"),
            K::RunFailed { .. } => self.run_ended("failed"),
            K::RunCancelled { .. } => {
                self.run_ended("cancelled");
                let run = &ev.run_id;
                self.open_attempts.retain(|k, _| &k.0 != run);
            }
            K::NodeStarted { .. } => {
                self.nodes_started += 1;
                self.open_attempts.insert(attempt_key(ev), ev.timestamp_ms);
            }
            K::NodeFinished { duration_ms, .. } => {
                self.nodes_finished += 1;
                self.open_attempts.remove(&attempt_key(ev));
                self.node_duration.observe(*duration_ms as f64 / 1000.0);
            }
            K::NodeFailed { .. } => {
                self.nodes_failed += 1;
                if let Some(start) = self.open_attempts.remove(&attempt_key(ev)) {
                    let ms = (ev.timestamp_ms - start).max(0);
                    self.node_duration.observe(ms as f64 / 1000.0);
                }
            }
            K::NodeCancelled { .. } => _ = self.open_attempts.remove(&attempt_key(ev)),
            K::ApprovalGranted { .. } => *self.approvals.entry("granted".into()).or_default() += 1,
            K::ApprovalDenied { .. } => *self.approvals.entry("denied".into()).or_default() += 1,
            K::ToolCallFinished {
                tool_name,
                status,
                duration_ms,
                ..
            } => self.tool_call(tool_name, *status, *duration_ms),
            K::TokenUsageReported {
                model,
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cache_write_tokens,
                reasoning_tokens,
                ..
            } => {
                let kinds = [
                    ("input", Some(*input_tokens)),
                    ("output", Some(*output_tokens)),
                    ("cache_read", *cache_read_tokens),
                    ("cache_write", *cache_write_tokens),
                    ("reasoning", *reasoning_tokens),
                ];
                self.tokens_used(model, kinds);
            }
            // Nothing counted of these.
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
            | K::NodeOutput { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepStarted { .. }
            | K::AgentStepFinished { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::ToolCallStarted { .. }
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
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {}
        }
    }

    fn run_ended(&mut self, status: &str) {
        *self.runs_ended.entry(status.into()).or_default() += 1;
    }

    fn tool_call(&mut self, tool_name: &str, status: ToolStatus, duration_ms: u64) {
        let st = match status {
            ToolStatus::Success => "success",
            ToolStatus::Error => "error",
        };
        *self
            .tool_calls
            .entry((tool_name.to_string(), st.to_string()))
            .or_default() += 1;
        self.tool_duration
            .entry(tool_name.to_string())
            .or_default()
            .observe(duration_ms as f64 / 1000.0);
    }

    /// Adds one model call's tokens, by kind, to its model's.
    fn tokens_used(&mut self, model: &str, kinds: [(&str, Option<u64>); 5]) {
        for (kind, n) in kinds {
            if let Some(n) = n {
                *self
                    .tokens
                    .entry((kind.to_string(), model.to_string()))
                    .or_default() += n;
            }
        }
    }

    /// The metrics in the Prometheus text exposition format, version 0.0.4.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        self.render_runs_and_nodes(&mut out);
        self.render_calls(&mut out);
        self.render_durations(&mut out);
        out
    }

    /// The counters of runs and node attempts.
    fn render_runs_and_nodes(&self, out: &mut String) {
        counter(
            out,
            "cairn_runs_total",
            "Runs started (resumes not counted).",
            &[(vec![], self.runs)],
        );
        counter(
            out,
            "cairn_runs_resumed_total",
            "Runs resumed.",
            &[(vec![], self.runs_resumed)],
        );
        let ended: Vec<_> = self
            .runs_ended
            .iter()
            .map(|(s, n)| (vec![("status", s.as_str())], *n))
            .collect();
        counter(
            out,
            "cairn_runs_ended_total",
            "Runs that ended, by final status.",
            &ended,
        );
        counter(
            out,
            "cairn_nodes_started_total",
            "Node attempts started.",
            &[(vec![], self.nodes_started)],
        );
        counter(
            out,
            "cairn_nodes_finished_total",
            "Node attempts finished.",
            &[(vec![], self.nodes_finished)],
        );
        counter(
            out,
            "cairn_nodes_failed_total",
            "Node attempts failed, retried attempts included.",
            &[(vec![], self.nodes_failed)],
        );
    }

    /// The counters of approvals, tool calls and tokens.
    fn render_calls(&self, out: &mut String) {
        let approvals: Vec<_> = self
            .approvals
            .iter()
            .map(|(d, n)| (vec![("decision", d.as_str())], *n))
            .collect();
        counter(
            out,
            "cairn_approvals_total",
            "Approval decisions.",
            &approvals,
        );
        let tools: Vec<_> = self
            .tool_calls
            .iter()
            .map(|((t, s), n)| (vec![("tool", t.as_str()), ("status", s.as_str())], *n))
            .collect();
        counter(
            out,
            "cairn_tool_calls_total",
            "Tool calls that ended, by tool and status.",
            &tools,
        );
        let tokens: Vec<_> = self
            .tokens
            .iter()
            .map(|((k, m), n)| (vec![("kind", k.as_str()), ("model", m.as_str())], *n))
            .collect();
        counter(
            out,
            "cairn_tokens_total",
            "Model tokens, by kind and model.",
            &tokens,
        );
    }

    /// The histograms of durations.
    fn render_durations(&self, out: &mut String) {
        header(
            out,
            "cairn_node_duration_seconds",
            "Duration of node attempts.",
            "histogram",
        );
        histogram(out, "cairn_node_duration_seconds", &[], &self.node_duration);
        header(
            out,
            "cairn_tool_duration_seconds",
            "Duration of tool calls, by tool.",
            "histogram",
        );
        for (tool, h) in &self.tool_duration {
            histogram(out, "cairn_tool_duration_seconds", &[("tool", tool)], h);
        }
    }
}

/// The (run, node, pass, attempt) an attempt's event is of.
fn attempt_key(ev: &Event) -> (RunId, String, u32, u32) {
    (
        ev.run_id.clone(),
        ev.scope.node_id.as_deref().unwrap_or_default().to_string(),
        ev.scope.iteration.unwrap_or(0),
        ev.scope.attempt.unwrap_or(0),
    )
}

fn header(out: &mut String, name: &str, help: &str, ty: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {ty}");
}

fn counter(out: &mut String, name: &str, help: &str, samples: &[(Vec<(&str, &str)>, u64)]) {
    header(out, name, help, "counter");
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}{} {v}", label_set(labels));
    }
}

fn histogram(out: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let mut cumulative = 0;
    for (i, bound) in DURATION_BUCKETS.iter().enumerate() {
        cumulative += h.counts[i];
        let le = format_float(*bound);
        let mut l = labels.to_vec();
        l.push(("le", &le));
        let _ = writeln!(out, "{name}_bucket{} {cumulative}", label_set(&l));
    }
    let mut l = labels.to_vec();
    l.push(("le", "+Inf"));
    let _ = writeln!(out, "{name}_bucket{} {}", label_set(&l), h.count);
    let _ = writeln!(
        out,
        "{name}_sum{} {}",
        label_set(labels),
        format_float(h.sum)
    );
    let _ = writeln!(out, "{name}_count{} {}", label_set(labels), h.count);
}

fn format_float(v: f64) -> String {
    // Rust's shortest round-trip form ("1", "0.005", "3.2") is a float
    // Prometheus parses, and keeps `le` labels short and stable.
    format!("{v}")
}

fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Label values escape backslash, double quote and newline (format 0.0.4).
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ErrorInfo, Scope};

    fn ev(run: &str, seq: u64, ts: i64, scope: Scope, kind: EventKind) -> Event {
        Event {
            run_id: RunId::parse(run).unwrap(),
            seq: crate::Seq(seq),
            timestamp_ms: ts,
            scope,
            kind,
        }
    }

    fn sample(text: &str, line_start: &str) -> String {
        text.lines()
            .find(|l| l.starts_with(line_start) && !l.starts_with('#'))
            .unwrap_or_else(|| panic!("no sample `{line_start}` in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
    }

    fn run_started(resumed: bool) -> EventKind {
        EventKind::RunStarted {
            workflow: "w".into(),
            workflow_hash: "h".into(),
            input: None,
            resumed,
            parent_run_id: None,
            parent_node_id: None,
            depth: 0,
            forked_from: None,
            trigger: None,
            replay_of: None,
        }
    }

    #[test]
    fn folds_counters_and_histograms_over_many_runs() {
        let a = |n: &str, at: u32| Scope::node(n, 0).with_attempt(at);
        let log = vec![
            ev("r1", 1, 0, Scope::run(), run_started(false)),
            ev("r2", 1, 0, Scope::run(), run_started(false)),
            ev(
                "r1",
                2,
                0,
                a("x", 1),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                "r2",
                2,
                0,
                a("x", 1),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                "r1",
                3,
                3000,
                a("x", 1),
                EventKind::NodeFailed {
                    error: ErrorInfo::new("e", "m"),
                    will_retry: true,
                    snapshot: None,
                },
            ),
            ev(
                "r1",
                4,
                3000,
                a("x", 2),
                EventKind::NodeStarted { snapshot: None },
            ),
            ev(
                "r1",
                5,
                3100,
                a("x", 2),
                EventKind::ToolCallFinished {
                    tool_name: "read".into(),
                    tool_seq: 1,
                    status: ToolStatus::Success,
                    duration_ms: 7,
                    error: None,
                },
            ),
            ev(
                "r1",
                6,
                3100,
                a("x", 2),
                EventKind::ToolCallFinished {
                    tool_name: "say \"hi\"\n".into(),
                    tool_seq: 2,
                    status: ToolStatus::Error,
                    duration_ms: 70_000,
                    error: None,
                },
            ),
            ev(
                "r1",
                7,
                3100,
                a("x", 2),
                EventKind::TokenUsageReported {
                    provider: "p".into(),
                    model: "m1".into(),
                    input_tokens: 10,
                    output_tokens: 5,
                    cache_read_tokens: Some(2),
                    cache_write_tokens: None,
                    reasoning_tokens: None,
                    cost_usd: None,
                },
            ),
            ev(
                "r1",
                8,
                3100,
                a("x", 2),
                EventKind::TokenUsageReported {
                    provider: "p".into(),
                    model: "m1".into(),
                    input_tokens: 1,
                    output_tokens: 1,
                    cache_read_tokens: None,
                    cache_write_tokens: None,
                    reasoning_tokens: Some(4),
                    cost_usd: None,
                },
            ),
            ev(
                "r1",
                9,
                3200,
                a("x", 2),
                EventKind::NodeFinished {
                    duration_ms: 200,
                    output: None,
                    cached: None,
                    snapshot: None,
                },
            ),
            ev(
                "r2",
                3,
                10,
                Scope::node("g", 0),
                EventKind::ApprovalDenied {
                    decided_by: None,
                    note: None,
                },
            ),
            ev(
                "r2",
                4,
                10,
                Scope::run(),
                EventKind::RunCancelled { reason: None },
            ),
            ev("r2", 5, 20, Scope::run(), run_started(true)),
            ev(
                "r1",
                10,
                3300,
                Scope::run(),
                EventKind::RunFinished {
                    output: None,
                    duration_ms: 3300,
                },
            ),
        ];
        let mut m = Metrics::new();
        for e in &log {
            m.apply(e);
        }
        let text = m.render_prometheus();
        assert_eq!(sample(&text, "cairn_runs_total "), "2");
        assert_eq!(sample(&text, "cairn_runs_resumed_total "), "1");
        assert_eq!(
            sample(&text, "cairn_runs_ended_total{status=\"cancelled\"}"),
            "1"
        );
        assert_eq!(sample(&text, "cairn_nodes_started_total "), "3");
        assert_eq!(sample(&text, "cairn_nodes_finished_total "), "1");
        assert_eq!(sample(&text, "cairn_nodes_failed_total "), "1");
        assert_eq!(
            sample(&text, "cairn_approvals_total{decision=\"denied\"}"),
            "1"
        );
        assert_eq!(
            sample(
                &text,
                "cairn_tool_calls_total{tool=\"read\",status=\"success\"}"
            ),
            "1"
        );
        assert_eq!(
            sample(
                &text,
                "cairn_tool_calls_total{tool=\"say \\\"hi\\\"\\n\",status=\"error\"}"
            ),
            "1",
            "label values are escaped"
        );
        assert_eq!(
            sample(&text, "cairn_tokens_total{kind=\"input\",model=\"m1\"}"),
            "11"
        );
        assert_eq!(
            sample(
                &text,
                "cairn_tokens_total{kind=\"cache_read\",model=\"m1\"}"
            ),
            "2"
        );
        assert_eq!(
            sample(&text, "cairn_tokens_total{kind=\"reasoning\",model=\"m1\"}"),
            "4"
        );
        assert!(
            !text.contains("kind=\"cache_write\""),
            "unreported kinds are not invented"
        );
        // The failed attempt is timed from its start (3 s), the finished one
        // by its durationMs (0.2 s).
        assert_eq!(sample(&text, "cairn_node_duration_seconds_count "), "2");
        assert_eq!(sample(&text, "cairn_node_duration_seconds_sum "), "3.2");
        assert_eq!(
            sample(&text, "cairn_node_duration_seconds_bucket{le=\"0.25\"}"),
            "1"
        );
        assert_eq!(
            sample(&text, "cairn_node_duration_seconds_bucket{le=\"2.5\"}"),
            "1"
        );
        assert_eq!(
            sample(&text, "cairn_node_duration_seconds_bucket{le=\"5\"}"),
            "2"
        );
        assert_eq!(
            sample(&text, "cairn_node_duration_seconds_bucket{le=\"+Inf\"}"),
            "2"
        );
        assert_eq!(
            sample(
                &text,
                "cairn_tool_duration_seconds_bucket{tool=\"read\",le=\"0.01\"}"
            ),
            "1"
        );
        assert_eq!(
            sample(
                &text,
                "cairn_tool_duration_seconds_bucket{tool=\"read\",le=\"0.005\"}"
            ),
            "0"
        );
        // r2's attempt was cut by the cancel: it is not timed and not kept.
        assert!(m.open_attempts.is_empty());
    }

    #[test]
    fn every_family_has_help_and_type_and_samples_follow_their_header() {
        let mut m = Metrics::new();
        m.apply(&ev(
            "r",
            1,
            0,
            Scope::node("a", 0).with_attempt(1),
            EventKind::NodeStarted { snapshot: None },
        ));
        let text = m.render_prometheus();
        let mut current: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = Some(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = current.as_deref().expect("sample before any TYPE");
                assert!(
                    name.starts_with(family),
                    "{name} outside its family {family}"
                );
            }
        }
        for family in [
            "cairn_runs_total",
            "cairn_nodes_started_total",
            "cairn_nodes_finished_total",
            "cairn_nodes_failed_total",
            "cairn_approvals_total",
            "cairn_tool_calls_total",
            "cairn_tokens_total",
            "cairn_node_duration_seconds",
            "cairn_tool_duration_seconds",
        ] {
            assert!(text.contains(&format!("# HELP {family} ")), "{family} HELP");
            assert!(text.contains(&format!("# TYPE {family} ")), "{family} TYPE");
        }
        assert!(text.ends_with('\n'));
    }
}
