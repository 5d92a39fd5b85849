//! The agent crash test: the real `cairn` binary runs an agent whose
//! model (a fake OpenAI-compatible server in this process) streams slowly
//! and whose tools append to a side-effect file, is killed with SIGKILL at
//! random moments over and over, and is resumed until the run is done.
//! No step is asked again once its `AgentStepFinished` is in the store, no
//! side effect happens twice, and every `TokenUsageReported` is one call's
//! own usage. On PostgreSQL too (when `CAIRN_TEST_PG` is set), resuming
//! right after each kill: the dead process's lease is taken over at once.

mod common;
use common::store::Store;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cairn_agent::testing::{FakeProvider, Recorded, Reply};
use cairn_events::{Event, EventKind};
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

fn events(store: &Store, run: &str) -> Vec<Event> {
    store
        .try_open()
        .map(|b| common::store::decoded_events(&*b, run))
        .unwrap_or_default()
}

#[test]
fn an_agent_killed_at_random_moments_repeats_no_finished_step_or_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::Sqlite(dir.path().join(".cairn/cairn.db"));
    agent_crash(dir.path(), &store);
}

/// The same on PostgreSQL, in a database of the test's own.
#[test]
fn an_agent_killed_at_random_moments_repeats_no_finished_step_or_side_effect_on_postgres() {
    let Some(server) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    let name = format!("cairn_agent_crash_{}", std::process::id());
    let url = cairn_postgres::testing::create_database(server, &name);
    let dir = tempfile::tempdir().unwrap();
    agent_crash(dir.path(), &Store::Pg(url));
    cairn_postgres::testing::drop_database(server, &name);
}

fn agent_crash(dir: &Path, store: &Store) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(FakeProvider::start());
    server.respond_with(script);
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
    let run = "agent-crash";
    let ended = || {
        let evs = events(store, run);
        let end = matches!(
            evs.last().map(|e| &e.kind),
            Some(EventKind::RunFinished { .. })
        );
        (!evs.is_empty() || store.run_exists(run), end)
    };
    let store_args = store.args();
    let store_args: Vec<&str> = store_args.iter().map(String::as_str).collect();
    kill_and_resume_on(
        dir,
        &store_args,
        &["run", "agent.yaml", "--run-id", run],
        run,
        KILLS,
        (60, 400),
        ended,
        |_| sessions_err(dir),
    );

    let evs = events(store, run);
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
        usages.len() > EFFECTS && usages.len() <= starts,
        "{usages:?}"
    );
    drop(server);
    drop(rt);
}
