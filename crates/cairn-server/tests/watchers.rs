//! Watchers over real sockets: WebSocket requests and pushes, and slow
//! watchers (SSE and WebSocket) cut off with a reason, able to resume from
//! their last seq, while the run's log is appended without waiting.

mod common;

use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

async fn ws(srv: &TestServer, header_token: Option<&str>) -> Ws {
    let mut req = format!("ws://{}/v1/ws", srv.addr)
        .into_client_request()
        .unwrap();
    if let Some(t) = header_token {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// The next JSON text message (skipping pings), or the close frame's code.
async fn recv(ws: &mut Ws) -> Result<Value, Option<(u16, String)>> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("a message within 30 s");
        match m {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Close(f))) => {
                return Err(f.map(|f| (u16::from(f.code), f.reason.to_string())))
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Err(None),
        }
    }
}

async fn reply(ws: &mut Ws, id: &str) -> Value {
    loop {
        let v = recv(ws).await.unwrap();
        if v["kind"] == "reply" && v["id"] == id {
            return v;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_subscribes_replays_lists_and_steers() {
    let srv = TestServer::start(Some("sekret")).await;
    srv.workflow(
        "gated",
        "name: gated\nnodes:\n  - id: gate\n    approval: \"Go?\"\n  - id: after\n    needs: [gate]\n    value: 2\n",
    );

    // No header: the first message must be the token; a wrong one closes.
    let mut w = ws(&srv, None).await;
    send(&mut w, json!({"type": "auth", "id": "a", "token": "nope"})).await;
    let r = recv(&mut w).await.unwrap();
    assert_eq!(
        (r["ok"].clone(), r["error"]["code"].clone()),
        (json!(false), json!("unauthorized"))
    );
    assert_eq!(recv(&mut w).await.unwrap_err().map(|c| c.0), Some(1008));

    let mut w = ws(&srv, None).await;
    send(
        &mut w,
        json!({"type": "auth", "id": "a", "token": "sekret"}),
    )
    .await;
    assert_eq!(reply(&mut w, "a").await["ok"], true);

    // Malformed messages are answered; the socket stays up.
    w.send(Message::text("{not json")).await.unwrap();
    let r = recv(&mut w).await.unwrap();
    assert_eq!(r["error"]["code"], "bad_json");
    send(&mut w, json!({"type": "subscribe", "id": 7})).await;
    let r = recv(&mut w).await.unwrap();
    assert_eq!(
        (r["id"].clone(), r["error"]["code"].clone()),
        (json!(7), json!("bad_message"))
    );
    assert!(
        r["error"]["message"].as_str().unwrap().contains("runId"),
        "{r}"
    );
    send(&mut w, json!({"type": "explode", "id": "x"})).await;
    assert_eq!(reply(&mut w, "x").await["error"]["code"], "bad_message");
    send(
        &mut w,
        json!({"type": "subscribe", "id": "s0", "runId": "ghost"}),
    )
    .await;
    assert_eq!(reply(&mut w, "s0").await["error"]["code"], "not_found");

    // A dashboard socket sees every run.
    let mut dash = ws(&srv, Some("sekret")).await;
    send(&mut dash, json!({"type": "subscribeAll", "id": "all"})).await;
    assert_eq!(reply(&mut dash, "all").await["ok"], true);

    let c = srv.client();
    c.post_json("/v1/runs", &json!({"workflow": "gated", "runId": "g1"}))
        .await
        .unwrap();
    send(
        &mut w,
        json!({"type": "subscribe", "id": "s1", "runId": "g1", "afterSeq": 0}),
    )
    .await;
    let r = recv(&mut w).await.unwrap();
    assert_eq!(
        (r["kind"].clone(), r["id"].clone(), r["ok"].clone()),
        (json!("reply"), json!("s1"), json!(true)),
        "the reply comes before any event"
    );
    let mut got = Vec::new();
    loop {
        let v = recv(&mut w).await.unwrap();
        if v["kind"] == "event" {
            let ty = v["event"]["type"].as_str().unwrap().to_string();
            got.push(v["event"].clone());
            if ty == "ApprovalRequested" {
                break;
            }
        }
    }
    send(
        &mut w,
        json!({"type": "approve", "id": "ap", "runId": "g1", "nodeId": "gate", "by": "ws"}),
    )
    .await;
    // The reply to the approval and the end of the subscription travel
    // apart: a run that ends at once may end its watch first.
    let (mut approved, mut ended) = (false, false);
    while !(approved && ended) {
        let v = recv(&mut w).await.unwrap();
        match v["kind"].as_str().unwrap() {
            "reply" => {
                assert_eq!(
                    (v["id"].clone(), v["ok"].clone()),
                    (json!("ap"), json!(true)),
                    "{v}"
                );
                approved = true;
            }
            "event" => got.push(v["event"].clone()),
            "end" => {
                assert_eq!(v["runId"], "g1");
                ended = true;
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert!(approved);
    let stored: Vec<Value> = srv
        .stored("g1")
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
    assert_eq!(got, stored, "the socket carried the store's log in order");

    // The raw frames carry the store's text byte for byte: check via replay.
    send(
        &mut w,
        json!({"type": "replay", "id": "rp", "runId": "g1", "afterSeq": 2}),
    )
    .await;
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), w.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Text(t))) => {
                let s = t.as_str().to_string();
                if s.starts_with("{\"kind\":\"event\",\"event\":") {
                    texts.push(s["{\"kind\":\"event\",\"event\":".len()..s.len() - 1].to_string());
                } else {
                    let v: Value = serde_json::from_str(&s).unwrap();
                    assert_eq!(v["id"], "rp");
                    assert_eq!(
                        v["result"]["count"].as_u64().unwrap() as usize,
                        stored.len() - 2
                    );
                    break;
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(texts, srv.stored("g1")[2..].to_vec());

    send(
        &mut w,
        json!({"type": "listRuns", "id": "ls", "status": "finished"}),
    )
    .await;
    let r = reply(&mut w, "ls").await;
    assert_eq!(r["result"]["runs"][0]["runId"], "g1");
    send(&mut w, json!({"type": "cancel", "id": "cx", "runId": "g1"})).await;
    assert_eq!(
        reply(&mut w, "cx").await["error"]["code"],
        "conflict",
        "a finished run cannot be cancelled"
    );
    send(
        &mut w,
        json!({"type": "unsubscribe", "id": "u", "runId": "g1"}),
    )
    .await;
    assert_eq!(reply(&mut w, "u").await["ok"], true);

    // The dashboard saw the run's events too, in order.
    let mut seqs = Vec::new();
    while seqs.len() < stored.len() {
        let v = recv(&mut dash).await.unwrap();
        if v["kind"] == "event" && v["event"]["runId"] == "g1" {
            seqs.push(v["event"]["seq"].as_u64().unwrap());
        }
    }
    assert_eq!(seqs, (1..=stored.len() as u64).collect::<Vec<_>>());
    srv.stop().await;
}

/// Appends enough events, each big enough, that a watcher which reads
/// nothing falls further behind than the store's live buffer even after the
/// sockets' buffers have filled.
async fn flood(log: &cairn_store::RunLog, n: usize) {
    let text = "x".repeat(1000);
    for i in 0..n {
        output(log, "spam", &text);
        if i % 2000 == 1999 {
            log.sync().await.unwrap();
        }
    }
    log.sync().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_sse_watcher_is_cut_off_and_resumes_from_its_last_seq() {
    let srv = TestServer::start(None).await;
    let log = srv.manual_run("busy");
    log.sync().await.unwrap();
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&with_host(
        srv.addr,
        b"GET /v1/runs/busy/events/stream HTTP/1.1\r\nConnection: close\r\n\r\n",
    ))
    .await
    .unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // Now read nothing while the run writes 26,000 events; the writer
    // never waits for this watcher.
    flood(&log, 26_000).await;
    finish(&log).await;
    let total = srv.stored("busy").len() as u64;

    let mut buf = Vec::new();
    buf.extend_from_slice(&first[..n]);
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|s| s.parse().unwrap())
        .collect();
    assert!(!ids.is_empty());
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "in order, no gap"
    );
    let last = *ids.last().unwrap();
    assert!(last < total, "the watcher was cut off before the end");
    let tail = &text[text.rfind("event: error").expect("a final error event")..];
    let data: Value =
        serde_json::from_str(tail.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(data["error"]["code"], "lagged");
    assert_eq!(data["error"]["lastSeq"], last);

    // Reconnecting from there yields the rest, once.
    let mut rest = srv
        .client()
        .events(&run_id("busy"), last, false)
        .await
        .unwrap();
    let mut next = last;
    while let Some(line) = rest.next_event().await {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        next += 1;
        assert_eq!(v["seq"], next);
    }
    assert_eq!(next, total);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_websocket_is_closed_with_a_reason() {
    let srv = TestServer::start_with(None, |c| c.watcher_queue = 16).await;
    let log = srv.manual_run("busy");
    log.sync().await.unwrap();
    let mut w = ws(&srv, None).await;
    send(
        &mut w,
        json!({"type": "subscribe", "id": "s", "runId": "busy"}),
    )
    .await;
    assert_eq!(reply(&mut w, "s").await["ok"], true);
    flood(&log, 26_000).await;
    finish(&log).await;
    let total = srv.stored("busy").len() as u64;
    let mut last = 0;
    let mut lagged = None;
    let close = loop {
        match recv(&mut w).await {
            Ok(v) if v["kind"] == "event" => {
                last += 1;
                assert_eq!(v["event"]["seq"], last, "in order, no gap");
            }
            Ok(v) if v["kind"] == "error" => lagged = Some(v),
            Ok(v) => panic!("unexpected {v}"),
            Err(close) => break close,
        }
    };
    assert!(last < total);
    let lagged = lagged.expect("an error message before the close");
    assert_eq!(lagged["error"]["code"], "lagged");
    assert_eq!(lagged["error"]["lastSeq"], last);
    let (code, reason) = close.expect("a close frame");
    assert_eq!(code, 4000);
    assert!(reason.contains(&format!("after seq {last}")), "{reason}");
    assert_ne!(CloseCode::from(code), CloseCode::Normal);

    // A new socket resumes from there.
    let mut w = ws(&srv, None).await;
    send(
        &mut w,
        json!({"type": "subscribe", "id": "s", "runId": "busy", "afterSeq": last}),
    )
    .await;
    assert_eq!(reply(&mut w, "s").await["ok"], true);
    loop {
        let v = recv(&mut w).await.unwrap();
        if v["kind"] == "end" {
            break;
        }
        last += 1;
        assert_eq!(v["event"]["seq"], last);
    }
    assert_eq!(last, total);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_ends_every_watcher_with_a_reason() {
    let srv = TestServer::start(None).await;
    let log = srv.manual_run("live");
    output(&log, "n", "one");
    log.sync().await.unwrap();
    let addr = srv.addr;

    // An SSE watcher and a WebSocket watcher, both following the live run.
    let mut sse = TcpStream::connect(addr).await.unwrap();
    sse.write_all(&with_host(
        addr,
        b"GET /v1/runs/live/events/stream?follow=true HTTP/1.1\r\nConnection: close\r\n\r\n",
    ))
    .await
    .unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("id: 2\n") {
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(30), sse.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&b[..n]);
    }
    let mut w = ws(&srv, None).await;
    send(
        &mut w,
        json!({"type": "subscribe", "id": "s", "runId": "live", "follow": true}),
    )
    .await;
    assert_eq!(reply(&mut w, "s").await["ok"], true);
    for seq in 1..=2 {
        let v = recv(&mut w).await.unwrap();
        assert_eq!(v["event"]["seq"], seq);
    }
    drop(log);

    srv.stop().await;
    tokio::time::timeout(Duration::from_secs(30), sse.read_to_end(&mut seen))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&seen);
    let tail = &text[text.find("event: shutdown").expect("a shutdown event")..];
    let data: Value =
        serde_json::from_str(tail.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(data["lastSeq"], 2);
    assert!(data["reason"].as_str().unwrap().contains("Last-Event-ID"));
    let close = recv(&mut w).await.expect_err("the socket closes");
    assert_eq!(close.map(|c| c.0), Some(1001));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_subscription_follows_the_child_runs() {
    let srv = TestServer::start(None).await;
    srv.workflow(
        "leaf",
        "name: leaf\nnodes:\n  - id: gate\n    approval: \"Go?\"\n  - id: v\n    needs: [gate]\n    value: 3\noutput: \"{{ nodes.v.output }}\"\n",
    );
    srv.workflow(
        "parent",
        "name: parent\nnodes:\n  - id: sub\n    workflow: leaf.yaml\noutput: \"{{ nodes.sub.output }}\"\n",
    );
    let mut w = ws(&srv, None).await;
    let c = srv.client();
    c.post_json("/v1/runs", &json!({"workflow": "parent", "runId": "tp"}))
        .await
        .unwrap();
    send(
        &mut w,
        json!({"type": "subscribe", "id": "s", "runId": "tp", "tree": true}),
    )
    .await;
    let mut child: Option<String> = None;
    let mut ended = std::collections::BTreeSet::new();
    let mut noticed = false;
    while ended.len() < 2 {
        let v = recv(&mut w).await.unwrap();
        if v["kind"] == "subscribed" {
            noticed = true;
            child = v["runId"].as_str().map(str::to_string);
            continue;
        }
        let ev = &v["event"];
        if ev["type"] == "ApprovalRequested" {
            // The child's gate, seen on the parent's socket: decide it.
            let run = ev["runId"].as_str().unwrap();
            assert_eq!(Some(run), child.as_deref());
            c.post_json(
                &format!("/v1/runs/{run}/approvals/gate"),
                &json!({"approved": true}),
            )
            .await
            .unwrap();
        }
        if ev["type"] == "RunFinished" {
            ended.insert(ev["runId"].as_str().unwrap().to_string());
        }
    }
    assert!(noticed, "the child's subscription was announced");
    let child = child.unwrap();
    assert!(child.starts_with("tp."), "{child}");
    assert!(ended.contains("tp") && ended.contains(&child));
    srv.stop().await;
}
