//! `cairn fork` with the real binary: at a node, with another input and
//! another workflow file (finished work is not redone, the files are put
//! back as they were at the point); in the middle of an agent's
//! conversation against the scripted model (the fork goes on from that
//! step, the step's calls made again on the files as they were); and the
//! points it refuses. Only the files the run changed after the point are
//! put back: another process's files survive a fork, a file both changed
//! is a conflict (exit 5, `--force` overwrites), and `--dry-run` prints
//! the plan and changes nothing.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use cairn_events::{Event, EventKind, ForkedFrom};
use serde_json::Value;

fn ok(out: &Output) -> String {
    expect_code(out, 0);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn output(dir: &Path, run: &str) -> Value {
    events(dir, run)
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunFinished { output, .. } => output.clone(),
            _ => None,
        })
        .expect("the run finished with an output")
}

/// The nodes that started an attempt in `evs` after seq `after`.
fn started_after(evs: &[Event], after: u64) -> Vec<String> {
    evs.iter()
        .filter(|e| e.seq.get() > after && matches!(e.kind, EventKind::NodeStarted { .. }))
        .map(|e| e.scope.node_id.as_deref().unwrap().to_string())
        .collect()
}

fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".txt") {
            out.insert(name, std::fs::read_to_string(e.path()).unwrap());
        }
    }
    out
}

#[test]
fn a_fork_at_a_node_keeps_what_finished_and_puts_the_files_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("pipe.yaml"), PIPE).unwrap();
    std::fs::write(dir.join("theirs.txt"), "before the run\n").unwrap();
    ok(&cairn(
        dir,
        &[
            "run",
            "pipe.yaml",
            "--run-id",
            "orig",
            "--input",
            r#"{"x":1}"#,
        ],
    ));
    assert_eq!(output(dir, "orig"), "FB1");
    let orig = events(dir, "orig");
    // Something outside Cairn changes the files after the run: a file of
    // its own made, one of its own changed, and one the run wrote.
    std::fs::write(dir.join("build.txt"), "edited by hand\n").unwrap();
    std::fs::write(dir.join("stray.txt"), "made later\n").unwrap();
    std::fs::write(dir.join("theirs.txt"), "changed later\n").unwrap();
    let before_fork = files(dir);
    let fork_f1 = |extra: &[&str]| {
        let mut args = vec![
            "fork",
            "orig",
            "--at",
            "build",
            "--input",
            r#"{"x":2}"#,
            "--run-id",
            "f1",
        ];
        args.extend_from_slice(extra);
        cairn(dir, &args)
    };

    // build.txt was written by the run after the point and by hand since:
    // a conflict, refused with exit 5, nothing touched, no run made.
    let out = fork_f1(&[]);
    expect_code(&out, 5);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("conflict build.txt: the run left a file, and something else changed it"),
        "{said}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(files(dir), before_fork);
    assert!(
        !cairn(dir, &["status", "f1"]).status.success(),
        "no fork made"
    );

    // The dry run says the same, as text and as JSON, and changes nothing.
    let out = fork_f1(&["--dry-run"]);
    expect_code(&out, 5);
    assert!(String::from_utf8_lossy(&out.stdout).contains("conflict build.txt"));
    let out = fork_f1(&["--dry-run", "--force", "--json"]);
    expect_code(&out, 0);
    let answer: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    // As `POST /v1/runs/{id}/fork` answers.
    assert_eq!(answer["dryRun"], true, "{answer}");
    assert_eq!(answer["made"], false, "{answer}");
    assert_eq!(answer["runId"], Value::Null, "{answer}");
    assert_eq!(answer["from"], "orig", "{answer}");
    let plan = &answer["plan"];
    // build.txt was not there when `build` first started.
    assert_eq!(plan["write"], serde_json::json!([]), "{plan}");
    assert_eq!(plan["remove"], serde_json::json!(["build.txt"]), "{plan}");
    assert_eq!(plan["conflicts"][0]["path"], "build.txt", "{plan}");
    assert_eq!(files(dir), before_fork);
    assert!(
        !cairn(dir, &["status", "f1"]).status.success(),
        "no fork made"
    );

    // Forced: build.txt is put back (and rewritten by the fork's build);
    // the other process's files are left as it left them.
    let said = ok(&fork_f1(&["--force"]));
    assert!(said.contains("overwrote (--force) build.txt"), "{said}");
    assert!(said.contains("forked run f1 from orig at seq"), "{said}");
    assert_eq!(output(dir, "f1"), "FB2");
    let evs = events(dir, "f1");
    let EventKind::RunStarted {
        forked_from: Some(ForkedFrom { run_id, seq }),
        resumed: false,
        input,
        ..
    } = &evs[0].kind
    else {
        panic!("the fork's log opens with its origin: {:?}", evs[0].kind)
    };
    assert_eq!(run_id, "orig");
    assert_eq!(input.as_ref().unwrap()["x"], 2);
    // The copy is the original's events, seq for seq.
    for (a, b) in orig[1..*seq as usize].iter().zip(&evs[1..*seq as usize]) {
        assert_eq!((a.seq, &a.kind, &a.scope), (b.seq, &b.kind, &b.scope));
    }
    // `fetch` finished before the point and is not run again.
    assert_eq!(started_after(&evs, *seq), ["build", "join"]);
    // The files the run changed as they were when `build` first started:
    // fetch.txt from the one run of `fetch`, then the fork's build; the
    // other process's files as it left them.
    assert_eq!(
        files(dir),
        BTreeMap::from([
            ("fetch.txt".to_string(), "fetched\n".to_string()),
            ("build.txt".to_string(), "built-2\n".to_string()),
            ("stray.txt".to_string(), "made later\n".to_string()),
            ("theirs.txt".to_string(), "changed later\n".to_string()),
        ])
    );

    // Another workflow file: `build` changed, `fetch` kept as it finished.
    std::fs::write(
        dir.join("pipe2.yaml"),
        PIPE.replace("echo B{{ input.x }}", "echo V2-{{ input.x }}"),
    )
    .unwrap();
    // The fork f1 wrote build.txt since the original did: another run's
    // change, so a conflict for a fork of the original; forced.
    ok(&cairn(
        dir,
        &[
            "fork",
            "orig",
            "--at",
            "build",
            "--workflow",
            "pipe2.yaml",
            "--run-id",
            "f2",
            "--force",
        ],
    ));
    assert_eq!(output(dir, "f2"), "FV2-1");
    let evs = events(dir, "f2");
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::WorkflowReloaded { generation: 1, .. })));
    assert_eq!(started_after(&evs, *seq), ["build", "join"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("fetch.txt")).unwrap(),
        "fetched\n"
    );

    // At a seq: everything up to it is kept, the rest runs.
    let fetch_end = orig
        .iter()
        .find(|e| matches!(e.kind, EventKind::NodeFinished { .. }))
        .unwrap()
        .seq
        .get();
    ok(&cairn(
        dir,
        &[
            "fork",
            "orig",
            "--at",
            &fetch_end.to_string(),
            "--run-id",
            "f3",
        ],
    ));
    assert_eq!(output(dir, "f3"), "FB1");
    assert_eq!(
        started_after(&events(dir, "f3"), fetch_end),
        ["build", "join"]
    );
    // And a fork of a fork.
    ok(&cairn(
        dir,
        &["fork", "f1", "--at", "join", "--run-id", "f4"],
    ));
    assert_eq!(output(dir, "f4"), "FB2");
}

#[test]
fn a_fork_refuses_points_it_cannot_start_from() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("pipe.yaml"), PIPE).unwrap();
    ok(&cairn(
        dir,
        &["run", "pipe.yaml", "--run-id", "o", "--input", r#"{"x":1}"#],
    ));
    let last = events(dir, "o").len();
    for (args, says) in [
        (vec!["fork", "o", "--at", "0"], "seqs start at 1"),
        (vec!["fork", "o", "--at", "999999"], "ends at seq"),
        (
            vec!["fork", "o", "--at", &last.to_string()],
            "the run ended at seq",
        ),
        (vec!["fork", "o", "--at", "nope"], "no node `nope`"),
        (vec!["fork", "missing", "--at", "3"], "no run `missing`"),
        (
            vec!["fork", "o", "--at", "build", "--input", r#"{"x":"text"}"#],
            "input",
        ),
        (
            vec!["fork", "o", "--at", "build", "--run-id", "o"],
            "already exists",
        ),
    ] {
        let out = cairn(dir, &args);
        assert_eq!(
            out.status.code(),
            Some(4),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

const AGENT: &str = r#"
name: writer
models:
  m: { provider: scripted, script: turns.yaml }
nodes:
  - id: author
    agent:
      model: m
      prompt: Write the notes.
      tools: [write, read]
"#;

/// Three steps: two writes, then the answer.
const TURNS: &str = r#"
turns:
  - text: First draft.
    tool_calls:
      - { name: write, args: { path: one.txt, content: "one\n" } }
  - text: Second file.
    tool_calls:
      - { name: write, args: { path: two.txt, content: "two\n" } }
      - { name: read, args: { path: one.txt } }
  - text: All written.
"#;

#[test]
fn a_fork_in_the_middle_of_a_conversation_goes_on_from_that_step() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("writer.yaml"), AGENT).unwrap();
    std::fs::write(dir.join("turns.yaml"), TURNS).unwrap();
    ok(&cairn(dir, &["run", "writer.yaml", "--run-id", "w"]));
    let orig = events(dir, "w");
    let seq_of =
        |pred: &dyn Fn(&EventKind) -> bool| orig.iter().find(|e| pred(&e.kind)).unwrap().seq.get();
    let step2_end = seq_of(&|k| matches!(k, EventKind::AgentStepFinished { step: 2, .. }));
    let step2_start = seq_of(&|k| matches!(k, EventKind::AgentStepStarted { step: 2, .. }));
    // Step 2 has a snapshot: the files step 1's call left.
    assert!(orig.iter().any(|e| matches!(
        &e.kind,
        EventKind::AgentStepStarted {
            step: 2,
            snapshot: Some(_),
            ..
        }
    )));
    // The point is among step 2's calls (after its first call started):
    // the fork goes back to the end of step 2's answer and makes its
    // calls again, on the files as they were before them.
    let in_calls = seq_of(&|k| matches!(k, EventKind::ToolCallStarted { tool_seq: 2, .. }));
    assert!(in_calls > step2_end);
    // two.txt, which the run wrote after the point, scribbled on by hand:
    // a conflict, overwritten with --force.
    std::fs::write(dir.join("two.txt"), "scribbled\n").unwrap();
    let at = in_calls.to_string();
    expect_code(
        &cairn(dir, &["fork", "w", "--at", &at, "--run-id", "wf"]),
        5,
    );
    let said = ok(&cairn(
        dir,
        &["fork", "w", "--at", &at, "--run-id", "wf", "--force"],
    ));
    assert!(said.contains(&format!("at seq {step2_end}")), "{said}");
    let evs = events(dir, "wf");
    let after: Vec<String> = evs
        .iter()
        .filter(|e| e.seq.get() > step2_end)
        .filter_map(|e| match &e.kind {
            EventKind::AgentStepStarted { step, .. } => Some(format!("step{step}")),
            EventKind::ToolCallStarted { tool_name, .. } => Some(tool_name.clone()),
            EventKind::NodeStarted { .. } => Some(format!("attempt{}", e.scope.attempt.unwrap())),
            _ => None,
        })
        .collect();
    // The conversation goes on: step 2's two calls, then step 3; step 1 is
    // neither asked again nor its write repeated.
    assert_eq!(after, ["attempt2", "write", "read", "step3"], "{after:?}");
    let out = events(dir, "wf")
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::NodeFinished { output, .. }
                if e.scope.node_id.as_deref() == Some("author") =>
            {
                output.clone()
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(out.to_value(), "All written.");
    assert_eq!(
        std::fs::read_to_string(dir.join("two.txt")).unwrap(),
        "two\n"
    );

    // Just before step 2's model call: the files after step 1's call, and
    // the fork asks step 2 itself. A file made by hand meanwhile is left.
    std::fs::write(dir.join("mine.txt"), "by hand\n").unwrap();
    ok(&cairn(
        dir,
        &[
            "fork",
            "w",
            "--at",
            &(step2_start - 1).to_string(),
            "--run-id",
            "wg",
        ],
    ));
    let evs = events(dir, "wg");
    let steps: Vec<u32> = evs
        .iter()
        .filter(|e| e.seq.get() >= step2_start)
        .filter_map(|e| match &e.kind {
            EventKind::AgentStepStarted { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [2, 3]);
    assert_eq!(
        std::fs::read_to_string(dir.join("one.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("mine.txt")).unwrap(),
        "by hand\n"
    );
}

#[test]
fn a_run_that_is_being_driven_is_not_forked() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("slow.yaml"),
        "name: slow\nnodes:\n  - id: a\n    command: [\"sh\", \"-c\", \"echo x > a.txt\"]\n  - id: b\n    needs: [a]\n    command: [\"sleep\", \"30\"]\n",
    )
    .unwrap();
    let mut run = cairn_session(dir, &["run", "slow.yaml", "--run-id", "busy"]);
    wait_until("b to start", || {
        mirror(dir, "busy").contains("\"nodeId\":\"b\",\"iteration\":0,\"attempt\":1")
    });
    let out = cairn(dir, &["fork", "busy", "--at", "b", "--run-id", "nope"]);
    let _ = run.kill();
    wait_exit(&mut run);
    expect_code(&out, 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("being driven by another process"), "{err}");
    // Nothing was made.
    assert!(!mirror(dir, "nope").contains("RunStarted"));
}

/// A gate, then a node whose command a reload changes while the gate waits.
const GATED: &str = r#"name: gated
nodes:
  - id: gate
    approval: go on?
  - id: after
    needs: [gate]
    command: ["echo", "OLD"]
output: "{{ nodes.after.output }}"
"#;

#[test]
fn a_fork_after_a_reload_runs_the_generation_of_its_point() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("gated.yaml"), GATED).unwrap();
    let mut run = cairn_session(dir, &["run", "gated.yaml", "--run-id", "g", "--watch"]);
    let wait = |what: &str| wait_until(what, || mirror(dir, "g").contains(what));
    wait("\"NodeWaitingApproval\"");
    std::fs::write(dir.join("gated.yaml"), GATED.replace("OLD", "NEW")).unwrap();
    wait("\"WorkflowReloaded\"");
    expect_code(&cairn(dir, &["approve", "g", "gate"]), 0);
    assert_eq!(wait_exit(&mut run).code(), Some(0), "{}", sessions_err(dir));
    assert_eq!(output(dir, "g"), "NEW");
    // The file goes back to OLD: the fork runs what the run had at the
    // point (generation 1), not the file.
    std::fs::write(dir.join("gated.yaml"), GATED).unwrap();
    ok(&cairn(
        dir,
        &["fork", "g", "--at", "after", "--run-id", "g2"],
    ));
    assert_eq!(output(dir, "g2"), "NEW");
    let evs = events(dir, "g2");
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::WorkflowReloaded { generation: 1, .. })));
}

#[test]
fn a_fork_cut_short_before_its_log_is_made_again_not_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("pipe.yaml"), PIPE).unwrap();
    ok(&cairn(
        dir,
        &["run", "pipe.yaml", "--run-id", "o", "--input", r#"{"x":1}"#],
    ));
    // What a kill between the fork's record and its log leaves: the record
    // of a fork being made, and no event.
    {
        use cairn_store::prelude::*;
        let b = cairn_store::SqliteBackend::open(&dir.join(".cairn/cairn.db")).unwrap();
        let mut rec = b
            .get_run(&cairn_events::RunId::parse("o").unwrap())
            .unwrap()
            .unwrap();
        rec.run_id = cairn_events::RunId::parse("cut").unwrap();
        rec.status = cairn_engine::FORKING;
        b.create_run(&rec).unwrap();
    }
    let out = cairn(dir, &["resume", "cut"]);
    expect_code(&out, 4);
    assert!(String::from_utf8_lossy(&out.stderr).contains("fork that was cut short"));
    assert!(events(dir, "cut").is_empty(), "nothing ran");
    ok(&cairn(
        dir,
        &["fork", "o", "--at", "build", "--run-id", "cut"],
    ));
    assert_eq!(output(dir, "cut"), "FB1");
}
