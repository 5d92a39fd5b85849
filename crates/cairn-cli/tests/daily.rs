//! Everyday use through the real binary: the store found upward, who
//! drives a run, `logs --follow` before the run exists, and people
//! answering a run (and its child runs) without copying ids.

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `cairn` in `dir` with no `--store`: the store is found as git finds
/// `.git`.
fn cairn_here(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("run cairn")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_store_is_found_in_the_nearest_folder_upward() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.yaml"),
        "name: one\nnodes:\n  - id: a\n    value: 1\n",
    )
    .unwrap();
    expect_code(
        &cairn_here(dir.path(), &["run", "one.yaml", "--run-id", "up1"]),
        0,
    );
    let deep = dir.path().join("src/deeper");
    std::fs::create_dir_all(&deep).unwrap();
    let runs = cairn_here(&deep, &["runs"]);
    expect_code(&runs, 0);
    assert!(text(&runs).contains("up1"), "{}", text(&runs));
    expect_code(&cairn_here(&deep, &["status", "up1"]), 0);
    // No store made below: the project's is used.
    assert!(!deep.join(".cairn").exists());
    // A folder outside the project has none: its own default, missing.
    let elsewhere = tempfile::tempdir().unwrap();
    expect_code(&cairn_here(elsewhere.path(), &["status", "up1"]), 4);
    // The search goes up to, not into, a ceiling folder (as git's
    // GIT_CEILING_DIRECTORIES): a store above it is not the project's.
    let ceiling = dir.path().join("src");
    let capped = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(&deep)
        .args(["status", "up1"])
        .env_remove("CAIRN_STORE")
        .env("CAIRN_CEILING_DIRECTORIES", &ceiling)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    expect_code(&capped, 4);
    // A ceiling that is the folder itself still lets it be looked in.
    let at_home = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir.path())
        .args(["status", "up1"])
        .env_remove("CAIRN_STORE")
        .env("CAIRN_CEILING_DIRECTORIES", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    expect_code(&at_home, 0);
}

const ASKS: &str = r#"
name: parent
nodes:
  - id: child
    workflow: child.yaml
  - id: gate
    approval: "Go on?"
"#;

const CHILD: &str = r#"
name: child
nodes:
  - id: pick
    ask: "Which size?"
    schema: { type: integer, minimum: 1, maximum: 5 }
  - id: big_gate
    needs: [pick]
    approval: "Size {{ nodes.pick.output }} ok?"
"#;

#[test]
fn people_answer_a_run_and_its_child_runs_from_the_parent_without_ids() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("parent.yaml"), ASKS).unwrap();
    std::fs::write(dir.path().join("child.yaml"), CHILD).unwrap();
    let out = cairn(
        dir.path(),
        &["run", "parent.yaml", "--run-id", "p1", "--exit-on-wait"],
    );
    expect_code(&out, 3);
    // Status lists both waits, the child's with its run, the choices, the
    // commands to use, and that nobody drives the run.
    let st = cairn(dir.path(), &["status", "p1"]);
    let shown = text(&st);
    assert!(shown.contains("gate waits for approval: Go on?"), "{shown}");
    assert!(shown.contains("pick (in child run p1."), "{shown}");
    assert!(shown.contains("answer: integer from 1 to 5"), "{shown}");
    assert!(shown.contains("cairn answer p1 '<answer>'"), "{shown}");
    assert!(shown.contains("no process drives this run"), "{shown}");
    assert!(shown.contains("cairn resume p1"), "{shown}");
    // An answer that breaks the schema is refused, the question stays.
    let bad = cairn(dir.path(), &["answer", "p1", "9"]);
    expect_code(&bad, 4);
    assert!(text(&bad).contains("maximum of 5"), "{}", text(&bad));
    // The one open question needs no id, though it is in the child.
    let ok = cairn(dir.path(), &["answer", "p1", "3"]);
    expect_code(&ok, 0);
    assert!(text(&ok).contains("of child run p1."), "{}", text(&ok));
    expect_code(&cairn(dir.path(), &["answer", "p1", "4"]), 4);
    expect_code(&cairn(dir.path(), &["resume", "p1", "--exit-on-wait"]), 3);
    // The child's approval, decided on the parent.
    let ok = cairn(dir.path(), &["approve", "p1", "big_gate"]);
    expect_code(&ok, 0);
    assert!(text(&ok).contains("of child run"), "{}", text(&ok));
    expect_code(&cairn(dir.path(), &["approve", "p1", "gate"]), 0);
    expect_code(&cairn(dir.path(), &["resume", "p1"]), 0);
}

#[test]
fn two_open_questions_are_named_by_node_or_request_id() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("two.yaml"),
        "name: two\nnodes:\n  - id: a\n    ask: \"A?\"\n  - id: b\n    ask: \"B?\"\n",
    )
    .unwrap();
    expect_code(
        &cairn(
            dir.path(),
            &["run", "two.yaml", "--run-id", "t2", "--exit-on-wait"],
        ),
        3,
    );
    let which = cairn(dir.path(), &["answer", "t2", "yes"]);
    expect_code(&which, 4);
    assert!(
        text(&which).contains("2 open questions"),
        "{}",
        text(&which)
    );
    expect_code(&cairn(dir.path(), &["answer", "t2", "a", "first"]), 0);
    // One left: no name needed.
    expect_code(&cairn(dir.path(), &["answer", "t2", "second"]), 0);
    expect_code(&cairn(dir.path(), &["resume", "t2"]), 0);
}

#[test]
fn logs_follow_waits_for_a_run_that_has_not_started() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.yaml"),
        "name: one\nnodes:\n  - id: a\n    value: 1\n",
    )
    .unwrap();
    // Nothing there yet, not even the store: it gives up at its timeout.
    let gone = cairn(
        dir.path(),
        &["logs", "nope", "--follow", "--timeout", "200ms"],
    );
    expect_code(&gone, 4);
    assert!(
        text(&gone).contains("no run `nope` started within 200ms"),
        "{}",
        text(&gone)
    );
    // Started before the run, it waits and follows it to its end.
    let follower = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir.path())
        .args([
            "--store",
            ".cairn/cairn.db",
            "logs",
            "f1",
            "--follow",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    expect_code(
        &cairn(dir.path(), &["run", "one.yaml", "--run-id", "f1"]),
        0,
    );
    let out = follower.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        mirror(dir.path(), "f1")
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("waiting for run `f1`"));
}

#[test]
fn status_names_the_process_that_drives_a_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("slow.yaml"),
        "name: slow\nnodes:\n  - id: a\n    command: [sleep, \"30\"]\n",
    )
    .unwrap();
    let mut run = cairn_session(dir.path(), &["run", "slow.yaml", "--run-id", "d1"]);
    // The mirror exists once the run has started (the store is whole).
    let started = dir.path().join(".cairn/logs/d1/events.ndjson");
    wait_until("the command to start", || {
        started.exists()
            && events(dir.path(), "d1")
                .iter()
                .any(|e| e.kind.type_name() == "NodeStarted")
    });
    let st = cairn(dir.path(), &["status", "d1"]);
    let shown = text(&st);
    assert!(
        shown.contains(&format!("driven by pid {} on this machine", run.id())),
        "{shown}"
    );
    let _ = run.kill();
    wait_exit(&mut run);
    let st = cairn(dir.path(), &["status", "d1"]);
    assert!(
        text(&st).contains("no process drives this run"),
        "{}",
        text(&st)
    );
}

#[test]
fn init_writes_a_starter_that_runs_and_ignores_the_store_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".gitignore"), "target").unwrap();
    let out = cairn_here(dir.path(), &["init"]);
    expect_code(&out, 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".gitignore")).unwrap(),
        "target\n.cairn/\n"
    );
    // Never over a file, and the line is added once.
    expect_code(&cairn_here(dir.path(), &["init"]), 4);
    expect_code(&cairn_here(dir.path(), &["init", "second.yaml"]), 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join(".gitignore")).unwrap(),
        "target\n.cairn/\n"
    );
    expect_code(&cairn_here(dir.path(), &["validate", "workflow.yaml"]), 0);
    expect_code(&cairn_here(dir.path(), &["run", "workflow.yaml"]), 0);
}

#[test]
fn completions_and_the_man_page_come_from_the_cli_definition() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = cairn_here(dir.path(), &["completions", shell]);
        expect_code(&out, 0);
        let script = String::from_utf8_lossy(&out.stdout);
        // fish names a flag without its dashes (`-l store`).
        for word in ["resume", "answer", "completions", "store"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    expect_code(&cairn_here(dir.path(), &["completions", "tcsh"]), 4);
    let man = cairn_here(dir.path(), &["man"]);
    expect_code(&man, 0);
    let page = String::from_utf8_lossy(&man.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH cairn 1"),
        "{page}"
    );
    assert!(
        page.contains("resume") && page.contains("\\-\\-store"),
        "{page}"
    );
}

/// A run whose process stopped at a gate (`--exit-on-wait`), cancelled
/// later from another process: its clean-up handler runs (in the process
/// that cancels, which waits for it) before the run ends cancelled.
#[test]
fn cancelling_a_parked_run_runs_its_clean_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("deploy.yaml"),
        r#"
name: deploy
nodes:
  - id: gate
    approval: "Deploy?"
  - id: deploy
    needs: [gate]
    command: ["sh", "-c", "echo deployed > deployed.txt"]
  - id: cleanup
    needs: [deploy]
    if: "always()"
    command: ["sh", "-c", "echo cleaned > cleaned.txt"]
"#,
    )
    .unwrap();
    let out = cairn_here(
        dir,
        &["run", "deploy.yaml", "--run-id", "d1", "--exit-on-wait"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let out = cairn_here(dir, &["cancel", "d1", "--reason", "not today"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("cleaned.txt")).unwrap(),
        "cleaned\n"
    );
    assert!(!dir.join("deployed.txt").exists());
    let st = cairn_here(dir, &["status", "d1", "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["status"], "cancelled", "{st}");
    let node = |id: &str| {
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["nodeId"] == id)
            .unwrap_or_else(|| panic!("no node {id}: {st}"))["status"]
            .clone()
    };
    assert_eq!(node("cleanup"), "finished", "{st}");
    assert_eq!(node("deploy"), "cancelled", "{st}");
}
