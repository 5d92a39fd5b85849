//! Crash semantics and the run inbox, end to end on a real SQLite store: an
//! attempt a stop interrupts is run again (or fails the node with
//! `on_interrupt: fail`), a cancel between retries names the last attempt,
//! layers count cancelled nodes apart, commands reach a run driven here, by
//! nobody, or busy with a large round.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind, RunCommand};
use cairn_store::{Journal, JournalOptions};
use serde_json::json;
use tokio::sync::mpsc;

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

/// Options whose observer keeps every event and tells `tx` each type name.
fn watched() -> (
    Arc<Mutex<Vec<Event>>>,
    StartOptions,
    mpsc::UnboundedReceiver<Event>,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::unbounded_channel();
    let e2 = events.clone();
    let opts = StartOptions {
        observer: Some(Arc::new(move |ev: &Event| {
            e2.lock().unwrap().push(ev.clone());
            let _ = tx.send(ev.clone());
        })),
        ..StartOptions::default()
    };
    (events, opts, rx)
}

async fn until(rx: &mut mpsc::UnboundedReceiver<Event>, f: impl Fn(&Event) -> bool) -> Event {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let ev = rx.recv().await.expect("the run ended first");
            if f(&ev) {
                return ev;
            }
        }
    })
    .await
    .expect("the event did not come within 30 s")
}

/// Resumes a run on `engine` and waits for the session to end.
async fn resume_to_end(engine: &Engine, run: &str) -> RunOutcome {
    engine
        .resume(
            &cairn_events::RunId::parse(run).unwrap(),
            StartOptions::default(),
        )
        .await
        .unwrap()
        .wait()
        .await
}

fn stored(engine: &Engine, run: &str) -> Vec<Event> {
    engine
        .journal()
        .backend()
        .read_events(
            &cairn_events::RunId::parse(run).unwrap(),
            &Default::default(),
        )
        .unwrap()
        .iter()
        .map(|e| e.decode().unwrap())
        .collect()
}

/// A command node whose first attempt hangs (and leaves a marker) and whose
/// later attempts succeed at once.
fn hanging_once(extra: &str) -> String {
    format!(
        r#"
name: interrupted
nodes:
  - id: slow
    command: ["sh", "-c", "if [ -f ran-once ]; then echo again; exit 0; fi; touch ran-once; sleep 30"]
{extra}
  - id: after
    needs: [slow]
    value: done
"#
    )
}

/// Starts the run, stops the engine while `slow` runs (its attempt is left
/// open in the log, as a crash leaves it), and resumes it on a new engine.
async fn interrupt_and_resume(dir: &std::path::Path, yaml: &str) -> (Engine, String, RunOutcome) {
    let j = journal(dir);
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let (_events, opts, mut rx) = watched();
    let h = engine
        .start(workflow(dir, yaml), json!({}), opts)
        .await
        .unwrap();
    let run = h.run_id.to_string();
    until(&mut rx, |e| {
        matches!(
            e.kind,
            EventKind::NodeOutput { .. } | EventKind::NodeStarted { .. }
        ) && e.scope.node_id.as_deref() == Some("slow")
    })
    .await;
    // Let the command start for real before the stop.
    while !dir.join("ran-once").exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine.shutdown(Duration::ZERO).await;
    assert_eq!(h.wait().await, RunOutcome::Interrupted);
    let engine = Engine::new(j, EngineOptions::default());
    let outcome = resume_to_end(&engine, &run).await;
    (engine, run, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_attempt_runs_again_whatever_its_retry_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, run, outcome) = interrupt_and_resume(dir.path(), &hanging_once("")).await;
    assert_eq!(outcome, RunOutcome::Finished(None));
    let evs: Vec<Event> = stored(&engine, &run)
        .into_iter()
        .filter(|e| e.scope.node_id.as_deref() == Some("slow"))
        .collect();
    let failed: Vec<&Event> = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::NodeFailed { .. }))
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let EventKind::NodeFailed {
        error,
        will_retry,
        snapshot: None,
    } = &failed[0].kind
    else {
        unreachable!()
    };
    assert_eq!(error.kind, "interrupted");
    assert!(will_retry);
    assert_eq!(failed[0].scope.attempt, Some(1));
    let retrying = evs
        .iter()
        .find(|e| matches!(e.kind, EventKind::NodeRetrying { .. }))
        .expect("NodeRetrying");
    assert_eq!(retrying.scope.attempt, Some(2));
    let finished = evs
        .iter()
        .find(|e| matches!(e.kind, EventKind::NodeFinished { .. }))
        .expect("NodeFinished");
    assert_eq!(finished.scope.attempt, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_interrupt_fail_fails_the_node_instead() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, run, outcome) =
        interrupt_and_resume(dir.path(), &hanging_once("    on_interrupt: fail")).await;
    let RunOutcome::Failed(err) = outcome else {
        panic!("the run should fail, got {outcome:?}")
    };
    assert!(err.message.contains("slow"), "{err:?}");
    let evs = stored(&engine, &run);
    let failed = evs
        .iter()
        .find(|e| matches!(e.kind, EventKind::NodeFailed { .. }))
        .unwrap();
    assert!(matches!(
        &failed.kind,
        EventKind::NodeFailed { error, will_retry: false, .. } if error.kind == "interrupted"
    ));
    assert!(!evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::NodeRetrying { .. })));
    // The dependent never ran.
    assert!(!evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::NodeStarted { .. })
            && e.scope.node_id.as_deref() == Some("after")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_between_retries_names_the_last_attempt_and_layers_count_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let wf = workflow(
        dir.path(),
        r#"
name: between
nodes:
  - id: flaky
    command: ["sh", "-c", "exit 3"]
    retry: { attempts: 5, delay: 20s, backoff: fixed }
  - id: sibling
    value: 1
"#,
    );
    let (_events, opts, mut rx) = watched();
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run = h.run_id.clone();
    until(&mut rx, |e| {
        matches!(e.kind, EventKind::NodeRetrying { .. })
    })
    .await;
    engine
        .cancel(&run, false, Some("enough".into()), Some("test".into()))
        .await
        .unwrap();
    assert_eq!(h.wait().await, RunOutcome::Cancelled);
    let evs = stored(&engine, &run);
    let cancelled = evs
        .iter()
        .find(|e| {
            matches!(e.kind, EventKind::NodeCancelled { .. })
                && e.scope.node_id.as_deref() == Some("flaky")
        })
        .expect("flaky cancelled");
    assert_eq!(cancelled.scope.attempt, Some(1), "{}", cancelled.to_json());
    let layer = evs
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::LayerFinished {
                succeeded,
                failed,
                skipped,
                cancelled,
                ..
            } => Some((*succeeded, *failed, *skipped, *cancelled)),
            _ => None,
        })
        .expect("LayerFinished");
    assert_eq!(layer, (1, 0, 0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_reaches_a_run_nobody_drives_and_is_refused_twice() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let wf = workflow(
        dir.path(),
        r#"
name: gated
nodes:
  - id: gate
    approval: "ship?"
  - id: after
    needs: [gate]
    command: ["sh", "-c", "echo shipped"]
"#,
    );
    let opts = StartOptions {
        exit_on_wait: true,
        ..StartOptions::default()
    };
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run = h.run_id.clone();
    assert_eq!(h.wait().await, RunOutcome::Waiting);
    // Nobody drives the run: the engine applies the decision with the run's
    // own driver and stops before starting anything.
    let ev = engine
        .send(
            &run,
            RunCommand::Approve {
                node_id: "gate".into(),
                note: Some("yes".into()),
                by: Some("ann".into()),
            },
        )
        .await
        .unwrap();
    assert!(matches!(ev.kind, EventKind::ApprovalGranted { .. }));
    let evs = stored(&engine, &run);
    assert!(!evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::NodeStarted { .. })
            && e.scope.node_id.as_deref() == Some("after")));
    // The decision is taken: a second one is refused with the reason.
    let err = engine
        .send(
            &run,
            RunCommand::Deny {
                node_id: "gate".into(),
                note: None,
                by: None,
            },
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not waiting"), "{err}");
    let err = engine
        .send(
            &run,
            RunCommand::Approve {
                node_id: "nope".into(),
                note: None,
                by: None,
            },
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no node `nope`"), "{err}");
    assert!(engine
        .journal()
        .backend()
        .pending_commands(&cairn_events::RunId::parse(&run).unwrap())
        .unwrap()
        .is_empty());
    let outcome = resume_to_end(&engine, &run).await;
    assert_eq!(outcome, RunOutcome::Finished(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_lands_within_a_large_round() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    // Value nodes end in the round that starts them, so the whole for_each
    // is one round unless the driver looks at its inbox in between.
    let wf = workflow(
        dir.path(),
        r#"
name: big
nodes:
  - id: items
    value: "{{ range(20000) | list }}"
  - id: each
    needs: [items]
    for_each: "nodes.items.output"
    nodes:
      - id: v
        value: "{{ item }}"
"#,
    );
    let (_events, opts, mut rx) = watched();
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run = h.run_id.clone();
    until(&mut rx, |e| {
        matches!(e.kind, EventKind::NodeFinished { .. })
            && e.scope.node_id.as_deref() == Some("each[0].v")
    })
    .await;
    let sender = engine.clone();
    let r = run.clone();
    let cancel = tokio::spawn(async move { sender.cancel(&r, false, None, None).await });
    assert_eq!(h.wait().await, RunOutcome::Cancelled);
    cancel.await.unwrap().unwrap();
    let evs = stored(&engine, &run);
    let cancelled = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::NodeCancelled { .. }))
        .count();
    assert!(
        cancelled > 0,
        "the cancel waited for the whole round: no item was left to cancel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_accepted_before_a_stop_is_carried_out_by_the_resume() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let (_events, opts, mut rx) = watched();
    let h = engine
        .start(workflow(dir.path(), &hanging_once("")), json!({}), opts)
        .await
        .unwrap();
    let run = h.run_id.clone();
    until(&mut rx, |e| {
        matches!(e.kind, EventKind::NodeStarted { .. })
            && e.scope.node_id.as_deref() == Some("slow")
    })
    .await;
    while !dir.path().join("ran-once").exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A graceful cancel lets `slow` run on: the run is still cancelling
    // when the engine stops.
    engine
        .cancel(&run, true, Some("enough".into()), None)
        .await
        .unwrap();
    engine.shutdown(Duration::ZERO).await;
    assert_eq!(h.wait().await, RunOutcome::Interrupted);
    j.close();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let outcome = resume_to_end(&engine, &run).await;
    assert_eq!(outcome, RunOutcome::Cancelled);
    assert!(!stored(&engine, &run)
        .iter()
        .any(|e| matches!(e.kind, EventKind::NodeStarted { .. })
            && e.scope.node_id.as_deref() == Some("after")));
    // The attempt the stop interrupted ends cancelled; it is not run again.
    let st = engine.state(&run).unwrap();
    let slow = st.node("slow", 0).unwrap();
    assert_eq!(slow.attempts.len(), 1, "the interrupted attempt ran again");
    assert_eq!(slow.status, cairn_events::NodeStatus::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_recorded_before_a_stop_fails_the_run_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let wf = workflow(
        dir.path(),
        r#"
name: failing
nodes:
  - id: bad
    command: ["sh", "-c", "sleep 0.3; exit 1"]
  - id: after
    needs: [bad]
    value: never
"#,
    );
    let (_events, opts, mut rx) = watched();
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run = h.run_id.clone();
    until(&mut rx, |e| {
        matches!(e.kind, EventKind::NodeStarted { .. }) && e.scope.node_id.as_deref() == Some("bad")
    })
    .await;
    // `bad` fails within the shutdown's grace: its failure is in the log,
    // the run's end is not.
    engine.shutdown(Duration::from_secs(10)).await;
    assert_eq!(h.wait().await, RunOutcome::Interrupted);
    assert!(stored(&engine, &run).iter().any(|e| matches!(
        e.kind,
        EventKind::NodeFailed {
            will_retry: false,
            ..
        }
    )));
    j.close();
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    let outcome = resume_to_end(&engine, &run).await;
    let RunOutcome::Failed(err) = outcome else {
        panic!("the run should fail, got {outcome:?}")
    };
    assert!(err.message.contains("bad"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_to_a_stopped_run_leaves_its_interrupted_attempts_to_the_resume() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let wf = workflow(
        dir.path(),
        r#"
name: stopped
nodes:
  - id: slow
    command: ["sh", "-c", "if [ -f ran-once ]; then exit 0; fi; touch ran-once; sleep 30"]
  - id: gate
    approval: "ship?"
"#,
    );
    let (_events, opts, mut rx) = watched();
    let h = engine.start(wf, json!({}), opts).await.unwrap();
    let run = h.run_id.clone();
    until(&mut rx, |e| {
        matches!(e.kind, EventKind::ApprovalRequested { .. })
    })
    .await;
    while !dir.path().join("ran-once").exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine.shutdown(Duration::ZERO).await;
    assert_eq!(h.wait().await, RunOutcome::Interrupted);
    j.close();
    // Nobody drives the run: the sender applies the decision and stops.
    // `slow` was running when the engine stopped; that is the resume's to
    // settle, not a reason to call the run stuck.
    let engine = Engine::new(journal(dir.path()), EngineOptions::default());
    engine.decide(&run, "gate", true, None, None).await.unwrap();
    let state = engine.state(&run).unwrap();
    assert!(
        !state.status.is_some_and(|s| s.is_terminal()),
        "the decision ended the run: {:?} {:?}",
        state.status,
        state.error
    );
    let outcome = resume_to_end(&engine, &run).await;
    assert_eq!(outcome, RunOutcome::Finished(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_cancel_ends_a_stopped_run_whose_gate_has_not_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let wf = workflow(
        dir.path(),
        r#"
name: gated
nodes:
  - id: gate
    approval: "go?"
  - id: after
    needs: [gate]
    value: never
"#,
    );
    let j = journal(dir.path());
    let engine = Engine::new(j.clone(), EngineOptions::default());
    let opts = StartOptions {
        exit_on_wait: true,
        ..StartOptions::default()
    };
    let h = engine.start(wf, json!({}), opts.clone()).await.unwrap();
    let run = h.run_id.clone();
    engine.shutdown(Duration::ZERO).await;
    j.close();
    if h.wait().await == RunOutcome::Interrupted {
        let engine = Engine::new(journal(dir.path()), EngineOptions::default());
        let h = engine.resume(&run, opts).await.unwrap();
        assert_eq!(h.wait().await, RunOutcome::Waiting);
    }
    // Nobody drives the run: the sender applies the cancel, which reaches
    // the gate's attempt before the gate asks again. A graceful cancel
    // stops gates; this one must not wait for a person for ever.
    let sender = Engine::new(journal(dir.path()), EngineOptions::default());
    tokio::time::timeout(
        Duration::from_secs(30),
        sender.cancel(&run, true, Some("enough".into()), None),
    )
    .await
    .expect("the cancel never came back")
    .unwrap();
    assert_eq!(
        sender.state(&run).unwrap().status,
        Some(cairn_events::RunStatus::Cancelled)
    );
}
