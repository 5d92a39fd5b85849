//! The agent crash test: the real `cairn` binary runs an agent whose
//! model (a fake OpenAI-compatible server in this process) streams slowly
//! and whose tools append to a side-effect file, is killed with SIGKILL at
//! random moments over and over, and is resumed until the run is done.
//! No step is asked again once its `AgentStepFinished` is in the store, no
//! side effect happens twice, and every `TokenUsageReported` is one call's
//! own usage.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn_agent::testing::{FakeProvider, Recorded, Reply};
use cairn_events::{Event, EventKind};
use cairn_store::{Backend, EventQuery, SqliteBackend};
use serde_json::json;

const KILLS: usize = 10;
/// The model's turns: each a side effect (an append), then the answer.
const EFFECTS: usize = 5;

fn usage_of(turn: usize) -> u64 {
    100 * (turn as u64 + 1)
}

/// Turn k answers a conversation that holds k answers: a `bash` call that
/// appends `effect-k` to side.log, or at the end the answer. Streamed in
/// pieces 25 ms apart, so that kills land inside answers too.
fn script(r: &Recorded) -> Reply {
    let k = r.body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    let mut events: Vec<String> = ["Working ", "on it, ", "step by ", "step."]
        .iter()
        .map(|p| json!({"choices": [{"index": 0, "delta": {"content": p}}]}).to_string())
        .collect();
    if k < EFFECTS {
        let args =
            json!({"argv": ["sh", "-c", format!("echo effect-{k} >> side.log")]}).to_string();
        events.push(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": format!("c{k}"),
                "type": "function", "function": {"name": "bash", "arguments": args}}]}, "finish_reason": "tool_calls"}]})
            .to_string(),
        );
    } else {
        events.push(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string(),
        );
    }
    events.push(
        json!({"choices": [], "usage": {"prompt_tokens": usage_of(k), "completion_tokens": 7}})
            .to_string(),
    );
    events.push("[DONE]".into());
    Reply::sse(events).every(Duration::from_millis(25))
}

fn cairn(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .args(["--store", ".cairn/cairn.db"])
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn")
}

fn events(store: &Path, run: &str) -> Vec<Event> {
    if !store.exists() {
        return Vec::new();
    }
    let Ok(backend) = SqliteBackend::open(store) else {
        return Vec::new();
    };
    backend
        .read_events(run, &EventQuery::default())
        .unwrap_or_default()
        .iter()
        .map(|s| s.decode().expect("stored events decode"))
        .collect()
}

#[test]
fn an_agent_killed_at_random_moments_repeats_no_finished_step_or_side_effect() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(FakeProvider::start());
    server.respond_with(script);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let yaml = format!(
        r#"
name: agent-crash
models:
  m: {{ provider: openai, model: gpt-4o, base_url: "{}", idle_timeout: 10s }}
nodes:
  - id: work
    agent:
      model: m
      prompt: Make the effects.
      tools: [bash]
"#,
        server.url()
    );
    std::fs::write(dir.join("agent.yaml"), yaml).unwrap();
    let store = dir.join(".cairn/cairn.db");
    let run = "agent-crash";
    let mut seed = std::process::id() as u64 * 2654435761 % 1_000_003 + 1;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut started = false;
    let mut done = false;
    for _ in 0..KILLS {
        let mut child = if started {
            cairn(dir, &["resume", run])
        } else {
            cairn(dir, &["run", "agent.yaml", "--run-id", run])
        };
        std::thread::sleep(Duration::from_millis(60 + next() % 400));
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0), "{}", stderr_of(&mut child));
            done = true;
            break;
        }
        child.kill().unwrap(); // SIGKILL
        wait_exit(&mut child);
        let evs = events(&store, run);
        started = started || !evs.is_empty();
        // Killed after the run's end was committed: nothing to resume.
        if matches!(
            evs.last().map(|e| &e.kind),
            Some(EventKind::RunFinished { .. })
        ) {
            done = true;
            break;
        }
    }
    if !done {
        let mut child = cairn(dir, &["resume", run]);
        let status = wait_exit(&mut child);
        assert_eq!(
            status.code(),
            Some(0),
            "the final resume failed: {}",
            stderr_of(&mut child)
        );
    }

    let evs = events(&store, run);
    assert!(matches!(
        evs.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
    cairn_events::check_log(&evs).unwrap();
    let sessions = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    eprintln!("{sessions} sessions");
    // No side effect twice.
    let side = std::fs::read_to_string(dir.join("side.log")).unwrap_or_default();
    for k in 0..EFFECTS {
        let n = side.lines().filter(|l| *l == format!("effect-{k}")).count();
        assert!(n <= 1, "effect-{k} happened {n} times: {side:?}");
    }
    // No step asked again once finished; every request is a logged step.
    let mut finished: BTreeMap<u32, u32> = BTreeMap::new();
    let mut starts = 0;
    for e in &evs {
        match &e.kind {
            EventKind::AgentStepStarted { step, .. } => {
                starts += 1;
                assert!(
                    !finished.contains_key(step),
                    "step {step} asked again after it finished"
                );
            }
            EventKind::AgentStepFinished { step, .. } => {
                *finished.entry(*step).or_default() += 1;
            }
            _ => {}
        }
    }
    assert_eq!(finished.len(), EFFECTS + 1, "{finished:?}");
    assert!(finished.values().all(|&n| n == 1), "{finished:?}");
    let requests = server.requests().len();
    assert!(
        requests <= starts,
        "{requests} model requests, {starts} logged steps"
    );
    // Every usage is one call's own: never added up.
    let allowed: Vec<u64> = (0..=EFFECTS).map(usage_of).collect();
    let usages: Vec<u64> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported { input_tokens, .. } => Some(*input_tokens),
            _ => None,
        })
        .collect();
    assert!(usages.iter().all(|u| allowed.contains(u)), "{usages:?}");
    assert!(
        usages.len() >= EFFECTS + 1 && usages.len() <= starts,
        "{usages:?}"
    );
    drop(server);
    drop(rt);
}
