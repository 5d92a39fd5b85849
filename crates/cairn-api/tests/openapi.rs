//! The OpenAPI document held to the API's types, both ways.
//!
//! Every answer and request body the document describes as JSON has
//! samples here, made from the types with every field written out (no
//! `..Default::default()`), so that a field added to a type does not
//! compile until its samples set it. Each sample must match its schema,
//! where an object that lists its properties takes no others unless it
//! says `additionalProperties: true`: a field the type sends and the
//! document lacks fails. And every property the document lists must be
//! sent by some sample: a field the document has and the type never sends
//! fails too. A documented answer without samples, or samples for an
//! answer the document does not have, fail as well.
//!
//! No JSON Schema library: the document uses a small part of the
//! standard (types, `required`, `properties`, `additionalProperties`,
//! `items`, `enum`, `const`, bounds, lengths, `$ref`), checked below in a
//! hundred lines; `pattern`s are left to the server's own tests.

use std::collections::{BTreeMap, BTreeSet};

use cairn_api::*;
use cairn_events::{Event, RunId, RunState, RunStatus, TokenTotals};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The document, and which of its properties the samples sent.
struct Checker {
    doc: Value,
    seen: BTreeSet<String>,
}

/// A JSON Pointer's escaping of one key.
fn esc(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

impl Checker {
    fn schema(&self, loc: &str) -> &Value {
        self.doc
            .pointer(loc)
            .unwrap_or_else(|| panic!("no schema at {loc}"))
    }

    /// Checks `v` (at `at` in the sample) against the schema at `loc`,
    /// adding what is wrong to `errs`.
    fn check(&mut self, v: &Value, loc: &str, at: &str, errs: &mut Vec<String>) {
        let schema = self.schema(loc).clone();
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let target = r.strip_prefix('#').expect("local refs only").to_string();
            return self.check(v, &target, at, errs);
        }
        if let Some(t) = schema.get("type") {
            let types: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => panic!("{loc}: odd type {t}"),
            };
            let fits = |ty: &str| match ty {
                "object" => v.is_object(),
                "array" => v.is_array(),
                "string" => v.is_string(),
                "boolean" => v.is_boolean(),
                "null" => v.is_null(),
                "integer" => v.is_i64() || v.is_u64(),
                "number" => v.is_number(),
                other => panic!("{loc}: unknown type {other}"),
            };
            if !types.iter().any(|t| fits(t)) {
                errs.push(format!("{at}: {v} is not {types:?} ({loc})"));
                return;
            }
        }
        if let Some(c) = schema.get("const") {
            if c != v {
                errs.push(format!("{at}: {v} is not the constant {c} ({loc})"));
            }
        }
        if let Some(e) = schema.get("enum").and_then(Value::as_array) {
            if !e.contains(v) {
                errs.push(format!("{at}: {v} is not one of {e:?} ({loc})"));
            }
        }
        if let Some(n) = v.as_f64() {
            let below = schema.get("minimum").and_then(Value::as_f64);
            let above = schema.get("maximum").and_then(Value::as_f64);
            if below.is_some_and(|m| n < m) || above.is_some_and(|m| n > m) {
                errs.push(format!("{at}: {v} is out of bounds ({loc})"));
            }
        }
        if let Some(s) = v.as_str() {
            let len = s.chars().count() as u64;
            let short = schema.get("minLength").and_then(Value::as_u64);
            let long = schema.get("maxLength").and_then(Value::as_u64);
            if short.is_some_and(|m| len < m) || long.is_some_and(|m| len > m) {
                errs.push(format!("{at}: `{s}` has a length out of bounds ({loc})"));
            }
        }
        if let Some(obj) = v.as_object() {
            for r in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let r = r.as_str().unwrap();
                if !obj.contains_key(r) {
                    errs.push(format!("{at}: required `{r}` is missing ({loc})"));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, val) in obj {
                let at = format!("{at}.{k}");
                if props.is_some_and(|p| p.contains_key(k)) {
                    let ploc = format!("{loc}/properties/{}", esc(k));
                    self.seen.insert(ploc.clone());
                    self.check(val, &ploc, &at, errs);
                    continue;
                }
                match schema.get("additionalProperties") {
                    Some(Value::Bool(true)) => {}
                    Some(Value::Object(_)) => {
                        self.check(val, &format!("{loc}/additionalProperties"), &at, errs)
                    }
                    // An object that lists its properties takes no others
                    // here, whatever JSON Schema allows by default.
                    _ if props.is_some() => errs.push(format!(
                        "{at}: sent by the type but not in the document ({loc})"
                    )),
                    _ => {}
                }
            }
        }
        if let (Some(_), Some(arr)) = (schema.get("items"), v.as_array()) {
            for (i, item) in arr.iter().enumerate() {
                self.check(item, &format!("{loc}/items"), &format!("{at}[{i}]"), errs);
            }
        }
    }

    /// Every property location reachable from the schema at `loc`.
    fn documented(&self, loc: &str, out: &mut BTreeSet<String>, visited: &mut BTreeSet<String>) {
        if !visited.insert(loc.to_string()) {
            return;
        }
        let schema = self.schema(loc);
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            return self.documented(r.strip_prefix('#').unwrap(), out, visited);
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for k in props.keys() {
                let ploc = format!("{loc}/properties/{}", esc(k));
                out.insert(ploc.clone());
                self.documented(&ploc, out, visited);
            }
        }
        if schema.get("items").is_some() {
            self.documented(&format!("{loc}/items"), out, visited);
        }
        if schema
            .get("additionalProperties")
            .is_some_and(Value::is_object)
        {
            self.documented(&format!("{loc}/additionalProperties"), out, visited);
        }
    }
}

/// Every JSON body of the document: `METHOD path status` (or `request`)
/// and the location of its schema.
fn documented_bodies(doc: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let base = format!("/paths/{}/{method}", esc(path));
            let op_name = format!("{} {path}", method.to_uppercase());
            if op["requestBody"]["content"]["application/json"]["schema"].is_object() {
                out.insert(
                    format!("{op_name} request"),
                    format!("{base}/requestBody/content/application~1json/schema"),
                );
            }
            for (status, resp) in op["responses"].as_object().unwrap() {
                if resp["content"]["application/json"]["schema"].is_object() {
                    out.insert(
                        format!("{op_name} {status}"),
                        format!("{base}/responses/{status}/content/application~1json/schema"),
                    );
                }
            }
        }
    }
    out
}

fn to_json(v: impl Serialize) -> Value {
    serde_json::to_value(v).unwrap()
}

fn tokens() -> TokenTotals {
    TokenTotals {
        input: 10,
        output: 5,
        cache_read: 1,
        cache_write: 2,
        reasoning: 3,
    }
}

/// A run's state with every field the reducer can set, folded in part
/// from contract events (its nodes) and set in part by hand (what would
/// take a long log to reach).
fn rich_state(ended: RunStatus) -> RunState {
    let mut st = RunState::new(RunId::parse("r1").unwrap());
    let lines = [
        r#"{"type":"NodePending","runId":"r1","seq":1,"timestampMs":10,"nodeId":"a","iteration":0,"layerIndex":0}"#,
        r#"{"type":"NodeStarted","runId":"r1","seq":2,"timestampMs":11,"nodeId":"a","iteration":0,"attempt":1}"#,
        r#"{"type":"NodeFinished","runId":"r1","seq":3,"timestampMs":12,"nodeId":"a","iteration":0,"attempt":1,"durationMs":1,"output":{"ok":true}}"#,
        r#"{"type":"NodePending","runId":"r1","seq":4,"timestampMs":13,"nodeId":"b","iteration":0,"layerIndex":1}"#,
    ];
    for l in lines {
        st.apply(&Event::from_json(l).unwrap_or_else(|e| panic!("{l}: {e}")));
    }
    st.workflow = Some("w".into());
    st.workflow_hash = Some("ab".into());
    st.input = Some(json!({"x": 1}));
    st.status = Some(ended);
    st.started_ms = Some(10);
    st.resumed_ms = Some(12);
    st.ended_ms = Some(20);
    if ended == RunStatus::Failed {
        st.error = Some(
            cairn_events::ErrorInfo::new("command", "exit 1").with_details(json!({"code": 1})),
        );
    } else {
        st.output = Some(json!({"done": true}));
    }
    st.cancel_requested = Some("ana".into());
    st.resumes = 1;
    st.tokens = tokens();
    st.cost_usd = Some(0.25);
    st.tool_calls = 2;
    st.questions.insert(
        "q1".into(),
        cairn_events::Question {
            node_id: "b".into(),
            iteration: 0,
            prompt: "which?".into(),
            schema: Some(json!({"type": "string"})),
            answer: Some(json!("main")),
            answered_by: Some("ana".into()),
        },
    );
    st.parent_run_id = Some(RunId::parse("p1").unwrap());
    st.parent_node_id = Some("delegate".into());
    st.depth = 1;
    st.children.push(cairn_events::ChildRun {
        run_id: RunId::parse("c1").unwrap(),
        node_id: "b".into(),
        iteration: 0,
        agent: "workflow".into(),
        workflow: "child.yaml".into(),
        status: Some("finished".into()),
    });
    st.generation = 2;
    st.forked_from = Some(cairn_events::ForkedFrom {
        run_id: RunId::parse("f1").unwrap(),
        seq: 3,
    });
    st.trigger = Some(cairn_events::Trigger {
        kind: cairn_events::TriggerKind::Schedule,
        name: "nightly".into(),
        due_ms: Some(1_000),
        delivery_id: Some("d-1".into()),
    });
    st.replay_of = Some(cairn_events::ReplayOf {
        run_id: RunId::parse("orig").unwrap(),
        live: true,
        tools: cairn_events::ReplayTools::Recorded,
    });
    st.hijack_requested.insert("b".into());
    st.open_revert = Some(Box::new(cairn_events::OpenRevert {
        node_id: "a".into(),
        iteration: 0,
        attempt: 1,
        snapshot: "0123abcd".into(),
    }));
    st
}

fn scorer(mean: Option<f64>) -> ScorerStats {
    ScorerStats {
        node_id: "judge".into(),
        scorer_id: "s".into(),
        scorer_name: "S".into(),
        count: 2,
        failed: 1,
        mean,
        min: mean,
        max: mean,
        stddev: mean.map(|_| 0.1),
    }
}

fn entry(full: bool) -> ActivityEntry {
    let some = |s: &str| full.then(|| s.to_string());
    ActivityEntry {
        id: "r1-3".into(),
        run_id: rid("r1"),
        node_id: some("a"),
        iteration: full.then_some(0),
        previous_activity_id: some("r1-1"),
        delegated_by: full.then(|| DelegatedBy {
            run_id: rid("p1"),
            node_id: "delegate".into(),
        }),
        kind: "command".into(),
        title: "Ran `make`".into(),
        status: "success".into(),
        started_ms: 10,
        ended_ms: full.then_some(12),
        seq: 3,
        updated_seq: 4,
        error: some("exit 1"),
        child_run_id: Some(rid("c1")),
        detail: some("make"),
        reasoning: some("The build is stale."),
    }
}

fn plan_node(full: bool) -> PlanNode {
    let some = |s: &str| full.then(|| s.to_string());
    PlanNode {
        path: "g.x".into(),
        id: "x".into(),
        kind: "loop".into(),
        depth: 1,
        needs: vec!["g.w".into()],
        line: 7,
        parent: some("g"),
        stage: some("work"),
        max_iterations: full.then_some(3),
        tool: some("read"),
        children: full.then(|| vec!["g.x.y".into()]),
        handler: some("failure()"),
        cases: full.then(|| {
            vec![
                PlanCase {
                    label: "bug".into(),
                    nodes: vec!["g.fix".into()],
                    default: false,
                },
                PlanCase {
                    label: "default".into(),
                    nodes: vec!["g.triage".into()],
                    default: true,
                },
            ]
        }),
    }
}

fn tool_call(full: bool) -> ToolCall {
    ToolCall {
        attempt: 1,
        tool_seq: 1,
        tool: "read".into(),
        idempotency_key: "k".into(),
        side_effect: false,
        idempotent: true,
        input: json!({"path": "a.txt"}),
        status: "success".into(),
        started_ms: 10,
        output: full.then(|| json!("text")),
        finished_ms: full.then_some(11),
        error: full.then(|| json!({"message": "no"})),
    }
}

fn summary(full: bool) -> RunSummary {
    RunSummary {
        run_id: rid("r1"),
        workflow: "w".into(),
        status: "running".into(),
        created_ms: 1,
        updated_ms: 2,
        parent_run_id: full.then(|| rid("p1")),
        progress: full.then_some(0.5),
        tokens: full.then(tokens),
        started_ms: full.then_some(1),
        ended_ms: full.then_some(3),
        cost_usd: full.then_some(0.01),
        instance: full.then(|| "web-1".into()),
    }
}

fn event(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_string()).unwrap()
}

/// Samples of every documented body, by `METHOD path status`.
fn samples() -> Vec<(&'static str, Value)> {
    let p1 = rid("p1");
    let meta = RunMeta {
        workflow: "w",
        status: "running",
        parent_run_id: Some(&p1),
    };
    let mut detail = RunDetail::new(&rich_state(RunStatus::Finished), &meta);
    detail.with_instance(Some("web-1".into()));
    detail.with_child_states(|_| Some("waiting-approval".into()));
    let events = vec![
        event(r#"{"type":"RunStarted","runId":"r1","seq":1,"timestampMs":5,"workflow":"w"}"#),
        event(r#"{"type":"NodePending","runId":"r1","seq":2,"timestampMs":6,"nodeId":"a"}"#),
    ];
    vec![
        ("GET /healthz 200", to_json(Health::ok())),
        (
            "GET /openapi.json 200",
            serde_json::from_str(OPENAPI).unwrap(),
        ),
        (
            "GET /v1/session 200",
            to_json(Session {
                token_required: true,
                authenticated: false,
            }),
        ),
        (
            "POST /v1/session 200",
            to_json(Session {
                token_required: false,
                authenticated: true,
            }),
        ),
        (
            "POST /v1/session request",
            to_json(LoginBody {
                token: "secret".into(),
            }),
        ),
        (
            "GET /v1/runs 200",
            to_json(RunList {
                runs: vec![summary(true), summary(false)],
                limit: 2,
                offset: 0,
                next_offset: Some(2),
            }),
        ),
        (
            "GET /v1/runs 200",
            to_json(RunList {
                runs: vec![],
                limit: 50,
                offset: 0,
                next_offset: None,
            }),
        ),
        (
            "POST /v1/runs request",
            to_json(StartBody {
                workflow: "team/review".into(),
                input: Some(json!({"x": 1})),
                run_id: Some("r-1".into()),
                max_concurrency: Some(2),
            }),
        ),
        (
            "POST /v1/runs request",
            to_json(StartBody {
                workflow: "hello".into(),
                input: None,
                run_id: None,
                max_concurrency: None,
            }),
        ),
        (
            "POST /v1/runs 201",
            to_json(RunAccepted { run_id: rid("r1") }),
        ),
        ("GET /v1/runs/{id} 200", to_json(&detail)),
        (
            "GET /v1/runs/{id} 200",
            to_json(RunDetail::new(&rich_state(RunStatus::Failed), &meta)),
        ),
        (
            "GET /v1/runs/{id} 200",
            to_json(RunDetail::new(
                &RunState::new(RunId::parse("r0").unwrap()),
                &RunMeta {
                    workflow: "w",
                    status: "pending",
                    parent_run_id: None,
                },
            )),
        ),
        (
            "GET /v1/runs/{id}/compare/{other} 200",
            to_json(comparison()),
        ),
        (
            "GET /v1/runs/{id}/activity 200",
            to_json(ActivityPage {
                run_id: rid("r1"),
                activity: vec![entry(true), entry(false)],
            }),
        ),
        (
            "GET /v1/runs/{id}/plan 200",
            to_json(Plan {
                run_id: rid("r1"),
                workflow: "w".into(),
                nodes: vec![plan_node(true), plan_node(false)],
            }),
        ),
        (
            "GET /v1/runs/{id}/nodes/{node}/tool-calls 200",
            to_json(ToolCalls {
                run_id: rid("r1"),
                node_id: "a".into(),
                iteration: 0,
                tool_calls: vec![tool_call(true), tool_call(false)],
            }),
        ),
        (
            "GET /v1/runs/{id}/events 200",
            to_json(EventsPage {
                run_id: rid("r1"),
                events,
                next_after: Some(2),
            }),
        ),
        (
            "GET /v1/runs/{id}/events 200",
            to_json(EventsPage {
                run_id: rid("r1"),
                events: vec![],
                next_after: None,
            }),
        ),
        (
            "POST /v1/runs/{id}/approvals/{node} request",
            to_json(DecideBody {
                approved: true,
                note: Some("fine".into()),
                by: Some("ana".into()),
            }),
        ),
        (
            "POST /v1/runs/{id}/approvals/{node} request",
            to_json(DecideBody {
                approved: false,
                note: None,
                by: None,
            }),
        ),
        (
            "POST /v1/runs/{id}/approvals/{node} 200",
            to_json(Decided {
                run_id: rid("r1"),
                node_id: "gate".into(),
                approved: true,
            }),
        ),
        (
            "POST /v1/runs/{id}/inputs/{requestId} request",
            to_json(AnswerBody {
                value: json!("main"),
                by: Some("ana".into()),
            }),
        ),
        (
            "POST /v1/runs/{id}/inputs/{requestId} 200",
            to_json(Answered {
                run_id: rid("r1"),
                request_id: "q1".into(),
            }),
        ),
        (
            "POST /v1/runs/{id}/cancel request",
            to_json(CancelBody {
                graceful: true,
                reason: Some("enough".into()),
                by: Some("ana".into()),
            }),
        ),
        (
            "POST /v1/runs/{id}/cancel 202",
            to_json(Cancelled {
                run_id: rid("r1"),
                mechanism: CancelMechanism::Graceful,
            }),
        ),
        (
            "POST /v1/runs/{id}/cancel 202",
            to_json(Cancelled {
                run_id: rid("r1"),
                mechanism: CancelMechanism::Immediate,
            }),
        ),
        (
            "POST /v1/runs/{id}/resume request",
            to_json(ResumeBody {
                max_concurrency: Some(4),
            }),
        ),
        (
            "POST /v1/runs/{id}/resume 202",
            to_json(RunAccepted { run_id: rid("r1") }),
        ),
        (
            "POST /v1/runs/{id}/nodes/{node}/hijack request",
            to_json(HijackBody {
                by: Some("ana".into()),
            }),
        ),
        (
            "POST /v1/runs/{id}/nodes/{node}/hijack 202",
            to_json(HijackRequested {
                run_id: rid("r1"),
                node_id: "coder".into(),
                seq: 7,
            }),
        ),
        (
            "POST /v1/runs/{id}/revert request",
            to_json(RevertBody {
                node: "build".into(),
                iteration: Some(0),
                attempt: Some(1),
                force: true,
                dry_run: true,
            }),
        ),
        ("POST /v1/runs/{id}/revert 200", to_json(reverted(None))),
        (
            "POST /v1/runs/{id}/revert 200",
            to_json(reverted(Some("disk full"))),
        ),
        (
            "POST /v1/runs/{id}/fork request",
            to_json(ForkBody {
                at: "build".into(),
                input: Some(json!({"x": 2})),
                workflow: Some("pipe".into()),
                run_id: Some("f1".into()),
                force: true,
                dry_run: true,
            }),
        ),
        ("POST /v1/runs/{id}/fork 200", to_json(forked(false))),
        ("POST /v1/runs/{id}/fork 201", to_json(forked(true))),
        (
            "GET /v1/scores 200",
            to_json(ScoreReport {
                workflows: vec![WorkflowScores {
                    workflow: "w".into(),
                    scorers: vec![scorer(Some(0.5)), scorer(None)],
                    generations: vec![GenerationScores {
                        workflow_hash: "ab".into(),
                        runs: 2,
                        first_run_ms: 1,
                        last_run_ms: 2,
                        scorers: vec![scorer(Some(1.0))],
                    }],
                }],
            }),
        ),
        (
            "GET /v1/schedules 200",
            to_json(ScheduleList {
                schedules: vec![schedule(true), schedule(false)],
            }),
        ),
        ("POST /v1/schedules request", to_json(schedule_body(true))),
        ("POST /v1/schedules request", to_json(schedule_body(false))),
        ("POST /v1/schedules 201", to_json(schedule(false))),
        ("GET /v1/schedules/{name} 200", to_json(schedule(true))),
        ("POST /v1/schedules/{name}/pause request", json!({})),
        (
            "POST /v1/schedules/{name}/pause 200",
            to_json(schedule(true)),
        ),
        ("POST /v1/schedules/{name}/resume request", json!({})),
        (
            "POST /v1/schedules/{name}/resume 200",
            to_json(schedule(false)),
        ),
        ("POST /v1/schedules/{name}/trigger request", json!({})),
        ("POST /v1/schedules/{name}/trigger 201", to_json(fire(true))),
        (
            "GET /v1/schedules/{name}/fires 200",
            to_json(FireList {
                fires: vec![fire(true), fire(false)],
            }),
        ),
        (
            "POST /v1/hooks/{name} request",
            json!({"action": "opened", "number": 1}),
        ),
        (
            "POST /v1/hooks/{name} 201",
            to_json(HookAccepted {
                run_id: rid("hook-gh-ab"),
                duplicate: false,
            }),
        ),
        (
            "POST /v1/hooks/{name} 200",
            to_json(HookAccepted {
                run_id: rid("hook-gh-ab"),
                duplicate: true,
            }),
        ),
    ]
}

fn schedule(full: bool) -> ScheduleView {
    ScheduleView {
        name: "nightly".into(),
        definition: json!({"name": "nightly", "workflow": "w", "every": "1000ms"}),
        from_file: full,
        paused: false,
        next_due_ms: full.then_some(2_000),
        pending_due_ms: full.then_some(1_000),
        last_run_id: full.then(|| rid("sched-nightly-1000")),
    }
}

fn schedule_body(full: bool) -> ScheduleBody {
    ScheduleBody {
        name: "nightly".into(),
        workflow: "w".into(),
        cron: full.then(|| "0 30 2 * * *".into()),
        timezone: full.then(|| "Europe/Paris".into()),
        every: full.then(|| "30s".into()),
        input: full.then(|| json!({"x": 1})),
        overlap: full.then(|| "queue_one".into()),
        catchup: full.then(|| "all".into()),
        catchup_limit: full.then_some(5),
        grace: full.then(|| "10s".into()),
    }
}

fn fire(full: bool) -> FireView {
    FireView {
        due_ms: 1_000,
        decided_ms: 1_001,
        outcome: if full { "started" } else { "missed" }.into(),
        run_id: full.then(|| rid("sched-nightly-1000")),
        detail: (!full).then(|| "3 due times missed while no instance ran".into()),
    }
}

fn files_plan() -> FilesPlan {
    FilesPlan {
        snapshot: "ab12".into(),
        write: vec!["a.txt".into()],
        remove: vec!["b.txt".into()],
        conflicts: vec![FileConflict {
            path: "a.txt".into(),
            why: "changed since".into(),
        }],
        force: true,
        unknown: vec!["node x attempt 1".into()],
    }
}

fn reverted(error: Option<&str>) -> Reverted {
    Reverted {
        plan: files_plan(),
        node: "build".into(),
        iteration: 0,
        attempt: 1,
        dry_run: false,
        applied: true,
        before: "cd34".into(),
        written: 1,
        removed: 1,
        finished_open: error.map(|_| "fetch".into()),
        error: error.map(str::to_string),
    }
}

fn forked(made: bool) -> Forked {
    Forked {
        run_id: made.then(|| rid("f1")),
        from: rid("orig"),
        seq: 12,
        starts_after: if made { 13 } else { 0 },
        snapshot: made.then(|| "ab12".into()),
        made,
        dry_run: !made,
        written: 1,
        removed: 0,
        plan: files_plan(),
    }
}

/// Two runs compared, every field filled in.
fn comparison() -> cairn_events::comparison::Comparison {
    use cairn_events::comparison::*;
    let side = |a: Option<&str>, b: Option<&str>| Side {
        original: a.map(str::to_string),
        replay: b.map(str::to_string),
    };
    Comparison {
        original: "orig".into(),
        replay: "rep".into(),
        steps_replayed: 2,
        steps_new: 1,
        divergence: Some(Divergence {
            node_id: "write".into(),
            iteration: 0,
            attempt: Some(1),
            step: Some(1),
            kind: "request".into(),
            message:
                "node `write` asked the model a request at step 1 that the original never made"
                    .into(),
            request: Some(RequestDiff {
                original_found: true,
                system: Some(side(Some("be brief"), None)),
                messages: vec![MessageDiff {
                    index: 0,
                    role: side(Some("user"), Some("user")),
                    text: side(Some("Summarize"), Some("Sum up")),
                    diff: "-Summarize\n+Sum up\n".into(),
                }],
                tools_added: vec!["bash".into()],
                tools_removed: vec!["read".into()],
                tools_changed: vec!["grep".into()],
            }),
        }),
        stopped: true,
        nodes: vec![NodeCompared {
            node_id: "write".into(),
            iteration: 0,
            status: Side {
                original: "finished".into(),
                replay: "failed".into(),
            },
            output: Side {
                original: Some(json!("done")),
                replay: None,
            },
            error: Side {
                original: None,
                replay: Some(json!({"kind": "replay_diverged", "message": "..."})),
            },
            same: false,
        }],
        output: Side {
            original: Some(json!("done")),
            replay: None,
        },
        same_output: false,
    }
}

/// What every error answer may be.
fn error_samples() -> Vec<Value> {
    vec![
        to_json(ErrorBody {
            error: ErrorInfo {
                code: "invalid_workflow".into(),
                message: "not valid".into(),
                details: Some(to_json(vec![ProblemLocation {
                    file: "w.yaml".into(),
                    line: Some(3),
                    column: None,
                    field: Some("nodes[0]".into()),
                }])),
            },
        }),
        to_json(ErrorBody {
            error: ErrorInfo {
                code: "not_found".into(),
                message: "no run `x`".into(),
                details: None,
            },
        }),
    ]
}

#[test]
fn the_document_and_the_types_agree_both_ways() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let bodies = documented_bodies(&doc);
    let mut c = Checker {
        doc,
        seen: BTreeSet::new(),
    };
    let mut errs = Vec::new();
    let samples = samples();
    let sampled: BTreeSet<&str> = samples.iter().map(|(k, _)| *k).collect();
    for (key, v) in &samples {
        match bodies.get(*key) {
            Some(loc) => c.check(v, loc, key, &mut errs),
            None => errs.push(format!("{key}: a sample for a body the document lacks")),
        }
    }
    let error_ref = json!({"$ref": "#/components/schemas/Error"});
    for (key, loc) in &bodies {
        if *c.schema(loc) == error_ref {
            for v in error_samples() {
                c.check(&v, loc, key, &mut errs);
            }
        } else if !sampled.contains(key.as_str()) {
            errs.push(format!(
                "{key}: documented, but no type's sample answers it"
            ));
        }
    }
    let mut documented = BTreeSet::new();
    let mut visited = BTreeSet::new();
    for loc in bodies.values() {
        c.documented(loc, &mut documented, &mut visited);
    }
    // The document itself, served at /openapi.json, is not an API type.
    let openapi = bodies["GET /openapi.json 200"].clone();
    for loc in documented.difference(&c.seen) {
        if !loc.starts_with(&openapi) {
            errs.push(format!("{loc}: documented, but no type sends it"));
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// The checker itself: a field more, a field less, a wrong type.
#[test]
fn the_checker_catches_what_it_is_for() {
    let doc = json!({"components": {"schemas": {"S": {
        "type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "string"}}
    }}}});
    let mut c = Checker {
        doc,
        seen: BTreeSet::new(),
    };
    let loc = "/components/schemas/S";
    let errors = |c: &mut Checker, v: Value| {
        let mut errs = Vec::new();
        c.check(&v, loc, "s", &mut errs);
        errs
    };
    assert!(errors(&mut c, json!({"a": 1})).is_empty());
    assert_eq!(errors(&mut c, json!({"a": 1, "z": 2})).len(), 1);
    assert_eq!(errors(&mut c, json!({"b": "x"})).len(), 1);
    assert_eq!(errors(&mut c, json!({"a": -1})).len(), 1);
    assert_eq!(errors(&mut c, json!({"a": "1"})).len(), 1);
    // A property no sample sent is what the coverage check reports.
    c.seen.clear();
    assert!(errors(&mut c, json!({"a": 1})).is_empty());
    let mut documented = BTreeSet::new();
    c.documented(loc, &mut documented, &mut BTreeSet::new());
    let unsent: Vec<&String> = documented.difference(&c.seen).collect();
    assert_eq!(unsent, ["/components/schemas/S/properties/b"]);
}

/// A run id of the examples.
fn rid(text: &str) -> cairn_events::RunId {
    cairn_events::RunId::parse(text).unwrap()
}
