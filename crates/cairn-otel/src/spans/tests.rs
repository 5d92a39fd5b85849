use super::*;
use cairn_events::{NodeCounts, RunId, Scope, Seq, TokenTotals};

/// A run's log being written by hand.
struct Log {
    run: String,
    events: Vec<Event>,
}

impl Log {
    fn new(run: &str) -> Log {
        Log {
            run: run.into(),
            events: Vec::new(),
        }
    }

    fn at(&mut self, ts: i64, scope: Scope, kind: EventKind) -> &mut Log {
        let seq = self.events.len() as u64 + 1;
        self.events.push(Event {
            run_id: cairn_events::RunId::parse(&self.run).unwrap(),
            seq: Seq(seq),
            timestamp_ms: ts,
            scope,
            kind,
        });
        self
    }

    fn started(&mut self, ts: i64, resumed: bool) -> &mut Log {
        self.at(
            ts,
            Scope::run(),
            EventKind::RunStarted {
                workflow: "wf".into(),
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
}

fn att(node: &str, attempt: u32) -> Scope {
    Scope::node(node, 0).with_attempt(attempt)
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn int(s: &Span, key: &str) -> Option<i64> {
    match attr(s, key) {
        Some(any_value::Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn text<'a>(s: &'a Span, key: &str) -> Option<&'a str> {
    match attr(s, key) {
        Some(any_value::Value::StringValue(v)) => Some(v),
        _ => None,
    }
}

fn flag(s: &Span, key: &str) -> Option<bool> {
    match attr(s, key) {
        Some(any_value::Value::BoolValue(b)) => Some(*b),
        _ => None,
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn code(s: &Span) -> Option<i32> {
    s.status.as_ref().map(|st| st.code)
}

fn ms(s: &Span) -> (u64, u64) {
    (
        s.start_time_unix_nano / 1_000_000,
        s.end_time_unix_nano / 1_000_000,
    )
}

/// A run with a retried node, an agent that calls a model twice and two
/// tools (one fails), and a node that fails the run.
fn agent_run() -> Log {
    let mut l = Log::new("r");
    l.started(1_000, false)
        .at(
            1_010,
            att("flaky", 1),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_020,
            att("flaky", 1),
            EventKind::NodeFailed {
                error: ErrorInfo::new("exit", "exit code 3"),
                will_retry: true,
                snapshot: None,
            },
        )
        .at(
            1_021,
            Scope::node("flaky", 0).with_attempt(2),
            EventKind::NodeRetrying { delay_ms: 5 },
        )
        .at(
            1_030,
            att("flaky", 2),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_040,
            att("flaky", 2),
            EventKind::NodeFinished {
                duration_ms: 10,
                output: None,
                cached: None,
                snapshot: None,
            },
        )
        .at(
            1_100,
            att("fix", 1),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_110,
            att("fix", 1),
            EventKind::AgentStepStarted {
                step: 1,
                model: "gpt-4o".into(),
                snapshot: None,
                request_hash: None,
                prompt: None,
            },
        )
        .at(
            1_150,
            att("fix", 1),
            EventKind::TokenUsageReported {
                provider: "openai".into(),
                model: "gpt-4o-2024".into(),
                input_tokens: 412,
                output_tokens: 48,
                cache_read_tokens: Some(100),
                cache_write_tokens: None,
                reasoning_tokens: None,
                cost_usd: Some(0.002),
            },
        )
        .at(
            1_160,
            att("fix", 1),
            EventKind::AgentStepFinished {
                step: 1,
                tool_calls: 2,
                finish_reason: "tool_calls".into(),
                message: serde_json::json!({}),
            },
        )
        .at(
            1_170,
            att("fix", 1),
            EventKind::ToolCallStarted {
                tool_name: "read".into(),
                tool_seq: 1,
                idempotency_key: "k1".into(),
                side_effect: false,
            },
        )
        .at(
            1_175,
            att("fix", 1),
            EventKind::ToolCallFinished {
                tool_name: "read".into(),
                tool_seq: 1,
                status: ToolStatus::Success,
                duration_ms: 5,
                error: None,
            },
        )
        .at(
            1_180,
            att("fix", 1),
            EventKind::ToolCallStarted {
                tool_name: "edit".into(),
                tool_seq: 2,
                idempotency_key: "k2".into(),
                side_effect: true,
            },
        )
        .at(
            1_190,
            att("fix", 1),
            EventKind::ToolCallFinished {
                tool_name: "edit".into(),
                tool_seq: 2,
                status: ToolStatus::Error,
                duration_ms: 10,
                error: Some(ErrorInfo::new("patch", "the patch does not apply")),
            },
        )
        .at(
            1_200,
            att("fix", 1),
            EventKind::AgentStepStarted {
                step: 2,
                model: "gpt-4o".into(),
                snapshot: None,
                request_hash: None,
                prompt: None,
            },
        )
        .at(
            1_220,
            att("fix", 1),
            EventKind::TokenUsageReported {
                provider: "openai".into(),
                model: "gpt-4o-2024".into(),
                input_tokens: 500,
                output_tokens: 20,
                cache_read_tokens: None,
                cache_write_tokens: None,
                reasoning_tokens: Some(7),
                cost_usd: Some(0.001),
            },
        )
        .at(
            1_230,
            att("fix", 1),
            EventKind::AgentStepFinished {
                step: 2,
                tool_calls: 0,
                finish_reason: "stop".into(),
                message: serde_json::json!({}),
            },
        )
        .at(
            1_240,
            att("fix", 1),
            EventKind::NodeFinished {
                duration_ms: 140,
                output: None,
                cached: None,
                snapshot: None,
            },
        )
        .at(
            1_300,
            att("bad", 1),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_310,
            att("bad", 1),
            EventKind::NodeFailed {
                error: ErrorInfo::new("exit", "exit code 1"),
                will_retry: false,
                snapshot: None,
            },
        )
        .at(
            1_320,
            Scope::run(),
            EventKind::RunSummary {
                duration_ms: 320,
                nodes: NodeCounts {
                    finished: 2,
                    failed: 1,
                    skipped: 0,
                    cancelled: 0,
                },
                tokens: TokenTotals::default(),
                cost_usd: None,
                timings: Vec::new(),
            },
        )
        .at(
            1_321,
            Scope::run(),
            EventKind::RunFailed {
                error: ErrorInfo::new("node_failed", "node `bad` failed"),
            },
        );
    l
}

#[test]
fn a_run_gives_run_attempt_model_and_tool_spans_with_their_parents() {
    let log = agent_run();
    let spans = build_spans(&log.events, &Lineage::root(&RunId::parse("r").unwrap()));
    let run = &spans[0];
    assert_eq!(run.name, "run wf");
    assert!(run.parent_span_id.is_empty());
    assert_eq!(run.trace_id, trace_id("r").to_vec());
    assert!(spans.iter().all(|s| s.trace_id == run.trace_id));
    assert_eq!(ms(run), (1_000, 1_321));
    assert_eq!(code(run), Some(status::StatusCode::Error as i32));
    assert_eq!(text(run, "cairn.run.status"), Some("failed"));
    assert_eq!(text(run, "cairn.error.kind"), Some("node_failed"));
    assert_eq!(int(run, "cairn.usage.input_tokens"), Some(912));
    assert_eq!(int(run, "cairn.run.nodes.failed"), Some(1));
    // Totals on the run are Cairn's, not gen_ai's (no double counting).
    assert_eq!(int(run, "gen_ai.usage.input_tokens"), None);

    // A retried node: two attempt spans under the run, the first an error.
    let flaky = named(&spans, "node flaky");
    assert_eq!(flaky.len(), 2);
    assert!(flaky.iter().all(|s| s.parent_span_id == run.span_id));
    assert_eq!(int(flaky[0], "cairn.node.attempt"), Some(1));
    assert_eq!(code(flaky[0]), Some(status::StatusCode::Error as i32));
    assert_eq!(flag(flaky[0], "cairn.will_retry"), Some(true));
    assert_eq!(text(flaky[0], "cairn.error.kind"), Some("exit"));
    assert_eq!(
        flaky[0].status.as_ref().unwrap().message,
        "exit: exit code 3"
    );
    assert_eq!(int(flaky[1], "cairn.node.attempt"), Some(2));
    assert_eq!(int(flaky[1], "cairn.node.retry_delay_ms"), Some(5));
    assert_eq!(code(flaky[1]), Some(status::StatusCode::Ok as i32));
    assert_eq!(ms(flaky[1]), (1_030, 1_040));
    assert_ne!(flaky[0].span_id, flaky[1].span_id);

    // The agent's attempt, its two model calls and two tool calls.
    let fix = named(&spans, "node fix")[0];
    assert_eq!(int(fix, "cairn.usage.model_calls"), Some(2));
    assert_eq!(int(fix, "cairn.usage.output_tokens"), Some(68));
    let models = named(&spans, "chat gpt-4o");
    assert_eq!(models.len(), 2);
    for m in &models {
        assert_eq!(m.parent_span_id, fix.span_id);
        assert_eq!(m.kind, span::SpanKind::Client as i32);
        assert_eq!(text(m, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(text(m, "gen_ai.provider.name"), Some("openai"));
        assert_eq!(text(m, "gen_ai.response.model"), Some("gpt-4o-2024"));
    }
    assert_eq!(int(models[0], "gen_ai.usage.input_tokens"), Some(412));
    assert_eq!(int(models[0], "gen_ai.usage.output_tokens"), Some(48));
    assert_eq!(
        int(models[0], "gen_ai.usage.cache_read.input_tokens"),
        Some(100)
    );
    assert_eq!(int(models[0], "cairn.agent.tool_calls"), Some(2));
    assert_eq!(ms(models[0]), (1_110, 1_160));
    assert!(
        matches!(attr(models[0], "cairn.cost_usd"), Some(any_value::Value::DoubleValue(c)) if (*c - 0.002).abs() < 1e-12)
    );
    assert_eq!(int(models[1], "cairn.usage.reasoning_tokens"), Some(7));
    let read = named(&spans, "execute_tool read")[0];
    assert_eq!(read.parent_span_id, fix.span_id);
    assert_eq!(text(read, "gen_ai.tool.name"), Some("read"));
    assert_eq!(int(read, "cairn.tool.seq"), Some(1));
    assert_eq!(text(read, "cairn.tool.idempotency_key"), Some("k1"));
    assert_eq!(flag(read, "cairn.tool.side_effect"), Some(false));
    assert_eq!(text(read, "cairn.tool.status"), Some("success"));
    let edit = named(&spans, "execute_tool edit")[0];
    assert_eq!(code(edit), Some(status::StatusCode::Error as i32));
    assert_eq!(text(edit, "cairn.error.kind"), Some("patch"));
    assert_eq!(flag(edit, "cairn.tool.side_effect"), Some(true));

    let bad = named(&spans, "node bad")[0];
    assert_eq!(code(bad), Some(status::StatusCode::Error as i32));
    assert_eq!(flag(bad, "cairn.will_retry"), Some(false));
    assert_eq!(spans.len(), 1 + 2 + 1 + 2 + 2 + 1);
    assert!(spans
        .iter()
        .all(|s| s.end_time_unix_nano >= s.start_time_unix_nano));
    assert!(spans.iter().all(|s| flag(s, "cairn.incomplete").is_none()));

    // The same log gives the same spans, ids included.
    assert_eq!(
        build_spans(&log.events, &Lineage::root(&RunId::parse("r").unwrap())),
        spans
    );
}

#[test]
fn a_resumed_run_is_one_run_span_with_stable_ids() {
    let mut l = Log::new("r");
    l.started(1_000, false)
        .at(
            1_010,
            att("slow", 1),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_500,
            att("slow", 1),
            EventKind::NodeOutput {
                text: "working".into(),
                stream: cairn_events::OutputStream::Stdout,
            },
        );
    // What an export at the crash would have sent.
    let before = build_spans(&l.events, &Lineage::root(&RunId::parse("r").unwrap()));
    assert_eq!(before.len(), 2);
    assert_eq!(flag(&before[0], "cairn.incomplete"), Some(true));
    assert_eq!(text(&before[0], "cairn.run.status"), Some("running"));
    assert_eq!(before[0].status, None);
    assert_eq!(ms(&before[0]), (1_000, 1_500));
    assert_eq!(ms(&before[1]), (1_010, 1_500));

    // The process died; a resume came back a minute later.
    l.started(61_000, true)
        .at(
            61_001,
            att("slow", 1),
            EventKind::NodeFailed {
                error: ErrorInfo::new("interrupted", "the engine stopped"),
                will_retry: true,
                snapshot: None,
            },
        )
        .at(
            61_002,
            Scope::node("slow", 0).with_attempt(2),
            EventKind::NodeRetrying { delay_ms: 0 },
        )
        .at(
            61_003,
            att("slow", 2),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            61_100,
            att("slow", 2),
            EventKind::NodeFinished {
                duration_ms: 97,
                output: None,
                cached: None,
                snapshot: None,
            },
        )
        .at(
            61_101,
            Scope::run(),
            EventKind::RunFinished {
                output: None,
                duration_ms: 60_101,
            },
        );
    let after = build_spans(&l.events, &Lineage::root(&RunId::parse("r").unwrap()));
    let runs: Vec<&Span> = after
        .iter()
        .filter(|s| s.name.starts_with("run "))
        .collect();
    assert_eq!(runs.len(), 1, "one run span across sessions");
    let run = runs[0];
    assert_eq!(int(run, "cairn.run.sessions"), Some(2));
    assert_eq!(run.events.len(), 1);
    assert_eq!(run.events[0].name, "run resumed");
    assert_eq!(ms(run), (1_000, 61_101));
    assert_eq!(code(run), Some(status::StatusCode::Ok as i32));
    let slow = named(&after, "node slow");
    assert_eq!(slow.len(), 2);
    // The interrupted attempt stopped at its last event, not at the resume.
    assert_eq!(ms(slow[0]), (1_010, 1_500));
    assert_eq!(flag(slow[0], "cairn.node.interrupted"), Some(true));
    assert_eq!(text(slow[0], "cairn.error.kind"), Some("interrupted"));
    // Ids do not move between exports.
    assert_eq!(before[0].span_id, run.span_id);
    assert_eq!(before[1].span_id, slow[0].span_id);
    assert_eq!(before[0].trace_id, run.trace_id);
}

#[test]
fn a_waiting_run_ends_at_its_last_event_with_its_status_unset() {
    let mut l = Log::new("r");
    l.started(1_000, false)
        .at(
            1_010,
            att("gate", 1),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_011,
            Scope::node("gate", 0),
            EventKind::NodeWaitingApproval {},
        )
        .at(
            1_012,
            Scope::node("gate", 0),
            EventKind::ApprovalRequested {
                message: Some("ship it?".into()),
            },
        )
        .at(
            1_013,
            Scope::run(),
            EventKind::RunStatusChanged {
                status: cairn_events::RunStatus::WaitingApproval,
            },
        );
    let spans = build_spans(&l.events, &Lineage::root(&RunId::parse("r").unwrap()));
    let (run, gate) = (&spans[0], &spans[1]);
    assert_eq!(run.status, None);
    assert_eq!(flag(run, "cairn.incomplete"), Some(true));
    assert_eq!(text(run, "cairn.run.status"), Some("waiting-approval"));
    assert_eq!(ms(run), (1_000, 1_013));
    assert_eq!(gate.status, None);
    assert_eq!(text(gate, "cairn.node.status"), Some("running"));
    assert_eq!(ms(gate), (1_010, 1_013));
    // The approval is an event of the attempt that waits.
    assert_eq!(gate.events.len(), 1);
    assert_eq!(gate.events[0].name, "approval requested");
}

#[test]
fn a_child_run_hangs_from_the_parent_attempt_that_started_it() {
    let mut parent = Log::new("p");
    parent
        .started(1_000, false)
        .at(
            1_010,
            att("sub", 1),
            EventKind::NodeStarted { snapshot: None },
        )
        .at(
            1_020,
            att("sub", 1),
            EventKind::DelegationStarted {
                child_run_id: cairn_events::RunId::parse("p.c1").unwrap(),
                agent: "workflow".into(),
                workflow: "child.yaml".into(),
            },
        );
    let mut b = TraceBuilder::new(Lineage::root(&RunId::parse("p").unwrap()));
    for ev in &parent.events {
        b.push(ev);
    }
    let lineage = b.child_lineage(&RunId::parse("p.c1").unwrap());
    let parent_spans = b.finish();
    let attempt = named(&parent_spans, "node sub")[0];
    assert_eq!(attempt.events[0].name, "delegation started");
    assert_eq!(
        lineage,
        Lineage {
            root_run_id: RunId::parse("p").unwrap(),
            parent: Some(ParentSpan::Attempt {
                run_id: RunId::parse("p").unwrap(),
                node_id: "sub".into(),
                iteration: 0,
                attempt: 1,
            }),
        }
    );

    let mut child = Log::new("p.c1");
    child.started(1_030, false).at(
        1_040,
        Scope::run(),
        EventKind::RunFinished {
            output: None,
            duration_ms: 10,
        },
    );
    let child_spans = build_spans(&child.events, &lineage);
    assert_eq!(child_spans[0].trace_id, parent_spans[0].trace_id);
    assert_eq!(child_spans[0].parent_span_id, attempt.span_id);
    // A child the parent's log does not name hangs from the parent run.
    let unnamed = build_spans(&child.events, &b_lineage_without_delegation());
    assert_eq!(unnamed[0].parent_span_id, parent_spans[0].span_id);
}

fn b_lineage_without_delegation() -> Lineage {
    let mut parent = Log::new("p");
    parent.started(1_000, false);
    let mut b = TraceBuilder::new(Lineage::root(&RunId::parse("p").unwrap()));
    for ev in &parent.events {
        b.push(ev);
    }
    b.child_lineage(&RunId::parse("p.other").unwrap())
}

#[test]
fn hostile_logs_stay_bounded() {
    let huge = "x".repeat(100_000);
    let mut l = Log::new("r");
    l.started(1_000, false).at(
        1_010,
        att("n", 1),
        EventKind::NodeStarted { snapshot: None },
    );
    for i in 0..(MAX_EVENTS_PER_SPAN + 10) {
        l.at(
            1_020 + i as i64,
            Scope::node("n", 0),
            EventKind::ApprovalRequested {
                message: Some(huge.clone()),
            },
        );
    }
    l.at(
        3_000,
        att("n", 1),
        EventKind::NodeFailed {
            error: ErrorInfo::new("exit", huge.clone()),
            will_retry: false,
            snapshot: None,
        },
    );
    // An event of another run is no part of this one.
    l.events.push(Event {
        run_id: cairn_events::RunId::parse("intruder").unwrap(),
        seq: Seq(999),
        timestamp_ms: 9_999_999,
        scope: Scope::run(),
        kind: EventKind::RunCancelled { reason: None },
    });
    let spans = build_spans(&l.events, &Lineage::root(&RunId::parse("r").unwrap()));
    let n = &spans[1];
    assert_eq!(n.events.len(), MAX_EVENTS_PER_SPAN);
    assert_eq!(n.dropped_events_count, 10);
    let msg = text(n, "cairn.error.message").unwrap();
    assert!(msg.len() <= MAX_ATTRIBUTE_LEN && msg.ends_with('…'));
    assert!(n.status.as_ref().unwrap().message.len() <= MAX_ATTRIBUTE_LEN);
    for e in &n.events {
        for a in &e.attributes {
            if let Some(AnyValue {
                value: Some(any_value::Value::StringValue(s)),
            }) = &a.value
            {
                assert!(s.len() <= MAX_ATTRIBUTE_LEN);
            }
        }
    }
    assert_eq!(int(&spans[0], "cairn.events_ignored"), Some(1));
    assert_eq!(ms(&spans[0]).1, 3_000);

    // Past the span cap, spans are counted, not kept.
    let mut many = Log::new("m");
    many.started(1, false)
        .at(2, att("n", 1), EventKind::NodeStarted { snapshot: None });
    for seq in 1..=(MAX_SPANS_PER_RUN as u32 + 5) {
        many.at(
            3,
            att("n", 1),
            EventKind::ToolCallStarted {
                tool_name: "read".into(),
                tool_seq: seq,
                idempotency_key: String::new(),
                side_effect: false,
            },
        );
    }
    // The ends of dropped spans do not count them again.
    for seq in (MAX_SPANS_PER_RUN as u32 - 10)..=(MAX_SPANS_PER_RUN as u32 + 5) {
        many.at(
            4,
            att("n", 1),
            EventKind::ToolCallFinished {
                tool_name: "read".into(),
                tool_seq: seq,
                status: ToolStatus::Success,
                duration_ms: 1,
                error: None,
            },
        );
    }
    let spans = build_spans(&many.events, &Lineage::root(&RunId::parse("m").unwrap()));
    assert_eq!(spans.len(), MAX_SPANS_PER_RUN);
    assert_eq!(int(&spans[0], "cairn.spans_dropped"), Some(7));
}

#[test]
fn strings_are_cut_at_a_character_boundary() {
    let s = "é".repeat(MAX_ATTRIBUTE_LEN);
    let c = cap(&s);
    assert!(c.len() <= MAX_ATTRIBUTE_LEN);
    assert!(c.ends_with('…'));
    assert_eq!(cap("short"), "short");
}

#[test]
fn nodes_inside_groups_hang_from_the_group_attempt() {
    let mut l = Log::new("r");
    l.started(1, false);
    let fin = |d| EventKind::NodeFinished {
        duration_ms: d,
        output: None,
        cached: None,
        snapshot: None,
    };
    l.at(2, att("each", 1), EventKind::NodeStarted { snapshot: None });
    l.at(
        3,
        att("each[0].say", 1),
        EventKind::NodeStarted { snapshot: None },
    );
    l.at(4, att("each[0].say", 1), fin(1));
    l.at(5, att("each", 1), fin(3));
    l.at(
        6,
        att("review", 1),
        EventKind::NodeStarted { snapshot: None },
    );
    for pass in 0..2 {
        let s = Scope::node("review.fix", pass).with_attempt(1);
        l.at(
            7 + i64::from(pass),
            s.clone(),
            EventKind::NodeStarted { snapshot: None },
        );
        l.at(7 + i64::from(pass), s, fin(0));
    }
    l.at(9, att("review", 1), fin(3));
    l.at(10, att("top", 1), EventKind::NodeStarted { snapshot: None });
    l.at(11, att("top", 1), fin(1));
    let spans = build_spans(&l.events, &Lineage::root(&RunId::parse("r").unwrap()));
    let id = |name: &str| named(&spans, name)[0].span_id.clone();
    let run = id("run wf");
    assert_eq!(
        named(&spans, "node each[0].say")[0].parent_span_id,
        id("node each")
    );
    for fix in named(&spans, "node review.fix") {
        assert_eq!(fix.parent_span_id, id("node review"));
    }
    assert_eq!(named(&spans, "node review")[0].parent_span_id, run);
    assert_eq!(named(&spans, "node top")[0].parent_span_id, run);
}

#[test]
fn the_group_of_a_path() {
    assert_eq!(enclosing_group("top"), None);
    assert_eq!(enclosing_group("review.fix"), Some("review"));
    assert_eq!(enclosing_group("per_line[3].show"), Some("per_line"));
    assert_eq!(enclosing_group("a.b[12].c"), Some("a.b"));
}
