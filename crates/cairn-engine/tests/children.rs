//! Child runs end to end: `workflow` nodes and agents' delegates on a real
//! SQLite store, with real child processes; each tree of runs checked with
//! the contract's parent and child rules ([`cairn_events::check_tree`]).

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{check_tree, Event, EventKind, RunStatus};
use cairn_store::RunFilter;
use serde_json::{json, Value};

fn write(dir: &Path, name: &str, yaml: &str) {
    std::fs::write(dir.join(name), yaml).unwrap();
}

fn children(engine: &Engine, run: &str) -> Vec<cairn_store::RunRecord> {
    let mut c = engine
        .journal()
        .backend()
        .list_runs(&RunFilter {
            parent: Some(cairn_events::RunId::parse(run).unwrap()),
            ..RunFilter::default()
        })
        .unwrap();
    c.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    c
}

/// Checks the tree under `run` against the contract, all the way down.
fn check(engine: &Engine, run: &str) {
    let logs: BTreeMap<String, Vec<Event>> = children(engine, run)
        .into_iter()
        .map(|c| (c.run_id.to_string(), stored(engine, &c.run_id)))
        .collect();
    check_tree(&stored(engine, run), &logs).unwrap_or_else(|e| panic!("run {run}: {e}"));
    for id in logs.keys() {
        check(engine, id);
    }
}

async fn start(engine: &Engine, dir: &Path, file: &str, input: Value, run: &str) -> RunOutcome {
    start_with(engine, dir, file, input, run, false).await
}

async fn start_with(
    engine: &Engine,
    dir: &Path,
    file: &str,
    input: Value,
    run: &str,
    exit_on_wait: bool,
) -> RunOutcome {
    let wf = engine
        .load_workflow(dir.join(file).to_str().unwrap(), None)
        .unwrap();
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse(run).unwrap()),
        exit_on_wait,
        ..StartOptions::default()
    };
    engine.start(wf, input, opts).await.unwrap().wait().await
}

const CHILD: &str = r#"
name: child
description: Doubles a number.
input:
  type: object
  required: [n]
  properties: { n: { type: integer } }
nodes:
  - id: double
    value: { doubled: "{{ input.n * 2 }}" }
output: "{{ nodes.double.output }}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_node_runs_a_child_run_and_ends_with_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "child.yaml", CHILD);
    write(
        d,
        "parent.yaml",
        r#"
name: parent
nodes:
  - id: seven
    value: 7
  - id: twice
    needs: [seven]
    workflow: child.yaml
    input: { n: "{{ nodes.seven.output }}" }
output: "{{ nodes.twice.output }}"
"#,
    );
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(&engine, d, "parent.yaml", json!({}), "p1").await;
    assert_eq!(outcome, RunOutcome::Finished(Some(json!({"doubled": 14}))));
    let kids = children(&engine, "p1");
    assert_eq!(kids.len(), 1);
    let child = &kids[0];
    assert!(child.run_id.starts_with("p1."), "{}", child.run_id);
    assert_eq!(child.status.as_str(), "finished");
    let state = engine.state(&child.run_id).unwrap();
    assert_eq!(state.parent_run_id.as_deref(), Some("p1"));
    assert_eq!(state.parent_node_id.as_deref(), Some("twice"));
    assert_eq!(state.depth, 1);
    let parent = engine
        .state(&cairn_events::RunId::parse("p1").unwrap())
        .unwrap();
    assert_eq!(parent.children.len(), 1);
    assert_eq!(parent.children[0].status.as_deref(), Some("finished"));
    check(&engine, "p1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_child_fails_its_node_and_a_retry_starts_a_new_child() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "flaky.yaml",
        r#"
name: flaky
nodes:
  - id: fail
    command: ["sh", "-c", "echo broken >&2; exit 3"]
"#,
    );
    write(
        d,
        "parent.yaml",
        r#"
name: parent
nodes:
  - id: sub
    workflow: flaky.yaml
    retry: { attempts: 2, delay: 10ms }
    on_failure: continue
  - id: after
    needs: [sub]
    value: still here
"#,
    );
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(&engine, d, "parent.yaml", json!({}), "p2").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let kids = children(&engine, "p2");
    assert_eq!(kids.len(), 2, "one child per attempt");
    assert!(kids.iter().all(|k| k.status.as_str() == "failed"));
    let node = engine
        .state(&cairn_events::RunId::parse("p2").unwrap())
        .unwrap();
    let sub = node.node("sub", 0).unwrap();
    let err = sub.attempts.last().unwrap().error.as_ref().unwrap();
    assert_eq!(err.kind, "child");
    assert!(err.message.contains("flaky.yaml"), "{}", err.message);
    check(&engine, "p2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_parent_cancels_its_child() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "slow.yaml",
        "name: slow\nnodes:\n  - id: wait\n    command: [\"sleep\", \"30\"]\n",
    );
    write(
        d,
        "parent.yaml",
        "name: parent\nnodes:\n  - id: sub\n    workflow: slow.yaml\n",
    );
    let engine = Engine::new(journal(d), EngineOptions::default());
    let wf = engine
        .load_workflow(d.join("parent.yaml").to_str().unwrap(), None)
        .unwrap();
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse("p3").unwrap()),
        ..StartOptions::default()
    };
    let handle = engine.start(wf, json!({}), opts).await.unwrap();
    // Wait until the child's command runs.
    let child = loop {
        if let Some(c) = children(&engine, "p3").pop() {
            let st = engine.state(&c.run_id).unwrap();
            if st.node("wait", 0).is_some_and(|n| !n.attempts.is_empty()) {
                break c.run_id;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    engine
        .cancel(
            &cairn_events::RunId::parse("p3").unwrap(),
            false,
            Some("enough".into()),
            None,
        )
        .await
        .unwrap();
    assert_eq!(handle.wait().await, RunOutcome::Cancelled);
    let st = engine.state(&child).unwrap();
    assert_eq!(st.status, Some(RunStatus::Cancelled));
    check(&engine, "p3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_that_starts_itself_stops_at_a_cycle_or_the_depth_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The same input every time: a cycle, found at once.
    write(
        d,
        "same.yaml",
        "name: same\nnodes:\n  - id: again\n    workflow: same.yaml\n",
    );
    // A new input every time: only the depth limit stops it.
    write(
        d,
        "deeper.yaml",
        r#"
name: deeper
nodes:
  - id: again
    workflow: deeper.yaml
    input: { n: "{{ (input.n | default(0)) + 1 }}" }
"#,
    );
    let engine = Engine::new(
        journal(d),
        EngineOptions {
            max_depth: 3,
            ..EngineOptions::default()
        },
    );
    let outcome = start(&engine, d, "same.yaml", json!({}), "cyc").await;
    let RunOutcome::Failed(e) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(e.message.contains("ancestors"), "{e:?}");
    let st = engine
        .state(&cairn_events::RunId::parse("cyc").unwrap())
        .unwrap();
    let err = st.node("again", 0).unwrap().attempts[0]
        .error
        .clone()
        .unwrap();
    assert_eq!(err.kind, "cycle");
    assert!(children(&engine, "cyc").is_empty(), "nothing was started");

    let outcome = start(&engine, d, "deeper.yaml", json!({}), "deep").await;
    assert!(matches!(outcome, RunOutcome::Failed(_)), "{outcome:?}");
    // deep → 1 → 2 → 3, whose node may not go a level further.
    let mut run = "deep".to_string();
    let mut depth = 0;
    while let Some(c) = children(&engine, &run).pop() {
        run = c.run_id.to_string();
        depth += 1;
    }
    assert_eq!(depth, 3);
    let st = engine
        .state(&cairn_events::RunId::parse(&run).unwrap())
        .unwrap();
    let err = st.node("again", 0).unwrap().attempts[0]
        .error
        .clone()
        .unwrap();
    assert_eq!(err.kind, "depth", "{err:?}");
    check(&engine, "deep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_waits_for_a_person_makes_its_parent_wait() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "gate.yaml",
        "name: gate\nnodes:\n  - id: ok\n    approval: Go on?\n  - id: done\n    needs: [ok]\n    value: approved\noutput: \"{{ nodes.done.output }}\"\n",
    );
    write(
        d,
        "parent.yaml",
        "name: parent\nnodes:\n  - id: sub\n    workflow: gate.yaml\noutput: \"{{ nodes.sub.output }}\"\n",
    );
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start_with(&engine, d, "parent.yaml", json!({}), "p5", true).await;
    assert_eq!(outcome, RunOutcome::Waiting);
    assert_eq!(
        engine
            .state(&cairn_events::RunId::parse("p5").unwrap())
            .unwrap()
            .status,
        Some(RunStatus::WaitingApproval)
    );
    let child = children(&engine, "p5").pop().unwrap().run_id;
    assert_eq!(
        engine.state(&child).unwrap().status,
        Some(RunStatus::WaitingApproval)
    );
    engine
        .decide(&child, "ok", true, None, Some("tester".into()))
        .await
        .unwrap();
    let outcome = engine
        .resume(
            &cairn_events::RunId::parse("p5").unwrap(),
            StartOptions::default(),
        )
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome, RunOutcome::Finished(Some(json!("approved"))));
    assert_eq!(
        children(&engine, "p5").len(),
        1,
        "the resume took the child up"
    );
    check(&engine, "p5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_parent_takes_up_its_child_instead_of_starting_another() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "work.yaml",
        r#"
name: work
nodes:
  - id: slow
    command: ["sh", "-c", "sleep 1; echo $$ >> runs.log"]
"#,
    );
    write(
        d,
        "parent.yaml",
        "name: parent\nnodes:\n  - id: sub\n    workflow: work.yaml\n",
    );
    let engine = Engine::new(journal(d), EngineOptions::default());
    let wf = engine
        .load_workflow(d.join("parent.yaml").to_str().unwrap(), None)
        .unwrap();
    let opts = StartOptions {
        run_id: Some(cairn_events::RunId::parse("p6").unwrap()),
        ..StartOptions::default()
    };
    let handle = engine.start(wf, json!({}), opts).await.unwrap();
    while children(&engine, "p6").is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (engine, outcome) = stop_and_resume(d, engine, handle, "p6").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let kids = children(&engine, "p6");
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert_eq!(kids[0].status.as_str(), "finished");
    let child = stored(&engine, &kids[0].run_id);
    assert!(
        child
            .iter()
            .any(|e| matches!(e.kind, EventKind::RunStarted { resumed: true, .. })),
        "the child was resumed"
    );
    check(&engine, "p6");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_delegates_two_tasks_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "research.yaml",
        r#"
name: research
description: Researches a topic.
input:
  type: object
  required: [topic]
  properties: { topic: { type: string } }
nodes:
  - id: look
    command: ["sh", "-c", "sleep 0.5; echo found {{ input.topic }}"]
output: "{{ nodes.look.output | trim }}"
"#,
    );
    write(
        d,
        "turns.yaml",
        r#"
turns:
  - text: Two questions at once.
    tool_calls:
      - { name: research, args: { topic: rust } }
      - { name: research, args: { topic: sqlite } }
      - { name: research, args: { nope: 1 } }
  - text: Both answered.
"#,
    );
    write(
        d,
        "lead.yaml",
        r#"
name: lead
models:
  s: { provider: scripted, script: turns.yaml }
nodes:
  - id: lead
    agent:
      model: s
      prompt: Find out.
      delegates:
        research: research.yaml
output: "{{ nodes.lead.output }}"
"#,
    );
    let engine = Engine::new(journal(d), EngineOptions::default());
    let outcome = start(&engine, d, "lead.yaml", json!({}), "p7").await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let kids = children(&engine, "p7");
    assert_eq!(kids.len(), 2, "the call with a bad input started nothing");
    let outputs: Vec<Value> = kids
        .iter()
        .map(|k| engine.state(&k.run_id).unwrap().output.unwrap())
        .collect();
    assert!(outputs.contains(&json!("found rust")), "{outputs:?}");
    assert!(outputs.contains(&json!("found sqlite")), "{outputs:?}");
    // Side by side: the second child started before the first ended.
    let span = |id: &str| {
        let evs = stored(&engine, id);
        (
            evs.first().unwrap().timestamp_ms,
            evs.last().unwrap().timestamp_ms,
        )
    };
    let (a, b) = (span(&kids[0].run_id), span(&kids[1].run_id));
    assert!(a.0 < b.1 && b.0 < a.1, "{a:?} {b:?}");
    // The model saw each result, and the refusal of the bad input.
    let evs = stored(&engine, "p7");
    let statuses: Vec<_> = evs
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { status, error, .. } => {
                Some((*status, error.as_ref().map(|e| e.kind.clone())))
            }
            _ => None,
        })
        .collect();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    assert!(
        statuses.iter().any(|(_, e)| e.as_deref() == Some("input")),
        "{statuses:?}"
    );
    check(&engine, "p7");
}

#[test]
fn a_missing_child_workflow_is_found_before_the_parent_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "parent.yaml",
        "name: parent\nnodes:\n  - id: ok\n    value: 1\n  - id: sub\n    workflow: nowhere.yaml\n",
    );
    let err = cairn_workflow::load_tree(&d.join("parent.yaml")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("parent.yaml:5"), "{text}");
    assert!(text.contains("nowhere.yaml"), "{text}");
    // A broken child is reported in its own file, with its line.
    write(
        d,
        "broken.yaml",
        "name: broken\nnodes:\n  - id: x\n    comand: [true]\n",
    );
    write(
        d,
        "parent.yaml",
        "name: parent\nnodes:\n  - id: sub\n    workflow: broken.yaml\n",
    );
    let text = cairn_workflow::load_tree(&d.join("parent.yaml"))
        .unwrap_err()
        .to_string();
    assert!(text.contains("broken.yaml:4"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_a_crash_left_without_its_first_event_starts_on_resume() {
    // A crash between the run's record and its `RunStarted`: the resume
    // starts it, with its stored input, rather than resuming nothing.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "child.yaml", CHILD);
    let engine = Engine::new(journal(d), EngineOptions::default());
    let wf = engine
        .load_workflow(d.join("child.yaml").to_str().unwrap(), None)
        .unwrap();
    let rec = cairn_store::RunRecord {
        run_id: cairn_events::RunId::parse("bare").unwrap(),
        workflow: wf.name.clone(),
        workflow_path: wf.path.display().to_string(),
        workflow_hash: wf.hash.clone(),
        workflow_source: wf.source.clone(),
        input: json!({"n": 5}),
        status: cairn_store::RecordStatus::Pending,
        created_ms: 1,
        updated_ms: 1,
        parent_run_id: None,
    };
    engine.journal().backend().create_run(&rec).unwrap();
    let outcome = engine
        .resume(
            &cairn_events::RunId::parse("bare").unwrap(),
            StartOptions::default(),
        )
        .await
        .unwrap()
        .wait()
        .await;
    assert_eq!(outcome, RunOutcome::Finished(Some(json!({"doubled": 10}))));
    let evs = stored(&engine, "bare");
    assert!(matches!(
        &evs[0].kind,
        EventKind::RunStarted { resumed: false, input: Some(i), .. } if i == &json!({"n": 5})
    ));
}
