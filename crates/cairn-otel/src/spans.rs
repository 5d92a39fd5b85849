//! A run's spans, folded from its events: no I/O, so the same log always
//! gives the same spans.
//!
//! One span per run (all its sessions: a resumed run is one span), per node
//! attempt, per model call (agent step) and per tool call. A span whose end
//! is not in the log (the run is still going, waits for a person, or was cut
//! off) ends at its parent's end, with its status unset and
//! `cairn.incomplete` set.

use std::collections::HashMap;

use cairn_events::{CancelMechanism, ErrorInfo, Event, EventKind, RunId, ToolStatus};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, status, Span, Status};

use crate::ids::{span_id, trace_id, SpanKey};

/// Longest string attribute value, in bytes; longer ones are cut (at a
/// character boundary) and end with `…`. An error message or a prompt in a
/// hostile log could otherwise be megabytes in every export.
pub const MAX_ATTRIBUTE_LEN: usize = 4096;
/// Most span events (approvals, questions, retries, delegations) kept on
/// one span; the rest are counted in `dropped_events_count`.
pub const MAX_EVENTS_PER_SPAN: usize = 128;
/// Most spans one run gives; the rest are counted in the run span's
/// `cairn.spans_dropped`. Bounds the memory of an export whatever the log.
pub const MAX_SPANS_PER_RUN: usize = 100_000;

/// Where a run sits in its tree of runs: which trace it belongs to and
/// which span is its run span's parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    /// The id of the tree's first run: it names the trace.
    pub root_run_id: RunId,
    /// The span the run span hangs from; `None` for a root run.
    pub parent: Option<ParentSpan>,
}

impl Lineage {
    /// The lineage of a run that has no parent.
    pub fn root(run_id: &RunId) -> Lineage {
        Lineage {
            root_run_id: run_id.clone(),
            parent: None,
        }
    }

    /// The parent's span id, empty for a root run (as OTLP wants it).
    fn parent_span_id(&self) -> Vec<u8> {
        let root = self.root_run_id.as_str();
        match &self.parent {
            None => Vec::new(),
            Some(ParentSpan::Run { run_id }) => span_id(root, &SpanKey::Run { run_id }).to_vec(),
            Some(ParentSpan::Attempt {
                run_id,
                node_id,
                iteration,
                attempt,
            }) => span_id(
                root,
                &SpanKey::Attempt {
                    run_id,
                    node_id,
                    iteration: *iteration,
                    attempt: *attempt,
                },
            )
            .to_vec(),
        }
    }
}

/// The span a child run's span hangs from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentSpan {
    /// The parent's node attempt that started the child (its
    /// `DelegationStarted` names the child).
    Attempt {
        /// The parent run.
        run_id: RunId,
        /// The node instance that delegated.
        node_id: String,
        /// Its loop pass.
        iteration: u32,
        /// Its attempt.
        attempt: u32,
    },
    /// The parent run itself, when its log does not say which attempt
    /// started the child.
    Run {
        /// The parent run.
        run_id: RunId,
    },
}

/// The spans of a run's whole log (every session), with the trace and
/// parent its lineage gives.
///
/// ```
/// use cairn_events::{Event, EventKind, RunId, Scope, Seq};
/// use cairn_otel::{build_spans, Lineage};
/// let ev = |seq, ts, kind| Event { run_id: RunId::parse("r").unwrap(), seq: Seq(seq), timestamp_ms: ts, scope: Scope::run(), kind };
/// let log = vec![
///     ev(1, 1_000, EventKind::RunStarted { workflow: "w".into(), workflow_hash: "h".into(), input: None,
///         resumed: false, parent_run_id: None, parent_node_id: None, depth: 0, forked_from: None, trigger: None,
///         replay_of: None }),
///     ev(2, 1_500, EventKind::RunFinished { output: None, duration_ms: 500 }),
/// ];
/// let spans = build_spans(&log, &Lineage::root(&RunId::parse("r").unwrap()));
/// assert_eq!(spans.len(), 1);
/// assert_eq!(spans[0].name, "run w");
/// assert_eq!(spans[0].end_time_unix_nano - spans[0].start_time_unix_nano, 500_000_000);
/// ```
pub fn build_spans<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    lineage: &Lineage,
) -> Vec<Span> {
    let mut b = TraceBuilder::new(lineage.clone());
    for ev in events {
        b.push(ev);
    }
    b.finish()
}

/// Which kind of span an accumulator builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Run,
    Attempt,
    Model,
    Tool,
}

/// Token usage added up over model calls.
#[derive(Debug, Default)]
struct Usage {
    calls: u64,
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    reasoning: u64,
    cost_usd: Option<f64>,
    provider: Option<String>,
    model: Option<String>,
}

impl Usage {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        provider: &str,
        model: &str,
        input: u64,
        output: u64,
        cache_read: Option<u64>,
        cache_write: Option<u64>,
        reasoning: Option<u64>,
        cost_usd: Option<f64>,
    ) {
        self.calls += 1;
        self.input = self.input.saturating_add(input);
        self.output = self.output.saturating_add(output);
        self.cache_read = self.cache_read.saturating_add(cache_read.unwrap_or(0));
        self.cache_write = self.cache_write.saturating_add(cache_write.unwrap_or(0));
        self.reasoning = self.reasoning.saturating_add(reasoning.unwrap_or(0));
        if let Some(c) = cost_usd.filter(|c| c.is_finite()) {
            *self.cost_usd.get_or_insert(0.0) += c;
        }
        if !provider.is_empty() {
            self.provider = Some(provider.to_string());
        }
        if !model.is_empty() {
            self.model = Some(model.to_string());
        }
    }

    /// Adds another sum of model calls to this one.
    fn merge(&mut self, other: &Usage) {
        self.calls += other.calls;
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
        if let Some(c) = other.cost_usd {
            *self.cost_usd.get_or_insert(0.0) += c;
        }
        if other.provider.is_some() {
            self.provider.clone_from(&other.provider);
        }
        if other.model.is_some() {
            self.model.clone_from(&other.model);
        }
    }

    /// The GenAI semantic conventions' names, for a model call's span.
    fn gen_ai_attributes(&self, out: &mut Vec<KeyValue>) {
        if self.calls == 0 {
            return;
        }
        if let Some(p) = &self.provider {
            set(out, kv_str("gen_ai.provider.name", p));
        }
        if let Some(m) = &self.model {
            set(out, kv_str("gen_ai.response.model", m));
        }
        set(out, kv_u64("gen_ai.usage.input_tokens", self.input));
        set(out, kv_u64("gen_ai.usage.output_tokens", self.output));
        set(
            out,
            kv_u64("gen_ai.usage.cache_read.input_tokens", self.cache_read),
        );
        set(
            out,
            kv_u64("gen_ai.usage.cache_creation.input_tokens", self.cache_write),
        );
        set(out, kv_u64("cairn.usage.reasoning_tokens", self.reasoning));
        if let Some(c) = self.cost_usd {
            set(out, kv_f64("cairn.cost_usd", c));
        }
    }

    /// Cairn's own names, for totals on attempt and run spans: backends
    /// that add up `gen_ai.usage.*` over a trace would count them twice.
    fn total_attributes(&self, out: &mut Vec<KeyValue>) {
        if self.calls == 0 {
            return;
        }
        set(out, kv_u64("cairn.usage.model_calls", self.calls));
        set(out, kv_u64("cairn.usage.input_tokens", self.input));
        set(out, kv_u64("cairn.usage.output_tokens", self.output));
        set(
            out,
            kv_u64("cairn.usage.cache_read_tokens", self.cache_read),
        );
        set(
            out,
            kv_u64("cairn.usage.cache_write_tokens", self.cache_write),
        );
        set(out, kv_u64("cairn.usage.reasoning_tokens", self.reasoning));
        if let Some(c) = self.cost_usd {
            set(out, kv_f64("cairn.cost_usd", c));
        }
    }
}

/// One span being built.
#[derive(Debug)]
struct Acc {
    level: Level,
    id: [u8; 8],
    /// For an attempt's span, which attempt it is.
    attempt_key: Option<AttemptKey>,
    /// Index of the parent accumulator; `None` for the run span.
    parent: Option<usize>,
    name: String,
    kind: span::SpanKind,
    start_ms: i64,
    end_ms: Option<i64>,
    /// The latest event that concerned this span.
    last_ms: i64,
    attrs: Vec<KeyValue>,
    usage: Usage,
    events: Vec<span::Event>,
    dropped_events: u32,
    status: Option<(status::StatusCode, String)>,
}

impl Acc {
    fn new(level: Level, id: [u8; 8], parent: Option<usize>, name: String, ts: i64) -> Acc {
        Acc {
            level,
            id,
            attempt_key: None,
            parent,
            name: cap(&name),
            kind: match level {
                Level::Model => span::SpanKind::Client,
                _ => span::SpanKind::Internal,
            },
            start_ms: ts,
            end_ms: None,
            last_ms: ts,
            attrs: Vec::new(),
            usage: Usage::default(),
            events: Vec::new(),
            dropped_events: 0,
            status: None,
        }
    }

    fn event(&mut self, ts: i64, name: &str, attributes: Vec<KeyValue>) {
        if self.events.len() >= MAX_EVENTS_PER_SPAN {
            self.dropped_events = self.dropped_events.saturating_add(1);
            return;
        }
        self.events.push(span::Event {
            time_unix_nano: nanos(ts),
            name: name.to_string(),
            attributes,
            dropped_attributes_count: 0,
        });
    }

    fn fail(&mut self, error: &ErrorInfo) {
        set(&mut self.attrs, kv_str("cairn.error.kind", &error.kind));
        set(
            &mut self.attrs,
            kv_str("cairn.error.message", &error.message),
        );
        self.status = Some((
            status::StatusCode::Error,
            cap(&format!("{}: {}", error.kind, error.message)),
        ));
    }
}

/// (node path, loop pass, attempt).
type AttemptKey = (String, u32, u32);

/// Folds a run's events, one at a time, into its spans (see [`build_spans`]).
/// Memory grows with the spans, never with the events' payloads.
#[derive(Debug)]
pub struct TraceBuilder {
    lineage: Lineage,
    trace_id: [u8; 16],
    run_id: Option<RunId>,
    /// Index 0 is the run span once the first event came.
    accs: Vec<Acc>,
    attempts: HashMap<AttemptKey, usize>,
    /// The latest attempt of each (node, pass): where node-scoped events
    /// (approvals, questions) go.
    latest: HashMap<(String, u32), usize>,
    /// The latest attempt of each node path, whatever its pass: a node
    /// inside a group hangs from the group's attempt, which runs while the
    /// node does.
    by_path: HashMap<String, usize>,
    steps: HashMap<(usize, u32), usize>,
    /// The model call an attempt is in (`AgentStepStarted` without its
    /// `AgentStepFinished` yet): its usage reports belong to it.
    open_step: HashMap<usize, usize>,
    tools: HashMap<(usize, u32), usize>,
    retry_delay: HashMap<(String, u32), u64>,
    /// The attempt that first delegated to each child run, by the child's id.
    delegations: HashMap<RunId, AttemptKey>,
    run_status: Option<String>,
    sessions: u64,
    dropped_spans: u64,
    foreign_events: u64,
    unreadable_events: u64,
}

impl TraceBuilder {
    /// A builder for one run whose place in its tree is `lineage`.
    pub fn new(lineage: Lineage) -> TraceBuilder {
        TraceBuilder {
            trace_id: trace_id(&lineage.root_run_id),
            lineage,
            run_id: None,
            accs: Vec::new(),
            attempts: HashMap::new(),
            latest: HashMap::new(),
            by_path: HashMap::new(),
            steps: HashMap::new(),
            open_step: HashMap::new(),
            tools: HashMap::new(),
            retry_delay: HashMap::new(),
            delegations: HashMap::new(),
            run_status: None,
            sessions: 0,
            dropped_spans: 0,
            foreign_events: 0,
            unreadable_events: 0,
        }
    }

    /// Counts a stored event that could not be read back, so the run span
    /// says its picture is partial (`cairn.events_unreadable`).
    pub fn skip_unreadable(&mut self) {
        self.unreadable_events += 1;
    }

    /// The run's id as span keys carry it; empty before the first event.
    fn run_id_text(&self) -> &str {
        self.run_id.as_ref().map_or("", RunId::as_str)
    }

    /// The lineage of a child run of this one, from the `DelegationStarted`
    /// that named it (or this run's span, when none did).
    pub fn child_lineage(&self, child_run_id: &RunId) -> Lineage {
        // A builder that has seen no event has no run of its own: the
        // child hangs from the root's run span.
        let run_id = self
            .run_id
            .clone()
            .unwrap_or_else(|| self.lineage.root_run_id.clone());
        Lineage {
            root_run_id: self.lineage.root_run_id.clone(),
            parent: Some(match self.delegations.get(child_run_id) {
                Some((node_id, iteration, attempt)) => ParentSpan::Attempt {
                    run_id,
                    node_id: node_id.clone(),
                    iteration: *iteration,
                    attempt: *attempt,
                },
                None => ParentSpan::Run { run_id },
            }),
        }
    }

    fn root(&self) -> &str {
        &self.lineage.root_run_id
    }

    /// Adds a span unless the run already has its fill of them. `starts`:
    /// the event is the span's first (`NodeStarted`, ...), the one that
    /// counts a dropped span once, whatever else the log says of it.
    fn add(&mut self, acc: Acc, starts: bool) -> Option<usize> {
        if self.accs.len() >= MAX_SPANS_PER_RUN {
            if starts {
                self.dropped_spans += 1;
            }
            return None;
        }
        self.accs.push(acc);
        Some(self.accs.len() - 1)
    }

    /// The attempt an attempt-scoped event belongs to, made when the log
    /// lacks its `NodeStarted` and `create` says so.
    fn attempt_of(&mut self, ev: &Event, create: bool) -> Option<usize> {
        let node = ev.scope.node_id.as_deref()?;
        let iteration = ev.scope.iteration.unwrap_or(0);
        let attempt = ev.scope.attempt?;
        let key = (node.to_string(), iteration, attempt);
        if let Some(&i) = self.attempts.get(&key) {
            return Some(i);
        }
        if !create {
            return None;
        }
        let run_id = self.run_id_text().to_string();
        let id = span_id(
            self.root(),
            &SpanKey::Attempt {
                run_id: &run_id,
                node_id: node,
                iteration,
                attempt,
            },
        );
        let parent = enclosing_group(node)
            .and_then(|g| self.by_path.get(g).copied())
            .unwrap_or(0);
        let mut acc = Acc::new(
            Level::Attempt,
            id,
            Some(parent),
            format!("node {node}"),
            ev.timestamp_ms,
        );
        acc.attrs = vec![
            kv_str("cairn.run.id", &run_id),
            kv_str("cairn.node.id", node),
            kv_u64("cairn.node.iteration", iteration.into()),
            kv_u64("cairn.node.attempt", attempt.into()),
        ];
        if let Some(chapter) = &ev.scope.chapter {
            acc.attrs.push(kv_str("cairn.node.chapter", chapter));
        }
        if let Some(delay) = self.retry_delay.remove(&(node.to_string(), iteration)) {
            acc.attrs.push(kv_u64("cairn.node.retry_delay_ms", delay));
        }
        acc.attempt_key = Some(key.clone());
        let starts = matches!(ev.kind, EventKind::NodeStarted { .. });
        let i = self.add(acc, starts)?;
        self.attempts.insert(key, i);
        self.latest.insert((node.to_string(), iteration), i);
        self.by_path.insert(node.to_string(), i);
        Some(i)
    }

    /// Where a node-scoped event (an approval, a question) is shown: its
    /// attempt, else the node's latest attempt while it is open, else the
    /// run.
    fn node_target(&mut self, ev: &Event) -> usize {
        if let Some(i) = self.attempt_of(ev, false) {
            return i;
        }
        let Some((node, iteration)) = ev.node_key() else {
            return 0;
        };
        match self.latest.get(&(node.to_string(), iteration)) {
            Some(&i) if self.accs[i].end_ms.is_none() => i,
            _ => 0,
        }
    }

    /// A model call's or tool call's span under attempt `a`, made at `ts`.
    fn child_span(
        &mut self,
        level: Level,
        a: usize,
        number: u32,
        name: String,
        ts: i64,
        starts: bool,
    ) -> Option<usize> {
        let (node, iteration, attempt) = self.accs[a].attempt_key.clone()?;
        let run_id = self.run_id_text().to_string();
        let key = match level {
            Level::Model => SpanKey::ModelCall {
                run_id: &run_id,
                node_id: &node,
                iteration,
                attempt,
                step: number,
            },
            _ => SpanKey::ToolCall {
                run_id: &run_id,
                node_id: &node,
                iteration,
                attempt,
                tool_seq: number,
            },
        };
        let id = span_id(self.root(), &key);
        let mut acc = Acc::new(level, id, Some(a), name, ts);
        acc.attrs = vec![
            kv_str("cairn.run.id", &run_id),
            kv_str("cairn.node.id", &node),
            kv_u64("cairn.node.iteration", iteration.into()),
            kv_u64("cairn.node.attempt", attempt.into()),
        ];
        self.add(acc, starts)
    }

    fn model_call(
        &mut self,
        a: usize,
        step: u32,
        model: &str,
        ts: i64,
        starts: bool,
    ) -> Option<usize> {
        if let Some(&m) = self.steps.get(&(a, step)) {
            return Some(m);
        }
        let name = if model.is_empty() {
            "chat".to_string()
        } else {
            format!("chat {model}")
        };
        let m = self.child_span(Level::Model, a, step, name, ts, starts)?;
        let attrs = &mut self.accs[m].attrs;
        attrs.push(kv_str("gen_ai.operation.name", "chat"));
        if !model.is_empty() {
            attrs.push(kv_str("gen_ai.request.model", model));
        }
        attrs.push(kv_u64("cairn.agent.step", step.into()));
        self.steps.insert((a, step), m);
        Some(m)
    }

    fn tool_call(
        &mut self,
        a: usize,
        seq: u32,
        tool: &str,
        ts: i64,
        starts: bool,
    ) -> Option<usize> {
        if let Some(&t) = self.tools.get(&(a, seq)) {
            return Some(t);
        }
        let name = format!("execute_tool {tool}");
        let t = self.child_span(Level::Tool, a, seq, name, ts, starts)?;
        let attrs = &mut self.accs[t].attrs;
        attrs.push(kv_str("gen_ai.operation.name", "execute_tool"));
        attrs.push(kv_str("gen_ai.tool.name", tool));
        attrs.push(kv_u64("cairn.tool.seq", seq.into()));
        self.tools.insert((a, seq), t);
        Some(t)
    }

    /// Folds one event in. Events of another run than the first one seen
    /// are ignored (and counted).
    pub fn push(&mut self, ev: &Event) {
        match &self.run_id {
            None => self.run_id = Some(ev.run_id.clone()),
            Some(r) if *r != ev.run_id => {
                self.foreign_events += 1;
                return;
            }
            Some(_) => {}
        }
        let ts = ev.timestamp_ms;
        if self.accs.is_empty() {
            let run_id = ev.run_id.clone();
            let id = span_id(self.root(), &SpanKey::Run { run_id: &run_id });
            let mut acc = Acc::new(Level::Run, id, None, "run".into(), ts);
            acc.attrs.push(kv_str("cairn.run.id", &run_id));
            self.accs.push(acc);
        }
        {
            let run = &mut self.accs[0];
            run.last_ms = run.last_ms.max(ts);
        }
        self.fold(ev);
        // Every event of an attempt moves its "last seen", which is where
        // an interrupted attempt is taken to have stopped. After the fold:
        // the event that closes an interrupted attempt must not count.
        if let Some(a) = self.attempt_of(ev, false) {
            let acc = &mut self.accs[a];
            if acc.end_ms.is_none() {
                acc.last_ms = acc.last_ms.max(ts);
            }
        }
    }

    /// What one event does to the spans. Every event type has its arm: a
    /// new type does not compile until it says what a trace shows of it.
    fn fold(&mut self, ev: &Event) {
        use EventKind as K;
        let ts = ev.timestamp_ms;
        match &ev.kind {
            // The run span.
            K::RunStarted {
                workflow,
                workflow_hash,
                resumed,
                parent_run_id,
                parent_node_id,
                depth,
                ..
            } => {
                self.session_started(ts, *resumed);
                if self.sessions == 1 {
                    let parent = (parent_run_id.as_deref(), parent_node_id.as_deref());
                    self.run_attributes(workflow, workflow_hash, *depth, parent);
                }
            }
            K::RunStatusChanged { status } => self.run_status = Some(status.as_str().into()),
            K::RunCancelRequested {
                reason,
                requested_by,
                mechanism,
            } => self.cancel_requested(ts, reason, requested_by, *mechanism),
            K::RunSummary { nodes, .. } => {
                let attrs = &mut self.accs[0].attrs;
                let counts = [
                    ("finished", nodes.finished),
                    ("failed", nodes.failed),
                    ("skipped", nodes.skipped),
                    ("cancelled", nodes.cancelled),
                ];
                for (status, n) in counts {
                    set(attrs, kv_u64(&format!("cairn.run.nodes.{status}"), n));
                }
            }
            K::RunFinished { duration_ms, .. } => {
                let run = self.run_ended(ts, "finished");
                run.status = Some((status::StatusCode::Ok, String::new()));
                set(&mut run.attrs, kv_u64("cairn.duration_ms", *duration_ms));
            }
            K::RunFailed { error } => self.run_ended(ts, "failed").fail(error),
            K::RunCancelled { reason } => {
                let run = self.run_ended(ts, "cancelled");
                if let Some(r) = reason {
                    set(&mut run.attrs, kv_str("cairn.cancel.reason", r));
                }
            }
            // Attempt spans.
            K::NodeStarted { .. } => _ = self.attempt_of(ev, true),
            K::NodeFinished {
                duration_ms,
                cached,
                ..
            } => self.node_finished(ev, *duration_ms, *cached),
            K::NodeFailed {
                error, will_retry, ..
            } => self.node_failed(ev, error, *will_retry),
            K::NodeCancelled { reason } => self.node_cancelled(ev, reason),
            K::NodeRetrying { delay_ms } => {
                if let Some((node, iteration)) = ev.node_key() {
                    self.retry_delay
                        .insert((node.to_string(), iteration), *delay_ms);
                }
            }
            // Span events of gates and questions.
            K::ApprovalRequested { message } => {
                let attrs = message
                    .iter()
                    .map(|m| kv_str("cairn.approval.message", m))
                    .collect();
                self.node_event(ev, "approval requested", attrs);
            }
            K::ApprovalGranted { decided_by, note } => {
                self.decided(ev, "approval granted", decided_by, note)
            }
            K::ApprovalDenied { decided_by, note } => {
                self.decided(ev, "approval denied", decided_by, note)
            }
            K::InputRequested {
                request_id, prompt, ..
            } => {
                let attrs = vec![
                    kv_str("cairn.input.request_id", request_id),
                    kv_str("cairn.input.prompt", prompt),
                ];
                self.node_event(ev, "input requested", attrs);
            }
            // The answer itself stays in the log: it may be anything a
            // person typed.
            K::InputReceived {
                request_id,
                answered_by,
                ..
            } => {
                let by = answered_by.iter();
                let attrs = std::iter::once(kv_str("cairn.input.request_id", request_id))
                    .chain(by.map(|b| kv_str("cairn.input.answered_by", b)))
                    .collect();
                self.node_event(ev, "input received", attrs);
            }
            // Model calls and tool calls.
            K::AgentStepStarted { step, model, .. } => self.step_started(ev, *step, model),
            K::AgentStepFinished {
                step,
                tool_calls,
                finish_reason,
                ..
            } => self.step_finished(ev, *step, *tool_calls, finish_reason),
            K::AgentGenerationRetried { step, reason } => {
                self.generation_retried(ev, *step, reason)
            }
            K::AgentContextCompacted {
                step,
                strategy,
                tokens_before,
                tokens_after,
                ..
            } => self.step_note(
                ev,
                *step,
                "context compacted",
                vec![
                    kv_str("cairn.compaction.strategy", strategy),
                    kv_u64("cairn.compaction.tokens_before", *tokens_before),
                    kv_u64("cairn.compaction.tokens_after", *tokens_after),
                ],
            ),
            K::AgentWaiting {
                step,
                reason,
                wait_ms,
                ..
            } => {
                let mut attrs = vec![kv_str("cairn.wait.reason", reason)];
                if let Some(ms) = wait_ms {
                    attrs.push(kv_u64("cairn.wait.ms", *ms));
                }
                self.step_note(ev, *step, "waiting for the model's limits", attrs)
            }
            K::TokenUsageReported {
                provider,
                model,
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cache_write_tokens,
                reasoning_tokens,
                cost_usd,
            } => {
                let mut used = Usage::default();
                used.add(
                    provider,
                    model,
                    *input_tokens,
                    *output_tokens,
                    *cache_read_tokens,
                    *cache_write_tokens,
                    *reasoning_tokens,
                    *cost_usd,
                );
                self.token_usage(ev, &used);
            }
            K::ToolCallStarted {
                tool_name,
                tool_seq,
                idempotency_key,
                side_effect,
            } => self.tool_started(ev, tool_name, *tool_seq, idempotency_key, *side_effect),
            K::ToolCallFinished {
                tool_name,
                tool_seq,
                status,
                duration_ms,
                error,
            } => {
                let end = (*status, *duration_ms, error.as_ref());
                self.tool_finished(ev, tool_name, *tool_seq, end);
            }
            // Child runs.
            K::DelegationStarted {
                child_run_id,
                agent,
                workflow,
            } => self.delegation_started(ev, child_run_id, agent, workflow),
            K::DelegationFinished {
                child_run_id,
                status,
            } => {
                let attrs = vec![
                    kv_str("cairn.child.run_id", child_run_id),
                    kv_str("cairn.child.status", status),
                ];
                self.attempt_event(ev, "delegation finished", attrs);
            }
            // Not in a trace: the plan's bookkeeping, streams, the
            // runtime's own news, the workspace, reloads and scoring.
            K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeSkipped { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::AgentEvent { .. }
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
}

/// The run span: its sessions, its cancel, its end.
impl TraceBuilder {
    /// A `RunStarted`: a run taken up again after it ended is going again.
    fn session_started(&mut self, ts: i64, resumed: bool) {
        self.sessions += 1;
        let run = &mut self.accs[0];
        if resumed || self.sessions > 1 {
            run.event(
                ts,
                "run resumed",
                vec![kv_u64("cairn.run.session", self.sessions)],
            );
        }
        run.end_ms = None;
        run.status = None;
        self.run_status = Some("running".into());
    }

    /// The first session's `RunStarted` names the run span; `parent`: the
    /// parent run and node of a child.
    fn run_attributes(
        &mut self,
        workflow: &str,
        workflow_hash: &str,
        depth: u32,
        parent: (Option<&str>, Option<&str>),
    ) {
        let run = &mut self.accs[0];
        run.name = cap(&format!("run {workflow}"));
        run.attrs.push(kv_str("cairn.workflow", workflow));
        run.attrs.push(kv_str("cairn.workflow.hash", workflow_hash));
        run.attrs.push(kv_u64("cairn.run.depth", depth.into()));
        if let Some(p) = parent.0 {
            run.attrs.push(kv_str("cairn.run.parent_id", p));
        }
        if let Some(n) = parent.1 {
            run.attrs.push(kv_str("cairn.run.parent_node_id", n));
        }
    }

    fn cancel_requested(
        &mut self,
        ts: i64,
        reason: &Option<String>,
        requested_by: &Option<String>,
        mechanism: CancelMechanism,
    ) {
        let mut attrs = vec![kv_str(
            "cairn.cancel.mechanism",
            match mechanism {
                CancelMechanism::Immediate => "immediate",
                CancelMechanism::Graceful => "graceful",
            },
        )];
        if let Some(r) = reason {
            attrs.push(kv_str("cairn.cancel.reason", r));
        }
        if let Some(b) = requested_by {
            attrs.push(kv_str("cairn.cancel.requested_by", b));
        }
        self.accs[0].event(ts, "cancel requested", attrs);
    }

    /// A terminal event ends the run span at `ts` with `status`.
    fn run_ended(&mut self, ts: i64, status: &str) -> &mut Acc {
        self.run_status = Some(status.into());
        let run = &mut self.accs[0];
        run.end_ms = Some(ts);
        run
    }
}

/// Attempt spans, and the span events of gates and questions on them.
impl TraceBuilder {
    fn node_finished(&mut self, ev: &Event, duration_ms: u64, cached: Option<bool>) {
        let Some(a) = self.attempt_of(ev, true) else {
            return;
        };
        let acc = &mut self.accs[a];
        acc.end_ms = Some(ev.timestamp_ms);
        acc.status = Some((status::StatusCode::Ok, String::new()));
        set(&mut acc.attrs, kv_str("cairn.node.status", "finished"));
        set(&mut acc.attrs, kv_u64("cairn.duration_ms", duration_ms));
        if let Some(c) = cached {
            set(&mut acc.attrs, kv_bool("cairn.node.cached", c));
        }
    }

    fn node_failed(&mut self, ev: &Event, error: &ErrorInfo, will_retry: bool) {
        let Some(a) = self.attempt_of(ev, true) else {
            return;
        };
        let acc = &mut self.accs[a];
        // A crash is closed by the resume that found it: the attempt
        // really stopped at its last event, not when someone came back.
        if error.kind == "interrupted" {
            acc.end_ms = Some(acc.last_ms);
            set(&mut acc.attrs, kv_bool("cairn.node.interrupted", true));
        } else {
            acc.end_ms = Some(ev.timestamp_ms);
        }
        acc.fail(error);
        set(&mut acc.attrs, kv_str("cairn.node.status", "failed"));
        set(&mut acc.attrs, kv_bool("cairn.will_retry", will_retry));
    }

    fn node_cancelled(&mut self, ev: &Event, reason: &Option<String>) {
        // Without an attempt it ends a node that never started, and
        // `attempt_of` finds nothing.
        let Some(a) = self.attempt_of(ev, true) else {
            return;
        };
        let acc = &mut self.accs[a];
        acc.end_ms = Some(ev.timestamp_ms);
        set(&mut acc.attrs, kv_str("cairn.node.status", "cancelled"));
        if let Some(r) = reason {
            set(&mut acc.attrs, kv_str("cairn.cancel.reason", r));
        }
    }

    /// A span event where a node-scoped event is shown ([`Self::node_target`]).
    fn node_event(&mut self, ev: &Event, name: &str, attrs: Vec<KeyValue>) {
        let t = self.node_target(ev);
        self.accs[t].event(ev.timestamp_ms, name, attrs);
    }

    /// `ApprovalGranted` or `ApprovalDenied` (`name` says which).
    fn decided(
        &mut self,
        ev: &Event,
        name: &str,
        decided_by: &Option<String>,
        note: &Option<String>,
    ) {
        let mut attrs = Vec::new();
        if let Some(b) = decided_by {
            attrs.push(kv_str("cairn.approval.decided_by", b));
        }
        if let Some(n) = note {
            attrs.push(kv_str("cairn.approval.note", n));
        }
        self.node_event(ev, name, attrs);
    }

    /// The first attempt that named the child started it; a later one
    /// that took up an interrupted call only waits.
    fn delegation_started(
        &mut self,
        ev: &Event,
        child_run_id: &RunId,
        agent: &str,
        workflow: &str,
    ) {
        if self.delegations.len() < MAX_SPANS_PER_RUN {
            if let (Some((node, iteration)), Some(attempt)) = (ev.node_key(), ev.scope.attempt) {
                self.delegations
                    .entry(child_run_id.clone())
                    .or_insert_with(|| (node.to_string(), iteration, attempt));
            }
        }
        let attrs = vec![
            kv_str("cairn.child.run_id", child_run_id),
            kv_str("cairn.child.agent", agent),
            kv_str("cairn.child.workflow", workflow),
        ];
        self.attempt_event(ev, "delegation started", attrs);
    }

    /// A span event on the attempt an event is of (made if the log lacks
    /// its start).
    fn attempt_event(&mut self, ev: &Event, name: &str, attrs: Vec<KeyValue>) {
        if let Some(a) = self.attempt_of(ev, true) {
            self.accs[a].event(ev.timestamp_ms, name, attrs);
        }
    }
}

/// Model calls' and tool calls' spans.
impl TraceBuilder {
    fn step_started(&mut self, ev: &Event, step: u32, model: &str) {
        if let Some(a) = self.attempt_of(ev, true) {
            if let Some(m) = self.model_call(a, step, model, ev.timestamp_ms, true) {
                self.open_step.insert(a, m);
            }
        }
    }

    fn step_finished(&mut self, ev: &Event, step: u32, tool_calls: u32, finish_reason: &str) {
        let ts = ev.timestamp_ms;
        let Some(a) = self.attempt_of(ev, true) else {
            return;
        };
        let Some(m) = self.model_call(a, step, "", ts, false) else {
            return;
        };
        let acc = &mut self.accs[m];
        acc.end_ms = Some(ts);
        acc.status = Some((status::StatusCode::Ok, String::new()));
        if !finish_reason.is_empty() {
            set(
                &mut acc.attrs,
                kv_strs("gen_ai.response.finish_reasons", &[finish_reason]),
            );
        }
        set(
            &mut acc.attrs,
            kv_u64("cairn.agent.tool_calls", tool_calls.into()),
        );
        if self.open_step.get(&a) == Some(&m) {
            self.open_step.remove(&a);
        }
    }

    fn generation_retried(&mut self, ev: &Event, step: u32, reason: &str) {
        let attrs = vec![kv_str("cairn.retry.reason", reason)];
        self.step_note(ev, step, "generation retried", attrs);
    }

    /// A span event on a model call's span, or its attempt's when the call
    /// has not started yet (a compaction comes before its step).
    fn step_note(&mut self, ev: &Event, step: u32, name: &str, mut attrs: Vec<KeyValue>) {
        if let Some(a) = self.attempt_of(ev, true) {
            let t = self.steps.get(&(a, step)).copied().unwrap_or(a);
            attrs.insert(0, kv_u64("cairn.agent.step", step.into()));
            self.accs[t].event(ev.timestamp_ms, name, attrs);
        }
    }

    /// One model call's usage, added to the run's, its attempt's and the
    /// model call it is in.
    fn token_usage(&mut self, ev: &Event, used: &Usage) {
        self.accs[0].usage.merge(used);
        if let Some(a) = self.attempt_of(ev, true) {
            self.accs[a].usage.merge(used);
            if let Some(&m) = self.open_step.get(&a) {
                self.accs[m].usage.merge(used);
            }
        }
    }

    fn tool_started(
        &mut self,
        ev: &Event,
        tool_name: &str,
        tool_seq: u32,
        idempotency_key: &str,
        side_effect: bool,
    ) {
        let Some(a) = self.attempt_of(ev, true) else {
            return;
        };
        if let Some(t) = self.tool_call(a, tool_seq, tool_name, ev.timestamp_ms, true) {
            let attrs = &mut self.accs[t].attrs;
            set(attrs, kv_str("cairn.tool.idempotency_key", idempotency_key));
            set(attrs, kv_bool("cairn.tool.side_effect", side_effect));
        }
    }

    /// `end`: how the call ended, how long it took, and its error.
    fn tool_finished(
        &mut self,
        ev: &Event,
        tool_name: &str,
        tool_seq: u32,
        end: (ToolStatus, u64, Option<&ErrorInfo>),
    ) {
        let (outcome, duration_ms, error) = end;
        let ts = ev.timestamp_ms;
        let Some(a) = self.attempt_of(ev, true) else {
            return;
        };
        let Some(t) = self.tool_call(a, tool_seq, tool_name, ts, false) else {
            return;
        };
        let acc = &mut self.accs[t];
        acc.end_ms = Some(ts);
        set(&mut acc.attrs, kv_u64("cairn.duration_ms", duration_ms));
        match outcome {
            ToolStatus::Success => {
                set(&mut acc.attrs, kv_str("cairn.tool.status", "success"));
                acc.status = Some((status::StatusCode::Ok, String::new()));
            }
            ToolStatus::Error => {
                set(&mut acc.attrs, kv_str("cairn.tool.status", "error"));
                match error {
                    Some(e) => acc.fail(e),
                    None => {
                        acc.status =
                            Some((status::StatusCode::Error, "the tool call failed".into()))
                    }
                }
            }
        }
    }
}

impl TraceBuilder {
    /// The spans, the run span first, then the others in the order they
    /// began in the log.
    pub fn finish(mut self) -> Vec<Span> {
        if self.accs.is_empty() {
            return Vec::new();
        }
        let parent_of_run = self.lineage.parent_span_id();
        // Parents are always made before their children, so one pass in
        // order knows every parent's end before its children's.
        let mut ends: Vec<i64> = Vec::with_capacity(self.accs.len());
        for acc in &self.accs {
            let fallback = match acc.parent {
                None => acc.last_ms,
                Some(p) => ends[p],
            };
            ends.push(acc.end_ms.unwrap_or(fallback).max(acc.start_ms));
        }
        let run_status = self
            .run_status
            .clone()
            .unwrap_or_else(|| "running".to_string());
        let mut spans = Vec::with_capacity(self.accs.len());
        let ids: Vec<[u8; 8]> = self.accs.iter().map(|a| a.id).collect();
        for (i, mut acc) in self.accs.drain(..).enumerate() {
            match acc.level {
                Level::Run => {
                    set(&mut acc.attrs, kv_str("cairn.run.status", &run_status));
                    set(&mut acc.attrs, kv_u64("cairn.run.sessions", self.sessions));
                    acc.usage.total_attributes(&mut acc.attrs);
                    if self.dropped_spans > 0 {
                        set(
                            &mut acc.attrs,
                            kv_u64("cairn.spans_dropped", self.dropped_spans),
                        );
                    }
                    if self.unreadable_events > 0 {
                        set(
                            &mut acc.attrs,
                            kv_u64("cairn.events_unreadable", self.unreadable_events),
                        );
                    }
                    if self.foreign_events > 0 {
                        set(
                            &mut acc.attrs,
                            kv_u64("cairn.events_ignored", self.foreign_events),
                        );
                    }
                }
                Level::Attempt => {
                    if acc.end_ms.is_none() {
                        set(&mut acc.attrs, kv_str("cairn.node.status", "running"));
                    }
                    acc.usage.total_attributes(&mut acc.attrs);
                }
                Level::Model => acc.usage.gen_ai_attributes(&mut acc.attrs),
                Level::Tool => {}
            }
            if acc.end_ms.is_none() {
                set(&mut acc.attrs, kv_bool("cairn.incomplete", true));
            }
            spans.push(Span {
                trace_id: self.trace_id.to_vec(),
                span_id: acc.id.to_vec(),
                parent_span_id: match acc.parent {
                    None => parent_of_run.clone(),
                    Some(p) => ids[p].to_vec(),
                },
                name: acc.name,
                kind: acc.kind as i32,
                start_time_unix_nano: nanos(acc.start_ms),
                end_time_unix_nano: nanos(ends[i]),
                attributes: acc.attrs,
                events: acc.events,
                dropped_events_count: acc.dropped_events,
                status: acc.status.map(|(code, message)| Status {
                    message,
                    code: code as i32,
                }),
                ..Default::default()
            });
        }
        spans
    }
}

/// Unix milliseconds as OTLP's nanoseconds (a time before 1970 is 0).
fn nanos(ms: i64) -> u64 {
    (ms.max(0) as u64).saturating_mul(1_000_000)
}

/// At most [`MAX_ATTRIBUTE_LEN`] bytes of `s`, cut at a character boundary.
fn cap(s: &str) -> String {
    if s.len() <= MAX_ATTRIBUTE_LEN {
        return s.to_string();
    }
    let mut end = MAX_ATTRIBUTE_LEN - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Replaces the attribute with the same key, or adds it.
fn set(attrs: &mut Vec<KeyValue>, kv: KeyValue) {
    match attrs.iter_mut().find(|a| a.key == kv.key) {
        Some(a) => *a = kv,
        None => attrs.push(kv),
    }
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn kv_str(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(cap(value)))
}

fn kv_u64(key: &str, value: u64) -> KeyValue {
    kv(
        key,
        any_value::Value::IntValue(i64::try_from(value).unwrap_or(i64::MAX)),
    )
}

fn kv_f64(key: &str, value: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(value))
}

fn kv_bool(key: &str, value: bool) -> KeyValue {
    kv(key, any_value::Value::BoolValue(value))
}

fn kv_strs(key: &str, values: &[&str]) -> KeyValue {
    let values = values
        .iter()
        .map(|v| AnyValue {
            value: Some(any_value::Value::StringValue(cap(v))),
        })
        .collect();
    kv(key, any_value::Value::ArrayValue(ArrayValue { values }))
}

/// The path of the group a node path is inside: `review` for `review.fix`,
/// `per_line` for `per_line[3].show`; `None` at the top.
fn enclosing_group(path: &str) -> Option<&str> {
    let (group, _) = path.rsplit_once('.')?;
    // A for_each element (`per_line[3]`) runs inside the for_each node.
    Some(
        match group.strip_suffix(']').and_then(|g| g.rsplit_once('[')) {
            Some((g, _)) => g,
            None => group,
        },
    )
}

#[cfg(test)]
mod tests;
