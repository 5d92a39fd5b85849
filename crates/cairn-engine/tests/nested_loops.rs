//! Loops in loops: every pass of an inner loop, in every pass of the outer
//! one, is its own node instance, also across a stop and a resume.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use cairn_engine::{Engine, EngineOptions, RunOutcome, StartOptions};
use cairn_events::{Event, EventKind};
use cairn_store::{EventQuery, Journal, JournalOptions};
use serde_json::json;

/// An outer loop of 2 passes around an inner loop of 3, whose second pass
/// waits for a person: the run stops there (exit on wait) in both outer
/// passes and is resumed.
const WORKFLOW: &str = r#"
name: nested
output: "{{ nodes.review.output.inner.check }}"
nodes:
  - id: review
    loop:
      until: "iteration >= 1"
      max_iterations: 5
      nodes:
        - id: inner
          loop:
            until: "iteration >= 2"
            max_iterations: 5
            nodes:
              - id: fix
                value: "{{ iteration }}"
              - id: gate
                needs: [fix]
                if: "iteration == 1"
                approval: "go on?"
              - id: check
                needs: [fix]
                value: "{{ nodes.fix.output }}"
"#;

fn setup(dir: &std::path::Path) -> (Engine, cairn_workflow::Workflow) {
    common::setup(dir, WORKFLOW)
}

fn waiting_opts() -> StartOptions {
    StartOptions {
        exit_on_wait: true,
        ..StartOptions::default()
    }
}

fn log_of(engine: &Engine, run_id: &str) -> Vec<Event> {
    engine
        .journal()
        .backend()
        .read_events(
            &cairn_events::RunId::parse(run_id).unwrap(),
            &EventQuery::default(),
        )
        .unwrap()
        .iter()
        .map(|e| e.decode().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inner_passes_are_distinct_in_every_outer_pass_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(dir.path());
    let h = engine.start(wf, json!({}), waiting_opts()).await.unwrap();
    let run_id = h.run_id.clone();
    let mut outcome = h.wait().await;
    let mut decided = Vec::new();
    while outcome == RunOutcome::Waiting {
        let st = engine.state(&run_id).unwrap();
        let gate = st
            .nodes
            .iter()
            .find(|n| n.status.as_str() == "waiting-approval")
            .expect("a waiting gate")
            .node_id
            .clone();
        assert!(decided.len() < 2, "more stops than gates: {decided:?}");
        engine
            .decide(&run_id, &gate, true, None, None)
            .await
            .unwrap();
        decided.push(gate);
        outcome = engine
            .resume(&run_id, waiting_opts())
            .await
            .unwrap()
            .wait()
            .await;
    }
    // The inner gate of each outer pass, told apart by the outer pass.
    assert_eq!(decided, ["review.inner@0.gate", "review.inner@1.gate"]);
    // The last check read its sibling `fix` of the same inner pass.
    assert_eq!(outcome, RunOutcome::Finished(Some(json!(2))));

    let log = log_of(&engine, &run_id);
    let mut pending: BTreeMap<(String, u32), usize> = BTreeMap::new();
    let mut finished: BTreeMap<(String, u32), usize> = BTreeMap::new();
    for e in &log {
        let Some((id, it)) = e.node_key() else {
            continue;
        };
        let key = (id.to_string(), it);
        match &e.kind {
            EventKind::NodePending { .. } => *pending.entry(key).or_default() += 1,
            EventKind::NodeFinished { .. } | EventKind::NodeSkipped { .. } => {
                *finished.entry(key).or_default() += 1
            }
            _ => {}
        }
    }
    for (key, n) in pending.iter().chain(finished.iter()) {
        assert_eq!(*n, 1, "{key:?}: {n} events where one is due");
    }
    assert_eq!(
        pending.keys().collect::<BTreeSet<_>>(),
        finished.keys().collect::<BTreeSet<_>>(),
        "every instance pending once ended once"
    );
    let inner_children: BTreeSet<(String, u32)> = pending
        .keys()
        .filter(|(id, _)| id.starts_with("review.inner@"))
        .cloned()
        .collect();
    let mut want = BTreeSet::new();
    for outer in 0..2 {
        for inner in 0..3 {
            for child in ["fix", "gate", "check"] {
                want.insert((format!("review.inner@{outer}.{child}"), inner));
            }
        }
    }
    assert_eq!(inner_children, want);

    let st = engine.state(&run_id).unwrap();
    for outer in 0..2 {
        for inner in 0..3u32 {
            let check = st
                .node(&format!("review.inner@{outer}.check"), inner)
                .unwrap();
            assert_eq!(check.status.as_str(), "finished");
            assert_eq!(
                check.output.as_ref().map(|o| o.to_value()),
                Some(json!(inner))
            );
            let gate = st
                .node(&format!("review.inner@{outer}.gate"), inner)
                .unwrap();
            let want = if inner == 1 { "finished" } else { "skipped" };
            assert_eq!(gate.status.as_str(), want, "gate {outer}/{inner}");
        }
        // The inner loop itself is an instance of each outer pass.
        assert_eq!(
            st.node("review.inner", outer).unwrap().status.as_str(),
            "finished"
        );
    }
    // A top-level loop keeps its children's plain paths.
    assert!(st.node("review.inner", 0).is_some());
    assert!(st.nodes.iter().all(|n| !n.node_id.starts_with("review@")));
}

/// A pass reads what the previous pass of a sibling gave (`nodes.check`
/// is the latest pass), while the driver lets go of the outputs of passes
/// that later ones replaced: what the run computes, and every pass's output
/// in the log, are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_reads_the_previous_pass_and_the_log_keeps_every_pass() {
    let dir = tempfile::tempdir().unwrap();
    let journal =
        Journal::open_sqlite(&dir.path().join("cairn.db"), JournalOptions::default()).unwrap();
    let path = dir.path().join("wf.yaml");
    std::fs::write(
        &path,
        r#"
name: carry
output: "{{ nodes.l.output.check }}"
nodes:
  - id: l
    loop:
      until: "iteration >= 3"
      max_iterations: 10
      nodes:
        - id: step
          value: "{{ (nodes.check.output if nodes.check is defined else 0) + 1 }}"
        - id: check
          needs: [step]
          value: "{{ nodes.step.output * 10 }}"
"#,
    )
    .unwrap();
    let wf = cairn_workflow::load(&path).unwrap();
    let engine = Engine::new(journal, EngineOptions::default());
    let h = engine
        .start(wf, json!({}), StartOptions::default())
        .await
        .unwrap();
    let run_id = h.run_id.clone();
    assert_eq!(h.wait().await, RunOutcome::Finished(Some(json!(11110))));
    let st = engine.state(&run_id).unwrap();
    let mut steps: Vec<(u32, serde_json::Value)> = st
        .nodes
        .iter()
        .filter(|n| n.node_id.as_str() == "l.step")
        .map(|n| (n.iteration, n.output.as_ref().unwrap().to_value()))
        .collect();
    steps.sort_by_key(|(i, _)| *i);
    let values: Vec<serde_json::Value> = steps.into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, vec![json!(1), json!(11), json!(111), json!(1111)]);
}
