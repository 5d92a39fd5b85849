//! The web page's side of the server: the page and its files (served
//! without a token, with a strict policy and revalidation), the login that
//! gives a browser its session cookie (derived from the token, HttpOnly,
//! SameSite=Strict), what pages of other sites cannot do with that cookie,
//! and the routes the page reads (the plan, tool calls, the run list's
//! numbers and its `parent` filter).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "s3cret-token";
const JSON: &str = "Content-Type: application/json";

/// One HTTP/1.1 exchange: (status, head, body). The head's header names
/// are lowercased.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String, String) {
    let own_host = headers
        .iter()
        .any(|l| l.to_ascii_lowercase().starts_with("host:"));
    let mut h = if own_host {
        String::new()
    } else {
        format!("Host: {addr}\r\n")
    };
    for line in headers {
        h.push_str(line);
        h.push_str("\r\n");
    }
    let request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\n{h}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let head = head
        .lines()
        .map(|l| match l.split_once(':') {
            Some((k, v)) => format!("{}:{v}", k.to_ascii_lowercase()),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    (status, head, body.to_string())
}

/// A header's value from a head `exchange` returned.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(str::trim)
}

fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"]["code"].as_str().unwrap_or("").to_string()
}

/// Logs in with `token` and returns the `Cookie` header line to send.
async fn login(addr: SocketAddr, token: &str) -> String {
    let (s, head, body) = exchange(
        addr,
        "POST",
        "/v1/session",
        &[JSON],
        &json!({"token": token}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let set = header(&head, "set-cookie").expect("a session cookie");
    let pair = set.split(';').next().unwrap().trim();
    format!("Cookie: {pair}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_loads_without_a_token_under_a_strict_policy_and_revalidates() {
    let srv = TestServer::start(Some(TOKEN)).await;
    let (s, head, body) = exchange(srv.addr, "GET", "/", &[], "").await;
    assert_eq!(s, 200, "{body}");
    assert!(
        body.contains("<script type=\"module\" src=\"/ui/main.js\">"),
        "{body}"
    );
    assert_eq!(
        header(&head, "content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = header(&head, "content-security-policy").unwrap();
    for part in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "object-src 'none'",
    ] {
        assert!(csp.contains(part), "{csp} lacks {part}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&head, "referrer-policy"), Some("no-referrer"));
    assert_eq!(header(&head, "cache-control"), Some("no-cache"));
    let etag = header(&head, "etag").unwrap().to_string();
    assert!(etag.starts_with('"') && etag.len() > 10, "{etag}");

    // A copy still current is not sent again.
    let inm = format!("If-None-Match: {etag}");
    let (s, head, body) = exchange(srv.addr, "GET", "/", &[&inm], "").await;
    assert_eq!(s, 304);
    assert!(body.is_empty());
    assert_eq!(header(&head, "etag"), Some(etag.as_str()));
    let (s, _, _) = exchange(srv.addr, "GET", "/", &["If-None-Match: \"stale\""], "").await;
    assert_eq!(s, 200);

    for (file, ty) in [
        ("main.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let (s, head, _) = exchange(srv.addr, "GET", &format!("/ui/{file}"), &[], "").await;
        assert_eq!(s, 200, "{file}");
        assert_eq!(header(&head, "content-type"), Some(ty), "{file}");
        assert!(header(&head, "content-security-policy").is_some(), "{file}");
    }
    let (s, _, body) = exchange(srv.addr, "GET", "/ui/nope.js", &[], "").await;
    assert_eq!((s, code(&body).as_str()), (404, "not_found"));
    let (s, _, body) = exchange(srv.addr, "GET", "/ui/..%2Fapi.rs", &[], "").await;
    assert_eq!(s, 404, "{body}");

    // The page holds no data; the data still needs the token.
    let (s, head, body) = exchange(srv.addr, "GET", "/v1/runs", &[], "").await;
    assert_eq!((s, code(&body).as_str()), (401, "unauthorized"));
    assert!(header(&head, "www-authenticate").is_some());
    // The page is refused to other hosts like everything else.
    let (s, _, body) = exchange(srv.addr, "GET", "/", &["Host: evil.example"], "").await;
    assert_eq!((s, code(&body).as_str()), (403, "host_not_allowed"));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_gives_a_derived_httponly_cookie_that_opens_the_api_until_logout() {
    let srv = TestServer::start(Some(TOKEN)).await;
    let a = srv.addr;
    let (s, _, body) = exchange(a, "GET", "/v1/session", &[], "").await;
    assert_eq!(s, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"tokenRequired": true, "authenticated": false})
    );

    // A wrong token: 401 and no cookie.
    let (s, head, body) = exchange(a, "POST", "/v1/session", &[JSON], r#"{"token":"nope"}"#).await;
    assert_eq!((s, code(&body).as_str()), (401, "unauthorized"));
    assert!(header(&head, "set-cookie").is_none());
    // Not JSON: refused like every POST (so no form can log a browser in).
    let (s, _, _) = exchange(
        a,
        "POST",
        "/v1/session",
        &["Content-Type: application/x-www-form-urlencoded"],
        "token=s3cret-token",
    )
    .await;
    assert_eq!(s, 415);

    let (s, head, body) = exchange(
        a,
        "POST",
        "/v1/session",
        &[JSON],
        &json!({"token": TOKEN}).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let set = header(&head, "set-cookie").unwrap().to_string();
    let attrs: Vec<&str> = set.split(';').map(str::trim).collect();
    for want in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(attrs.contains(&want), "{set} lacks {want}");
    }
    let value = attrs[0].strip_prefix("cairn_session=").unwrap();
    assert_eq!(value.len(), 64);
    assert!(value.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(!set.contains(TOKEN), "the cookie is not the token");
    let cookie = format!("Cookie: theme=dark; {}", attrs[0]);

    // The cookie opens the API, as the bearer token does.
    let (s, _, body) = exchange(a, "GET", "/v1/runs", &[&cookie], "").await;
    assert_eq!(s, 200, "{body}");
    let (_, _, body) = exchange(a, "GET", "/v1/session", &[&cookie], "").await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["authenticated"],
        true
    );
    let (s, _, _) = exchange(a, "GET", "/v1/runs", &["Cookie: cairn_session=00ff"], "").await;
    assert_eq!(s, 401, "a made-up cookie opens nothing");
    let (s, _, _) = exchange(
        a,
        "GET",
        "/v1/runs",
        &[&cookie, "Authorization: Bearer wrong"],
        "",
    )
    .await;
    assert_eq!(
        s, 401,
        "a wrong bearer token is wrong even beside a good cookie"
    );

    // The WebSocket of a logged-in page needs no token message.
    let mut req = format!("ws://{a}/v1/ws").into_client_request().unwrap();
    req.headers_mut()
        .insert("cookie", attrs[0].parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(Message::Text(r#"{"type":"ping","id":1}"#.into()))
        .await
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let reply: Value = serde_json::from_str(reply.to_text().unwrap()).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    drop(ws);

    // Another server with the same token takes the cookie; one with
    // another token (a changed token) does not.
    let twin = TestServer::start(Some(TOKEN)).await;
    let (s, _, _) = exchange(twin.addr, "GET", "/v1/runs", &[&cookie], "").await;
    assert_eq!(s, 200);
    twin.stop().await;
    let other = TestServer::start(Some("another-token")).await;
    let (s, _, _) = exchange(other.addr, "GET", "/v1/runs", &[&cookie], "").await;
    assert_eq!(s, 401);
    other.stop().await;

    // Logging out clears the cookie.
    let (s, head, _) = exchange(a, "DELETE", "/v1/session", &[&cookie], "").await;
    assert_eq!(s, 204);
    let cleared = header(&head, "set-cookie").unwrap();
    assert!(
        cleared.starts_with("cairn_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );

    // A server without a token needs no login and sets no cookie.
    let open = TestServer::start(None).await;
    let (s, head, body) = exchange(
        open.addr,
        "POST",
        "/v1/session",
        &[JSON],
        r#"{"token":"anything"}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert!(header(&head, "set-cookie").is_none());
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"tokenRequired": false, "authenticated": true})
    );
    open.stop().await;
    srv.stop().await;
}

const GATED: &str = "name: gated\nnodes:\n  - id: gate\n    approval: \"Go on?\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_sites_cannot_act_with_the_session_cookie() {
    let srv = TestServer::start(Some(TOKEN)).await;
    srv.workflow("gated", GATED);
    let a = srv.addr;
    let c = srv.client();
    let run = c
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();
    // The gate is waiting before anyone tries to act on it, so that the
    // end of the test tells an untouched run from one still starting.
    let t0 = std::time::Instant::now();
    while c.run(&run_id(&run)).await.unwrap()["status"] != "waiting-approval" {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "the gate never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cookie = login(a, TOKEN).await;
    let evil = "Origin: http://evil.example";
    let form = "Content-Type: application/x-www-form-urlencoded";

    // A cross-site form: its browser sends the Origin, which is refused.
    let (s, _, body) = exchange(
        a,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        &[&cookie, evil, form],
        "graceful=false",
    )
    .await;
    assert_eq!((s, code(&body).as_str()), (403, "origin_not_allowed"));
    // The same form from a browser that sends no Origin: not JSON, refused.
    let (s, _, body) = exchange(
        a,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        &[&cookie, form],
        "graceful=false",
    )
    .await;
    assert_eq!((s, code(&body).as_str()), (415, "unsupported_media_type"));
    let (s, _, body) = exchange(
        a,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        &[&cookie, "Content-Type: text/plain"],
        "{}",
    )
    .await;
    assert_eq!((s, code(&body).as_str()), (415, "unsupported_media_type"));
    // A foreign page's fetch with JSON (after a preflight no one answers).
    let (s, _, body) = exchange(
        a,
        "POST",
        &format!("/v1/runs/{run}/approvals/gate"),
        &[&cookie, evil, JSON],
        r#"{"approved":true}"#,
    )
    .await;
    assert_eq!((s, code(&body).as_str()), (403, "origin_not_allowed"));
    let (s, _, _) = exchange(
        a,
        "OPTIONS",
        &format!("/v1/runs/{run}/cancel"),
        &[evil, "Access-Control-Request-Method: POST"],
        "",
    )
    .await;
    assert!(s == 403 || s == 405, "no preflight is granted: {s}");
    // Nor read: the same refusal for GETs, with no CORS header to lift it.
    let (s, head, _) = exchange(a, "GET", "/v1/runs", &[&cookie, evil], "").await;
    assert_eq!(s, 403);
    assert!(header(&head, "access-control-allow-origin").is_none());
    // Nor log a browser in to a session of the attacker's choosing.
    let (s, _, _) = exchange(
        a,
        "POST",
        "/v1/session",
        &[evil, JSON],
        &json!({"token": TOKEN}).to_string(),
    )
    .await;
    assert_eq!(s, 403);

    // The run is untouched; the page's own origin, with the cookie, decides.
    assert_eq!(
        c.run(&run_id(&run)).await.unwrap()["status"],
        "waiting-approval"
    );
    let own = format!("Origin: http://{a}");
    let (s, _, body) = exchange(
        a,
        "POST",
        &format!("/v1/runs/{run}/approvals/gate"),
        &[&cookie, &own, JSON],
        r#"{"approved":true,"note":"from the page"}"#,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    srv.stop().await;
}

const SHAPES: &str = r#"
name: shapes
nodes:
  - id: start
    value: 1
  - id: notes
    needs: [start]
    tool: read
    args: { path: notes.txt }
  - id: again
    needs: [start]
    stage: work
    loop:
      until: "iteration >= 1"
      max_iterations: 3
      nodes:
        - id: step
          value: "{{ iteration }}"
        - id: check
          needs: [step]
          value: true
  - id: each
    needs: [notes]
    for_each: "[1, 2]"
    nodes:
      - id: show
        value: "{{ item }}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_tool_calls_and_run_list_numbers_are_served() {
    let srv = TestServer::start(None).await;
    srv.workflow("shapes", SHAPES);
    std::fs::write(srv.dir.path().join("workflows/notes.txt"), "some notes\n").unwrap();
    let c = srv.client();
    let run = c
        .post_json("/v1/runs", &json!({"workflow": "shapes"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c.run(&run_id(&run)).await.unwrap()["status"] != "finished" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            c.run(&run_id(&run)).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let plan = c.get_json(&format!("/v1/runs/{run}/plan")).await.unwrap();
    assert_eq!(plan["workflow"], "shapes");
    let nodes = plan["nodes"].as_array().unwrap();
    let paths: Vec<&str> = nodes.iter().map(|n| n["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "start",
            "notes",
            "again",
            "again.step",
            "again.check",
            "each",
            "each.show"
        ]
    );
    let again = &nodes[2];
    assert_eq!(again["kind"], "loop");
    assert_eq!(again["children"], json!(["again.step", "again.check"]));
    assert_eq!(again["stage"], "work");
    assert_eq!(again["maxIterations"], 3);
    assert_eq!(nodes[4]["needs"], json!(["again.step"]));
    assert_eq!(nodes[4]["parent"], "again");
    assert_eq!(nodes[1]["tool"], "read");

    // The tool node's call, with its arguments and its result.
    let calls = c
        .get_json(&format!("/v1/runs/{run}/nodes/notes/tool-calls"))
        .await
        .unwrap();
    let list = calls["toolCalls"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{calls}");
    assert_eq!(list[0]["tool"], "read");
    assert_eq!(list[0]["status"], "success");
    assert_eq!(list[0]["input"]["path"], "notes.txt");
    assert!(
        list[0]["output"].to_string().contains("some notes"),
        "{calls}"
    );
    let none = c
        .get_json(&format!(
            "/v1/runs/{run}/nodes/start/tool-calls?iteration=0"
        ))
        .await
        .unwrap();
    assert_eq!(none["toolCalls"], json!([]));
    let (s, body) = raw(
        srv.addr,
        &request(
            "GET",
            &format!("/v1/runs/{run}/nodes/start/tool-calls?iteration=-1"),
            None,
            "",
        ),
    )
    .await;
    assert_eq!(s, 400, "{body}");
    let (s, _) = raw(srv.addr, &request("GET", "/v1/runs/nope/plan", None, "")).await;
    assert_eq!(s, 404);

    // The list's numbers, folded once and then kept up to date.
    let list = c.get_json("/v1/runs").await.unwrap();
    let entry = &list["runs"][0];
    assert_eq!(entry["runId"], run.as_str());
    assert_eq!(entry["progress"], 1.0);
    assert!(entry["startedMs"].as_i64().unwrap() > 0);
    assert!(entry["endedMs"].as_i64().unwrap() >= entry["startedMs"].as_i64().unwrap());
    assert_eq!(
        entry["tokens"],
        json!({"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "reasoning": 0})
    );
    assert!(entry.get("costUsd").is_none());
    let state = c.run(&run_id(&run)).await.unwrap();
    assert_eq!(state["progress"], entry["progress"]);

    // `parent` filters (it used to be refused as unknown).
    let children = c.get_json(&format!("/v1/runs?parent={run}")).await.unwrap();
    assert_eq!(children["runs"], json!([]));
    let (s, body) = raw(srv.addr, &request("GET", "/v1/runs?parnet=x", None, "")).await;
    assert_eq!(s, 400, "{body}");
    srv.stop().await;
}

/// A run's state read through the cache equals the engine's whole fold,
/// also while events keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_state_is_the_whole_fold_while_it_grows() {
    let srv = TestServer::start(None).await;
    let log = srv.manual_run("grow");
    let c = srv.client();
    for i in 0..5 {
        output(&log, &format!("n{i}"), "x");
        log.sync().await.unwrap();
        let served = c.run(&run_id("grow")).await.unwrap();
        let whole = srv
            .engine
            .state(&cairn_events::RunId::parse("grow").unwrap())
            .unwrap();
        assert_eq!(served["lastSeq"], whole.last_seq);
        assert_eq!(served["nodes"].as_array().unwrap().len(), whole.nodes.len());
    }
    finish(&log).await;
    let served = c.run(&run_id("grow")).await.unwrap();
    assert_eq!(served["status"], "finished");
    srv.stop().await;
}

/// Ten wrong tokens from one address in a minute: its logins are refused
/// with 429 and `Retry-After` until the minute ends, the right token too,
/// while the API with the bearer header goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_guessing_tokens_is_held_off() {
    let srv = TestServer::start(Some(TOKEN)).await;
    let a = srv.addr;
    for i in 0..10 {
        let (s, _, body) = exchange(
            a,
            "POST",
            "/v1/session",
            &[JSON],
            &json!({ "token": format!("guess-{i}") }).to_string(),
        )
        .await;
        assert_eq!(
            (s, code(&body).as_str()),
            (401, "unauthorized"),
            "guess {i}"
        );
    }
    let (s, head, body) = exchange(
        a,
        "POST",
        "/v1/session",
        &[JSON],
        &json!({ "token": TOKEN }).to_string(),
    )
    .await;
    assert_eq!(
        (s, code(&body).as_str()),
        (429, "too_many_logins"),
        "{body}"
    );
    let wait: u64 = header(&head, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(header(&head, "set-cookie").is_none());
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let (s, _, body) = exchange(a, "GET", "/v1/runs", &[&bearer], "").await;
    assert_eq!(s, 200, "{body}");
    srv.stop().await;
}
