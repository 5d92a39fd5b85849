//! An event's JSON without the envelope its columns already hold, and the
//! same JSON rebuilt from the columns and that rest, byte for byte.
//!
//! Every event begins `{"type":…,"runId":…,"seq":…,"timestampMs":…` and,
//! for a node's event, `,"nodeId":…` ([`cairn_events::Event::to_json`]
//! writes them first, in this order). A store keeps those fields in columns
//! anyway, to index them; repeating them in the stored text took about 95 of
//! a value node's 121-byte event. A backend stores [`Envelope::body`]
//! instead of the JSON and gives readers [`Envelope::json`] of it, which is
//! exactly the text it was given: what the NDJSON mirror, SSE and WebSocket
//! carry.
//!
//! A body is the JSON's tail after the envelope: `}` for an event with no
//! other field, or `,"iteration":0,…}`. Text that does not begin with the
//! envelope its columns name (a row written by hand, a JSON of another
//! writer) is kept whole behind [`VERBATIM`]. Either form begins with a
//! byte no other form and no JSON text begins with, so a body read back is
//! never taken for the other form: anything else is [`BadBody`].

use std::borrow::Cow;
use std::fmt::Write as _;

/// The first byte of a body that holds its event's whole JSON, because the
/// JSON did not begin with the envelope of its columns.
pub const VERBATIM: char = '=';

/// The columns of an event that its JSON's envelope repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// `type`.
    pub type_name: &'a str,
    /// `runId`.
    pub run_id: &'a str,
    /// `seq`.
    pub seq: u64,
    /// `timestampMs`.
    pub timestamp_ms: i64,
    /// `nodeId`, for a node's event.
    pub node_id: Option<&'a str>,
}

/// The event a backend reads back from one row: its envelope's columns and
/// its stored body, the JSON rebuilt by [`Envelope::json`]. Both backends
/// read their rows through this, so a row means the same on either.
pub fn stored_event(
    run_id: &cairn_events::RunId,
    seq: u64,
    type_name: String,
    node_id: Option<String>,
    timestamp_ms: i64,
    body: &str,
) -> Result<crate::StoredEvent, BadBody> {
    let json = Envelope {
        type_name: &type_name,
        run_id,
        seq,
        timestamp_ms,
        node_id: node_id.as_deref(),
    }
    .json(body)?;
    Ok(crate::StoredEvent {
        run_id: run_id.clone(),
        seq,
        type_name,
        node_id: node_id.map(cairn_events::NodePath::from),
        timestamp_ms,
        json: json.into(),
    })
}

/// A stored body that is neither form [`Envelope::body`] writes: the row
/// was damaged or written by something else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the stored event text {0}")]
pub struct BadBody(String);

impl<'a> Envelope<'a> {
    /// The envelope's JSON text: the event's opening brace and the fields
    /// its columns hold, in the contract's order, written exactly as
    /// serde_json writes them.
    fn write_prefix(&self, out: &mut String) {
        out.push_str("{\"type\":");
        push_json_str(out, self.type_name);
        out.push_str(",\"runId\":");
        push_json_str(out, self.run_id);
        // Integers are written alike by serde_json and `Display`.
        let _ = write!(
            out,
            ",\"seq\":{},\"timestampMs\":{}",
            self.seq, self.timestamp_ms
        );
        if let Some(node) = self.node_id {
            out.push_str(",\"nodeId\":");
            push_json_str(out, node);
        }
    }

    /// What to store of `json`, the event's text: its tail after this
    /// envelope when it begins with it (borrowed, no copy), or the whole
    /// text behind [`VERBATIM`].
    pub fn body<'j>(&self, json: &'j str) -> Cow<'j, str> {
        let mut prefix = String::with_capacity(64 + self.run_id.len());
        self.write_prefix(&mut prefix);
        match json.strip_prefix(prefix.as_str()) {
            Some(rest) if rest.starts_with([',', '}']) => Cow::Borrowed(rest),
            _ => {
                let mut whole = String::with_capacity(json.len() + 1);
                whole.push(VERBATIM);
                whole.push_str(json);
                Cow::Owned(whole)
            }
        }
    }

    /// The event's JSON from a stored `body`: exactly the text
    /// [`Envelope::body`] was given.
    pub fn json(&self, body: &str) -> Result<String, BadBody> {
        match body.as_bytes().first() {
            Some(b',' | b'}') => {
                let mut json = String::with_capacity(64 + self.run_id.len() + body.len());
                self.write_prefix(&mut json);
                json.push_str(body);
                Ok(json)
            }
            Some(_) if body.starts_with(VERBATIM) => Ok(body[VERBATIM.len_utf8()..].to_string()),
            Some(_) => Err(BadBody(format!(
                "begins with {:?}, which no stored form begins with",
                body.chars().next().unwrap_or_default()
            ))),
            None => Err(BadBody("is empty".into())),
        }
    }
}

/// Appends `s` as a JSON string, escaped exactly as serde_json escapes it.
fn push_json_str(out: &mut String, s: &str) {
    // Ids rarely hold what needs escaping; serde_json writes the rest.
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(&serde_json::to_string(s).expect("strings always serialize"));
    } else {
        out.push('"');
        out.push_str(s);
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{Event, EventType, Scope};
    use serde_json::{json, Value};

    /// The fields an event of type `t` needs besides its envelope, and an
    /// optional one where the type has one, so that every type is stored
    /// with its own fields. Every type has its arm: a new one must get a
    /// sample here.
    fn fields(t: EventType) -> Value {
        use EventType as T;
        let error = json!({"kind": "k", "message": "m", "details": {"x": [1, 2]}});
        match t {
            T::RunStarted => json!({"workflow": "w", "workflowHash": "h", "resumed": false,
                "depth": 0, "input": {"a": "ü"}, "forkedFrom": {"runId": "r0", "seq": 3}}),
            T::RunStatusChanged => json!({"status": "waiting-input"}),
            T::RunCancelRequested => json!({"mechanism": "graceful", "reason": "r"}),
            T::RunSummary => json!({"durationMs": 5,
                "nodes": {"finished": 1, "failed": 0, "skipped": 0, "cancelled": 0},
                "tokens": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0,
                    "reasoning": 0},
                "costUsd": 0.25, "timings": [{"nodeId": "a", "iteration": 0, "durationMs": 5}]}),
            T::RunFinished => json!({"output": {"k": [null, true, 1.5e300]}, "durationMs": 9}),
            T::RunFailed => json!({"error": error}),
            T::RunCancelled => json!({}),
            T::FrameCommitted => json!({"frameNo": 1, "xmlHash": "ab", "mounted": 3}),
            T::LayerStarted => json!({"layerIndex": 0, "nodeCount": 2}),
            T::LayerFinished => json!({"layerIndex": 0, "durationMs": 1, "succeeded": 1,
                "failed": 0, "skipped": 0, "cancelled": 1}),
            T::EdgeTraversed => json!({"from": "a", "to": "b", "condition": "x > 1"}),
            T::BranchResolved => json!({"chosen": "yes", "candidates": ["yes", "no"]}),
            T::ChapterStarted => json!({"chapter": "c"}),
            T::ChapterFinished => json!({"chapter": "c", "status": "finished"}),
            T::NodePending => json!({"layerIndex": 4}),
            T::NodeStarted => json!({"snapshot": "0123456789abcdef0123456789abcdef01234567"}),
            T::NodeHeartbeat => json!({"elapsedMs": 10, "timeoutMs": 100, "percentElapsed": 0.1}),
            T::NodeOutput => json!({"text": "line\n\t\"quoted\" \\ \u{1} 🙂", "stream": "stdout"}),
            T::NodeFinished => json!({"durationMs": 3, "output": {"v": "é"}, "cached": true}),
            T::NodeFailed => json!({"error": error, "willRetry": true}),
            T::NodeRetrying => json!({"delayMs": 100}),
            T::NodeSkipped => json!({"reason": "when"}),
            T::NodeCancelled => json!({"reason": "unmounted"}),
            T::NodeWaitingApproval => json!({}),
            T::NodeWaitingInput => json!({"requestId": "q1"}),
            T::ApprovalRequested => json!({"message": "ok?"}),
            T::ApprovalGranted | T::ApprovalDenied => json!({"decidedBy": "me", "note": "n"}),
            T::InputRequested => json!({"requestId": "q1", "prompt": "p", "schema": {}}),
            T::InputReceived => json!({"requestId": "q1", "answer": [1], "answeredBy": "me"}),
            T::AgentStepStarted => json!({"step": 1, "model": "m"}),
            T::AgentStepFinished => json!({"step": 1, "toolCalls": 0, "finishReason": "stop",
                "message": {"text": "hi", "toolCalls": []}}),
            T::AgentGenerationRetried => json!({"step": 1, "reason": "r"}),
            T::AgentContextCompacted => json!({"step": 3, "strategy": "summarize",
                "tokensBefore": 9000, "tokensAfter": 2000, "message": "so far"}),
            T::AgentWaiting => json!({"step": 2, "model": "m", "reason": "concurrency",
                "waitMs": 20}),
            T::AgentEvent => json!({"engine": "e", "event": {"raw": ["x"]}}),
            T::TokenUsageReported => json!({"provider": "p", "model": "m", "inputTokens": 1,
                "outputTokens": 2, "costUsd": 0.5}),
            T::ToolCallStarted => json!({"toolName": "t", "toolSeq": 1, "idempotencyKey": "k",
                "sideEffect": true}),
            T::ToolCallFinished => json!({"toolName": "t", "toolSeq": 1, "status": "error",
                "durationMs": 2, "error": error}),
            T::DelegationStarted => json!({"childRunId": "c", "agent": "a", "workflow": "w"}),
            T::DelegationFinished => json!({"childRunId": "c", "status": "finished"}),
            T::McpServerStarting => json!({"server": "s", "command": "c", "args": ["-x"]}),
            T::McpServerConnected => json!({"server": "s", "toolCount": 2, "startMs": 3}),
            T::McpServerStderr => json!({"server": "s", "message": "m"}),
            T::McpServerDisconnected => json!({"server": "s", "reason": "r"}),
            T::NetworkAccess => json!({"action": "blocked", "target": "t", "reason": "r"}),
            T::Diagnostic => json!({"level": "warn", "source": "s", "message": "m"}),
            T::RevertStarted => json!({"snapshot": "s"}),
            T::RevertFinished => json!({"snapshot": "s", "success": false, "error": error}),
            T::WorkflowReloadDetected => json!({"changedFiles": ["a"]}),
            T::WorkflowReloaded => json!({"generation": 2, "changedFiles": []}),
            T::WorkflowReloadFailed => json!({"error": error, "changedFiles": ["a.yaml"]}),
            T::WorkflowReloadUnsafe => json!({"reason": "r", "changedFiles": ["a"]}),
            T::ScorerStarted => json!({"scorerId": "s", "scorerName": "n"}),
            T::ScorerFinished => json!({"scorerId": "s", "scorerName": "n", "score": 0.5}),
            T::ScorerFailed => json!({"scorerId": "s", "scorerName": "n", "error": error}),
            T::RunHijackRequested => json!({"nodeId": "a/b", "requestedBy": "me"}),
            T::RunHijacked => json!({"engine": "e", "mode": "interactive", "resumed": true}),
        }
    }

    /// An event of type `t` in `scope`, made the way events are read.
    fn event(t: EventType, run: &str, seq: u64, ts: i64, scope: &Scope) -> Event {
        let Value::Object(extra) = fields(t) else {
            unreachable!("samples are objects")
        };
        let mut m = serde_json::Map::new();
        m.insert("type".into(), json!(t.as_str()));
        m.insert("runId".into(), json!(run));
        m.insert("seq".into(), json!(seq));
        m.insert("timestampMs".into(), json!(ts));
        m.extend(extra);
        let mut ev = Event::from_json(&Value::Object(m).to_string())
            .unwrap_or_else(|e| panic!("the sample of {t}: {e}"));
        ev.scope = scope.clone();
        ev
    }

    /// Stores an event's JSON as a backend does and reads it back.
    fn round_trip(ev: &Event) -> (String, bool) {
        let json = ev.to_json();
        let env = Envelope {
            type_name: ev.type_name(),
            run_id: &ev.run_id,
            seq: ev.seq.get(),
            timestamp_ms: ev.timestamp_ms,
            node_id: ev.scope.node_id.as_deref(),
        };
        let body = env.body(&json);
        let stripped = !body.starts_with(VERBATIM);
        (env.json(&body).expect("a body read back"), stripped)
    }

    const NODE_IDS: &[&str] = &[
        "a",
        "loop/3/step",
        "ünï/cødé/🙂",
        "quote\"back\\slash",
        "ctl\u{0}\u{1f}\n\t\u{7f}",
        "",
        " spaced  ",
        "\u{2028}\u{2029}",
    ];

    #[test]
    fn every_event_type_reads_back_byte_for_byte_without_its_envelope_stored() {
        let scopes: Vec<Scope> = std::iter::once(Scope::run())
            .chain(NODE_IDS.iter().map(|n| {
                Scope::node(*n, 7)
                    .with_attempt(2)
                    .with_chapter(Some("stage ü".into()))
            }))
            .chain([Scope::node("n1", 0)])
            .collect();
        let runs = ["r", "run-01:a.b_c", &"x".repeat(128)];
        let stamps = [0, 1, -1, i64::MAX, i64::MIN, 1_764_000_000_000];
        let seqs = [1, 2, u64::from(u32::MAX) + 1, u64::MAX];
        let mut n = 0;
        for &t in EventType::ALL {
            for scope in &scopes {
                for (i, run) in runs.iter().enumerate() {
                    let (seq, ts) = (seqs[(n + i) % seqs.len()], stamps[n % stamps.len()]);
                    n += 1;
                    let ev = event(t, run, seq, ts, scope);
                    let (back, stripped) = round_trip(&ev);
                    assert_eq!(back, ev.to_json(), "{t} in {scope:?}");
                    assert!(stripped, "{t}: the envelope is stored once, in columns");
                }
            }
        }
    }

    proptest::proptest! {
        /// Any node id, chapter, run id of the allowed characters, seq,
        /// timestamp and output text: the JSON read back is the event's.
        #[test]
        fn any_event_reads_back_byte_for_byte(
            node in proptest::option::of(".{0,40}"),
            chapter in proptest::option::of(".{0,10}"),
            run in "[A-Za-z0-9][A-Za-z0-9._:-]{0,127}",
            seq: u64,
            ts: i64,
            text in ".{0,200}",
            type_at in 0usize..1000,
        ) {
            let t = EventType::ALL[type_at % EventType::ALL.len()];
            let scope = Scope { node_id: node.map(Into::into), iteration: Some(1),
                attempt: None, chapter };
            let mut ev = event(t, &run, seq, ts, &scope);
            if let cairn_events::EventKind::NodeOutput { text: t, .. } = &mut ev.kind {
                *t = text;
            }
            let (back, stripped) = round_trip(&ev);
            proptest::prop_assert_eq!(back, ev.to_json());
            proptest::prop_assert!(stripped);
        }
    }

    #[test]
    fn a_large_payload_reads_back_and_is_not_copied_to_be_stored() {
        let mut ev = event(EventType::NodeOutput, "r", 5, 9, &Scope::node("a", 0));
        let cairn_events::EventKind::NodeOutput { text, .. } = &mut ev.kind else {
            unreachable!()
        };
        *text = "ü\"\\\n".repeat(1 << 18);
        let json = ev.to_json();
        let env = Envelope {
            type_name: "NodeOutput",
            run_id: "r",
            seq: 5,
            timestamp_ms: 9,
            node_id: Some("a"),
        };
        let body = env.body(&json);
        assert!(matches!(body, Cow::Borrowed(_)));
        // `{"type":"NodeOutput","runId":"r","seq":5,"timestampMs":9,"nodeId":"a"`
        assert_eq!(body.len() + 69, json.len());
        assert_eq!(env.json(&body).unwrap(), json);
    }

    #[test]
    fn text_that_does_not_begin_with_its_columns_envelope_is_kept_whole() {
        let env = Envelope {
            type_name: "NodeStarted",
            run_id: "r",
            seq: 2,
            timestamp_ms: 3,
            node_id: Some("a"),
        };
        for json in [
            // Another run, seq, node, type; no node where the columns name one.
            r#"{"type":"NodeStarted","runId":"q","seq":2,"timestampMs":3,"nodeId":"a"}"#,
            r#"{"type":"NodeStarted","runId":"r","seq":20,"timestampMs":3,"nodeId":"a"}"#,
            r#"{"type":"NodeStarted","runId":"r","seq":2,"timestampMs":3,"nodeId":"ab"}"#,
            r#"{"type":"NodeFinished","runId":"r","seq":2,"timestampMs":3,"nodeId":"a"}"#,
            r#"{"type":"NodeStarted","runId":"r","seq":2,"timestampMs":3}"#,
            // Spaced, or not JSON at all.
            r#"{ "type":"NodeStarted","runId":"r","seq":2,"timestampMs":3,"nodeId":"a"}"#,
            "{}",
            "",
            "=already marked",
            ",}",
        ] {
            let body = env.body(json);
            assert!(body.starts_with(VERBATIM), "{json}");
            assert_eq!(env.json(&body).unwrap(), json);
        }
        // A node's event stored without the node: its nodeId stays in the body.
        let no_node = Envelope {
            node_id: None,
            ..env
        };
        let json = r#"{"type":"NodeStarted","runId":"r","seq":2,"timestampMs":3,"nodeId":"a"}"#;
        let body = no_node.body(json);
        assert_eq!(body, r#","nodeId":"a"}"#);
        assert_eq!(no_node.json(&body).unwrap(), json);
    }

    #[test]
    fn a_body_of_neither_form_is_an_error_not_a_panic() {
        let env = Envelope {
            type_name: "RunCancelled",
            run_id: "r",
            seq: 1,
            timestamp_ms: 0,
            node_id: None,
        };
        for body in ["", "{", "x", "ü", "\u{0}", " ,", "\"a\""] {
            let e = env.json(body).unwrap_err();
            assert!(e.to_string().starts_with("the stored event text "), "{e}");
        }
        // Only the form's first byte is checked: a damaged tail still comes
        // back as text, which decoding the event then refuses.
        assert_eq!(
            env.json("}}").unwrap(),
            r#"{"type":"RunCancelled","runId":"r","seq":1,"timestampMs":0}}"#
        );
        assert!(Event::from_json(&env.json(",\"x").unwrap()).is_err());
    }

    #[test]
    fn a_value_nodes_events_store_little_besides_their_columns() {
        let scope = Scope::node("n41", 0).with_attempt(1);
        let mut ev = event(
            EventType::NodeFinished,
            "01JDQ7ZK3V8W6R9M2X4C5B7N0P",
            3,
            1,
            &scope,
        );
        ev.kind = cairn_events::EventKind::NodeFinished {
            duration_ms: 0,
            output: Some(json!(41).into()),
            cached: None,
            snapshot: None,
        };
        let json = ev.to_json();
        let env = Envelope {
            type_name: ev.type_name(),
            run_id: &ev.run_id,
            seq: 3,
            timestamp_ms: 1,
            node_id: Some("n41"),
        };
        assert_eq!(
            env.body(&json),
            r#","iteration":0,"attempt":1,"durationMs":0,"output":41}"#
        );
    }
}
