//! How agents use their models, end to end against fake providers on
//! 127.0.0.1: text reaching the log as it streams, prompt caching, the
//! limits every agent on a model shares, fallback models, and
//! conversations longer than the model's context window (with a crash in
//! the middle of their compaction).

mod common;
use common::{setup, stored};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_agent::testing::{FakeProvider, Recorded, Reply};
use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind, OutputStream, RunId};
use serde_json::{json, Value};

/// One streamed Chat Completions answer: text in the given pieces, then
/// tool calls, then usage (input, output, cached).
fn turn(pieces: &[&str], calls: &[(&str, String)], usage: (u64, u64, u64)) -> Vec<String> {
    let mut events = Vec::new();
    for p in pieces {
        events.push(json!({"choices": [{"index": 0, "delta": {"content": p}}]}).to_string());
    }
    for (i, (name, args)) in calls.iter().enumerate() {
        events.push(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": format!("call_{i}"),
                "type": "function", "function": {"name": name, "arguments": args}}]}}]})
            .to_string(),
        );
    }
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    events
        .push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}).to_string());
    events.push(
        json!({"choices": [], "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1,
            "prompt_tokens_details": {"cached_tokens": usage.2}}})
        .to_string(),
    );
    events.push("[DONE]".into());
    events
}

async fn run(engine: &Engine, wf: cairn_workflow::Workflow, id: &str) -> RunOutcome {
    let opts = StartOptions {
        run_id: Some(RunId::parse(id).unwrap()),
        ..StartOptions::default()
    };
    engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reaches_the_log_while_it_streams_and_the_step_keeps_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    // Five pieces, no newline, 250 ms apart: each must be logged on its
    // own, long before the answer ends.
    let pieces = ["The answer ", "is forty", "-two, as ", "you can ", "see."];
    server.fallback(Reply::sse(turn(&pieces, &[], (10, 5, 0))).every(Duration::from_millis(250)));
    let yaml = format!(
        "name: t\nmodels:\n  m: {{ provider: openai, model: gpt-4o, base_url: \"{}\" }}\nnodes:\n  - id: a\n    agent: {{ model: m, prompt: go }}\n",
        server.url()
    );
    let (engine, wf) = setup(dir.path(), &yaml);
    assert!(matches!(
        run(&engine, wf, "stream").await,
        RunOutcome::Finished(_)
    ));
    let evs = stored(&engine, "stream");
    let outputs: Vec<&str> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::NodeOutput {
                text,
                stream: OutputStream::Text,
            } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(outputs.len() >= 4, "held back: {outputs:?}");
    assert_eq!(outputs.concat(), pieces.concat());
    let whole = evs.iter().find_map(|e| match &e.kind {
        EventKind::AgentStepFinished { message, .. } => message["text"].as_str(),
        _ => None,
    });
    assert_eq!(whole, Some(pieces.concat().as_str()));
}

/// An Anthropic answer: text, maybe a tool call, usage with cache figures.
fn anthropic_turn(text: &str, call: Option<(&str, Value)>, usage: (u64, u64, u64, u64)) -> Reply {
    let (input, output, read, write) = usage;
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"usage": {
            "input_tokens": input, "output_tokens": 1,
            "cache_read_input_tokens": read, "cache_creation_input_tokens": write}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
    ];
    let stop = match &call {
        Some((name, input)) => {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}}),
            ));
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ));
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ));
            "tool_use"
        }
        None => "end_turn",
    };
    events.push((
        "message_delta",
        json!({"type": "message_delta",
        "delta": {"stop_reason": stop}, "usage": {"output_tokens": output}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    Reply::named_sse(events.into_iter().map(|(n, v)| (n, v.to_string())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_step_reads_the_cached_prefix_and_costs_less() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let server = FakeProvider::start().await;
    // The first step writes 2,000 tokens to the cache, the second reads
    // them: the same prompt size, priced apart.
    server.push(anthropic_turn(
        "Reading.",
        Some(("read", json!({"path": "a.txt"}))),
        (100, 20, 0, 2000),
    ));
    server.push(anthropic_turn("It says hello.", None, (130, 20, 2000, 30)));
    let yaml = format!(
        "name: t\nmodels:\n  m: {{ provider: anthropic, model: claude-sonnet-4-5, base_url: \"{}\", api_key_env: CAIRN_TEST_CACHE_KEY }}\nnodes:\n  - id: a\n    agent: {{ model: m, system: Be brief., prompt: read a.txt, tools: [read] }}\n",
        server.url()
    );
    std::env::set_var("CAIRN_TEST_CACHE_KEY", "k-0123456789");
    let (engine, wf) = setup(dir.path(), &yaml);
    assert!(matches!(
        run(&engine, wf, "cache").await,
        RunOutcome::Finished(_)
    ));
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let second = &reqs[1].body;
    let ephemeral = json!({"type": "ephemeral"});
    assert_eq!(second["system"][0]["cache_control"], ephemeral);
    assert_eq!(
        second["tools"].as_array().unwrap().last().unwrap()["cache_control"],
        ephemeral
    );
    // The first step's last message (what it cached) and this step's.
    assert_eq!(
        second["messages"][0]["content"][0]["cache_control"],
        ephemeral
    );
    let last = second["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(
        last["content"].as_array().unwrap().last().unwrap()["cache_control"],
        ephemeral
    );

    let evs = stored(&engine, "cache");
    let usage: Vec<(Option<u64>, Option<u64>, f64)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported {
                cache_read_tokens,
                cache_write_tokens,
                cost_usd,
                ..
            } => Some((*cache_read_tokens, *cache_write_tokens, cost_usd.unwrap())),
            _ => None,
        })
        .collect();
    assert_eq!(usage[0].1, Some(2000));
    assert_eq!(usage[1].0, Some(2000));
    // Sonnet: $3/M input, $0.30/M cache reads, $3.75/M cache writes.
    let uncached = (130.0 + 2000.0 + 30.0) * 3.0 / 1e6 + 20.0 * 15.0 / 1e6;
    let cached = 130.0 * 3.0 / 1e6 + 2000.0 * 0.30 / 1e6 + 30.0 * 3.75 / 1e6 + 20.0 * 15.0 / 1e6;
    assert!((usage[1].2 - cached).abs() < 1e-12, "{usage:?}");
    assert!(usage[1].2 < uncached / 2.0);
    let summary = evs.iter().find_map(|e| match &e.kind {
        EventKind::RunSummary { tokens, .. } => Some(tokens.clone()),
        _ => None,
    });
    let tokens = summary.unwrap();
    assert_eq!((tokens.cache_read, tokens.cache_write), (2000, 2030));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_one_model_share_its_concurrency_and_wait_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    server.fallback(Reply::sse(turn(&["done"], &[], (5, 1, 0))).every(Duration::from_millis(60)));
    let yaml = format!(
        "name: t\nmodels:\n  m: {{ provider: openai, model: gpt-4o, base_url: \"{}\", max_concurrency: 1 }}\nnodes:\n  - id: a\n    agent: {{ model: m, prompt: one }}\n  - id: b\n    agent: {{ model: m, prompt: two }}\n  - id: c\n    agent: {{ model: m, prompt: three }}\n",
        server.url()
    );
    let (engine, wf) = setup(dir.path(), &yaml);
    assert!(matches!(
        run(&engine, wf, "limits").await,
        RunOutcome::Finished(_)
    ));
    let evs = stored(&engine, "limits");
    let waits: Vec<&Event> = evs
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::AgentWaiting { reason, model, .. } if reason == "concurrency" && model == "gpt-4o"))
        .collect();
    assert!(
        waits.len() >= 2,
        "three agents, one slot: {} waits",
        waits.len()
    );
    // One answer at a time: each step's answer ends before the next
    // one's first piece of text is logged.
    let mut open = 0i32;
    for e in &evs {
        match &e.kind {
            EventKind::NodeOutput { .. } => open += 1,
            EventKind::AgentStepFinished { .. } => open -= 1,
            _ => {}
        }
        assert!((0..=1).contains(&open), "two answers streamed at once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_out_of_retries_hands_the_step_to_its_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let busy = FakeProvider::start().await;
    busy.fallback(Reply::status(429, r#"{"error": {"message": "slow down"}}"#));
    let spare = FakeProvider::start().await;
    spare.fallback(Reply::sse(turn(&["from the spare"], &[], (7, 3, 0))));
    let yaml = format!(
        r#"name: t
models:
  main: {{ provider: openai, model: gpt-4o, base_url: "{}", retry: {{ attempts: 2, delay: 10ms }}, fallback: [spare] }}
  spare: {{ provider: openai, model: gpt-4o-mini, base_url: "{}" }}
nodes:
  - id: a
    agent: {{ model: main, prompt: go }}
"#,
        busy.url(),
        spare.url()
    );
    let (engine, wf) = setup(dir.path(), &yaml);
    let outcome = run(&engine, wf, "fallback").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    assert_eq!(
        output_of(&stored(&engine, "fallback")),
        json!("from the spare")
    );
    assert_eq!(
        busy.requests().len(),
        2,
        "the main model's own retries first"
    );
    let evs = stored(&engine, "fallback");
    let said = evs.iter().any(|e| matches!(&e.kind,
        EventKind::AgentGenerationRetried { reason, .. } if reason.contains("asking `spare` instead") && reason.contains("slow down")));
    assert!(said, "the log says the fallback took over");
    let answered: Vec<&str> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported { model, .. } => Some(model.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(answered, ["gpt-4o-mini"]);
}

/// The long conversation's model: it reads `p1.txt`, `p2.txt`, … one by
/// one (each result says which part it was), then answers; asked for a
/// summary, it summarises, slowly. It answers by what the request holds,
/// so a compacted or resumed conversation gets the same answers.
fn reader(r: &Recorded, parts: usize) -> Reply {
    let messages = r.body["messages"].as_array().cloned().unwrap_or_default();
    if is_summary(r) {
        let transcript = messages[1]["content"].as_str().unwrap_or("");
        let seen: Vec<String> = (1..=parts)
            .filter(|n| transcript.contains(&format!("PART-{n:02}")))
            .map(|n| format!("{n:02}"))
            .collect();
        let summary = format!("Read parts {} so far.", seen.join(", "));
        return Reply::sse(turn(&[&summary], &[], (50, 10, 0))).every(Duration::from_millis(150));
    }
    let last = messages
        .last()
        .map(|m| m["content"].to_string())
        .unwrap_or_default();
    let done = (1..=parts)
        .rev()
        .find(|n| last.contains(&format!("PART-{n:02}")))
        .unwrap_or(0);
    if done == parts {
        return Reply::sse(turn(&["All parts read."], &[], (100, 5, 0)));
    }
    let args = json!({"path": format!("p{}.txt", done + 1)}).to_string();
    Reply::sse(turn(&["Next."], &[("read", args)], (100, 5, 0)))
}

/// Whether a request asks for a summary of older turns.
fn is_summary(r: &Recorded) -> bool {
    r.body["messages"][0]["content"]
        .as_str()
        .is_some_and(|s| s.starts_with("You compress"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_many_times_its_window_is_compacted_and_survives_a_crash_mid_summary() {
    const PARTS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    // Each part is about 1,100 tokens: twenty of them are seven times the
    // window of 3,000.
    for n in 1..=PARTS {
        let body = format!("PART-{n:02}\n{}", "lorem ipsum dolor sit amet ".repeat(163));
        std::fs::write(dir.path().join(format!("p{n}.txt")), body).unwrap();
    }
    let server = FakeProvider::start().await;
    // The first session stops as soon as the first summary is asked for,
    // while its answer streams.
    let first: Arc<Mutex<Option<Engine>>> = Arc::default();
    let rt = tokio::runtime::Handle::current();
    {
        let first = first.clone();
        server.respond_with(move |r| {
            if is_summary(r) {
                if let Some(e) = first.lock().unwrap().take() {
                    rt.spawn(async move { e.shutdown(Duration::ZERO).await });
                }
            }
            reader(r, PARTS)
        });
    }
    let yaml = format!(
        "name: t\nmodels:\n  m: {{ provider: openai, model: local, base_url: \"{}\", context_window: 3000, max_tokens: 500 }}\nnodes:\n  - id: a\n    agent: {{ model: m, prompt: Read every part., tools: [read], max_steps: 40 }}\n",
        server.url()
    );
    let (engine, wf) = setup(dir.path(), &yaml);
    *first.lock().unwrap() = Some(engine.clone());
    let opts = StartOptions {
        run_id: Some(RunId::parse("long").unwrap()),
        ..StartOptions::default()
    };
    let outcome = engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    engine.shutdown(Duration::ZERO).await;
    engine.journal().close();
    assert!(matches!(outcome, RunOutcome::Interrupted), "{outcome:?}");
    let before = server.requests();
    assert_eq!(before.iter().filter(|r| is_summary(r)).count(), 1);
    assert!(
        first.lock().unwrap().is_none(),
        "the stop came while the summary was asked for"
    );

    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let handle = engine
        .resume(&RunId::parse("long").unwrap(), StartOptions::default())
        .await
        .unwrap();
    let outcome = handle.wait().await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    assert_eq!(
        output_of(&stored(&engine, "long")),
        json!("All parts read.")
    );
    // The conversation rebuilt from the log is the one the first session
    // had: the summary asked again is the same request, byte for byte.
    let after = server.requests();
    let again = after[before.len()..]
        .iter()
        .find(|r| is_summary(r))
        .unwrap();
    let cut_short = before.iter().find(|r| is_summary(r)).unwrap();
    assert_eq!(again.body.to_string(), cut_short.body.to_string());

    let evs = stored(&engine, "long");
    let compactions: Vec<(&str, u64, u64)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AgentContextCompacted {
                strategy,
                tokens_before,
                tokens_after,
                ..
            } => Some((strategy.as_str(), *tokens_before, *tokens_after)),
            _ => None,
        })
        .collect();
    assert!(
        compactions.iter().filter(|c| c.0 == "summarize").count() >= 2,
        "{compactions:?}"
    );
    assert!(compactions.iter().all(|c| c.2 < c.1), "{compactions:?}");
    // Every step answered once, and each part read.
    let mut steps = std::collections::HashSet::new();
    for e in &evs {
        if let EventKind::AgentStepFinished { step, .. } = &e.kind {
            assert!(steps.insert(*step), "step {step} answered twice");
        }
    }
    assert_eq!(steps.len(), PARTS + 1);
    // No request passed the window (a quarter of its bytes, as Cairn
    // estimates, less room for the answer).
    for r in server.requests() {
        let bytes = r.body["messages"].to_string().len() + r.body["tools"].to_string().len();
        assert!(bytes / 4 < 3000, "a request of {bytes} bytes");
    }
    // The latest summary is what the last request begins with.
    let summary = evs
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            EventKind::AgentContextCompacted {
                message: Some(m), ..
            } => Some(m.clone()),
            _ => None,
        })
        .unwrap();
    let last = server.requests().last().unwrap().body.clone();
    assert!(last["messages"][0]["content"]
        .as_str()
        .unwrap()
        .ends_with(&summary));
}

/// The output of the node that finished last.
fn output_of(evs: &[Event]) -> Value {
    evs.iter()
        .rev()
        .find_map(|e| match &e.kind {
            EventKind::NodeFinished { output, .. } => output.as_ref().map(|o| o.to_value()),
            _ => None,
        })
        .unwrap_or(Value::Null)
}

/// The store `setup` made in `dir`, opened again.
fn journal(dir: &std::path::Path) -> cairn_store::Journal {
    cairn_store::Journal::open_sqlite(
        &dir.join("cairn.db"),
        cairn_store::JournalOptions {
            log_dir: Some(dir.join("logs")),
        },
    )
    .unwrap()
}

/// A Responses API answer: a reasoning item with its encrypted content and
/// a `read` call, or (once the call's result is in the request) text.
fn responses_reply(r: &Recorded) -> Reply {
    let ev = |v: Value| (v["type"].as_str().unwrap().to_string(), v.to_string());
    let done = |usage: Value| {
        ev(json!({"type": "response.completed", "sequence_number": 9,
            "response": {"id": "resp_1", "status": "completed", "usage": usage}}))
    };
    if r.body.to_string().contains("function_call_output") {
        return Reply::named_sse(vec![
            ev(
                json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_2",
                "output_index": 0, "content_index": 0, "delta": "It says hello."}),
            ),
            done(json!({"input_tokens": 60, "output_tokens": 5})),
        ]);
    }
    let reasoning = json!({"id": "rs_1", "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Read the file."}],
        "encrypted_content": "gAAAAB-opaque"});
    let call = json!({"id": "fc_1", "type": "function_call", "status": "completed",
        "arguments": "{\"path\": \"a.txt\"}", "call_id": "call_a", "name": "read"});
    Reply::named_sse(vec![
        ev(
            json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        ),
        ev(
            json!({"type": "response.reasoning_summary_text.delta", "sequence_number": 2,
            "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Read the file."}),
        ),
        ev(
            json!({"type": "response.output_item.done", "sequence_number": 3, "output_index": 0,
            "item": reasoning}),
        ),
        ev(
            json!({"type": "response.output_item.done", "sequence_number": 4, "output_index": 1,
            "item": call}),
        ),
        done(json!({"input_tokens": 40, "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 12}})),
    ])
}

/// A Gemini answer: a thought and a signed `read` call, or (once the
/// call's result is in the request) text.
fn gemini_reply(r: &Recorded) -> Reply {
    let chunk = |parts: Value, usage: Value| {
        json!({"candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0,
            "finishReason": "STOP"}], "usageMetadata": usage})
        .to_string()
    };
    if r.body.to_string().contains("functionResponse") {
        return Reply::sse(vec![chunk(
            json!([{"text": "It says hello."}]),
            json!({"promptTokenCount": 60, "candidatesTokenCount": 5}),
        )]);
    }
    Reply::sse(vec![chunk(
        json!([
            {"text": "Read the file.", "thought": true},
            {"functionCall": {"name": "read", "args": {"path": "a.txt"}}, "thoughtSignature": "c2ln"}
        ]),
        json!({"promptTokenCount": 40, "candidatesTokenCount": 8, "thoughtsTokenCount": 12}),
    )])
}

/// Runs one agent of `provider` to its end, stopped after its first step
/// when `stop`, and returns the request its second step was answered for.
async fn second_request(
    provider: &str,
    model: &str,
    reply: fn(&Recorded) -> Reply,
    stop: bool,
) -> Value {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(reply);
    std::env::set_var("CAIRN_TEST_NEW_PROVIDER_KEY", "k-0123456789");
    let yaml = format!(
        "name: t\nmodels:\n  m: {{ provider: {provider}, model: {model}, base_url: \"{}\", api_key_env: CAIRN_TEST_NEW_PROVIDER_KEY }}\nnodes:\n  - id: a\n    agent: {{ model: m, system: Be brief., prompt: read a.txt, tools: [read] }}\n",
        server.url()
    );
    let (engine, wf) = setup(dir.path(), &yaml);
    let mut opts = StartOptions {
        run_id: Some(RunId::parse("p").unwrap()),
        ..StartOptions::default()
    };
    if stop {
        let e = engine.clone();
        let rt = tokio::runtime::Handle::current();
        opts.observer = Some(Arc::new(move |ev: &Event| {
            if matches!(ev.kind, EventKind::AgentStepFinished { step: 1, .. }) {
                let e = e.clone();
                rt.spawn(async move { e.shutdown(Duration::ZERO).await });
            }
        }));
    }
    let outcome = engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    let engine = if stop {
        assert!(matches!(outcome, RunOutcome::Interrupted), "{outcome:?}");
        engine.shutdown(Duration::ZERO).await;
        engine.journal().close();
        let again = Engine::new(journal(dir.path()), EngineOptions::default());
        let handle = again
            .resume(&RunId::parse("p").unwrap(), StartOptions::default())
            .await
            .unwrap();
        let outcome = handle.wait().await;
        assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
        again
    } else {
        assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
        engine
    };
    assert_eq!(output_of(&stored(&engine, "p")), json!("It says hello."));
    // The stop may land while the second step streams: a crash costs at
    // most that step, asked again after the resume.
    let reqs = server.requests();
    assert!(
        reqs.len() == 2 || (stop && reqs.len() == 3),
        "{} requests",
        reqs.len()
    );
    reqs.last().unwrap().body.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newer_providers_resume_a_conversation_with_the_same_request() {
    // The Responses API: the reasoning item goes back with its encrypted
    // content, and the conversation's cache key is sent.
    let whole = second_request("openai-responses", "gpt-5.1", responses_reply, false).await;
    let resumed = second_request("openai-responses", "gpt-5.1", responses_reply, true).await;
    assert_eq!(whole.to_string(), resumed.to_string());
    assert!(whole["prompt_cache_key"]
        .as_str()
        .unwrap()
        .starts_with("cairn-"));
    assert!(whole.to_string().contains("gAAAAB-opaque"));
    // Gemini: the call goes back on its part, with its signature.
    let whole = second_request("gemini", "gemini-2.5-flash", gemini_reply, false).await;
    let resumed = second_request("gemini", "gemini-2.5-flash", gemini_reply, true).await;
    assert_eq!(whole.to_string(), resumed.to_string());
    assert!(whole.to_string().contains("\"thoughtSignature\":\"c2ln\""));
}
