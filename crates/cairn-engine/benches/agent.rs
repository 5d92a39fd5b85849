//! The engine's cost per agent step, and many agents at once.
//!
//! ```sh
//! cargo bench -p cairn-engine --bench agent
//! ```
//!
//! - **steps**: one agent whose scripted model answers at once, 200 steps,
//!   each asking for one `read` of a small file: what the loop costs per
//!   step with its commits (`AgentStepStarted` and `AgentStepFinished`
//!   durable, the call's row and `ToolCallStarted` durable), against a
//!   baseline measured in the same run: as many durable appends through
//!   the journal as a step makes (three), with nothing else.
//! - **parallel**: 200 agent nodes at once against a fake OpenAI-compatible
//!   server on 127.0.0.1 that streams each answer in pieces: peak memory
//!   per running agent and events per second.
//!
//! Target: under 1 ms of engine per step, commits included.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_agent::testing::{FakeProvider, Recorded, Reply};
use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind, Scope};
use cairn_store::{Journal, JournalOptions};
use serde_json::json;

cairn_engine::use_run_allocator!();

const STEPS: usize = 200;
const AGENTS: usize = 200;

fn journal(dir: &std::path::Path) -> Journal {
    Journal::open_sqlite(
        &dir.join("cairn.db"),
        JournalOptions {
            log_dir: Some(dir.join("logs")),
        },
    )
    .unwrap()
}

fn peak_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

async fn run(engine: &Engine, path: &std::path::Path, counter: Arc<AtomicU64>) -> RunOutcome {
    let wf = cairn_workflow::load(path).expect("load");
    let opts = StartOptions {
        observer: Some(Arc::new(move |_: &Event| {
            counter.fetch_add(1, Ordering::Relaxed);
        })),
        ..StartOptions::default()
    };
    engine
        .start(wf, json!({}), opts)
        .await
        .expect("start")
        .wait()
        .await
}

/// One agent, `STEPS` steps of a scripted model that answers at once.
async fn steps() -> (f64, u64) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), "a small file\n").unwrap();
    let mut turns: Vec<serde_json::Value> = (0..STEPS - 1)
        .map(|_| json!({"tool_calls": [{"name": "read", "args": {"path": "f.txt"}}], "usage": {"input": 100, "output": 10}}))
        .collect();
    turns.push(json!({"text": "done", "usage": {"input": 100, "output": 1}}));
    std::fs::write(
        dir.path().join("turns.json"),
        json!({ "turns": turns }).to_string(),
    )
    .unwrap();
    let yaml = format!(
        "name: steps\nmodels:\n  m: {{ provider: scripted, script: turns.json }}\nnodes:\n  - id: a\n    agent: {{ model: m, prompt: go, tools: [read], max_steps: {} }}\n",
        STEPS + 1
    );
    let path = dir.path().join("wf.yaml");
    std::fs::write(&path, yaml).unwrap();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let events = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let outcome = run(&engine, &path, events.clone()).await;
    let took = t0.elapsed();
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    engine.journal().close();
    (
        took.as_secs_f64() * 1e6 / STEPS as f64,
        events.load(Ordering::Relaxed),
    )
}

/// Three durable appends per step through the journal alone.
async fn baseline() -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let log = j
        .run_log(&cairn_events::RunId::parse("baseline").unwrap())
        .unwrap();
    let t0 = Instant::now();
    for step in 0..STEPS as u32 {
        for kind in [
            EventKind::AgentStepStarted {
                step,
                model: "m".into(),
                snapshot: None,
                request_hash: None,
                prompt: None,
            },
            EventKind::AgentStepFinished {
                step,
                tool_calls: 1,
                finish_reason: "tool_calls".into(),
                message: json!({"toolCalls": [{"id": "call_1", "name": "read", "args": "{\"path\":\"f.txt\"}"}]}),
            },
            EventKind::ToolCallStarted {
                tool_name: "read".into(),
                tool_seq: step + 1,
                idempotency_key: "ck_0".into(),
                side_effect: false,
            },
        ] {
            log.append_durable(Scope::node("a", 0).with_attempt(1), kind)
                .await
                .unwrap();
        }
    }
    let took = t0.elapsed();
    drop(log);
    j.close();
    took.as_secs_f64() * 1e6 / STEPS as f64
}

/// The fake model's answer for the parallel case: a `read`, twice, then
/// the answer, each streamed in pieces.
fn parallel_reply(r: &Recorded) -> Reply {
    let answers = r.body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    let mut events = vec![];
    for piece in ["Looking ", "at the ", "file now."] {
        events.push(json!({"choices": [{"index": 0, "delta": {"content": piece}}]}).to_string());
    }
    if answers < 2 {
        events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
            "function": {"name": "read", "arguments": "{\"path\": \"f.txt\"}"}}]}, "finish_reason": "tool_calls"}]}).to_string());
    }
    events.push(
        json!({"choices": [], "usage": {"prompt_tokens": 200, "completion_tokens": 20}})
            .to_string(),
    );
    events.push("[DONE]".into());
    Reply::sse(events).every(Duration::from_millis(5))
}

/// `AGENTS` agents at once against the fake server.
async fn parallel() -> (f64, f64, f64, u64) {
    let server = FakeProvider::start().await;
    server.respond_with(parallel_reply);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), "a small file\n").unwrap();
    let mut yaml = format!(
        "name: parallel\nconcurrency: {AGENTS}\nmodels:\n  m: {{ provider: openai, model: gpt-4o-mini, base_url: {} }}\nnodes:\n",
        server.url()
    );
    for i in 0..AGENTS {
        yaml.push_str(&format!(
            "  - id: a{i}\n    agent: {{ model: m, prompt: go, tools: [read] }}\n"
        ));
    }
    let path = dir.path().join("wf.yaml");
    std::fs::write(&path, yaml).unwrap();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let before = rss_mb();
    let events = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let outcome = run(&engine, &path, events.clone()).await;
    let took = t0.elapsed().as_secs_f64();
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let peak = peak_mb();
    engine.journal().close();
    let n = events.load(Ordering::Relaxed);
    (
        took,
        (peak - before).max(0.0) * 1024.0 / AGENTS as f64,
        n as f64 / took,
        n,
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    cairn_engine::limit_malloc_arenas();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Warm the store's and the tools' code paths once.
        let _ = steps().await;
        let mut per_step: Vec<f64> = Vec::new();
        let mut base: Vec<f64> = Vec::new();
        let mut events = 0;
        for _ in 0..5 {
            let (s, e) = steps().await;
            per_step.push(s);
            events = e;
            base.push(baseline().await);
        }
        per_step.sort_by(f64::total_cmp);
        base.sort_by(f64::total_cmp);
        let (s, b) = (per_step[2], base[2]);
        println!();
        println!("agent steps: one agent, {STEPS} steps, scripted model answering at once, one `read` per step");
        println!(
            "  per step: {s:.0} µs  (baseline, three durable appends alone: {b:.0} µs; ratio {:.2}×; {events} events)  target < 1000 µs{}",
            s / b,
            if s < 1000.0 { "" } else { "  MISSED" }
        );
        let (took, kb_per_agent, eps, n) = parallel().await;
        println!(
            "parallel: {AGENTS} agents, 3 steps each, fake OpenAI server streaming: {took:.2} s, {n} events, {eps:.0} events/s, peak memory {kb_per_agent:.0} KB per running agent"
        );
    });
}
