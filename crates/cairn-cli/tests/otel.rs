//! Runs exported as OpenTelemetry traces: the real `cairn` binary sends
//! OTLP/HTTP requests to a receiver in this process, which decodes each one
//! as an `ExportTraceServiceRequest`. One trace per root run, spans with
//! their parents and attributes, child runs in their root's trace, a run
//! killed and resumed as one trace with stable ids, a busy receiver
//! retried, a silent one that does not hold the run, and settings Cairn
//! cannot use refused.

mod common;
use common::*;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cairn_otel::proto::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use cairn_otel::proto::common::v1::any_value::Value as Any;
use cairn_otel::proto::trace::v1::{status::StatusCode as Code, Span};
use prost::Message;

/// How the receiver answers.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// 200 with an empty `ExportTraceServiceResponse`.
    Accept,
    /// 503 with `Retry-After: 1` to the first N requests, then as `Accept`.
    BusyFirst(usize),
    /// Takes the request and never answers.
    Silent,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Got {
    content_type: Option<String>,
    tenant: Option<String>,
    body: Vec<u8>,
    /// What the receiver answered.
    answered: u16,
}

#[derive(Clone)]
struct Shared {
    mode: Mode,
    seen: Arc<AtomicUsize>,
    got: Arc<Mutex<Vec<Got>>>,
}

async fn traces(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let n = s.seen.fetch_add(1, Ordering::SeqCst);
    let header = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let answered = match s.mode {
        Mode::Silent => 0,
        Mode::BusyFirst(k) if n < k => 503,
        _ => 200,
    };
    s.got.lock().unwrap().push(Got {
        content_type: header("content-type"),
        tenant: header("x-tenant"),
        body: body.to_vec(),
        answered,
    });
    match answered {
        0 => std::future::pending::<Response>().await,
        503 => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            "busy",
        )
            .into_response(),
        _ => (
            StatusCode::OK,
            [("content-type", "application/x-protobuf")],
            ExportTraceServiceResponse::default().encode_to_vec(),
        )
            .into_response(),
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1, on a runtime of its own.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
    _rt: tokio::runtime::Runtime,
}

impl Receiver {
    fn start(mode: Mode) -> Receiver {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let shared = Shared {
            mode,
            seen: Arc::new(AtomicUsize::new(0)),
            got: Arc::new(Mutex::new(Vec::new())),
        };
        let got = shared.got.clone();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(traces))
            .with_state(shared);
        rt.spawn(async move { axum::serve(listener, app).await });
        Receiver { url, got, _rt: rt }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Every span of every request it accepted, in arrival order.
    fn spans(&self) -> Vec<Span> {
        self.got()
            .iter()
            .filter(|g| g.answered == 200)
            .flat_map(|g| {
                let req = ExportTraceServiceRequest::decode(g.body.as_slice())
                    .expect("a valid ExportTraceServiceRequest");
                req.resource_spans
                    .into_iter()
                    .flat_map(|r| r.scope_spans)
                    .flat_map(|s| s.spans)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The latest version of each span (a run exported at a wait and again
    /// at its end sends its spans twice, with the same ids).
    fn latest(&self) -> Vec<Span> {
        let mut by_id: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut out: Vec<Span> = Vec::new();
        for s in self.spans() {
            match by_id.get(&s.span_id) {
                Some(&i) => out[i] = s,
                None => {
                    by_id.insert(s.span_id.clone(), out.len());
                    out.push(s);
                }
            }
        }
        out
    }

    /// Waits until `done` holds of the spans received.
    fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let t0 = Instant::now();
        loop {
            let spans = self.latest();
            if done(&spans) {
                return spans;
            }
            assert!(
                t0.elapsed() < PATIENCE,
                "{what}: not received within {PATIENCE:?}; got {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `cairn ARGS` in `dir` with the store `dir/.cairn/cairn.db`, none of the
/// caller's `OTEL_*` settings, and these instead.
fn cairn(dir: &Path, args: &[&str], otel: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    c.current_dir(dir)
        .args(args)
        .args(["--store", ".cairn/cairn.db"])
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            c.env_remove(k);
        }
    }
    for (k, v) in otel {
        c.env(k, v);
    }
    c
}

/// Runs a `cairn` command to its end (within [`PATIENCE`]).
fn output(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child);
    let mut out = child.wait_with_output().unwrap();
    out.status = status;
    out
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a Any> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn int(s: &Span, key: &str) -> Option<i64> {
    match attr(s, key) {
        Some(Any::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn string<'a>(s: &'a Span, key: &str) -> Option<&'a str> {
    match attr(s, key) {
        Some(Any::StringValue(v)) => Some(v),
        _ => None,
    }
}

fn flag(s: &Span, key: &str) -> Option<bool> {
    match attr(s, key) {
        Some(Any::BoolValue(b)) => Some(*b),
        _ => None,
    }
}

fn code(s: &Span) -> Option<Code> {
    s.status
        .as_ref()
        .and_then(|st| Code::try_from(st.code).ok())
}

/// The spans named `name` of run `run`.
fn of<'a>(spans: &'a [Span], run: &str, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.name == name && string(s, "cairn.run.id") == Some(run))
        .collect()
}

fn one<'a>(spans: &'a [Span], run: &str, name: &str) -> &'a Span {
    let found = of(spans, run, name);
    assert_eq!(found.len(), 1, "{name} of {run}: {found:?}");
    found[0]
}

const TRACED: &str = r#"
name: traced
models:
  s:
    provider: scripted
    script: turns.yaml
    price: { input: 3.00, output: 15.00 }
sandbox:
  root: .
  network: false
nodes:
  - id: flaky
    command: ["sh", "-c", "if [ -e tried ]; then echo ok; else touch tried; exit 3; fi"]
    retry: { attempts: 2, delay: 10ms }
  - id: agent
    needs: [flaky]
    agent:
      model: s
      prompt: Read the note and say what it says.
      tools: [read]
  - id: sub
    needs: [agent]
    workflow: child.yaml
output: "{{ nodes.sub.output }}"
"#;

const TURNS: &str = r#"
turns:
  - text: Reading the note.
    tool_calls:
      - { name: read, args: { path: note.txt } }
    usage: { input: 120, output: 30 }
  - text: The note says hello.
    usage: { input: 200, output: 10 }
"#;

const CHILD: &str = r#"
name: child
nodes:
  - id: hello
    command: ["echo", "hi"]
"#;

const FAILING: &str = r#"
name: failing
nodes:
  - id: bad
    command: ["sh", "-c", "echo no >&2; exit 7"]
"#;

const QUICK: &str = r#"
name: quick
nodes:
  - id: only
    command: ["echo", "hi"]
"#;

fn endpoint(r: &Receiver) -> (&'static str, String) {
    ("OTEL_EXPORTER_OTLP_ENDPOINT", r.url.clone())
}

#[test]
fn a_run_is_one_trace_of_run_attempt_model_and_tool_spans_with_its_child_inside() {
    let receiver = Receiver::start(Mode::Accept);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("traced.yaml"), TRACED).unwrap();
    std::fs::write(dir.join("turns.yaml"), TURNS).unwrap();
    std::fs::write(dir.join("child.yaml"), CHILD).unwrap();
    std::fs::write(dir.join("note.txt"), "hello\n").unwrap();
    let (k, url) = endpoint(&receiver);
    let out = output(cairn(
        dir,
        &["run", "traced.yaml", "--run-id", "t1"],
        &[
            (k, &url),
            ("OTEL_SERVICE_NAME", "cairn-test"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team%20a"),
        ],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        text(&out)
    );

    // Requests as OTLP/HTTP wants them, with the configured header and
    // resource.
    let got = receiver.got();
    assert!(!got.is_empty());
    for g in &got {
        assert_eq!(g.content_type.as_deref(), Some("application/x-protobuf"));
        assert_eq!(g.tenant.as_deref(), Some("team a"));
        let req = ExportTraceServiceRequest::decode(g.body.as_slice()).unwrap();
        let resource = req.resource_spans[0].resource.as_ref().unwrap();
        assert!(resource.attributes.iter().any(|a| a.key == "service.name"
            && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()), Some(Any::StringValue(s)) if s == "cairn-test")));
    }

    let spans = receiver.latest();
    // One trace for the root run and its child.
    let traces: BTreeSet<&Vec<u8>> = spans.iter().map(|s| &s.trace_id).collect();
    assert_eq!(traces.len(), 1, "{spans:#?}");
    let ids: BTreeSet<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
    for s in &spans {
        assert!(
            s.parent_span_id.is_empty() || ids.contains(&s.parent_span_id),
            "{} hangs from a span that was not sent",
            s.name
        );
        assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
    }

    let run = one(&spans, "t1", "run traced");
    assert!(run.parent_span_id.is_empty());
    assert_eq!(code(run), Some(Code::Ok));
    assert_eq!(string(run, "cairn.run.status"), Some("finished"));
    assert_eq!(string(run, "cairn.workflow"), Some("traced"));
    assert_eq!(int(run, "cairn.usage.input_tokens"), Some(320));

    // The retried node: two attempts, the first failed and retried.
    let flaky = of(&spans, "t1", "node flaky");
    assert_eq!(flaky.len(), 2);
    let first = flaky
        .iter()
        .find(|s| int(s, "cairn.node.attempt") == Some(1))
        .unwrap();
    let second = flaky
        .iter()
        .find(|s| int(s, "cairn.node.attempt") == Some(2))
        .unwrap();
    assert_eq!(code(first), Some(Code::Error));
    assert_eq!(flag(first, "cairn.will_retry"), Some(true));
    assert!(string(first, "cairn.error.kind").is_some());
    assert!(!first.status.as_ref().unwrap().message.is_empty());
    assert_eq!(code(second), Some(Code::Ok));
    for a in &flaky {
        assert_eq!(a.parent_span_id, run.span_id);
    }

    // The agent: its attempt, two model calls and a tool call under it.
    let agent = one(&spans, "t1", "node agent");
    assert_eq!(agent.parent_span_id, run.span_id);
    let models = of(&spans, "t1", "chat s");
    assert_eq!(
        models.len(),
        2,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let mut inputs: Vec<i64> = models
        .iter()
        .map(|m| {
            assert_eq!(m.parent_span_id, agent.span_id);
            assert_eq!(string(m, "gen_ai.operation.name"), Some("chat"));
            assert_eq!(string(m, "gen_ai.provider.name"), Some("scripted"));
            assert!(matches!(attr(m, "cairn.cost_usd"), Some(Any::DoubleValue(c)) if *c > 0.0));
            int(m, "gen_ai.usage.input_tokens").unwrap()
        })
        .collect();
    inputs.sort();
    assert_eq!(inputs, vec![120, 200]);
    let read = one(&spans, "t1", "execute_tool read");
    assert_eq!(read.parent_span_id, agent.span_id);
    assert_eq!(int(read, "cairn.tool.seq"), Some(1));
    assert_eq!(string(read, "cairn.tool.status"), Some("success"));
    assert_eq!(flag(read, "cairn.tool.side_effect"), Some(false));
    assert!(string(read, "cairn.tool.idempotency_key").is_some_and(|k| !k.is_empty()));

    // The child run: its run span hangs from the `sub` attempt that
    // started it, in the same trace.
    let sub = one(&spans, "t1", "node sub");
    let child = spans
        .iter()
        .find(|s| s.name == "run child")
        .expect("the child run's span");
    assert_eq!(child.parent_span_id, sub.span_id);
    assert_eq!(child.trace_id, run.trace_id);
    assert_eq!(string(child, "cairn.run.parent_id"), Some("t1"));
    let child_id = string(child, "cairn.run.id").unwrap();
    let hello = one(&spans, child_id, "node hello");
    assert_eq!(hello.parent_span_id, child.span_id);

    // Through a server of the same store: the same spans, byte for byte,
    // built from the events and child runs the API gives; and sent.
    let local = output(cairn(dir, &["trace", "t1", "--print"], &[]));
    assert_eq!(local.status.code(), Some(0), "{}", text(&local));
    let port = free_port();
    let mut server = serve(dir, &["--store", ".cairn/cairn.db"], port);
    wait_until("the server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let server_url = format!("http://127.0.0.1:{port}");
    let elsewhere = tempfile::tempdir().unwrap();
    let remote = |args: &[&str], otel: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        c.current_dir(elsewhere.path())
            .args(args)
            .args(["--server", &server_url])
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_TOKEN")
            .stdin(Stdio::null());
        for (k, _) in std::env::vars() {
            if k.starts_with("OTEL_") {
                c.env_remove(k);
            }
        }
        for (k, v) in otel {
            c.env(k, v);
        }
        output(c)
    };
    let printed = remote(&["trace", "t1", "--print"], &[]);
    assert_eq!(printed.status.code(), Some(0), "{}", text(&printed));
    assert!(!local.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        String::from_utf8_lossy(&local.stdout)
    );
    let before = receiver.got().len();
    let sent = remote(&["trace", "t1"], &[(k, &url)]);
    assert_eq!(sent.status.code(), Some(0), "{}", text(&sent));
    assert!(
        String::from_utf8_lossy(&sent.stderr).contains("of 2 runs"),
        "{}",
        text(&sent)
    );
    assert!(receiver.got().len() > before);
    let nope = remote(&["trace", "nope", "--print"], &[]);
    assert_eq!(nope.status.code(), Some(4), "{}", text(&nope));
    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    wait_exit(&mut server);
}

#[test]
fn a_failed_node_and_its_run_are_errors_and_a_busy_receiver_is_retried() {
    let receiver = Receiver::start(Mode::BusyFirst(1));
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("failing.yaml"), FAILING).unwrap();
    let (k, url) = endpoint(&receiver);
    let out = output(cairn(
        dir,
        &["run", "failing.yaml", "--run-id", "f1"],
        &[(k, &url)],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        text(&out)
    );

    // Answered 503 (Retry-After: 1), then the same request again.
    let got = receiver.got();
    assert_eq!(
        got.iter().map(|g| g.answered).collect::<Vec<_>>(),
        vec![503, 200]
    );
    assert_eq!(got[0].body, got[1].body);

    let spans = receiver.latest();
    let bad = one(&spans, "f1", "node bad");
    assert_eq!(code(bad), Some(Code::Error));
    assert_eq!(flag(bad, "cairn.will_retry"), Some(false));
    assert_eq!(string(bad, "cairn.node.status"), Some("failed"));
    assert!(string(bad, "cairn.error.message").is_some());
    let run = one(&spans, "f1", "run failing");
    assert_eq!(code(run), Some(Code::Error));
    assert_eq!(string(run, "cairn.run.status"), Some("failed"));
    assert!(string(run, "cairn.error.kind").is_some());
}

#[test]
fn a_run_killed_and_resumed_is_one_whole_trace_with_stable_ids() {
    let receiver = Receiver::start(Mode::Accept);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(
        dir.join("slow.yaml"),
        r#"
name: slow
nodes:
  - id: first
    command: ["echo", "one"]
  - id: slow
    needs: [first]
    command: ["sh", "-c", "if [ -e started ]; then echo done; else touch started; sleep 30; fi"]
"#,
    )
    .unwrap();
    let (k, url) = endpoint(&receiver);
    let mut first: Child = cairn(dir, &["run", "slow.yaml", "--run-id", "k1"], &[(k, &url)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.join("started").exists() {
        assert!(t0.elapsed() < PATIENCE, "the slow node never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap(); // SIGKILL: nothing is exported by this session
    wait_exit(&mut first);
    let out = output(cairn(dir, &["resume", "k1"], &[(k, &url)]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let spans = receiver.latest();
    let traces: BTreeSet<&Vec<u8>> = spans.iter().map(|s| &s.trace_id).collect();
    assert_eq!(traces.len(), 1);
    let run = one(&spans, "k1", "run slow");
    assert_eq!(int(run, "cairn.run.sessions"), Some(2));
    assert!(run.events.iter().any(|e| e.name == "run resumed"));
    assert_eq!(code(run), Some(Code::Ok));
    assert_eq!(one(&spans, "k1", "node first").parent_span_id, run.span_id);
    let slow = of(&spans, "k1", "node slow");
    assert_eq!(slow.len(), 2, "the interrupted attempt and the one after");
    let cut = slow
        .iter()
        .find(|s| flag(s, "cairn.node.interrupted") == Some(true))
        .expect("the interrupted attempt");
    assert_eq!(string(cut, "cairn.error.kind"), Some("interrupted"));
    assert!(slow.iter().any(|s| code(s) == Some(Code::Ok)));

    // Printed twice: the same spans, and the ids the resume sent.
    let print = || {
        let out = output(cairn(dir, &["trace", "k1", "--print"], &[]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let once = print();
    assert_eq!(once, print());
    let printed: Vec<serde_json::Value> = once
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let printed_ids: BTreeSet<String> = printed
        .iter()
        .flat_map(|r| {
            r["resourceSpans"][0]["scopeSpans"][0]["spans"]
                .as_array()
                .unwrap()
                .clone()
        })
        .map(|s| s["spanId"].as_str().unwrap().to_string())
        .collect();
    let sent_ids: BTreeSet<String> = spans
        .iter()
        .map(|s| s.span_id.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    assert_eq!(printed_ids, sent_ids);

    // `cairn trace` sends them again, with the same ids.
    let before = receiver.got().len();
    let out = output(cairn(dir, &["trace", "k1"], &[(k, &url)]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exported"),
        "{}",
        text(&out)
    );
    assert!(receiver.got().len() > before);
    let again: BTreeSet<Vec<u8>> = receiver.latest().into_iter().map(|s| s.span_id).collect();
    assert_eq!(again.len(), sent_ids.len());

    // Without an endpoint there is nowhere to send; an unknown run is bad
    // input too.
    let out = output(cairn(dir, &["trace", "k1"], &[]));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let out = output(cairn(dir, &["trace", "nope", "--print"], &[]));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
}

#[test]
fn a_receiver_that_never_answers_does_not_hold_the_run_past_the_timeout() {
    let receiver = Receiver::start(Mode::Silent);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("quick.yaml"), QUICK).unwrap();
    let (k, url) = endpoint(&receiver);
    let t0 = Instant::now();
    let out = output(cairn(
        dir,
        &["run", "quick.yaml", "--run-id", "q1"],
        &[(k, &url), ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
    ));
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!receiver.got().is_empty(), "the export was tried");
    // The run itself takes a fraction of a second; the export adds at most
    // its timeout.
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        text(&out)
    );
}

#[test]
fn settings_cairn_cannot_use_are_clear_errors_and_none_means_off() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("quick.yaml"), QUICK).unwrap();
    let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9");
    let out = output(cairn(
        dir,
        &["run", "quick.yaml"],
        &[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
    ));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && err.contains("http/protobuf"),
        "{err}"
    );
    assert!(
        !dir.join(".cairn").exists(),
        "nothing ran, no store was made"
    );
    let out = output(cairn(
        dir,
        &["run", "quick.yaml"],
        &[on, ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")],
    ));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    // Turned off: nothing is sent, nothing waits (port 9 would refuse).
    for off in [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_TRACES_EXPORTER", "none"),
    ] {
        let out = output(cairn(dir, &["run", "quick.yaml"], &[on, off]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("warning"),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn cairn_serve_exports_the_runs_it_drives() {
    let receiver = Receiver::start(Mode::Accept);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("quick.yaml"), QUICK).unwrap();
    let port = free_port();
    let mut server = cairn(
        dir,
        &[
            "serve",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--workflows",
            ".",
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str())],
    )
    .env_remove("CAIRN_TOKEN")
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let run = rt.block_on(async {
        cairn_client::wait_healthy(&url, PATIENCE).await.unwrap();
        let client = cairn_client::Client::new(&url, None).unwrap();
        client
            .post_json("/v1/runs", &serde_json::json!({"workflow": "quick"}))
            .await
            .unwrap()["runId"]
            .as_str()
            .unwrap()
            .to_string()
    });
    let spans = receiver.wait_for("the served run's trace", |spans| {
        of(spans, &run, "run quick")
            .first()
            .is_some_and(|s| string(s, "cairn.run.status") == Some("finished"))
    });
    let root = one(&spans, &run, "run quick");
    assert_eq!(one(&spans, &run, "node only").parent_span_id, root.span_id);
    let _ = server.kill();
    wait_exit(&mut server);
}
