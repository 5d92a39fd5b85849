//! The `agent` node end to end: a real SQLite store, the real sandboxed
//! tools, and a fake OpenAI-compatible server on 127.0.0.1 that answers by
//! the conversation it is sent.

mod common;
use common::stored;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_agent::testing::{FakeProvider, Recorded, Reply};
use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind, ToolStatus};
use cairn_store::{Journal, JournalOptions};
use serde_json::{json, Value};

fn journal(dir: &std::path::Path) -> Journal {
    Journal::open_sqlite(
        &dir.join("cairn.db"),
        JournalOptions {
            log_dir: Some(dir.join("logs")),
        },
    )
    .unwrap()
}

fn workflow(dir: &std::path::Path, yaml: &str) -> cairn_workflow::Workflow {
    let path = dir.join("wf.yaml");
    std::fs::write(&path, yaml).unwrap();
    cairn_workflow::load(&path).unwrap()
}

/// One streamed Chat Completions answer: text, then tool calls, then usage.
fn turn(text: &str, calls: &[(&str, &str)], usage: (u64, u64), every: Duration) -> Reply {
    let mut events = Vec::new();
    for piece in text.as_bytes().chunks(5) {
        let p = String::from_utf8_lossy(piece);
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
        json!({"choices": [], "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1}})
            .to_string(),
    );
    events.push("[DONE]".into());
    Reply::sse(events).every(every)
}

/// How many model answers the conversation of a request holds.
fn answers(r: &Recorded) -> usize {
    r.body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
}

fn wf_yaml(url: &str, agent: &str) -> String {
    format!(
        r#"
name: agent-test
models:
  m:
    provider: openai
    model: gpt-4o
    base_url: {url}
    idle_timeout: 5s
    retry: {{ attempts: 2, delay: 10ms }}
nodes:
  - id: a
    agent:
      model: m
      system: You are careful.
      prompt: "Work on {{{{ input.task }}}}"
{agent}
"#
    )
}

async fn run(engine: &Engine, wf: cairn_workflow::Workflow, run_id: &str) -> RunOutcome {
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse(run_id).unwrap()),
        ..StartOptions::default()
    };
    engine
        .start(wf, json!({"task": "the file"}), opts)
        .await
        .unwrap()
        .wait()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calls_tools_reads_its_mistakes_and_answers_in_schema() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "forty-two\n").unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(|r| match answers(r) {
        0 => turn(
            "Reading.",
            &[
                ("read", r#"{"path": "in.txt"}"#),
                ("fly", "{}"),
                ("read", r#"{"pa"#),
            ],
            (100, 20),
            Duration::ZERO,
        ),
        1 => turn("It says 42.", &[], (150, 10), Duration::ZERO),
        _ => turn(r#"{"answer": 42}"#, &[], (170, 8), Duration::ZERO),
    });
    let yaml = wf_yaml(
        &server.url(),
        "      tools: [read]\n      output_schema: { type: object, required: [answer], properties: { answer: { type: integer } } }",
    );
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let outcome = run(&engine, workflow(dir.path(), &yaml), "ag1").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let state = engine
        .state(&cairn_events::RunId::parse("ag1").unwrap())
        .unwrap();
    let node = state.node("a", 0).unwrap();
    assert_eq!(
        node.output.as_ref().unwrap().to_value(),
        json!({"answer": 42})
    );

    let evs = stored(&engine, "ag1");
    let kinds: Vec<&EventKind> = evs.iter().map(|e| &e.kind).collect();
    // Step 1 is finished before its calls start; the calls' results are
    // recorded, mistakes included.
    let pos = |f: &dyn Fn(&EventKind) -> bool| kinds.iter().position(|k| f(k)).unwrap();
    let step1_done = pos(&|k| matches!(k, EventKind::AgentStepFinished { step: 1, .. }));
    let first_call = pos(&|k| matches!(k, EventKind::ToolCallStarted { .. }));
    assert!(step1_done < first_call);
    let finished: Vec<(String, ToolStatus)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished {
                tool_name, status, ..
            } => Some((tool_name.clone(), *status)),
            _ => None,
        })
        .collect();
    assert_eq!(
        finished,
        vec![
            ("read".into(), ToolStatus::Success),
            ("fly".into(), ToolStatus::Error),
            ("read".into(), ToolStatus::Error),
        ]
    );
    // Every step: started, usage, finished; three model calls in all (the
    // second answer broke the schema and was sent back).
    let steps = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::AgentStepStarted { .. }))
        .count();
    assert_eq!(steps, 3);
    let tokens: u64 = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsageReported { input_tokens, .. } => Some(*input_tokens),
            _ => None,
        })
        .sum();
    assert_eq!(tokens, 100 + 150 + 170);
    let summary = evs.iter().find_map(|e| match &e.kind {
        EventKind::RunSummary {
            tokens, cost_usd, ..
        } => Some((tokens.clone(), *cost_usd)),
        _ => None,
    });
    let (t, cost) = summary.unwrap();
    assert_eq!((t.input, t.output), (420, 38));
    assert!(cost.unwrap() > 0.0, "gpt-4o is priced");
    if let Some(EventKind::AgentStepFinished {
        message,
        finish_reason,
        ..
    }) = kinds.get(step1_done).copied()
    {
        assert_eq!(finish_reason, "tool_calls");
        assert_eq!(message["toolCalls"][1]["name"], "fly");
    }

    // What the model read back: each result by its call, mistakes as errors.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tool_msgs: Vec<&Value> = msgs.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool_msgs.len(), 3);
    assert!(tool_msgs[0]["content"]
        .as_str()
        .unwrap()
        .contains("forty-two"));
    assert!(
        tool_msgs[1]["content"]
            .as_str()
            .unwrap()
            .contains("unknown_tool"),
        "{}",
        tool_msgs[1]
    );
    assert!(
        tool_msgs[2]["content"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{}",
        tool_msgs[2]
    );
    let last = reqs[2].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert!(
        last["content"].as_str().unwrap().contains("does not match"),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_fail_the_node_with_their_own_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(|r| {
        if r.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .contains("schema")
        {
            turn("not json", &[], (10, 1), Duration::ZERO)
        } else {
            turn(
                "again",
                &[("read", r#"{"path": "nothing"}"#)],
                (1_000_000, 0),
                Duration::ZERO,
            )
        }
    });
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let cases = [
        ("      tools: [read]\n      max_steps: 3", "max_steps"),
        ("      tools: [read]\n      max_cost_usd: 4", "budget"),
    ];
    for (i, (agent, kind)) in cases.iter().enumerate() {
        let run_id = format!("lim{i}");
        let outcome = run(
            &engine,
            workflow(dir.path(), &wf_yaml(&server.url(), agent)),
            &run_id,
        )
        .await;
        assert!(matches!(outcome, RunOutcome::Failed(_)), "{outcome:?}");
        let st = engine
            .state(&cairn_events::RunId::parse(&run_id).unwrap())
            .unwrap();
        assert_eq!(st.node("a", 0).unwrap().error().unwrap().kind, *kind);
    }
    // An answer that never matches the schema.
    let yaml = wf_yaml(
        &server.url(),
        "      system: schema\n      output_schema: { type: object }\n      schema_retries: 1",
    )
    .replace("      system: You are careful.\n", "");
    let outcome = run(&engine, workflow(dir.path(), &yaml), "sch").await;
    assert!(matches!(outcome, RunOutcome::Failed(_)), "{outcome:?}");
    let st = engine
        .state(&cairn_events::RunId::parse("sch").unwrap())
        .unwrap();
    assert_eq!(st.node("a", 0).unwrap().error().unwrap().kind, "schema");
}

/// The model's script for the crash test: two side effects (appends to
/// `side.log`), a write and a read, then the answer.
fn crash_script(r: &Recorded) -> Reply {
    let every = Duration::from_millis(15);
    match answers(r) {
        0 => turn(
            "First effect.",
            &[("bash", r#"{"argv": ["sh", "-c", "echo one >> side.log"]}"#)],
            (10, 1),
            every,
        ),
        1 => turn(
            "Write, read.",
            &[
                ("write", r#"{"path": "a.txt", "content": "A"}"#),
                ("read", r#"{"path": "a.txt"}"#),
            ],
            (20, 2),
            every,
        ),
        2 => turn(
            "Second effect.",
            &[("bash", r#"{"argv": ["sh", "-c", "echo two >> side.log"]}"#)],
            (30, 3),
            every,
        ),
        _ => turn("All done here.", &[], (40, 4), every),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_stopped_anywhere_repeats_nothing_it_finished() {
    let server = FakeProvider::start().await;
    server.respond_with(crash_script);
    // Stop the engine at the n-th event of each session, for many n.
    let mut stats = (0usize, 0usize);
    for stop_at in [4usize, 7, 9, 12, 15, 18, 22, 26, 31] {
        let dir = tempfile::tempdir().unwrap();
        let yaml = wf_yaml(&server.url(), "      tools: [bash, write, read]");
        let wf = workflow(dir.path(), &yaml);
        let before = server.requests().len();
        let mut sessions = 0;
        let outcome = loop {
            sessions += 1;
            assert!(sessions < 40, "the run never finished");
            let engine = Engine::new(journal(dir.path()), EngineOptions::default());
            let seen = Arc::new(Mutex::new(0usize));
            let (s2, e2) = (seen.clone(), engine.clone());
            let rt = tokio::runtime::Handle::current();
            // Later sessions stop later, and the seventh not at all, so
            // that every run ends.
            let stop = (sessions < 7).then_some(stop_at + 8 * (sessions - 1));
            let opts = StartOptions {
                run_id: Some(cairn_events::RunId::parse("crash").unwrap()),
                observer: Some(Arc::new(move |_: &Event| {
                    let mut n = s2.lock().unwrap();
                    *n += 1;
                    if Some(*n) == stop {
                        let e = e2.clone();
                        rt.spawn(async move { e.shutdown(Duration::ZERO).await });
                    }
                })),
                ..StartOptions::default()
            };
            let handle = if sessions == 1 {
                engine
                    .start(wf.clone(), json!({"task": "x"}), opts)
                    .await
                    .unwrap()
            } else {
                engine
                    .resume(&cairn_events::RunId::parse("crash").unwrap(), opts)
                    .await
                    .unwrap()
            };
            let outcome = handle.wait().await;
            engine.shutdown(Duration::ZERO).await;
            engine.journal().close();
            if !matches!(outcome, RunOutcome::Interrupted) {
                break outcome;
            }
        };
        assert!(
            matches!(outcome, RunOutcome::Finished(_)),
            "stop at {stop_at}: {outcome:?}"
        );
        assert!(
            sessions > 1 || stop_at > 30,
            "stop at {stop_at}: the run was never stopped"
        );
        let engine = Engine::new(journal(dir.path()), EngineOptions::default());
        let evs = stored(&engine, "crash");
        // No side effect twice: a call whose end was committed never runs
        // again, one that started and never ended is not run blindly.
        let side = std::fs::read_to_string(dir.path().join("side.log")).unwrap_or_default();
        for line in ["one", "two"] {
            assert!(
                side.lines().filter(|l| *l == line).count() <= 1,
                "stop at {stop_at}: {side:?}"
            );
        }
        // No step asked again once its answer was committed: every request
        // is a logged step start, and a finished step is never started again.
        let mut finished_steps = std::collections::HashSet::new();
        let mut starts = 0;
        for e in &evs {
            match &e.kind {
                EventKind::AgentStepStarted { step, .. } => {
                    starts += 1;
                    assert!(
                        !finished_steps.contains(step),
                        "stop at {stop_at}: step {step} asked again"
                    );
                }
                EventKind::AgentStepFinished { step, .. } => {
                    assert!(
                        finished_steps.insert(*step),
                        "stop at {stop_at}: step {step} finished twice"
                    );
                }
                _ => {}
            }
        }
        assert_eq!(finished_steps.len(), 4, "stop at {stop_at}");
        let requests = server.requests().len() - before;
        assert!(
            requests <= starts,
            "stop at {stop_at}: {requests} requests, {starts} logged steps"
        );
        // Token totals are the finished calls' own, once each.
        let input: u64 = evs
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::TokenUsageReported { input_tokens, .. } => Some(*input_tokens),
                _ => None,
            })
            .sum();
        assert_eq!(input, 10 + 20 + 30 + 40, "stop at {stop_at}");
        let reasked = evs
            .iter()
            .filter(|e| matches!(&e.kind, EventKind::AgentGenerationRetried { reason, .. } if reason == "interrupted"))
            .count();
        eprintln!("stop at {stop_at}: {sessions} sessions, {starts} step starts, {reasked} re-asked, side {side:?}");
        stats.0 += usize::from(sessions > 1);
        stats.1 += reasked;
        engine.journal().close();
    }
    // The stops did cut steps while they streamed.
    assert!(stats.0 >= 5 && stats.1 >= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_question_outlives_the_process_and_its_answer_reaches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(|r| match answers(r) {
        0 => turn(
            "One question.",
            &[("ask_user", r#"{"question": "Which colour?", "schema": {"type": "string", "enum": ["blue", "red"]}}"#)],
            (10, 1),
            Duration::ZERO,
        ),
        _ => turn("Blue it is.", &[], (20, 2), Duration::ZERO),
    });
    let wf = workflow(
        dir.path(),
        &wf_yaml(&server.url(), "      tools: [ask_user]"),
    );
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse("q").unwrap()),
        exit_on_wait: true,
        ..StartOptions::default()
    };
    let outcome = engine
        .start(wf, json!({"task": "x"}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    assert!(matches!(outcome, RunOutcome::Waiting), "{outcome:?}");
    let st = engine
        .state(&cairn_events::RunId::parse("q").unwrap())
        .unwrap();
    assert_eq!(st.status, Some(cairn_events::RunStatus::WaitingInput));
    let rid = st.questions.keys().next().unwrap().clone();
    assert_eq!(st.questions[&rid].prompt, "Which colour?");
    // Answered while no process drives the run, then resumed.
    assert!(engine
        .answer(
            &cairn_events::RunId::parse("q").unwrap(),
            &rid,
            json!("green"),
            None
        )
        .await
        .is_err());
    engine
        .answer(
            &cairn_events::RunId::parse("q").unwrap(),
            &rid,
            json!("blue"),
            Some("ana".into()),
        )
        .await
        .unwrap();
    let outcome = engine
        .resume(
            &cairn_events::RunId::parse("q").unwrap(),
            StartOptions::default(),
        )
        .await
        .unwrap()
        .wait()
        .await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2, "the first step is not asked again");
    let last = reqs[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["content"], "blue", "{last}");
    let st = engine
        .state(&cairn_events::RunId::parse("q").unwrap())
        .unwrap();
    assert_eq!(
        st.node("a", 0).unwrap().output.as_ref().unwrap().to_value(),
        json!("Blue it is.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_questions_are_answered_each_by_its_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(|r| match answers(r) {
        0 => turn(
            "Two questions.",
            &[
                ("ask_user", r#"{"question": "First?"}"#),
                ("ask_user", r#"{"question": "Second?"}"#),
            ],
            (10, 1),
            Duration::ZERO,
        ),
        _ => turn("Thanks.", &[], (20, 2), Duration::ZERO),
    });
    let wf = workflow(
        dir.path(),
        &wf_yaml(&server.url(), "      tools: [ask_user]"),
    );
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse("pq").unwrap()),
        ..StartOptions::default()
    };
    let handle = engine.start(wf, json!({"task": "x"}), opts).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let questions = loop {
        let st = engine
            .state(&cairn_events::RunId::parse("pq").unwrap())
            .unwrap();
        if st.questions.len() == 2 {
            break st.questions;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the questions never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        engine
            .state(&cairn_events::RunId::parse("pq").unwrap())
            .unwrap()
            .status,
        Some(cairn_events::RunStatus::WaitingInput)
    );
    // Answered in the other order, each to its own question.
    let mut by_prompt: Vec<(String, String)> = questions
        .iter()
        .map(|(rid, q)| (q.prompt.clone(), rid.clone()))
        .collect();
    by_prompt.sort();
    engine
        .answer(
            &cairn_events::RunId::parse("pq").unwrap(),
            &by_prompt[1].1,
            json!("two"),
            None,
        )
        .await
        .unwrap();
    engine
        .answer(
            &cairn_events::RunId::parse("pq").unwrap(),
            &by_prompt[0].1,
            json!("one"),
            None,
        )
        .await
        .unwrap();
    let outcome = handle.wait().await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let reqs = server.requests();
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tools: Vec<(String, String)> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().into(),
                m["content"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        tools,
        vec![
            ("call_0".into(), "one".into()),
            ("call_1".into(), "two".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_failure_starts_over_and_is_told_the_earlier_side_effects() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(|r| {
        let prompt = r.body["messages"][1]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if prompt.contains("Earlier attempts") {
            turn("Checked; done.", &[], (5, 1), Duration::ZERO)
        } else if answers(r) == 0 {
            turn(
                "Effect.",
                &[("bash", r#"{"argv": ["sh", "-c", "echo once >> side.log"]}"#)],
                (5, 1),
                Duration::ZERO,
            )
        } else {
            Reply::status(500, r#"{"error": {"message": "the model fell over"}}"#)
        }
    });
    let yaml = wf_yaml(
        &server.url(),
        "      tools: [bash]\n    retry: { attempts: 2, delay: 10ms }",
    );
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let outcome = run(&engine, workflow(dir.path(), &yaml), "rt").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let side = std::fs::read_to_string(dir.path().join("side.log")).unwrap();
    assert_eq!(side, "once\n");
    let evs = stored(&engine, "rt");
    let failed = evs.iter().find_map(|e| match &e.kind {
        EventKind::NodeFailed {
            error, will_retry, ..
        } => Some((error.kind.clone(), *will_retry)),
        _ => None,
    });
    assert_eq!(failed, Some(("server".into(), true)));
    // The new conversation counts its steps from 1 again.
    let steps: Vec<(u32, u32)> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AgentStepStarted { step, .. } => Some((e.scope.attempt.unwrap(), *step)),
            _ => None,
        })
        .collect();
    assert_eq!(steps, vec![(1, 1), (1, 2), (2, 1)]);
    let last = server.requests().last().unwrap().body.clone();
    let prompt = last["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("bash") && prompt.contains("ck_"),
        "{prompt}"
    );
}

/// Opt-in: a real model served locally (see README, "A real model"). Set
/// `CAIRN_REAL_MODEL_URL` (an OpenAI-compatible `/v1` base) and
/// `CAIRN_REAL_MODEL` (its model id). Small local servers stream no usage
/// chunk and refuse tools while streaming, so the agent has no tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_local_model_answers_an_agent() {
    let (Ok(url), Ok(model)) = (
        std::env::var("CAIRN_REAL_MODEL_URL"),
        std::env::var("CAIRN_REAL_MODEL"),
    ) else {
        eprintln!("skipped: CAIRN_REAL_MODEL_URL and CAIRN_REAL_MODEL are not set (see README, \"A real model\")");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"
name: real-model
models:
  m: {{ provider: openai, model: "{model}", base_url: "{url}", max_tokens: 64, temperature: 0, idle_timeout: 120s }}
nodes:
  - id: a
    agent:
      model: m
      prompt: "Say hello in one short sentence."
      max_steps: 2
"#
    );
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let outcome = run(&engine, workflow(dir.path(), &yaml), "real").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let st = engine
        .state(&cairn_events::RunId::parse("real").unwrap())
        .unwrap();
    let out = st.node("a", 0).unwrap().output.as_ref().unwrap().to_value();
    assert!(out.as_str().is_some_and(|s| !s.trim().is_empty()), "{out}");
    let evs = stored(&engine, "real");
    assert!(
        evs.iter()
            .any(|e| matches!(e.kind, EventKind::NodeOutput { .. })),
        "the answer streamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_no_answer_could_match_is_refused_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeProvider::start().await;
    server.respond_with(|r| match answers(r) {
        0 => turn(
            "Asking.",
            &[(
                "ask_user",
                r#"{"question": "Which?", "schema": {"type": 12}}"#,
            )],
            (1, 1),
            Duration::ZERO,
        ),
        _ => turn("Never mind.", &[], (1, 1), Duration::ZERO),
    });
    let wf = workflow(
        dir.path(),
        &wf_yaml(&server.url(), "      tools: [ask_user]"),
    );
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let outcome = run(&engine, wf, "badq").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    assert!(engine
        .state(&cairn_events::RunId::parse("badq").unwrap())
        .unwrap()
        .questions
        .is_empty());
    let tool = server.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(tool.contains("not a valid JSON Schema"), "{tool}");
}
