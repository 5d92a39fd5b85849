//! Load benchmark: one busy run watched by 1,000 SSE and 1,000 WebSocket
//! clients, server and clients in this process on 127.0.0.1.
//!
//! Reports events delivered per second (over all watchers), the latency
//! from append to receipt at p50 and p99, whether every watcher received
//! every event in order, and the process's peak memory (VmHWM; it includes
//! the clients). Bounded in time: the run lasts a few seconds and the whole
//! bench gives up after 120 s.
//!
//! `cargo bench -p cairn-server --bench load`; `CAIRN_BENCH_SSE`,
//! `CAIRN_BENCH_WS`, `CAIRN_BENCH_EVENTS` and `CAIRN_BENCH_RATE` (events/s)
//! change the load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_events::{EventKind, OutputStream, Scope};
use cairn_server::{Engine, EngineOptions, ServeConfig, Server};
use cairn_store::{Journal, JournalOptions, RunRecord};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one watcher saw.
struct Seen {
    events: usize,
    in_order: bool,
    latencies_us: Vec<u64>,
}

/// The append time rides in the event's text, in µs since `base`.
fn latency(base: Instant, json: &str) -> Option<u64> {
    let i = json.find("\"text\":\"t=")? + 10;
    let end = json[i..].find('"')? + i;
    let sent: u64 = json[i..end].parse().ok()?;
    Some((base.elapsed().as_micros() as u64).saturating_sub(sent))
}

fn seq_of(json: &str) -> u64 {
    let i = json.find("\"seq\":").unwrap() + 6;
    let end = json[i..].find(',').unwrap() + i;
    json[i..end].parse().unwrap()
}

async fn sse_watcher(
    addr: std::net::SocketAddr,
    base: Instant,
    ready: Arc<tokio::sync::Barrier>,
) -> Seen {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"GET /v1/runs/bench/events/stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut lines = BufReader::new(s).lines();
    let mut seen = Seen {
        events: 0,
        in_order: true,
        latencies_us: Vec::new(),
    };
    let mut last = 0;
    let mut waited = false;
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(json) = line.strip_prefix("data: ") else {
            continue;
        };
        if !json.starts_with("{\"type\"") {
            continue;
        }
        let seq = seq_of(json);
        seen.in_order &= seq == last + 1;
        last = seq;
        seen.events += 1;
        if let Some(l) = latency(base, json) {
            seen.latencies_us.push(l);
        }
        if !waited {
            waited = true;
            ready.wait().await;
        }
        if json.contains("\"type\":\"RunFinished\"") {
            break;
        }
    }
    seen
}

async fn ws_watcher(
    addr: std::net::SocketAddr,
    base: Instant,
    ready: Arc<tokio::sync::Barrier>,
) -> Seen {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws"))
        .await
        .unwrap();
    ws.send(Message::text(
        r#"{"type":"subscribe","id":1,"runId":"bench"}"#,
    ))
    .await
    .unwrap();
    let mut seen = Seen {
        events: 0,
        in_order: true,
        latencies_us: Vec::new(),
    };
    let mut last = 0;
    let mut waited = false;
    while let Some(Ok(m)) = ws.next().await {
        let Message::Text(t) = m else { continue };
        let t = t.as_str();
        if t.starts_with("{\"kind\":\"end\"") {
            break;
        }
        if !t.starts_with("{\"kind\":\"event\"") {
            continue;
        }
        let seq = seq_of(t);
        seen.in_order &= seq == last + 1;
        last = seq;
        seen.events += 1;
        if let Some(l) = latency(base, t) {
            seen.latencies_us.push(l);
        }
        if !waited {
            waited = true;
            ready.wait().await;
        }
    }
    seen
}

fn raise_fd_limit() {
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn vm_hwm() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() {
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match tokio::time::timeout(Duration::from_secs(120), bench()).await {
            Ok(()) => {}
            Err(_) => {
                eprintln!("load bench: gave up after 120 s");
                std::process::exit(1);
            }
        }
    });
}

async fn bench() {
    let n_sse = env("CAIRN_BENCH_SSE", 1000);
    let n_ws = env("CAIRN_BENCH_WS", 1000);
    let n_events = env("CAIRN_BENCH_EVENTS", 2000);
    let rate = env("CAIRN_BENCH_RATE", 500).max(1);

    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open_sqlite(
        &dir.path().join("cairn.db"),
        JournalOptions { log_dir: None },
    )
    .unwrap();
    let engine = Engine::new(journal.clone(), EngineOptions::default());
    let cfg = ServeConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..ServeConfig::default()
    };
    let server = Server::bind(cfg, engine).await.unwrap();
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));

    // Serving starts after the server resumes interrupted runs; the bench's
    // run must not be mistaken for one.
    cairn_server::client::wait_healthy(&format!("http://{addr}"), Duration::from_secs(30))
        .await
        .unwrap();
    journal
        .backend()
        .create_run(&RunRecord {
            run_id: "bench".into(),
            workflow: "bench".into(),
            workflow_path: "bench.yaml".into(),
            workflow_hash: "h".into(),
            workflow_source: String::new(),
            input: serde_json::json!({}),
            status: "running".into(),
            created_ms: 0,
            updated_ms: 0,
            parent_run_id: None,
        })
        .unwrap();
    let log = journal.run_log("bench").unwrap();
    log.append_durable(
        Scope::run(),
        EventKind::RunStarted {
            workflow: "bench".into(),
            workflow_hash: "h".into(),
            input: None,
            resumed: false,
            parent_run_id: None,
            parent_node_id: None,
            depth: 0,
        },
    )
    .await
    .unwrap();

    let base = Instant::now();
    let ready = Arc::new(tokio::sync::Barrier::new(n_sse + n_ws + 1));
    let mut watchers = Vec::new();
    let t_connect = Instant::now();
    for i in 0..n_sse.max(n_ws) {
        if i < n_sse {
            watchers.push(tokio::spawn(sse_watcher(addr, base, ready.clone())));
        }
        if i < n_ws {
            watchers.push(tokio::spawn(ws_watcher(addr, base, ready.clone())));
        }
    }
    // Every watcher has RunStarted: all are live.
    ready.wait().await;
    println!(
        "load: {n_sse} SSE + {n_ws} WebSocket watchers connected and live in {:.2} s",
        t_connect.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut tick = tokio::time::interval(interval);
    for _ in 0..n_events {
        tick.tick().await;
        let now = base.elapsed().as_micros() as u64;
        log.append(
            Scope::node("busy", 0).with_attempt(1),
            EventKind::NodeOutput {
                text: format!("t={now}"),
                stream: OutputStream::Stdout,
            },
        );
    }
    log.append_durable(
        Scope::run(),
        EventKind::RunFinished {
            output: None,
            duration_ms: 0,
        },
    )
    .await
    .unwrap();
    let appended = t0.elapsed();

    let mut lat = Vec::new();
    let mut delivered = 0usize;
    let mut complete = 0usize;
    let expected = n_events + 2;
    for w in watchers {
        let s = w.await.unwrap();
        delivered += s.events;
        if s.events == expected && s.in_order {
            complete += 1;
        }
        lat.extend(s.latencies_us);
    }
    let elapsed = t0.elapsed();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "load: {n_events} events appended at {rate}/s in {:.2} s; {} of {} watchers got all {expected} events in order",
        appended.as_secs_f64(),
        complete,
        n_sse + n_ws
    );
    println!(
        "load: {delivered} events delivered in {:.2} s = {:.0} events/s",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64()
    );
    println!(
        "load: append-to-receipt latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
        pct(0.50) as f64 / 1000.0,
        pct(0.99) as f64 / 1000.0,
        lat.last().copied().unwrap_or(0) as f64 / 1000.0,
        lat.len()
    );
    println!("load: peak memory (VmHWM, server and clients) {}", vm_hwm());
    let _ = stop.send(());
    drop(log);
    let _ = serving.await;
}
