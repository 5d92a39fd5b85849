//! What a web page in the user's browser cannot do to a local server (the
//! `Host`, `Origin` and `Content-Type` checks, token or not), and what a
//! client that holds connections open cannot do (the connection cap and the
//! header-read timeout).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;

const GATED: &str = "name: gated\nnodes:\n  - id: gate\n    approval: \"Go on?\"\n";

fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"]["code"].as_str().unwrap_or("").to_string()
}

/// A request with exactly the given extra header lines.
fn req(method: &str, path: &str, headers: &[String], body: &str) -> Vec<u8> {
    let mut h = String::new();
    for line in headers {
        h.push_str(line);
        h.push_str("\r\n");
    }
    format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\n{h}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn host(a: SocketAddr) -> String {
    format!("Host: {a}")
}

const JSON: &str = "Content-Type: application/json";

async fn start_gated(srv: &TestServer, token: Option<&str>) -> String {
    let mut h = vec![JSON.to_string()];
    if let Some(t) = token {
        h.push(format!("Authorization: Bearer {t}"));
    }
    let (s, b) = raw(
        srv.addr,
        &req("POST", "/v1/runs", &h, r#"{"workflow":"gated"}"#),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let run = v["runId"].as_str().unwrap().to_string();
    let c = srv.client();
    eventually_async(|| {
        let c = c.clone();
        let run = run.clone();
        async move { c.run(&run_id(&run)).await.unwrap()["status"] == "waiting-approval" }
    })
    .await;
    run
}

async fn eventually_async<F, Fut>(mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_must_name_this_server() {
    for token in [None, Some("sekret")] {
        let srv = TestServer::start(token).await;
        let a = srv.addr;
        let auth: Vec<String> = token
            .map(|t| format!("Authorization: Bearer {t}"))
            .into_iter()
            .collect();
        let with =
            |extra: &[String]| -> Vec<String> { auth.iter().chain(extra).cloned().collect() };
        let port = a.port();
        for good in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("LocalHost:{port}"),
        ] {
            let (s, b) = raw(
                a,
                &req("GET", "/v1/runs", &with(&[format!("Host: {good}")]), ""),
            )
            .await;
            assert_eq!(s, 200, "{good}: {b}");
        }
        // DNS rebinding: a name that resolves to 127.0.0.1 but is not ours;
        // and our own names on another port.
        for bad in [
            format!("evil.example:{port}"),
            "evil.example".to_string(),
            format!("127.0.0.1:{}", port.wrapping_add(1)),
            "localhost".to_string(),
        ] {
            for (m, path, body) in [
                ("GET", "/healthz", ""),
                ("GET", "/v1/runs", ""),
                ("GET", "/openapi.json", ""),
                ("POST", "/v1/runs", r#"{"workflow":"gated"}"#),
            ] {
                let mut h = with(&[format!("Host: {bad}")]);
                h.push(JSON.into());
                let (s, b) = raw(a, &req(m, path, &h, body)).await;
                assert_eq!(
                    (s, code(&b).as_str()),
                    (403, "host_not_allowed"),
                    "{bad} {m} {path}: {b}"
                );
                assert!(b.contains("`Host`"), "{b}");
            }
        }
        // An empty Host names nothing; HTTP/1.0 may leave it out, which
        // is refused too.
        let (s, b) = raw(a, b"GET /v1/runs HTTP/1.0\r\nHost:\r\n\r\n").await;
        assert_eq!(s, 403, "{b}");
        let mut c = TcpStream::connect(a).await.unwrap();
        c.write_all(b"GET /v1/runs HTTP/1.0\r\n\r\n").await.unwrap();
        let got = read_until_closed(&mut c).await.expect("an answer");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.0 400"), "{text}");
        assert!(text.contains("missing_host"), "{text}");
        srv.stop().await;
    }

    let srv = TestServer::start_with(None, |c| {
        c.allowed_hosts = vec!["cairn.example.com".into(), "10.1.2.3:9999".into()]
    })
    .await;
    for (h, want) in [
        ("cairn.example.com", 200),
        ("cairn.example.com:443", 200),
        ("10.1.2.3:9999", 200),
        ("10.1.2.3:9998", 403),
        ("other.example.com", 403),
    ] {
        let (s, b) = raw(
            srv.addr,
            &req("GET", "/v1/runs", &[format!("Host: {h}")], ""),
        )
        .await;
        assert_eq!(s, want, "{h}: {b}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_elsewhere_can_neither_start_runs_nor_decide_gates() {
    for token in [None, Some("sekret")] {
        let srv = TestServer::start(token).await;
        srv.workflow("gated", GATED);
        let a = srv.addr;
        let run = start_gated(&srv, token).await;
        let mut base = vec![host(a)];
        if let Some(t) = token {
            base.push(format!("Authorization: Bearer {t}"));
        }
        let with = |extra: &[&str]| -> Vec<String> {
            base.iter()
                .cloned()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect()
        };
        let approve = format!("/v1/runs/{run}/approvals/gate");
        let decision = r#"{"approved":true}"#;

        // A foreign Origin: refused on every state-changing route.
        for origin in [
            "Origin: http://evil.example",
            "Origin: null",
            "Origin: http://localhost:3000",
        ] {
            for (path, body) in [
                ("/v1/runs", r#"{"workflow":"gated"}"#),
                (approve.as_str(), decision),
                (&*format!("/v1/runs/{run}/cancel"), "{}"),
                (&*format!("/v1/runs/{run}/resume"), "{}"),
            ] {
                let (s, b) = raw(a, &req("POST", path, &with(&[JSON, origin]), body)).await;
                assert_eq!(
                    (s, code(&b).as_str()),
                    (403, "origin_not_allowed"),
                    "{origin} {path}: {b}"
                );
            }
        }
        // A browser form or a "simple" fetch cannot send application/json.
        for ct in [
            vec!["Content-Type: text/plain"],
            vec!["Content-Type: application/x-www-form-urlencoded"],
            vec!["Content-Type: multipart/form-data; boundary=x"],
            vec![],
        ] {
            let (s, b) = raw(a, &req("POST", &approve, &with(&ct), decision)).await;
            assert_eq!(
                (s, code(&b).as_str()),
                (415, "unsupported_media_type"),
                "{ct:?}: {b}"
            );
            assert!(b.contains("`Content-Type`"), "{b}");
        }
        let c = srv.client();
        assert_eq!(
            c.run(&run_id(&run)).await.unwrap()["status"],
            "waiting-approval",
            "nothing refused reached the run"
        );
        // GETs without Origin (curl, the CLI's client) work as before; so
        // does a request from the server's own origin.
        let (s, b) = raw(a, &req("GET", &format!("/v1/runs/{run}"), &with(&[]), "")).await;
        assert_eq!(s, 200, "{b}");
        let own = format!("Origin: http://{a}");
        let (s, b) = raw(
            a,
            &req("POST", &approve, &with(&[JSON, own.as_str()]), decision),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        srv.stop().await;
    }

    // An allowed origin is let through.
    let srv = TestServer::start_with(None, |c| {
        c.allowed_origins = vec!["https://ui.example.com".into()]
    })
    .await;
    let (s, b) = raw(
        srv.addr,
        &req(
            "POST",
            "/v1/runs/none/cancel",
            &[
                host(srv.addr),
                JSON.into(),
                "Origin: https://ui.example.com".into(),
            ],
            "{}",
        ),
    )
    .await;
    assert_eq!((s, code(&b).as_str()), (404, "not_found"), "{b}");
    srv.stop().await;
}

async fn ws_with(addr: SocketAddr, origin: Option<&str>) -> Result<(), u16> {
    let mut r = format!("ws://{addr}/v1/ws").into_client_request().unwrap();
    if let Some(o) = origin {
        r.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(r).await {
        Ok(_) => Ok(()),
        Err(WsError::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("websocket: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_from_foreign_origins_are_refused() {
    let srv = TestServer::start_with(None, |c| {
        c.allowed_origins = vec!["https://ui.example.com".into()]
    })
    .await;
    let a = srv.addr;
    assert_eq!(ws_with(a, Some("http://evil.example")).await, Err(403));
    assert_eq!(ws_with(a, Some("null")).await, Err(403));
    assert_eq!(ws_with(a, None).await, Ok(()));
    assert_eq!(ws_with(a, Some(&format!("http://{a}"))).await, Ok(()));
    assert_eq!(ws_with(a, Some("https://ui.example.com")).await, Ok(()));
    srv.stop().await;
}

/// Reads until the server closes the connection; `None` if it never does
/// within a generous bound.
async fn read_until_closed(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        let mut b = [0u8; 1024];
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
    })
    .await;
    read.ok().map(|_| got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_slow_to_send_its_headers_is_disconnected() {
    let srv =
        TestServer::start_with(None, |c| c.header_read_timeout = Duration::from_millis(300)).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHo").await.unwrap();
    let got = read_until_closed(&mut s)
        .await
        .expect("the server closes the connection");
    let text = String::from_utf8_lossy(&got);
    assert!(!text.contains("200 OK"), "{text}");
    // The server is fine.
    let (status, _) = raw(srv.addr, &request("GET", "/healthz", None, "")).await;
    assert_eq!(status, 200);
    srv.stop().await;
}

/// A kept-alive connection that has been served once (so the server holds
/// it), idle. A connection closed just before frees its slot a moment
/// after the close, so a 503 is tried again a while.
async fn held(addr: SocketAddr) -> TcpStream {
    for _ in 0..100 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut b = [0u8; 1024];
        let n = s.read(&mut b).await.unwrap_or(0);
        if b[..n].starts_with(b"HTTP/1.1 200") {
            return s;
        }
        assert!(
            n == 0 || b[..n].starts_with(b"HTTP/1.1 503"),
            "{}",
            String::from_utf8_lossy(&b[..n])
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no slot freed for a held connection");
}

/// A fresh connection's answer to a request: `Some(text)` or `None` when
/// the server reset it without a word.
async fn try_request(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    let _ = s
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
    let got = read_until_closed(&mut s)
        .await
        .expect("an answer or a close");
    Some(String::from_utf8_lossy(&got).to_string()).filter(|t| !t.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused_until_one_closes() {
    let srv = TestServer::start_with(None, |c| {
        c.max_connections = 2;
        c.header_read_timeout = Duration::from_secs(120);
    })
    .await;
    let a = srv.addr;
    let first = held(a).await;
    // A WebSocket keeps its place after the upgrade. The server frees the
    // slot of a connection that closed (the start's readiness probe) a
    // moment after the close, so the second place may take a few tries.
    let mut tries = 0;
    let ws = loop {
        match tokio_tungstenite::connect_async(format!("ws://{a}/v1/ws")).await {
            Ok((ws, _)) => break ws,
            Err(e) if tries < 100 => {
                assert!(e.to_string().contains("503"), "{e}");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the second place never freed: {e}"),
        }
    };
    for _ in 0..3 {
        match try_request(a).await {
            None => {}
            Some(t) => {
                assert!(t.starts_with("HTTP/1.1 503"), "over the cap: {t}");
                assert!(t.contains("too_many_connections"), "{t}");
            }
        }
    }
    drop(first);
    // The slot frees once the server sees the close.
    let mut served = false;
    for _ in 0..1500 {
        if try_request(a)
            .await
            .is_some_and(|t| t.starts_with("HTTP/1.1 200"))
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a slot freed by a closed connection is used again");
    // Stopping waits for every connection, the WebSocket's and an idle
    // kept-alive one's included, and ends them.
    let idle = held(a).await;
    srv.stop().await;
    drop((ws, idle));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_client_passes_every_check() {
    let srv = TestServer::start(Some("sekret")).await;
    srv.workflow("gated", GATED);
    let c = srv.client();
    let v = c
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .unwrap();
    let run = v["runId"].as_str().unwrap().to_string();
    eventually_async(|| {
        let c = c.clone();
        let run = run.clone();
        async move { c.run(&run_id(&run)).await.unwrap()["status"] == "waiting-approval" }
    })
    .await;
    c.post_json(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .unwrap();
    srv.stop().await;
}
