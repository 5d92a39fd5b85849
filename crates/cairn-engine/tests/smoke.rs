//! End-to-end runs of small workflows on a real SQLite store.

mod common;
use common::setup;

use std::sync::{Arc, Mutex};

use cairn_engine::{RunOutcome, StartOptions};
use cairn_events::{Event, EventKind};
use serde_json::json;

fn collector() -> (Arc<Mutex<Vec<Event>>>, StartOptions) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e2 = events.clone();
    let opts = StartOptions {
        observer: Some(Arc::new(move |ev: &Event| {
            e2.lock().unwrap().push(ev.clone())
        })),
        ..StartOptions::default()
    };
    (events, opts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_commands_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: smoke
output: "{{ nodes.count.output.n }}"
nodes:
  - id: log
    command: ["printf", "a\nb\nc\n"]
    output: lines
  - id: count
    needs: [log]
    value: { n: "{{ nodes.log.output | length }}" }
  - id: per_line
    needs: [log]
    for_each: "nodes.log.output"
    as: line
    nodes:
      - id: show
        command: ["echo", "{{ index }}: {{ line }}"]
  - id: review
    needs: [count]
    loop:
      until: "iteration >= 2"
      max_iterations: 5
      nodes:
        - id: step
          value: "pass {{ iteration }}"
  - id: never
    needs: [count]
    if: "nodes.count.output.n > 10"
    value: 1
  - id: after_never
    needs: [never]
    value: 2
"#,
    );
    let (events, opts) = collector();
    let outcome = engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    let events = events.lock().unwrap();
    for e in events.iter() {
        eprintln!("{}", e.to_json());
    }
    assert_eq!(outcome, RunOutcome::Finished(Some(json!(3))));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, cairn_events::Seq(i as u64 + 1));
    }
    let state = engine.state(&events[0].run_id).unwrap();
    assert_eq!(
        state
            .node("per_line[2].show", 0)
            .unwrap()
            .output
            .as_ref()
            .map(|o| o.to_value()),
        Some(json!("2: c"))
    );
    assert_eq!(
        state
            .node("review.step", 2)
            .unwrap()
            .output
            .as_ref()
            .map(|o| o.to_value()),
        Some(json!("pass 2"))
    );
    assert_eq!(state.node("never", 0).unwrap().status.as_str(), "skipped");
    assert_eq!(
        state.node("after_never", 0).unwrap().status.as_str(),
        "skipped"
    );
    assert!(matches!(
        events.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_then_fails_and_approval_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: retry
nodes:
  - id: flaky
    command: ["sh", "-c", "exit 3"]
    retry: { attempts: 2, delay: 10ms }
"#,
    );
    let (events, opts) = collector();
    let outcome = engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    assert!(matches!(outcome, RunOutcome::Failed(_)));
    let types: Vec<&str> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.type_name())
        .collect::<Vec<_>>()
        .leak()
        .to_vec();
    let joined = types.join(",");
    assert!(
        joined.contains("NodeStarted,NodeFailed,NodeRetrying,NodeStarted,NodeFailed"),
        "{joined}"
    );

    let (engine, wf) = setup(
        dir.path(),
        r#"
name: gate
nodes:
  - id: gate
    approval: "ship it?"
  - id: after
    needs: [gate]
    value: done
"#,
    );
    let (_events, mut opts) = collector();
    opts.exit_on_wait = true;
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run_id = h.run_id.clone();
    assert_eq!(h.wait().await, RunOutcome::Waiting);
    engine
        .decide(&run_id, "gate", true, Some("ok".into()), Some("me".into()))
        .await
        .unwrap();
    let outcome = engine
        .resume(&run_id, StartOptions::default())
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome, RunOutcome::Finished(None));
    let st = engine.state(&run_id).unwrap();
    assert_eq!(st.node("gate", 0).unwrap().attempts.len(), 1);
    assert_eq!(
        st.node("after", 0)
            .unwrap()
            .output
            .as_ref()
            .map(|o| o.to_value()),
        Some(json!("done"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_nodes_are_recorded_with_stable_keys() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "alpha\nTODO beta\n").unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: tools
nodes:
  - id: todos
    tool: grep
    args: { pattern: "TODO", path: "." , glob: "*.txt" }
  - id: save
    needs: [todos]
    tool: write
    args: { path: "out/found.txt", content: "found {{ nodes.todos.output.matches | length }}" }
  - id: escape
    needs: [save]
    on_failure: continue
    tool: read
    args: { path: "../../etc/passwd" }
"#,
    );
    let (events, opts) = collector();
    let outcome = engine
        .start(wf, json!({}), opts)
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome, RunOutcome::Finished(None));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/found.txt")).unwrap(),
        "found 1"
    );
    let events = events.lock().unwrap();
    let run_id = events[0].run_id.clone();
    let started: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallStarted {
                tool_name,
                tool_seq,
                idempotency_key,
                side_effect,
            } => Some((
                e.scope.node_id.clone().unwrap(),
                tool_name.clone(),
                *tool_seq,
                idempotency_key.clone(),
                *side_effect,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 3);
    assert_eq!(started[1].1, "write");
    assert!(started[1].4, "write has a side effect");
    assert_eq!(
        started[1].3,
        cairn_tools::idempotency_key(&run_id, "save", 0, 1)
    );
    let st = engine.state(&run_id).unwrap();
    assert_eq!(st.node("escape", 0).unwrap().status.as_str(), "failed");
    let calls = engine
        .journal()
        .backend()
        .tool_calls(&run_id, &cairn_events::NodePath::from("save"), 0)
        .unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].status.as_str(), "success");
    // A later attempt of `save` would be warned about the write.
    let earlier = cairn_engine::earlier_side_effects(
        engine.journal().backend().as_ref(),
        &run_id,
        &cairn_events::NodePath::from("save"),
        0,
        2,
    )
    .unwrap();
    assert_eq!(earlier.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_own_limit_lowers_the_workflows() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.txt"), "x".repeat(100)).unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: limits
sandbox: { max_output_bytes: 1000 }
nodes:
  - id: whole
    tool: read
    args: { path: big.txt }
  - id: capped
    on_failure: continue
    max_output_bytes: 10
    tool: read
    args: { path: big.txt }
  - id: raised
    max_output_bytes: 5000
    tool: read
    args: { path: big.txt }
"#,
    );
    let (_events, opts) = collector();
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run_id = h.run_id.clone();
    assert_eq!(h.wait().await, RunOutcome::Finished(None));
    let st = engine.state(&run_id).unwrap();
    assert_eq!(st.node("whole", 0).unwrap().status.as_str(), "finished");
    let capped = st.node("capped", 0).unwrap();
    assert_eq!(capped.status.as_str(), "failed");
    assert!(
        capped.error().unwrap().message.contains("10"),
        "{:?}",
        capped.error()
    );
    // A node cannot raise the workflow's ceiling, but 100 bytes fit under it.
    assert_eq!(st.node("raised", 0).unwrap().status.as_str(), "finished");
}

/// A decision for a node the run never had is refused up front, even while
/// the run is driven here, and leaves nothing in the inbox or the log; one
/// for a real gate that is not waiting yet is refused by the driver, with
/// its reason in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bogus_decisions_to_a_live_run_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: live
nodes:
  - id: first
    command: ["sh", "-c", "while [ ! -f go ]; do sleep 0.02; done"]
  - id: gate
    needs: [first]
    approval: "ship?"
"#,
    );
    let (events, opts) = collector();
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run = h.run_id.clone();
    // Once `first` runs, the plan (with `gate` pending) is in the store.
    let started = loop {
        let seen = events
            .lock()
            .unwrap()
            .iter()
            .find_map(|e| matches!(e.kind, EventKind::NodeStarted { .. }).then_some(e.seq));
        if let Some(seq) = seen {
            break seq;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    while engine
        .journal()
        .backend()
        .last_seq(&cairn_events::RunId::parse(&run).unwrap())
        .unwrap()
        < started.get()
    {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let err = engine
        .decide(&run, "nope", true, None, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no node `nope`"), "{err}");
    assert!(engine
        .journal()
        .backend()
        .pending_commands(&cairn_events::RunId::parse(&run).unwrap())
        .unwrap()
        .is_empty());
    // `gate` exists but does not wait yet: the driver says so.
    let err = engine
        .decide(&run, "gate", true, None, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not waiting"), "{err}");
    std::fs::write(dir.path().join("go"), "").unwrap();
    engine.cancel(&run, false, None, None).await.unwrap();
    assert_eq!(h.wait().await, RunOutcome::Cancelled);
    let diagnostics: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Diagnostic {
                source, message, ..
            } if source == "inbox" => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert!(diagnostics[0].contains("gate"), "{diagnostics:?}");
}
