//! The HTTP API over a real socket: runs started, approved and cancelled
//! over HTTP, bad requests answered with clear errors, the OpenAPI document
//! matching the routes.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const GATED: &str = r#"
name: gated
nodes:
  - id: first
    value: { n: 1 }
  - id: gate
    needs: [first]
    approval: "Go on?"
  - id: after
    needs: [gate]
    command: ["sh", "-c", "echo done"]
"#;

async fn status_of(c: &cairn_client::Client, run: &str) -> String {
    c.run(&run_id(run)).await.unwrap()["status"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

async fn wait_status(c: &cairn_client::Client, run: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = status_of(c, run).await;
        if s == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {run} stuck at {s}, wanted {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn collect(mut s: cairn_client::EventStream) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(line) = s.next_event().await {
        out.push(line.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_watch_reconnect_and_approve_over_http() {
    let srv = TestServer::start(Some("sekret")).await;
    srv.workflow("gated", GATED);
    let c = srv.client();
    let started = c
        .post_json("/v1/runs", &json!({"workflow": "gated", "input": {}}))
        .await
        .unwrap();
    let run = started["runId"].as_str().unwrap().to_string();

    // One watcher reads the whole run; another drops after three events and
    // comes back with Last-Event-ID.
    let whole = tokio::spawn(collect(c.events(&run_id(&run), 0, false).await.unwrap()));
    let mut partial = c.events(&run_id(&run), 0, false).await.unwrap();
    let mut pieces = Vec::new();
    for _ in 0..3 {
        pieces.push(partial.next_event().await.unwrap().unwrap());
    }
    let resume_from = partial.last_seq();
    drop(partial);

    wait_status(&c, &run, "waiting-approval").await;
    let state = c.run(&run_id(&run)).await.unwrap();
    let gate = state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["nodeId"] == "gate")
        .unwrap();
    assert_eq!(gate["status"], "waiting-approval");
    let decided = c
        .post_json(
            &format!("/v1/runs/{run}/approvals/gate"),
            &json!({"approved": true, "by": "ana", "note": "fine"}),
        )
        .await
        .unwrap();
    assert_eq!(decided["approved"], true);

    let rest = collect(c.events(&run_id(&run), resume_from, false).await.unwrap()).await;
    pieces.extend(rest);
    let whole = whole.await.unwrap();
    let stored = srv.stored(&run);
    assert!(
        stored.last().unwrap().contains("\"type\":\"RunFinished\""),
        "{stored:?}"
    );
    assert_eq!(
        whole, stored,
        "a watcher sees the store's log byte for byte"
    );
    assert_eq!(
        pieces, stored,
        "a reconnecting watcher sees every event once"
    );

    let state = c.run(&run_id(&run)).await.unwrap();
    assert_eq!(state["status"], "finished");
    assert_eq!(state["progress"], 1.0);
    let gate = state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["nodeId"] == "gate")
        .unwrap();
    assert_eq!(gate["decision"]["by"], "ana");

    // The page of the log, filtered.
    let page = c
        .get_json(&format!(
            "/v1/runs/{run}/events?type=ApprovalGranted,NodeFinished&limit=2"
        ))
        .await
        .unwrap();
    let evs = page["events"].as_array().unwrap();
    assert_eq!(evs.len(), 2);
    assert!(page["nextAfter"].as_u64().is_some());
    let page = c
        .get_json(&format!(
            "/v1/runs/{run}/events?node=gate&type=ApprovalGranted"
        ))
        .await
        .unwrap();
    assert_eq!(page["events"][0]["decidedBy"], "ana");

    // The Activity view tells the story.
    let act = c
        .get_json(&format!("/v1/runs/{run}/activity"))
        .await
        .unwrap();
    let kinds: Vec<&str> = act["activity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"run"));
    assert!(
        kinds.contains(&"approval") && kinds.contains(&"command"),
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&"completion"));

    // The run list.
    let list = c.get_json("/v1/runs?status=finished").await.unwrap();
    assert!(list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["runId"] == run.as_str()));
    let list = c.get_json("/v1/runs?status=running").await.unwrap();
    assert!(!list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["runId"] == run.as_str()));

    // Metrics, folded from the events.
    let (status, text) = raw(srv.addr, &request("GET", "/metrics", Some("sekret"), "")).await;
    assert_eq!(status, 200);
    assert!(text.contains("cairn_runs_total 1"), "{text}");
    assert!(
        text.contains("cairn_approvals_total{decision=\"granted\"} 1"),
        "{text}"
    );
    assert!(text.contains("cairn_nodes_finished_total 3"), "{text}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_over_http_ends_the_run_and_its_watchers() {
    let srv = TestServer::start(None).await;
    srv.workflow(
        "slow",
        "name: slow\nnodes:\n  - id: wait\n    command: [\"sleep\", \"30\"]\n",
    );
    let c = srv.client();
    let run = c
        .post_json("/v1/runs", &json!({"workflow": "slow", "runId": "slow-1"}))
        .await
        .unwrap();
    assert_eq!(run["runId"], "slow-1");
    let watcher = tokio::spawn(collect(
        c.events(&run_id("slow-1"), 0, false).await.unwrap(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !srv
        .stored("slow-1")
        .iter()
        .any(|e| e.contains("\"type\":\"NodeStarted\""))
    {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = c
        .post_json(
            "/v1/runs/slow-1/cancel",
            &json!({"reason": "enough", "by": "ops"}),
        )
        .await
        .unwrap();
    assert_eq!(r["mechanism"], "immediate");
    let seen = tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .unwrap()
        .unwrap();
    assert!(
        seen.last().unwrap().contains("\"type\":\"RunCancelled\""),
        "{seen:?}"
    );
    assert_eq!(seen, srv.stored("slow-1"));
    assert_eq!(status_of(&c, "slow-1").await, "cancelled");
    // Same id again is a conflict.
    let err = c
        .post_json("/v1/runs", &json!({"workflow": "slow", "runId": "slow-1"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("409"), "{err}");
    srv.stop().await;
}

fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"]["code"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_harm_nothing() {
    let srv = TestServer::start_with(Some("sekret"), |c| c.body_limit = 1024).await;
    srv.workflow("typo", "name: typo\nnodes:\n  - id: a\n    valeu: 1\n");
    srv.workflow(
        "typed",
        "name: typed\ninput:\n  type: object\n  required: [repo]\n  properties:\n    repo: { type: string }\nnodes:\n  - id: a\n    value: 1\n",
    );
    let t = Some("sekret");
    let a = srv.addr;

    let (s, b) = raw(a, &request("GET", "/v1/runs", None, "")).await;
    assert_eq!((s, code(&b).as_str()), (401, "unauthorized"));
    assert!(b.contains("Bearer"), "{b}");
    let (s, b) = raw(a, &request("GET", "/v1/runs", Some("wrong"), "")).await;
    assert_eq!((s, code(&b).as_str()), (401, "unauthorized"));
    let (s, _) = raw(a, &request("GET", "/healthz", None, "")).await;
    assert_eq!(s, 200, "healthz needs no token");

    let (s, b) = raw(a, &request("GET", "/v1/runs/nope", t, "")).await;
    assert_eq!((s, code(&b).as_str()), (404, "not_found"));
    assert!(b.contains("nope"), "{b}");
    for path in [
        "/v1/runs/nope/events",
        "/v1/runs/nope/events/stream",
        "/v1/runs/nope/activity",
    ] {
        let (s, b) = raw(a, &request("GET", path, t, "")).await;
        assert_eq!((s, code(&b).as_str()), (404, "not_found"), "{path}");
    }
    let (s, b) = raw(a, &request("POST", "/v1/runs/nope/cancel", t, "")).await;
    assert_eq!((s, code(&b).as_str()), (404, "not_found"));

    let (s, b) = raw(a, &request("POST", "/v1/runs", t, "{\"workflow\": ")).await;
    assert_eq!((s, code(&b).as_str()), (400, "bad_json"));
    assert!(b.contains("line 1"), "{b}");
    let (s, b) = raw(a, &request("POST", "/v1/runs", t, "{\"workflw\": \"x\"}")).await;
    assert_eq!((s, code(&b).as_str()), (400, "invalid_body"));
    assert!(b.contains("workflw"), "{b}");
    let (s, b) = raw(
        a,
        &request("POST", "/v1/runs", t, "{\"workflow\": \"typo\"}"),
    )
    .await;
    assert_eq!((s, code(&b).as_str()), (400, "invalid_workflow"));
    let v: Value = serde_json::from_str(&b).unwrap();
    assert!(v["error"]["details"][0]["line"].as_u64().is_some(), "{b}");
    // Located by line and field, the file's own text not quoted.
    assert_eq!(v["error"]["details"][0]["field"], "nodes[0]", "{b}");
    assert!(!b.contains("valeu"), "{b}");
    let (s, b) = raw(
        a,
        &request(
            "POST",
            "/v1/runs",
            t,
            "{\"workflow\": \"typed\", \"input\": {}}",
        ),
    )
    .await;
    assert_eq!((s, code(&b).as_str()), (422, "invalid_input"));
    assert!(b.contains("repo"), "{b}");
    // An input nested past the limit is refused whatever the schema says.
    let deep = format!(
        "{{\"workflow\": \"typed\", \"input\": {}1{}}}",
        "[".repeat(65),
        "]".repeat(65)
    );
    let (s, b) = raw(a, &request("POST", "/v1/runs", t, &deep)).await;
    assert_eq!((s, code(&b).as_str()), (422, "invalid_input"));
    assert!(b.contains("more than the 64 allowed"), "{b}");
    let (s, b) = raw(
        a,
        &request("POST", "/v1/runs", t, "{\"workflow\": \"no-such-flow\"}"),
    )
    .await;
    assert_eq!(s, 404, "{b}");

    let big = format!("{{\"workflow\": \"{}\"}}", "x".repeat(4096));
    let (s, b) = raw(a, &request("POST", "/v1/runs", t, &big)).await;
    assert_eq!((s, code(&b).as_str()), (413, "payload_too_large"));

    let (s, b) = raw(a, &request("GET", "/v1/runs?limit=lots", t, "")).await;
    assert_eq!((s, code(&b).as_str()), (400, "bad_request"));
    assert!(b.contains("`limit`"), "{b}");
    let (s, b) = raw(a, &request("GET", "/v1/runs?stauts=running", t, "")).await;
    assert_eq!(s, 400);
    assert!(b.contains("stauts"), "{b}");

    let (s, b) = raw(a, &request("GET", "/v2/nothing", t, "")).await;
    assert_eq!((s, code(&b).as_str()), (404, "no_route"));
    let (s, b) = raw(a, &request("DELETE", "/v1/runs", t, "")).await;
    assert_eq!((s, code(&b).as_str()), (405, "method_not_allowed"));

    let log = srv.manual_run("m1");
    finish(&log).await;
    let req = b"GET /v1/runs/m1/events/stream HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer sekret\r\nLast-Event-ID: ten\r\n\r\n";
    let (s, b) = raw(a, req).await;
    assert_eq!(s, 400);
    assert!(b.contains("Last-Event-ID"), "{b}");
    let (s, b) = raw(
        a,
        &request("GET", "/v1/runs/m1/events?type=NoSuchEvent", t, ""),
    )
    .await;
    assert_eq!(s, 400);
    assert!(b.contains("NoSuchEvent"), "{b}");
    drop(log);

    // Unharmed.
    let (s, b) = raw(a, &request("GET", "/v1/runs/m1", t, "")).await;
    assert_eq!(s, 200, "{b}");
    srv.stop().await;
}

/// Every path and method of the OpenAPI document reaches a handler (not the
/// router's fallbacks). The other direction, every route documented, is a
/// unit test beside the route table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served() {
    let srv = TestServer::start(None).await;
    let doc: Value = serde_json::from_str(cairn_server::OPENAPI).unwrap();
    let (s, served) = raw(srv.addr, &request("GET", "/openapi.json", None, "")).await;
    assert_eq!(s, 200);
    assert_eq!(serde_json::from_str::<Value>(&served).unwrap(), doc);
    let mut n = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let concrete = path
                .replace("{id}", "r")
                .replace("{node}", "n")
                .replace("{requestId}", "q")
                .replace("{name}", "x")
                .replace("{file}", "main.js")
                .replace("{other}", "r2");
            let (status, body) = raw(
                srv.addr,
                &request(&method.to_uppercase(), &concrete, None, "{}"),
            )
            .await;
            assert_ne!(status, 405, "{method} {path}: {body}");
            assert!(!body.contains("no_route"), "{method} {path}: {body}");
            n += 1;
        }
    }
    assert_eq!(n, 35);
    srv.stop().await;
}

const ASKING: &str = r#"
name: asking
nodes:
  - id: branch
    ask: "Which branch?"
    schema: { type: string, enum: [main, release] }
output: "{{ nodes.branch.output }}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_answered_over_http_and_a_wrong_answer_refused() {
    let srv = TestServer::start(Some("sekret")).await;
    srv.workflow("asking", ASKING);
    let c = srv.client();
    let started = c
        .post_json("/v1/runs", &json!({"workflow": "asking", "input": {}}))
        .await
        .unwrap();
    let run = started["runId"].as_str().unwrap().to_string();
    wait_status(&c, &run, "waiting-input").await;
    let state = c.run(&run_id(&run)).await.unwrap();
    let rid = state["questions"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let path = format!("/v1/runs/{run}/inputs/{rid}");

    let refused = c.post_json(&path, &json!({"value": "develop"})).await;
    let err = refused.unwrap_err().to_string();
    assert!(
        err.contains("400") && err.contains("does not match its schema"),
        "{err}"
    );
    assert_eq!(status_of(&c, &run).await, "waiting-input");

    let ok = c
        .post_json(&path, &json!({"value": "main", "by": "ana"}))
        .await
        .unwrap();
    assert_eq!(ok["requestId"], rid.as_str());
    wait_status(&c, &run, "finished").await;
    assert_eq!(c.run(&run_id(&run)).await.unwrap()["output"], "main");
}
