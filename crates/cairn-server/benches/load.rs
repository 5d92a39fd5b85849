//! Load benchmark: one busy run watched by 1,000 SSE and 1,000 WebSocket
//! clients over 127.0.0.1.
//!
//! The server (and the appender standing in for the engine) run in this
//! process; the watchers run in a second process (this binary started again
//! in client mode), so the server's peak memory is its own. Both processes
//! share the machine's cores: on a 2-core machine the clients' socket reads
//! compete with the server's writes, so the latencies include the clients'
//! share of the CPU. The output says how many cores there were.
//!
//! The busy run appends `NodeOutput` events of a realistic size (default
//! 160 bytes of text) at a fixed rate (default 100 events/s) for a fixed
//! time (default 5 s), then `RunFinished`. Each event carries its append
//! time (wall clock, µs since the Unix epoch, which both processes share),
//! so every watcher measures append-to-receipt latency itself.
//!
//! Reports the rate, events delivered per second (over all watchers),
//! whether every watcher received every event in order, latency p50, p99
//! and max, and peak memory (VmHWM) of the server process and of the client
//! process. Bounded: the whole bench gives up after 120 s.
//!
//! `cargo bench -p cairn-server --bench load`. Environment:
//! `CAIRN_BENCH_SSE`, `CAIRN_BENCH_WS` (watchers, default 1000 each),
//! `CAIRN_BENCH_RATE` (events/s, default 100), `CAIRN_BENCH_SECS` (default
//! 5), `CAIRN_BENCH_BYTES` (text per event, default 160),
//! `CAIRN_BENCH_CLIENT_THREADS` (the client process's runtime threads,
//! default 1).

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cairn_events::{EventKind, OutputStream, Scope};
use cairn_server::{Engine, EngineOptions, ServeConfig, Server};
use cairn_store::{Journal, JournalOptions, RunRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Set in the child's environment: the server address to watch.
const CLIENT_MODE: &str = "CAIRN_BENCH_CLIENT_OF";
const GIVE_UP: Duration = Duration::from_secs(120);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// User and system CPU time this process has used so far, in µs.
fn cpu_us() -> (u64, u64) {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(u.ru_utime), us(u.ru_stime))
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

fn main() {
    raise_fd_limit();
    let client_of = std::env::var(CLIENT_MODE).ok();
    // One thread reads all the watchers' sockets: cheaper per read than two
    // that steal work from each other, and it leaves the server the share
    // of the cores a remote client would.
    let threads = env("CAIRN_BENCH_CLIENT_THREADS", 1);
    let rt = if client_of.is_some() && threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(if client_of.is_some() { threads } else { 2 })
            .enable_all()
            .build()
            .unwrap()
    };
    rt.block_on(async {
        let r = match client_of {
            Some(addr) => tokio::time::timeout(GIVE_UP, clients(addr.parse().unwrap())).await,
            None => tokio::time::timeout(GIVE_UP, server()).await,
        };
        if r.is_err() {
            eprintln!("load bench: gave up after {} s", GIVE_UP.as_secs());
            std::process::exit(1);
        }
    });
}

// ---- the client process ----

/// What one watcher saw.
#[derive(Default)]
struct Seen {
    events: usize,
    in_order: bool,
    latencies_us: Vec<u32>,
}

impl Seen {
    fn new() -> Self {
        Seen {
            in_order: true,
            ..Default::default()
        }
    }

    /// One event's JSON: checks its seq follows the last one and takes the
    /// append time out of `"text":"t=<µs> ..."`. Returns true for the
    /// run's terminal event.
    fn event(&mut self, json: &[u8], last: &mut u64) -> bool {
        let seq = number_after(json, b"\"seq\":").unwrap_or(0);
        self.in_order &= seq == *last + 1;
        *last = seq;
        self.events += 1;
        if let Some(sent) = number_after(json, b"\"text\":\"t=") {
            let l = now_us().saturating_sub(sent);
            self.latencies_us.push(l.min(u32::MAX as u64) as u32);
        }
        json.starts_with(b"{\"type\":\"RunFinished\"")
    }
}

fn number_after(hay: &[u8], key: &[u8]) -> Option<u64> {
    let i = memchr::memmem::find(hay, key)? + key.len();
    let mut n = 0u64;
    let mut any = false;
    for &b in &hay[i..] {
        if !b.is_ascii_digit() {
            break;
        }
        n = n * 10 + (b - b'0') as u64;
        any = true;
    }
    any.then_some(n)
}

/// A raw connection read into one buffer, so that a watcher costs the
/// server's machine no more than its socket reads: the clients share the
/// cores with the server they measure.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    /// Unparsed bytes are `buf[start..filled]`.
    start: usize,
    filled: usize,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr, request: &[u8]) -> Conn {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(request).await.unwrap();
        Conn {
            s,
            buf: vec![0; 16 * 1024],
            start: 0,
            filled: 0,
        }
    }

    fn unparsed(&self) -> &[u8] {
        &self.buf[self.start..self.filled]
    }

    /// Reads more; false at the end of the stream.
    async fn fill(&mut self) -> bool {
        if self.start == self.filled {
            (self.start, self.filled) = (0, 0);
        } else if self.start > self.buf.len() / 2 {
            self.buf.copy_within(self.start..self.filled, 0);
            (self.start, self.filled) = (0, self.filled - self.start);
        }
        if self.filled == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        match self.s.read(&mut self.buf[self.filled..]).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.filled += n;
                true
            }
        }
    }
}

/// SSE over raw HTTP/1.1: every `data: ` line is an event (chunked framing
/// lines are skipped like any other line).
async fn sse_watcher(addr: std::net::SocketAddr, ready: Arc<tokio::sync::Barrier>) -> Seen {
    let mut c = Conn::open(
        addr,
        b"GET /v1/runs/bench/events/stream HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    let mut seen = Seen::new();
    let mut last = 0;
    let mut waited = false;
    while c.fill().await {
        while let Some(nl) = memchr::memchr(b'\n', c.unparsed()) {
            let (a, b) = (c.start, c.start + nl);
            c.start = b + 1;
            let Some(json) = c.buf[a..b].strip_prefix(b"data: ") else {
                continue;
            };
            if !json.starts_with(b"{\"type\"") {
                continue;
            }
            let end = seen.event(json, &mut last);
            if !waited {
                waited = true;
                ready.wait().await;
            }
            if end {
                return seen;
            }
        }
    }
    seen
}

/// One complete WebSocket frame at the start of `b`: its opcode and where
/// its payload lies. The server sends whole, unmasked messages.
fn ws_frame(b: &[u8]) -> Option<(u8, usize, usize)> {
    if b.len() < 2 {
        return None;
    }
    assert!(b[0] & 0x80 != 0, "the server sends unfragmented messages");
    assert!(b[1] & 0x80 == 0, "server frames are not masked");
    let (len, head) = match b[1] & 0x7f {
        126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
        127 if b.len() >= 10 => (
            u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
            10,
        ),
        126 | 127 => return None,
        n => (n as usize, 2),
    };
    (b.len() >= head + len).then_some((b[0] & 0x0f, head, head + len))
}

/// A masked text frame, as clients must send.
fn ws_text(payload: &[u8]) -> Vec<u8> {
    let key = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = vec![0x81];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

/// WebSocket over raw TCP: the upgrade, one `subscribe`, then frames.
async fn ws_watcher(addr: std::net::SocketAddr, ready: Arc<tokio::sync::Barrier>) -> Seen {
    let mut c = Conn::open(
        addr,
        b"GET /v1/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await;
    loop {
        assert!(c.fill().await, "the server closed during the upgrade");
        if let Some(i) = memchr::memmem::find(c.unparsed(), b"\r\n\r\n") {
            assert!(c.unparsed().starts_with(b"HTTP/1.1 101"), "upgrade refused");
            c.start += i + 4;
            break;
        }
    }
    c.s.write_all(&ws_text(br#"{"type":"subscribe","id":1,"runId":"bench"}"#))
        .await
        .unwrap();
    const EVENT: &[u8] = b"{\"kind\":\"event\",\"event\":";
    let mut seen = Seen::new();
    let mut last = 0;
    let mut waited = false;
    loop {
        while let Some((op, a, b)) = ws_frame(c.unparsed()) {
            let (a, b) = (c.start + a, c.start + b);
            c.start = b;
            match op {
                1 => {}
                // Close.
                8 => return seen,
                _ => continue,
            }
            let text = &c.buf[a..b];
            if text.starts_with(b"{\"kind\":\"end\"") {
                return seen;
            }
            let Some(json) = text.strip_prefix(EVENT) else {
                continue;
            };
            seen.event(json, &mut last);
            if !waited {
                waited = true;
                ready.wait().await;
            }
        }
        if !c.fill().await {
            return seen;
        }
    }
}

/// Connects every watcher, says `ready` on stdout once each has the run's
/// first event, and when all are done prints one `result` line.
async fn clients(addr: std::net::SocketAddr) {
    let n_sse = env("CAIRN_BENCH_SSE", 1000);
    let n_ws = env("CAIRN_BENCH_WS", 1000);
    let ready = Arc::new(tokio::sync::Barrier::new(n_sse + n_ws + 1));
    let mut watchers = Vec::new();
    for i in 0..n_sse.max(n_ws) {
        if i < n_sse {
            watchers.push(tokio::spawn(sse_watcher(addr, ready.clone())));
        }
        if i < n_ws {
            watchers.push(tokio::spawn(ws_watcher(addr, ready.clone())));
        }
    }
    ready.wait().await;
    let cpu0 = cpu_us();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut lat: Vec<u32> = Vec::new();
    let (mut delivered, mut complete, mut expected) = (0usize, 0usize, 0usize);
    let mut seens = Vec::new();
    for w in watchers {
        seens.push(w.await.unwrap());
    }
    let cpu1 = cpu_us();
    // Per protocol, to tell which path is slower (watchers alternate
    // SSE, WebSocket while both are left).
    let mut by_kind: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for (i, s) in seens.iter().enumerate() {
        let kind = if i < 2 * n_sse.min(n_ws) {
            i % 2
        } else {
            usize::from(n_ws > n_sse)
        };
        by_kind[kind].extend(&s.latencies_us);
    }
    for (name, mut l) in ["SSE", "WebSocket"].into_iter().zip(by_kind) {
        l.sort_unstable();
        let p = |q: f64| {
            l.get(((l.len() as f64 * q) as usize).min(l.len().saturating_sub(1)))
                .map_or(0.0, |&v| v as f64 / 1000.0)
        };
        eprintln!(
            "load: {name} latency p50 {:.2} ms, p99 {:.2} ms",
            p(0.5),
            p(0.99)
        );
    }
    for s in &seens {
        expected = expected.max(s.events);
    }
    for s in seens {
        delivered += s.events;
        if s.events == expected && s.in_order {
            complete += 1;
        }
        lat.extend(s.latencies_us);
    }
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "result {delivered} {complete} {expected} {} {} {} {} {} {} {}",
        lat.len(),
        pct(0.50),
        pct(0.99),
        lat.last().copied().unwrap_or(0),
        vm_hwm_kb(),
        cpu1.0 - cpu0.0,
        cpu1.1 - cpu0.1,
    );
}

// ---- the server process ----

async fn server() {
    let n_sse = env("CAIRN_BENCH_SSE", 1000);
    let n_ws = env("CAIRN_BENCH_WS", 1000);
    let rate = env("CAIRN_BENCH_RATE", 100).max(1);
    let secs = env("CAIRN_BENCH_SECS", 5).max(1);
    let bytes = env("CAIRN_BENCH_BYTES", 160).max(24);
    let n_events = rate * secs;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());

    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open_sqlite(
        &dir.path().join("cairn.db"),
        JournalOptions { log_dir: None },
    )
    .unwrap();
    let engine = Engine::new(journal.clone(), EngineOptions::default());
    let cfg = ServeConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        // The clients' requests say `Host: localhost`, without the port.
        allowed_hosts: vec!["localhost".into()],
        // Every watcher, and room for the bench's own requests.
        max_connections: n_sse + n_ws + 64,
        // Every watcher comes from this one address.
        max_connections_per_client: Some(n_sse + n_ws + 64),
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
    cairn_client::wait_healthy(&format!("http://{addr}"), Duration::from_secs(30))
        .await
        .unwrap();
    journal
        .backend()
        .create_run(&RunRecord {
            run_id: cairn_events::RunId::parse("bench").unwrap(),
            workflow: "bench".into(),
            workflow_path: "bench.yaml".into(),
            workflow_hash: "h".into(),
            workflow_source: String::new(),
            input: serde_json::json!({}),
            status: cairn_store::RecordStatus::Run(cairn_events::RunStatus::Running),
            created_ms: 0,
            updated_ms: 0,
            parent_run_id: None,
        })
        .unwrap();
    let log = journal
        .run_log(&cairn_events::RunId::parse("bench").unwrap())
        .unwrap();
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
            forked_from: None,
            trigger: None,
            replay_of: None,
        },
    )
    .await
    .unwrap();

    println!(
        "load: {n_sse} SSE + {n_ws} WebSocket watchers in a client process sharing this machine's {cores} cores with the server"
    );
    let t_connect = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CLIENT_MODE, addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            let _ = lines_tx.send(std::mem::take(&mut line));
        }
    });
    match lines.recv().await {
        Some(l) if l.trim() == "ready" => {}
        other => panic!("the client process did not get ready: {other:?}"),
    }
    println!(
        "load: all watchers connected and live in {:.2} s",
        t_connect.elapsed().as_secs_f64()
    );

    println!(
        "load: busy run: {n_events} NodeOutput events of {bytes} bytes of text at {rate} events/s for {secs} s"
    );
    // The store's share of the latency, as the server's feeds see it: a
    // subscription on the server's runtime.
    let probe = {
        let journal = journal.clone();
        tokio::spawn(async move {
            let mut sub = journal
                .subscribe(&cairn_events::RunId::parse("bench").unwrap(), 1)
                .unwrap();
            let mut lat = Vec::new();
            while let Some(Ok(ev)) = sub.next().await {
                if let Some(sent) = number_after(ev.json.as_bytes(), b"\"text\":\"t=") {
                    lat.push(now_us().saturating_sub(sent));
                }
            }
            lat.sort_unstable();
            lat
        })
    };
    let pad = "x".repeat(bytes);
    let cpu0 = cpu_us();
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..n_events {
        tick.tick().await;
        let mut text = format!("t={} ", now_us());
        text.push_str(&pad[..bytes.saturating_sub(text.len())]);
        log.append(
            Scope::node("busy", 0).with_attempt(1),
            EventKind::NodeOutput {
                text,
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

    let result = lines.recv().await.expect("the client process's result");
    let elapsed = t0.elapsed();
    let cpu1 = cpu_us();
    let _ = child.wait();
    let f: Vec<u64> = result
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let [delivered, complete, expected, samples, p50, p99, max, client_hwm, c_user, c_sys] = f[..]
    else {
        panic!("bad result line from the client process: {result}");
    };
    let ms = |us: u64| us as f64 / 1000.0;
    let store = probe.await.unwrap();
    let spct = |p: f64| {
        store
            .get(((store.len() as f64 * p) as usize).min(store.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "load: appended in {:.2} s ({:.0} events/s); {complete} of {} watchers got all {expected} events in order{}",
        appended.as_secs_f64(),
        (n_events + 1) as f64 / appended.as_secs_f64(),
        n_sse + n_ws,
        if expected as usize == n_events + 2 { "" } else { " (EXPECTED MORE)" },
    );
    println!(
        "load: delivered {delivered} events in {:.2} s = {:.0} events/s over all watchers",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64()
    );
    println!(
        "load: append-to-receipt latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({samples} samples)",
        ms(p50),
        ms(p99),
        ms(max),
    );
    println!(
        "load: of which the store (append to commit and publish, to a subscriber on the server's runtime): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(spct(0.50)),
        ms(spct(0.99)),
        ms(store.last().copied().unwrap_or(0)),
    );
    let per = |us: u64| us as f64 / delivered.max(1) as f64;
    let (s_user, s_sys) = (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1);
    println!(
        "load: CPU per delivered event, busy phase: server {:.2} µs ({:.2} user + {:.2} system), clients {:.2} µs ({:.2} user + {:.2} system)",
        per(s_user + s_sys),
        per(s_user),
        per(s_sys),
        per(c_user + c_sys),
        per(c_user),
        per(c_sys),
    );
    println!(
        "load: peak memory (VmHWM): server process {} MiB, client process {} MiB",
        vm_hwm_kb() / 1024,
        client_hwm / 1024
    );
    let _ = stop.send(());
    drop(log);
    let _ = serving.await;
}
