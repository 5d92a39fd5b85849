//! Hot reload with the real binary (`cairn run --watch`, `cairn serve
//! --watch`): while a node waits for a file, the workflow file is saved
//! again (as editors save: a new file renamed over the old one). A change
//! to nodes that have not started applies, and the run's output shows it;
//! one that does not validate, and one that would change the running node
//! or the input schema, leave the run on its definition; a resume after a
//! reload runs the last generation; a SIGKILL in the middle of a reload
//! loses nothing; a generation stored without its event is no generation;
//! a stored generation changed behind Cairn's back is refused.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_events::{check_log, Event, EventKind};
use cairn_store::prelude::*;
use cairn_store::{EventQuery, GenerationRecord, SqliteBackend};
use serde_json::{json, Value};

/// What the runs start from: `wait` runs until the file `go-<run>`
/// appears, `after` then says `old`.
const OLD: &str = r#"name: flow
input:
  type: object
output: "{{ nodes.after.output }}"
nodes:
  - id: wait
    command: ["sh", "-c", "while [ ! -f go-{{ run.id }} ]; do sleep 0.05; done; echo waited"]
  - id: after
    needs: [wait]
    command: ["echo", "old"]
"#;

/// `after` (not started while `wait` runs) says `new`, and a node is added
/// that the output reads.
const NEW: &str = r#"name: flow
input:
  type: object
output: "{{ nodes.after.output }} {{ nodes.extra.output }}"
nodes:
  - id: wait
    command: ["sh", "-c", "while [ ! -f go-{{ run.id }} ]; do sleep 0.05; done; echo waited"]
  - id: after
    needs: [wait]
    command: ["echo", "new"]
  - id: extra
    value: added
"#;

fn store(dir: &Path) -> PathBuf {
    dir.join(".cairn/cairn.db")
}

/// Saves `text` as `name` in `dir` the way editors do: written beside it,
/// then renamed over it.
fn save(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.swp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Lets run `run`'s `wait` node end.
fn go(dir: &Path, run: &str) {
    std::fs::write(dir.join(format!("go-{run}")), "").unwrap();
}

/// `cairn <args>` in `dir` with the test's store, its stdout in
/// `dir/<out>.out` and stderr in `dir/<out>.err`.
fn cairn_bg(dir: &Path, out: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .args(["--store", ".cairn/cairn.db"])
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{out}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{out}.err"))).unwrap())
        .spawn()
        .expect("spawn cairn")
}

/// `cairn run <file> --watch --run-id <run>`, in the background.
fn run_watched(dir: &Path, file: &str, run: &str) -> Child {
    cairn_bg(dir, run, &["run", file, "--watch", "--run-id", run])
}

fn said(dir: &Path, out: &str) -> String {
    let o = std::fs::read_to_string(dir.join(format!("{out}.out"))).unwrap_or_default();
    let e = std::fs::read_to_string(dir.join(format!("{out}.err"))).unwrap_or_default();
    format!("stdout:\n{o}\nstderr:\n{e}")
}

/// Run `run`'s log as committed so far (empty before the store exists).
fn events(dir: &Path, run: &str) -> Vec<Event> {
    if !store(dir).exists() {
        return Vec::new();
    }
    let b = SqliteBackend::open(&store(dir)).expect("open the store");
    b.read_events(
        &cairn_events::RunId::parse(run).unwrap(),
        &EventQuery::default(),
    )
    .unwrap()
    .iter()
    .map(|e| e.decode().unwrap())
    .collect()
}

/// The log, checked against the event contract.
fn checked(dir: &Path, run: &str) -> Vec<Event> {
    let evs = events(dir, run);
    check_log(&evs).unwrap_or_else(|e| panic!("run {run} breaks the contract: {e}"));
    evs
}

/// Polls run `run`'s log until `pred` picks an event; fails past
/// [`PATIENCE`], with what the sessions said.
fn wait_for(dir: &Path, run: &str, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
    let t0 = Instant::now();
    loop {
        if let Some(e) = events(dir, run).into_iter().find(|e| pred(e)) {
            return e;
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "no {what} in run {run} within {PATIENCE:?}\n{}",
            said(dir, run)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn started(e: &Event, node: &str) -> bool {
    matches!(e.kind, EventKind::NodeStarted { .. }) && e.scope.node_id.as_deref() == Some(node)
}

fn is_reloaded(e: &Event) -> bool {
    matches!(e.kind, EventKind::WorkflowReloaded { .. })
}

/// The output of the run's `RunFinished`.
fn output(evs: &[Event]) -> Value {
    evs.iter()
        .find_map(|e| match &e.kind {
            EventKind::RunFinished { output, .. } => Some(output.clone().unwrap_or(Value::Null)),
            _ => None,
        })
        .expect("the run finished")
}

/// Starts run `run` of `file` (holding `OLD`) watched, and waits until its
/// `wait` node runs.
fn start_waiting(dir: &Path, file: &str, run: &str) -> Child {
    save(dir, file, OLD);
    let child = run_watched(dir, file, run);
    wait_for(dir, run, "NodeStarted of wait", |e| started(e, "wait"));
    child
}

/// `flow.yaml` started as `run`, reloaded to [`NEW`], then SIGKILL.
fn reload_then_kill(d: &Path, run: &str) {
    let mut child = start_waiting(d, "flow.yaml", run);
    save(d, "flow.yaml", NEW);
    wait_for(d, run, "WorkflowReloaded", is_reloaded);
    child.kill().unwrap(); // SIGKILL
    wait_exit(&mut child);
}

fn finish(dir: &Path, run: &str, mut child: Child) {
    go(dir, run);
    let status = wait_exit(&mut child);
    assert_eq!(status.code(), Some(0), "{}", said(dir, run));
}

#[test]
fn a_change_to_nodes_not_started_applies_and_new_nodes_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let child = start_waiting(d, "flow.yaml", "r1");
    save(d, "flow.yaml", NEW);
    let reloaded = wait_for(d, "r1", "WorkflowReloaded", is_reloaded);
    finish(d, "r1", child);

    let evs = checked(d, "r1");
    let detected: Vec<&Event> = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::WorkflowReloadDetected { .. }))
        .collect();
    assert_eq!(detected.len(), 1, "one save, one reload: {detected:?}");
    assert_eq!(
        detected[0].kind,
        EventKind::WorkflowReloadDetected {
            changed_files: vec!["flow.yaml".into()]
        }
    );
    assert_eq!(
        reloaded.kind,
        EventKind::WorkflowReloaded {
            generation: 1,
            changed_files: vec!["flow.yaml".into()]
        }
    );
    assert_eq!(reloaded.seq.get(), detected[0].seq.get() + 1);
    // The plan is mounted again right after: a frame, the new node.
    let next = &evs[reloaded.seq.get() as usize];
    assert!(
        matches!(
            next.kind,
            EventKind::FrameCommitted {
                frame_no: 2,
                mounted: 3,
                ..
            }
        ),
        "{next:?}"
    );
    let pending = evs
        .iter()
        .find(|e| {
            matches!(e.kind, EventKind::NodePending { .. })
                && e.scope.node_id.as_deref() == Some("extra")
        })
        .expect("the new node is mounted");
    assert!(pending.seq > reloaded.seq);
    // Nothing starts with the new definition before its event.
    let after = evs.iter().find(|e| started(e, "after")).unwrap();
    assert!(after.seq > reloaded.seq);
    assert_eq!(output(&evs), json!("new added"));
    // `wait` ran once: the reload did not touch it.
    assert_eq!(evs.iter().filter(|e| started(e, "wait")).count(), 1);

    let shown = said(d, "r1");
    assert!(shown.contains("reload: flow.yaml changed"), "{shown}");
    assert!(
        shown.contains("reload: the run now uses generation 1 of the workflow (flow.yaml)"),
        "{shown}"
    );
    let status = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(d)
        .args(["status", "r1", "--store", ".cairn/cairn.db"])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("reloaded  generation 1"), "{status}");
}

#[test]
fn a_change_that_does_not_validate_is_reported_with_its_line_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let child = start_waiting(d, "flow.yaml", "r2");
    // A typo in `after`, at line 10 of the file.
    let broken = OLD.replace(
        "    command: [\"echo\", \"old\"]",
        "    comand: [\"echo\", \"new\"]",
    );
    let line = broken.lines().position(|l| l.contains("comand")).unwrap() + 1;
    assert_eq!(line, 10);
    save(d, "flow.yaml", &broken);
    let failed = wait_for(d, "r2", "WorkflowReloadFailed", |e| {
        matches!(e.kind, EventKind::WorkflowReloadFailed { .. })
    });
    let EventKind::WorkflowReloadFailed {
        error,
        changed_files,
    } = &failed.kind
    else {
        unreachable!()
    };
    assert_eq!(changed_files, &["flow.yaml"]);
    assert_eq!(error.kind, "workflow");
    assert!(
        error
            .message
            .contains("flow.yaml:10:5: nodes[1].comand: unknown field `comand`"),
        "{error:?}"
    );
    assert!(
        !error.message.contains(&d.display().to_string()),
        "{error:?}"
    );
    finish(d, "r2", child);

    let evs = checked(d, "r2");
    assert!(!evs.iter().any(is_reloaded));
    assert_eq!(output(&evs), json!("old"));
    let shown = said(d, "r2");
    assert!(
        shown.contains("reload failed (flow.yaml); the run goes on with the definition it has:"),
        "{shown}"
    );
    assert!(
        shown.contains("  flow.yaml:10:5: nodes[1].comand"),
        "{shown}"
    );
}

#[test]
fn a_change_to_the_running_node_or_the_input_schema_is_refused_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let child = start_waiting(d, "flow.yaml", "r3");
    let unsafe_reasons = || -> Vec<String> {
        events(d, "r3")
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::WorkflowReloadUnsafe { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    };

    // The node that runs, changed (and a node not started, too).
    save(
        d,
        "flow.yaml",
        &NEW.replace("echo waited", "echo waited twice"),
    );
    wait_for(d, "r3", "WorkflowReloadUnsafe", |e| {
        matches!(e.kind, EventKind::WorkflowReloadUnsafe { .. })
    });
    assert_eq!(
        unsafe_reasons(),
        ["node `wait` is running and its definition changed"]
    );

    // The running node as it was, but the input schema changed.
    save(
        d,
        "flow.yaml",
        &NEW.replace("  type: object\n", "  type: object\n  required: [topic]\n"),
    );
    let t0 = Instant::now();
    while unsafe_reasons().len() < 2 {
        assert!(t0.elapsed() < PATIENCE, "{}", said(d, "r3"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let reasons = unsafe_reasons();
    assert!(
        reasons[1].starts_with("the input schema changed"),
        "{reasons:?}"
    );
    finish(d, "r3", child);

    let evs = checked(d, "r3");
    assert!(!evs.iter().any(is_reloaded));
    assert_eq!(output(&evs), json!("old"));
    let shown = said(d, "r3");
    assert!(
        shown.contains("reload refused (flow.yaml): node `wait` is running and its definition changed; the run goes on with the definition it has"),
        "{shown}"
    );
}

#[test]
fn a_resume_after_a_reload_runs_the_last_generation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut child = start_waiting(d, "flow.yaml", "r4");
    save(d, "flow.yaml", NEW);
    wait_for(d, "r4", "WorkflowReloaded", is_reloaded);
    child.kill().unwrap(); // SIGKILL
    wait_exit(&mut child);
    // The file goes back to what the run started with: the resume runs the
    // run's last generation from the store, not the file.
    save(d, "flow.yaml", OLD);
    go(d, "r4");
    let mut resume = cairn_bg(d, "r4-resume", &["resume", "r4"]);
    let status = wait_exit(&mut resume);
    assert_eq!(status.code(), Some(0), "{}", said(d, "r4-resume"));

    let evs = checked(d, "r4");
    assert_eq!(output(&evs), json!("new added"));
    let new_hash = cairn_workflow::parse(NEW, &d.join("flow.yaml"))
        .unwrap()
        .hash;
    let resumed = evs
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted {
                resumed: true,
                workflow_hash,
                ..
            } => Some(workflow_hash.clone()),
            _ => None,
        })
        .expect("the resume's RunStarted");
    assert_eq!(
        resumed, new_hash,
        "the resume records the generation it runs"
    );
}

/// A small xorshift generator: varied kill times, not crypto.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn a_kill_in_the_middle_of_a_reload_leaves_the_run_on_one_generation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut seed = std::process::id() as u64 * 2654435761 % 1_000_003 + 1;
    let (mut old_runs, mut new_runs) = (0, 0);
    for i in 0..6 {
        let (file, run) = (format!("k{i}.yaml"), format!("k{i}"));
        let mut child = start_waiting(d, &file, &run);
        save(d, &file, NEW);
        // The reload comes about 200 ms after the save (the watcher waits
        // for the files to be quiet): kills before, during and after it.
        std::thread::sleep(Duration::from_millis(next(&mut seed) % 400));
        child.kill().unwrap(); // SIGKILL
        wait_exit(&mut child);
        let evs = checked(d, &run);
        let reloaded = evs.iter().any(is_reloaded);
        go(d, &run);
        let mut resume = cairn_bg(d, &format!("{run}-resume"), &["resume", &run]);
        let status = wait_exit(&mut resume);
        assert_eq!(
            status.code(),
            Some(0),
            "{}",
            said(d, &format!("{run}-resume"))
        );
        let evs = checked(d, &run);
        let want = if reloaded {
            new_runs += 1;
            json!("new added")
        } else {
            old_runs += 1;
            json!("old")
        };
        assert_eq!(output(&evs), want, "run {run} (reloaded: {reloaded})");
    }
    eprintln!("{old_runs} runs resumed on generation 0, {new_runs} on generation 1");
}

#[test]
fn a_generation_stored_without_its_event_is_no_generation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut child = start_waiting(d, "flow.yaml", "r6");
    child.kill().unwrap(); // SIGKILL
    wait_exit(&mut child);
    // What a kill between storing a generation and committing its
    // `WorkflowReloaded` leaves: the text, and a file that says the same.
    let b = SqliteBackend::open(&store(d)).unwrap();
    let new = cairn_workflow::parse(NEW, &d.join("flow.yaml")).unwrap();
    b.put_generation(&GenerationRecord {
        run_id: cairn_events::RunId::parse("r6").unwrap(),
        generation: 1,
        workflow_hash: new.hash.clone(),
        workflow_source: NEW.into(),
        files: Vec::new(),
        created_ms: 1,
    })
    .unwrap();
    drop(b);
    save(d, "flow.yaml", NEW);
    go(d, "r6");
    let mut resume = cairn_bg(d, "r6-resume", &["resume", "r6"]);
    let status = wait_exit(&mut resume);
    assert_eq!(status.code(), Some(0), "{}", said(d, "r6-resume"));
    let evs = checked(d, "r6");
    assert!(!evs.iter().any(is_reloaded));
    assert_eq!(output(&evs), json!("old"));
}

#[test]
fn a_stored_generation_changed_outside_cairn_is_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    reload_then_kill(d, "r7");
    let db = rusqlite::Connection::open(store(d)).unwrap();
    let changed = db
        .execute(
            "UPDATE generations SET source = replace(source, 'echo', 'curl') \
             WHERE run_id = 'r7' AND generation = 1",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);
    go(d, "r7");
    let mut resume = cairn_bg(d, "r7-resume", &["resume", "r7"]);
    let status = wait_exit(&mut resume);
    assert_eq!(status.code(), Some(1), "{}", said(d, "r7-resume"));
    let err = said(d, "r7-resume");
    assert!(
        err.contains("generation 1 of its workflow hashes to")
            && err.contains("changed outside Cairn"),
        "{err}"
    );
    assert!(!events(d, "r7")
        .iter()
        .any(|e| matches!(e.kind, EventKind::RunStarted { resumed: true, .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_server_reloads_the_runs_it_drives() {
    use cairn_client::{wait_healthy, Client};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    save(&d, "flow.yaml", OLD);
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--store", ".cairn/cairn.db", "serve", "--watch"])
        .args(["--addr", &format!("127.0.0.1:{port}"), "--workflows", "."])
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_LOG_DIR")
        .current_dir(&d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let c = Client::new(&url, None).unwrap();
    c.post_json("/v1/runs", &json!({"workflow": "flow", "runId": "s1"}))
        .await
        .unwrap();
    let dd = d.clone();
    tokio::task::spawn_blocking(move || {
        wait_for(&dd, "s1", "NodeStarted of wait", |e| started(e, "wait"));
        save(&dd, "flow.yaml", NEW);
        wait_for(&dd, "s1", "WorkflowReloaded", is_reloaded);
        go(&dd, "s1");
        wait_for(&dd, "s1", "RunFinished", |e| {
            matches!(e.kind, EventKind::RunFinished { .. })
        });
    })
    .await
    .unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    let evs = checked(&d, "s1");
    assert_eq!(output(&evs), json!("new added"));
}

#[test]
fn a_copied_run_resumes_on_its_last_generation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    reload_then_kill(d, "r8");
    let copy = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(d)
        .args([
            "store",
            "copy",
            "--from",
            ".cairn/cairn.db",
            "--to",
            "copy.db",
        ])
        .output()
        .unwrap();
    assert_eq!(
        copy.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    go(d, "r8");
    let resume = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(d)
        .args(["--store", "copy.db", "resume", "r8", "--json"])
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        resume.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resume.stderr)
    );
    let b = SqliteBackend::open(&d.join("copy.db")).unwrap();
    let evs: Vec<Event> = b
        .read_events(
            &cairn_events::RunId::parse("r8").unwrap(),
            &EventQuery::default(),
        )
        .unwrap()
        .iter()
        .map(|e| e.decode().unwrap())
        .collect();
    check_log(&evs).unwrap();
    assert_eq!(output(&evs), json!("new added"));
}

/// A parent whose `child` node, after `wait`, runs `child.yaml`.
const PARENT: &str = r#"name: parent
output: "{{ nodes.child.output }}"
nodes:
  - id: wait
    command: ["sh", "-c", "while [ ! -f go-{{ run.id }} ]; do sleep 0.05; done; echo waited"]
  - id: child
    needs: [wait]
    workflow: child.yaml
"#;

fn child_saying(word: &str) -> String {
    format!("name: child\noutput: \"{{{{ nodes.say.output }}}}\"\nnodes:\n  - id: say\n    value: {word}\n")
}

#[test]
fn a_changed_child_workflow_is_checked_and_adopted_as_a_generation() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(d, "parent.yaml", PARENT);
    save(d, "child.yaml", &child_saying("old"));
    let child = run_watched(d, "parent.yaml", "r9");
    wait_for(d, "r9", "NodeStarted of wait", |e| started(e, "wait"));

    // A broken child is reported at once, with its file and line.
    save(
        d,
        "child.yaml",
        "name: child\nnodes:\n  - id: say\n    valeu: 1\n",
    );
    let failed = wait_for(d, "r9", "WorkflowReloadFailed", |e| {
        matches!(e.kind, EventKind::WorkflowReloadFailed { .. })
    });
    let EventKind::WorkflowReloadFailed {
        error,
        changed_files,
    } = &failed.kind
    else {
        unreachable!()
    };
    assert_eq!(changed_files, &["child.yaml"]);
    assert!(
        error.message.contains("child.yaml:4:5: nodes[0].valeu"),
        "{error:?}"
    );

    // A good one: the run pinned the child's text when it began, so a
    // person's edit is a new generation (the parent's text with the new
    // child), which the child node runs when it starts.
    save(d, "child.yaml", &child_saying("new"));
    wait_for(d, "r9", "WorkflowReloaded", is_reloaded);
    finish(d, "r9", child);
    let evs = checked(d, "r9");
    assert_eq!(evs.iter().filter(|e| is_reloaded(e)).count(), 1);
    let detected = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::WorkflowReloadDetected { .. }))
        .count();
    assert_eq!(detected, 2);
    assert_eq!(output(&evs), json!("new"));
}

const GATED: &str = r#"name: gated
output: "{{ nodes.after.output }}"
nodes:
  - id: gate
    approval: "Go on?"
  - id: after
    needs: [gate]
    value: old
"#;

#[test]
fn a_run_waiting_at_a_gate_keeps_the_gate_and_takes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save(d, "gated.yaml", GATED);
    let mut child = run_watched(d, "gated.yaml", "r10");
    wait_for(d, "r10", "ApprovalRequested", |e| {
        matches!(e.kind, EventKind::ApprovalRequested { .. })
    });

    // The gate that waits, changed: refused.
    save(d, "gated.yaml", &GATED.replace("Go on?", "Really go on?"));
    let refused = wait_for(d, "r10", "WorkflowReloadUnsafe", |e| {
        matches!(e.kind, EventKind::WorkflowReloadUnsafe { .. })
    });
    assert!(
        matches!(&refused.kind, EventKind::WorkflowReloadUnsafe { reason, .. }
            if reason == "node `gate` is waiting for approval and its definition changed"),
        "{refused:?}"
    );

    // The gate as it was; `after` changed and a node added, which runs
    // while the gate still waits.
    let next = GATED.replace("value: old", "value: new").replace(
        "output: \"{{ nodes.after.output }}\"",
        "output: \"{{ nodes.after.output }} {{ nodes.side.output }}\"",
    ) + "  - id: side\n    value: ran\n";
    save(d, "gated.yaml", &next);
    wait_for(d, "r10", "NodeFinished of side", |e| {
        matches!(e.kind, EventKind::NodeFinished { .. })
            && e.scope.node_id.as_deref() == Some("side")
    });
    let approve = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(d)
        .args(["--store", ".cairn/cairn.db", "approve", "r10", "gate"])
        .output()
        .unwrap();
    assert_eq!(
        approve.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&approve.stderr)
    );
    let status = wait_exit(&mut child);
    assert_eq!(status.code(), Some(0), "{}", said(d, "r10"));
    let evs = checked(d, "r10");
    assert_eq!(output(&evs), json!("new ran"));
    assert_eq!(
        evs.iter().filter(|e| is_reloaded(e)).count(),
        1,
        "one reload applied"
    );
    // The gate asked once: the reload did not open it again.
    let asked = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ApprovalRequested { .. }))
        .count();
    assert_eq!(asked, 1);
}

#[test]
fn a_removed_node_that_never_started_is_unmounted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let child = start_waiting(d, "flow.yaml", "r11");
    let without_after = OLD
        .replace("output: \"{{ nodes.after.output }}\"\n", "")
        .replace(
            "  - id: after\n    needs: [wait]\n    command: [\"echo\", \"old\"]\n",
            "",
        );
    assert!(!without_after.contains("after"));
    save(d, "flow.yaml", &without_after);
    wait_for(d, "r11", "WorkflowReloaded", is_reloaded);
    finish(d, "r11", child);
    let evs = checked(d, "r11");
    let cancelled: Vec<&Event> = evs
        .iter()
        .filter(|e| e.scope.node_id.as_deref() == Some("after"))
        .filter(|e| !matches!(e.kind, EventKind::NodePending { .. }))
        .collect();
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert!(
        matches!(&cancelled[0].kind, EventKind::NodeCancelled { reason: Some(r) } if r == "unmounted"),
        "{cancelled:?}"
    );
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::RunFinished { .. })));
}
