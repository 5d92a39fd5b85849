//! One `cairn serve` driving hundreds to thousands of agent runs at once.
//!
//! Starts a fake OpenAI-compatible provider in this process and the real
//! `cairn serve` (SQLite, a temporary folder) as a child process, then runs
//! waves of runs of one workflow: one agent node with the `read` tool, whose
//! model is the fake provider. Every answer streams `CAIRN_BENCH_TOKENS`
//! tokens, one SSE chunk each, at `CAIRN_BENCH_RATE` tokens per second per
//! conversation; every step but the last ends with a `read` of a small file,
//! the last one answers without tools. Each token is `~<µs> ` (the time it
//! left the provider, base 36, on this process's clock), so that a watcher
//! finds the send time of every chunk in the `NodeOutput` text it receives,
//! however the engine batched the chunks.
//!
//! A wave starts all its runs over `POST /v1/runs` (a bounded number of
//! requests in flight), while `CAIRN_BENCH_WATCHERS` of them are followed
//! over SSE (`GET /v1/runs/{id}/events/stream`). The provider holds every
//! first answer until the whole wave has asked for it, so that all runs of
//! the wave stream at the same time. The wave ends when the store holds an
//! end for every run; every run must have finished, and every watcher must
//! have seen every event once, in order, up to `RunFinished`.
//!
//! Before the waves of each size comes the baseline, measured in the same
//! run: the same provider streaming the same number of conversations (same
//! steps, tokens and rate) straight to plain HTTP clients in this process,
//! the same number of them timing every chunk, with no Cairn in between.
//! Its CPU is this process's (provider and clients); Cairn's is the
//! server's. Per wave it prints:
//!
//! - server CPU (utime + stime of `/proc/<pid>/stat` over the wave) per
//!   streamed token and per step, against the baseline's CPU per token;
//! - p50, p99 and max of the delay from a chunk leaving the provider to a
//!   watcher receiving it (the baseline's alongside);
//! - peak RSS during the wave (VmRSS every 100 ms) over the RSS just before
//!   it, per run of the wave (all of them are under way at the peak), and
//!   RSS `CAIRN_BENCH_SETTLE_SECS` after the wave;
//! - events and bytes stored per step, read from the store (read-only):
//!   the events' count (and how many are `NodeOutput`) and stored JSON
//!   (`length(body)`), and the growth of the database's used pages
//!   (`page_count - freelist_count`, which counts what the write-ahead log
//!   holds too, so no checkpoint is needed);
//! - the time to start all runs (to the last `202`) and the wave's time.
//!
//! `cargo bench -p cairn-cli --bench agents_at_scale`. Environment:
//! `CAIRN_BENCH_SIZES` (runs per wave, `NxW` for W waves of N; default
//! `100,1000x3,2000`), `CAIRN_BENCH_STEPS` (steps per run, default 3),
//! `CAIRN_BENCH_TOKENS` (tokens per step, default 100), `CAIRN_BENCH_RATE`
//! (tokens per second per conversation, default 50), `CAIRN_BENCH_WATCHERS`
//! (default 100), `CAIRN_BENCH_STARTS` (start requests in flight, default
//! 32), `CAIRN_BENCH_SETTLE_SECS` (default 5), `CAIRN_BENCH_THREADS` (this
//! process's runtime threads, default 2), `CAIRN_BENCH_BIN` (another
//! `cairn` binary to measure; default the one cargo built),
//! `CAIRN_BENCH_TIMELINE` (set: print each wave's delays by when their
//! chunks were sent, 250 ms at a time).
//! Bounded: it gives up after 30 minutes.

#[path = "../tests/waves/mod.rs"]
mod waves;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::serve::ListenerExt;
use axum::Router;
use cairn_client::{Client, RunId};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GIVE_UP: Duration = Duration::from_secs(30 * 60);
/// A wave whose count of ended runs stays the same this long has stalled.
const STALL: Duration = Duration::from_secs(120);
/// The longest the provider holds first answers after the last start:
/// Cairn gives up on a provider silent for 60 s.
const HOLD_AT_MOST: Duration = Duration::from_secs(30);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `100,1000x3,2000`: (runs, waves).
fn sizes() -> Vec<(usize, usize)> {
    let spec = std::env::var("CAIRN_BENCH_SIZES").unwrap_or_else(|_| "100,1000x3,2000".into());
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let (n, w) = s.trim().split_once('x').unwrap_or((s.trim(), "1"));
            let n = n.parse().expect("CAIRN_BENCH_SIZES: runs per wave");
            let w = w.parse().expect("CAIRN_BENCH_SIZES: waves");
            (n, w)
        })
        .collect()
}

/// This process's clock, shared by the provider and the watchers.
fn now_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

fn base36(mut n: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.reverse();
    String::from_utf8(digits).unwrap()
}

/// Takes the delay of every token `~<base36> ` in `text` (received at
/// `now`) into `out`; returns how much of `text` it read, leaving a token
/// cut off at the end for the next read.
fn scan(text: &[u8], now: u64, out: &mut Vec<u32>) -> usize {
    let mut i = 0;
    while let Some(p) = text[i..].iter().position(|&b| b == b'~') {
        let start = i + p;
        let mut j = start + 1;
        let mut sent = 0u64;
        while j < text.len() && text[j].is_ascii_alphanumeric() {
            let d = (text[j] as char).to_digit(36).unwrap_or(0) as u64;
            sent = sent * 36 + d;
            j += 1;
        }
        if j == text.len() {
            return start;
        }
        if text[j] == b' ' && j > start + 1 {
            out.push(now.saturating_sub(sent).min(u32::MAX as u64) as u32);
        }
        i = j;
    }
    text.len()
}

fn main() {
    waves::raise_fd_limit();
    if std::env::var_os("CAIRN_BENCH_TIMELINE").is_some() {
        let _ = TIMELINE.set(Mutex::new(Vec::new()));
    }
    now_us();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env("CAIRN_BENCH_THREADS", 2).max(1))
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(async { tokio::time::timeout(GIVE_UP, bench()).await });
    if r.is_err() {
        eprintln!("agents_at_scale: gave up after {} s", GIVE_UP.as_secs());
        std::process::exit(1);
    }
}

#[derive(Clone)]
struct Config {
    steps: usize,
    tokens: usize,
    gap: Duration,
    watchers: usize,
    starts: usize,
    settle: Duration,
}

async fn bench() {
    let rate = env("CAIRN_BENCH_RATE", 50).max(1);
    let cfg = Config {
        steps: env("CAIRN_BENCH_STEPS", 3).max(1),
        tokens: env("CAIRN_BENCH_TOKENS", 100).max(1),
        gap: Duration::from_micros(1_000_000 / rate as u64),
        watchers: env("CAIRN_BENCH_WATCHERS", 100),
        starts: env("CAIRN_BENCH_STARTS", 32).max(1),
        settle: Duration::from_secs(env("CAIRN_BENCH_SETTLE_SECS", 5) as u64),
    };
    let sizes = sizes();
    let largest = sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "agents_at_scale: {cores} cores, load {}; runs of {} steps x {} tokens at {rate} tokens/s, a `read` between steps; {} SSE watchers; waves {:?}",
        loadavg(),
        cfg.steps,
        cfg.tokens,
        cfg.watchers,
        sizes,
    );

    let provider = Provider::start(cfg.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let wf = dir.path().join("workflows");
    std::fs::create_dir_all(&wf).unwrap();
    std::fs::write(
        wf.join("agents.yaml"),
        format!(
            r#"name: agents
models:
  fake: {{ provider: openai, model: bench, base_url: "{}/v1" }}
nodes:
  - id: agent
    agent:
      model: fake
      prompt: "Read notes.txt between your steps, then answer."
      tools: [read]
      max_steps: {}
"#,
            provider.url(),
            cfg.steps + 1
        ),
    )
    .unwrap();
    let bin = std::env::var_os("CAIRN_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cairn").into());
    // Every start request, watcher and poll comes from this one address.
    let mut served = waves::Served::start(&bin, dir.path(), largest + cfg.watchers + 256).await;
    let pid = served.child.id();
    let idle = rss_kb(pid).unwrap_or(0);
    println!(
        "agents_at_scale: cairn serve (pid {pid}) idle RSS {:.1} MB",
        mb(idle)
    );
    let store = Store::open(&dir.path().join("cairn.db"));

    let mut rows = Vec::new();
    let mut all_runs = 0;
    for &(runs, n_waves) in &sizes {
        let base = baseline(&provider, runs, &cfg).await;
        println!(
            "baseline {runs}: provider + {runs} plain clients, no Cairn: {:.1} s, bench CPU {:.2} s = {:.1} µs per token (other processes {:.2} s); delay p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} chunks timed)",
            base.wall.as_secs_f64(),
            base.cpu_us as f64 / 1e6,
            base.cpu_us as f64 / base.tokens as f64,
            base.others_cpu_us as f64 / 1e6,
            ms(pct(&base.delays, 50.0)),
            ms(pct(&base.delays, 99.0)),
            ms(pct(&base.delays, 100.0)),
            base.delays.len(),
        );
        for i in 1..=n_waves {
            let w = wave(
                &provider,
                &mut served,
                &store,
                dir.path(),
                runs,
                &cfg,
                all_runs,
            )
            .await;
            all_runs += runs;
            let row = Row {
                runs,
                wave: i,
                base: base.clone(),
                w,
            };
            row.print();
            rows.push(row);
        }
    }
    // The kernel updates VmHWM lazily: the samples may have seen more.
    let peak = rows
        .iter()
        .map(|r| r.w.rss_peak)
        .chain(status_kb(pid, "VmHWM"))
        .max()
        .unwrap_or(0);
    println!(
        "\nagents_at_scale: load {}; server peak RSS {:.1} MB\n",
        loadavg(),
        mb(peak)
    );
    println!("| runs | wave | start | wave time | server CPU per token | baseline CPU per token | server CPU per step | delay p50 | p99 | max | baseline p99 | per active run | RSS after | events per step | stored per step (JSON, pages) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        r.table_line();
    }
}

// ---- the fake provider ----

/// The provider's figures, over the whole bench.
#[derive(Default)]
struct Counts {
    tokens: AtomicU64,
    answers: AtomicU64,
    /// Answers streaming now, and the most at once since the last reset.
    open: AtomicUsize,
    most_open: AtomicUsize,
    conversations: AtomicU64,
}

/// One wave's hold of first answers.
struct Gate {
    firsts: AtomicUsize,
    open: tokio::sync::watch::Sender<bool>,
}

struct Shared {
    cfg: Config,
    counts: Counts,
    gate: Mutex<Arc<Gate>>,
}

struct Provider {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Provider {
    async fn start(cfg: Config) -> Provider {
        let shared = Arc::new(Shared {
            cfg,
            counts: Counts::default(),
            gate: Mutex::new(Arc::new(Gate {
                firsts: AtomicUsize::new(0),
                open: tokio::sync::watch::channel(true).0,
            })),
        });
        let app = Router::new().fallback(answer).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Chunks of a few dozen bytes every 20 ms: Nagle's algorithm would
        // hold each one back until the last was acknowledged.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Provider { addr, shared }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds first answers from now on until [`Provider::release`].
    fn hold(&self) -> Arc<Gate> {
        let gate = Arc::new(Gate {
            firsts: AtomicUsize::new(0),
            open: tokio::sync::watch::channel(false).0,
        });
        *self.shared.gate.lock().unwrap() = gate.clone();
        self.shared.counts.most_open.store(0, Ordering::Relaxed);
        gate
    }

    /// Waits until `n` conversations asked for their first answer (or
    /// [`HOLD_AT_MOST`]), then lets every held answer go; returns how
    /// many had asked.
    async fn release(&self, gate: &Gate, n: usize) -> usize {
        let until = Instant::now() + HOLD_AT_MOST;
        while gate.firsts.load(Ordering::Relaxed) < n && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = gate.open.send(true);
        gate.firsts.load(Ordering::Relaxed)
    }

    fn tokens(&self) -> u64 {
        self.shared.counts.tokens.load(Ordering::Relaxed)
    }

    fn answers(&self) -> u64 {
        self.shared.counts.answers.load(Ordering::Relaxed)
    }
}

/// Answers a chat completion: the step is the number of assistant messages
/// the conversation holds so far.
async fn answer(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let step = count(&body, br#""role":"assistant""#);
    if step == 0 {
        let gate = shared.gate.lock().unwrap().clone();
        let mut open = gate.open.subscribe();
        gate.firsts.fetch_add(1, Ordering::Relaxed);
        let _ = open.wait_for(|o| *o).await;
    }
    let counts = &shared.counts;
    let open = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
    counts.most_open.fetch_max(open, Ordering::Relaxed);
    // Conversations released together start a gap apart spread evenly, not
    // all on the same tick.
    let k = counts.conversations.fetch_add(1, Ordering::Relaxed);
    let gap = shared.cfg.gap;
    let phase = gap.mul_f64((k as f64 * 0.618_034) % 1.0);
    let a = Answer {
        shared: shared.clone(),
        step,
        token: 0,
        start: tokio::time::Instant::now() + phase,
        done: false,
    };
    let body = futures::stream::unfold(a, |mut a| async move {
        let cfg = &a.shared.cfg;
        if a.token < cfg.tokens {
            tokio::time::sleep_until(a.start + cfg.gap * a.token as u32).await;
            a.token += 1;
            a.shared.counts.tokens.fetch_add(1, Ordering::Relaxed);
            let chunk = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"~{} \"}}}}]}}\n\n",
                base36(now_us())
            );
            return Some((Ok::<_, std::io::Error>(Bytes::from(chunk)), a));
        }
        if a.done {
            return None;
        }
        a.done = true;
        a.shared.counts.answers.fetch_add(1, Ordering::Relaxed);
        let last = a.step + 1 >= cfg.steps;
        let mut tail = String::new();
        if !last {
            let call = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "id": format!("call_{}", a.step), "type": "function",
                "function": {"name": "read", "arguments": "{\"path\":\"notes.txt\"}"}}]}}]});
            tail.push_str(&format!("data: {call}\n\n"));
        }
        let finish = if last { "stop" } else { "tool_calls" };
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 200 + a.step * cfg.tokens,
            "completion_tokens": cfg.tokens}});
        tail.push_str(&format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{finish}\"}}]}}\n\ndata: {usage}\n\ndata: [DONE]\n\n"
        ));
        Some((Ok(Bytes::from(tail)), a))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}

/// One answer being streamed.
struct Answer {
    shared: Arc<Shared>,
    step: usize,
    token: usize,
    start: tokio::time::Instant,
    done: bool,
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.shared.counts.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

// ---- the baseline: the provider and plain clients, no Cairn ----

#[derive(Clone)]
struct Baseline {
    wall: Duration,
    cpu_us: u64,
    /// Other processes' CPU meanwhile (the idle server's included).
    others_cpu_us: u64,
    tokens: u64,
    delays: Vec<u32>,
}

async fn baseline(provider: &Provider, runs: usize, cfg: &Config) -> Baseline {
    let gate = provider.hold();
    let tokens0 = provider.tokens();
    let cpu0 = self_cpu_us();
    let all0 = machine_cpu_us();
    let t0 = Instant::now();
    let every = (runs / cfg.watchers.max(1)).max(1);
    let mut clients = Vec::with_capacity(runs);
    for i in 0..runs {
        let timed = i % every == 0 && i / every < cfg.watchers;
        let (addr, steps) = (provider.addr, cfg.steps);
        clients.push(tokio::spawn(converse(addr, steps, timed)));
    }
    let asked = provider.release(&gate, runs).await;
    assert_eq!(
        asked, runs,
        "baseline: only {asked} of {runs} conversations reached the provider"
    );
    let mut delays = Vec::new();
    for c in clients {
        match c.await.unwrap() {
            Ok(d) => delays.extend(d),
            Err(e) => panic!("baseline: a conversation failed: {e}"),
        }
    }
    let cpu = self_cpu_us() - cpu0;
    let others = (machine_cpu_us() - all0).saturating_sub(cpu);
    delays.sort_unstable();
    Baseline {
        wall: t0.elapsed(),
        cpu_us: cpu,
        others_cpu_us: others,
        tokens: provider.tokens() - tokens0,
        delays,
    }
}

/// One conversation over one kept-alive connection, read as raw bytes; the
/// delays of its chunks when `timed`.
async fn converse(addr: SocketAddr, steps: usize, timed: bool) -> Result<Vec<u32>, String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut delays = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut messages = String::from(r#"{"role":"user","content":"go"}"#);
    for _ in 0..steps {
        let body = format!(r#"{{"model":"bench","stream":true,"messages":[{messages}]}}"#);
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        // Unread bytes (a token cut off), then the end of the chunked body.
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the provider closed the connection".into());
            }
            let now = now_us();
            carry.extend_from_slice(&buf[..n]);
            let read = if timed {
                scan(&carry, now, &mut delays)
            } else {
                carry.len()
            };
            if carry.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
            // Keep what the end's test needs.
            let keep = read.min(carry.len().saturating_sub(8));
            carry.drain(..keep);
        }
        messages.push_str(r#",{"role":"assistant","content":"..."}"#);
    }
    Ok(delays)
}

// ---- a wave on cairn serve ----

struct WaveResult {
    start: Duration,
    wall: Duration,
    server_cpu_us: u64,
    start_cpu_us: u64,
    bench_cpu_us: u64,
    others_cpu_us: u64,
    tokens: u64,
    steps: u64,
    delays: Vec<u32>,
    rss_before: u64,
    rss_peak: u64,
    rss_after: u64,
    most_open: usize,
    events: u64,
    outputs: u64,
    json_bytes: u64,
    page_bytes: u64,
    watched_events: usize,
    load: String,
}

async fn wave(
    provider: &Provider,
    served: &mut waves::Served,
    store: &Store,
    dir: &Path,
    runs: usize,
    cfg: &Config,
    before: usize,
) -> WaveResult {
    let pid = served.child.id();
    let load = loadavg();
    let stored0 = store.totals();
    let gate = provider.hold();
    let (tokens0, answers0) = (provider.tokens(), provider.answers());
    let rss_before = rss_kb(pid).unwrap_or(0);
    let cpu0 = proc_cpu_us(pid);
    let self0 = self_cpu_us();
    let all0 = machine_cpu_us();
    let t0 = Instant::now();

    let peak = Arc::new(AtomicU64::new(rss_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while sampling.load(Ordering::Relaxed) {
                tick.tick().await;
                if let Some(kb) = rss_kb(pid) {
                    peak.fetch_max(kb, Ordering::Relaxed);
                }
            }
        })
    };

    let client = Client::new(&served.url, None).unwrap();
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.starts));
    let every = (runs / cfg.watchers.max(1)).max(1);
    let mut starts = Vec::with_capacity(runs);
    for i in 0..runs {
        let permit = slots.clone().acquire_owned().await.unwrap();
        let client = client.clone();
        let timed = i % every == 0 && i / every < cfg.watchers;
        starts.push(tokio::spawn(async move {
            let r = client
                .post_json("/v1/runs", &json!({"workflow": "agents"}))
                .await;
            drop(permit);
            let id = match r {
                Ok(v) => v["runId"].as_str().unwrap_or_default().to_string(),
                Err(e) => return Err(format!("start: {e}")),
            };
            let watcher = timed.then(|| tokio::spawn(watch(client, id.clone())));
            Ok((id, watcher))
        }));
    }
    let mut ids = Vec::with_capacity(runs);
    let mut watchers = Vec::new();
    for s in starts {
        match s.await.unwrap() {
            Ok((id, w)) => {
                ids.push(id);
                watchers.extend(w);
            }
            Err(e) => fail(dir, &format!("{runs} runs: {e}")),
        }
    }
    let start = t0.elapsed();
    let asked = provider.release(&gate, runs).await;
    let start_cpu = proc_cpu_us(pid) - cpu0;
    if asked < runs {
        eprintln!(
            "agents_at_scale: only {asked} of {runs} runs asked for their first answer within {} s of the last start",
            HOLD_AT_MOST.as_secs()
        );
    }

    // The store says when every run ended; reading it costs the server
    // nothing. The read blocks, so it leaves the runtime's thread to the
    // watchers, whose delays are being timed.
    let target = before + runs;
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let ended = tokio::task::block_in_place(|| store.ended());
        if ended >= target {
            break;
        }
        if ended != last {
            (last, since) = (ended, Instant::now());
        } else if since.elapsed() > STALL {
            fail(
                dir,
                &format!(
                    "{runs} runs: {} of them still under way after {} s without progress",
                    target - ended,
                    STALL.as_secs()
                ),
            );
        }
        if let Ok(Some(status)) = served.child.try_wait() {
            fail(
                dir,
                &format!("cairn serve exited during the wave: {status}"),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = t0.elapsed();
    let server_cpu = proc_cpu_us(pid) - cpu0;
    let bench_cpu = self_cpu_us() - self0;
    // What neither the server nor this process used: other processes'
    // share of the cores during the wave.
    let others_cpu = (machine_cpu_us() - all0).saturating_sub(server_cpu + bench_cpu);
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;

    let unfinished = store.not_finished(&ids);
    if !unfinished.is_empty() {
        fail(
            dir,
            &format!(
                "{runs} runs: {} did not finish, e.g. {:?}",
                unfinished.len(),
                &unfinished[..unfinished.len().min(5)]
            ),
        );
    }
    let mut delays = Vec::new();
    let mut watched_events = 0;
    for w in watchers {
        let (id, events, end, d) = w.await.unwrap();
        if end != "RunFinished" {
            fail(
                dir,
                &format!("watcher of {id}: the stream ended with {end}"),
            );
        }
        watched_events += events;
        delays.extend(d);
    }
    delays.sort_unstable();
    if let Some(line) = TIMELINE.get() {
        print_timeline(&mut line.lock().unwrap());
    }

    tokio::time::sleep(cfg.settle).await;
    let rss_after = rss_kb(pid).unwrap_or(0);
    let stored = store.totals();
    let tokens = provider.tokens() - tokens0;
    let steps = provider.answers() - answers0;
    let expected = (runs * cfg.steps) as u64;
    if steps != expected || tokens != expected * cfg.tokens as u64 {
        eprintln!(
            "agents_at_scale: {runs} runs: the provider streamed {steps} answers and {tokens} tokens, expected {expected} and {}",
            expected * cfg.tokens as u64
        );
    }
    WaveResult {
        start,
        wall,
        server_cpu_us: server_cpu,
        start_cpu_us: start_cpu,
        bench_cpu_us: bench_cpu,
        others_cpu_us: others_cpu,
        tokens,
        steps,
        delays,
        rss_before,
        rss_peak: peak.load(Ordering::Relaxed),
        rss_after,
        most_open: provider.shared.counts.most_open.load(Ordering::Relaxed),
        events: stored.events - stored0.events,
        outputs: stored.outputs - stored0.outputs,
        json_bytes: stored.json_bytes - stored0.json_bytes,
        page_bytes: stored.used_bytes.saturating_sub(stored0.used_bytes),
        watched_events,
        load,
    }
}

/// Follows a run's SSE stream to its end: the run, the events seen, how
/// the stream ended, and the delays of the chunks in its `NodeOutput`s.
async fn watch(client: Client, run: String) -> (String, usize, String, Vec<u32>) {
    let mut delays = Vec::new();
    let id = match RunId::parse(&run) {
        Ok(id) => id,
        Err(e) => return (run, 0, format!("run id: {e}"), delays),
    };
    let mut stream = match client.events(&id, 0, false).await {
        Ok(s) => s,
        Err(e) => return (run, 0, format!("stream: {e}"), delays),
    };
    let (mut n, mut last) = (0, String::from("(no event)"));
    while let Some(line) = stream.next_event().await {
        let now = now_us();
        let l = match line {
            Ok(l) => l,
            Err(e) => {
                last = format!("stream: {e}");
                break;
            }
        };
        n += 1;
        let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
        if v["seq"].as_u64() != Some(n as u64) {
            last = format!("event {n} has seq {}: a gap or a duplicate", v["seq"]);
            break;
        }
        last = v["type"].as_str().unwrap_or("?").to_string();
        if last == "NodeOutput" {
            if let Some(t) = v["text"].as_str() {
                let from = delays.len();
                scan(t.as_bytes(), now, &mut delays);
                if let Some(line) = TIMELINE.get() {
                    let mut line = line.lock().unwrap();
                    line.extend(delays[from..].iter().map(|&d| (now - d as u64, d)));
                }
            }
        }
    }
    (run, n, last, delays)
}

/// With `CAIRN_BENCH_TIMELINE` set, every timed chunk of the wave: (sent,
/// delay), both in µs; for finding when in a wave the slow chunks were.
static TIMELINE: OnceLock<Mutex<Vec<(u64, u32)>>> = OnceLock::new();

/// The wave's delays by when their chunks were sent, in windows of 250 ms:
/// a stall shows as a window whose p99 stands out.
fn print_timeline(line: &mut Vec<(u64, u32)>) {
    line.sort_unstable();
    let Some(&(t0, _)) = line.first() else {
        return;
    };
    let mut i = 0;
    while i < line.len() {
        let w = (line[i].0 - t0) / 250_000;
        let mut d: Vec<u32> = Vec::new();
        while i < line.len() && (line[i].0 - t0) / 250_000 == w {
            d.push(line[i].1);
            i += 1;
        }
        d.sort_unstable();
        println!(
            "  timeline {:>5.2} s: {:>5} chunks, p50 {:>4.0} ms, p99 {:>4.0} ms, max {:>4.0} ms",
            w as f64 / 4.0,
            d.len(),
            ms(pct(&d, 50.0)),
            ms(pct(&d, 99.0)),
            ms(pct(&d, 100.0))
        );
    }
    line.clear();
}

fn fail(dir: &Path, what: &str) -> ! {
    let err = std::fs::read_to_string(dir.join("serve.err")).unwrap_or_default();
    let mut i = err.len().saturating_sub(6000);
    while !err.is_char_boundary(i) {
        i += 1;
    }
    panic!(
        "agents_at_scale: {what}\ncairn serve said (tail):\n{}",
        &err[i..]
    );
}

// ---- the store, read-only ----

struct Store {
    path: PathBuf,
    conn: Mutex<Option<rusqlite::Connection>>,
}

#[derive(Default)]
struct Totals {
    events: u64,
    outputs: u64,
    json_bytes: u64,
    used_bytes: u64,
}

impl Store {
    fn open(path: &Path) -> Store {
        Store {
            path: path.to_path_buf(),
            conn: Mutex::new(None),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>) -> T {
        let mut c = self.conn.lock().unwrap();
        if c.is_none() {
            let conn = rusqlite::Connection::open_with_flags(
                &self.path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .expect("open the store read-only");
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            *c = Some(conn);
        }
        f(c.as_ref().unwrap()).expect("read the store")
    }

    /// Runs that ended, whichever way.
    fn ended(&self) -> usize {
        self.with(|c| {
            c.query_row(
                "SELECT count(*) FROM runs WHERE status IN ('finished', 'failed', 'cancelled')",
                [],
                |r| r.get::<_, i64>(0),
            )
        }) as usize
    }

    /// The runs of `ids` that did not finish, with their status and the
    /// first error their log holds.
    fn not_finished(&self, ids: &[String]) -> Vec<String> {
        self.with(|c| {
            let mut status = c.prepare("SELECT status FROM runs WHERE run_id = ?1")?;
            let mut error = c.prepare(
                "SELECT e.body FROM events e JOIN event_runs k ON k.run = e.run \
                 WHERE k.run_id = ?1 AND e.body LIKE '%\"error\"%' ORDER BY e.seq LIMIT 1",
            )?;
            let mut out = Vec::new();
            for id in ids {
                let s: Option<String> =
                    status
                        .query_row([id], |r| r.get(0))
                        .map(Some)
                        .or_else(|e| match e {
                            rusqlite::Error::QueryReturnedNoRows => Ok(None),
                            e => Err(e),
                        })?;
                if s.as_deref() != Some("finished") {
                    let why: Option<String> = error.query_row([id], |r| r.get(0)).ok();
                    out.push(format!(
                        "{id}: {} {}",
                        s.as_deref().unwrap_or("(no row)"),
                        why.unwrap_or_default()
                    ));
                }
            }
            Ok(out)
        })
    }

    fn totals(&self) -> Totals {
        self.with(|c| {
            let (events, json_bytes) = c.query_row(
                "SELECT count(*), coalesce(sum(length(body)), 0) FROM events",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )?;
            let outputs = c.query_row(
                "SELECT count(*) FROM events WHERE type = \
                 (SELECT type FROM event_types WHERE name = 'NodeOutput')",
                [],
                |r| r.get::<_, i64>(0),
            )? as u64;
            let pragma = |p: &str| c.query_row(&format!("PRAGMA {p}"), [], |r| r.get::<_, i64>(0));
            let used = (pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?;
            Ok(Totals {
                events,
                outputs,
                json_bytes,
                used_bytes: used as u64,
            })
        })
    }
}

// ---- figures from /proc ----

/// A number of kB from `/proc/<pid>/status`, while the process lives.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.split(':').next() == Some(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS")
}

/// A process's user + system CPU so far, in µs (clock-tick resolution).
fn proc_cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: state is the first,
    // utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // SAFETY: a plain call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) * 1_000_000 / hz
}

/// The CPU every process of the machine used so far (all but idle and
/// I/O wait), in µs.
fn machine_cpu_us() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let busy = f.iter().take(8).sum::<u64>() - f.get(3).unwrap_or(&0) - f.get(4).unwrap_or(&0);
    // SAFETY: a plain call.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    busy * 1_000_000 / hz
}

/// This process's user + system CPU so far, in µs.
fn self_cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// ---- the report ----

struct Row {
    runs: usize,
    wave: usize,
    base: Baseline,
    w: WaveResult,
}

impl Row {
    fn per_token_us(&self) -> f64 {
        self.w.server_cpu_us as f64 / self.w.tokens.max(1) as f64
    }

    fn base_per_token_us(&self) -> f64 {
        self.base.cpu_us as f64 / self.base.tokens.max(1) as f64
    }

    fn per_run_mb(&self) -> f64 {
        mb(self.w.rss_peak.saturating_sub(self.w.rss_before)) / self.runs as f64
    }

    fn print(&self) {
        let w = &self.w;
        let steps = w.steps.max(1) as f64;
        println!(
            "wave {} of {} runs (load {}): started in {:.1} s, all ended {:.1} s after the first start; {} tokens, {} steps, at most {} answers streaming at once\n  \
             server CPU {:.2} s ({:.2} s of it starting: {:.2} ms per run): {:.1} µs per token ({:.2}x the baseline's {:.1}), {:.2} ms per step; bench CPU {:.2} s, other processes {:.2} s\n  \
             delay provider -> watcher: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} chunks in {} events; baseline p50 {:.1}, p99 {:.1} ms)\n  \
             RSS before {:.1} MB, peak {:.1} MB: {:.3} MB per active run; {:.1} MB after the wave\n  \
             stored: {:.1} events per step ({:.1} of them `NodeOutput`), {:.0} B of JSON per step, {:.0} B of pages per step",
            self.wave,
            self.runs,
            w.load,
            w.start.as_secs_f64(),
            w.wall.as_secs_f64(),
            w.tokens,
            w.steps,
            w.most_open,
            w.server_cpu_us as f64 / 1e6,
            w.start_cpu_us as f64 / 1e6,
            w.start_cpu_us as f64 / 1e3 / self.runs as f64,
            self.per_token_us(),
            self.per_token_us() / self.base_per_token_us(),
            self.base_per_token_us(),
            w.server_cpu_us as f64 / 1e3 / steps,
            w.bench_cpu_us as f64 / 1e6,
            w.others_cpu_us as f64 / 1e6,
            ms(pct(&w.delays, 50.0)),
            ms(pct(&w.delays, 99.0)),
            ms(pct(&w.delays, 100.0)),
            w.delays.len(),
            w.watched_events,
            ms(pct(&self.base.delays, 50.0)),
            ms(pct(&self.base.delays, 99.0)),
            mb(w.rss_before),
            mb(w.rss_peak),
            self.per_run_mb(),
            mb(w.rss_after),
            w.events as f64 / steps,
            w.outputs as f64 / steps,
            w.json_bytes as f64 / steps,
            w.page_bytes as f64 / steps,
        );
    }

    fn table_line(&self) {
        let w = &self.w;
        let steps = w.steps.max(1) as f64;
        println!(
            "| {} | {} | {:.1} s | {:.1} s | {:.1} µs | {:.1} µs | {:.2} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} MB | {:.1} MB | {:.1} | {:.0} B, {:.0} B |",
            self.runs,
            self.wave,
            w.start.as_secs_f64(),
            w.wall.as_secs_f64(),
            self.per_token_us(),
            self.base_per_token_us(),
            w.server_cpu_us as f64 / 1e3 / steps,
            ms(pct(&w.delays, 50.0)),
            ms(pct(&w.delays, 99.0)),
            ms(pct(&w.delays, 100.0)),
            ms(pct(&self.base.delays, 99.0)),
            self.per_run_mb(),
            mb(w.rss_after),
            w.events as f64 / steps,
            w.json_bytes as f64 / steps,
            w.page_bytes as f64 / steps,
        );
    }
}

/// The `p`th percentile of sorted delays, in µs.
fn pct(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(us: u32) -> f64 {
    us as f64 / 1000.0
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}
