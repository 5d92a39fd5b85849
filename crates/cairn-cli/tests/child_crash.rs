//! The delegation crash test: the real `cairn` binary runs a lead agent
//! (scripted model, streamed slowly) that delegates three tasks side by
//! side, then a `workflow` node; the process is SIGKILLed at random moments
//! while children run, and resumed until the run is done. Every child runs
//! to its end once, no call starts a second child, and the tree of logs
//! keeps the contract's parent and child rules.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn_events::{check_tree, Event, EventKind};
use cairn_store::{Backend, EventQuery, RunFilter, SqliteBackend};

const KILLS: usize = 12;

fn cairn(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(args)
        .args(["--store", ".cairn/cairn.db"])
        .env_remove("CAIRN_STORE")
        .env_remove("CAIRN_LOG_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("sessions.err"))
                .unwrap(),
        ))
        .spawn()
        .expect("spawn cairn")
}

fn open(store: &Path) -> Option<SqliteBackend> {
    store.exists().then(|| SqliteBackend::open(store).ok())?
}

fn events(b: &SqliteBackend, run: &str) -> Vec<Event> {
    b.read_events(run, &EventQuery::default())
        .unwrap_or_default()
        .iter()
        .map(|s| s.decode().expect("stored events decode"))
        .collect()
}

fn children(b: &SqliteBackend, run: &str) -> Vec<String> {
    b.list_runs(&RunFilter {
        parent: Some(run.into()),
        ..RunFilter::default()
    })
    .unwrap()
    .into_iter()
    .map(|r| r.run_id)
    .collect()
}

const TASK: &str = r#"
name: task
input:
  type: object
  required: [k]
  properties: { k: { type: integer } }
nodes:
  - id: work
    command: ["sh", "-c", "sleep 0.2; echo done-{{ input.k }} >> side.log; echo {{ input.k }}"]
    output: json
  - id: more
    needs: [work]
    command: ["sh", "-c", "sleep 0.1; echo {{ nodes.work.output * 10 }}"]
    output: json
output: "{{ nodes.more.output }}"
"#;

const TURNS: &str = r#"
chunk_chars: 4
chunk_delay: 20ms
turns:
  - text: Three tasks at once, please.
    tool_calls:
      - { name: task, args: { k: 1 } }
      - { name: task, args: { k: 2 } }
      - { name: task, args: { k: 3 } }
  - text: All three are back and the numbers add up.
"#;

const LEAD: &str = r#"
name: lead
models:
  s: { provider: scripted, script: turns.yaml }
nodes:
  - id: lead
    agent:
      model: s
      prompt: Do the three tasks.
      delegates:
        task: task.yaml
  - id: last
    needs: [lead]
    workflow: task.yaml
    input: { k: 4 }
output: "{{ nodes.last.output }}"
"#;

#[test]
fn a_parent_killed_while_children_run_starts_each_child_once() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("task.yaml"), TASK).unwrap();
    std::fs::write(dir.join("turns.yaml"), TURNS).unwrap();
    std::fs::write(dir.join("lead.yaml"), LEAD).unwrap();
    let store = dir.join(".cairn/cairn.db");
    let run = "lead-crash";
    let mut seed = std::process::id() as u64 * 2654435761 % 1_000_003 + 1;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut started = false;
    let mut done = false;
    for _ in 0..KILLS {
        let mut child = if started {
            cairn(dir, &["resume", run])
        } else {
            cairn(dir, &["run", "lead.yaml", "--run-id", run])
        };
        std::thread::sleep(Duration::from_millis(80 + next() % 300));
        if let Some(status) = child.try_wait().unwrap() {
            if status.code() != Some(0) {
                let tail: Vec<String> = open(&store)
                    .map(|b| events(&b, run))
                    .unwrap_or_default()
                    .iter()
                    .rev()
                    .take(8)
                    .map(|e| format!("{:?}", e.kind))
                    .collect();
                let kids: Vec<String> = open(&store)
                    .map(|b| {
                        children(&b, run)
                            .iter()
                            .map(|k| {
                                let evs: Vec<String> = events(&b, k)
                                    .iter()
                                    .map(|e| format!("{} {:?} {:?}", e.seq, e.scope, e.kind))
                                    .collect();
                                format!("{k}:\n  {}", evs.join("\n  "))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                panic!(
                    "exit {:?}: {}\nthe log ends: {tail:#?}\nchildren:\n{}",
                    status.code(),
                    std::fs::read_to_string(dir.join("sessions.err")).unwrap_or_default(),
                    kids.join("\n")
                );
            }
            done = true;
            break;
        }
        child.kill().unwrap(); // SIGKILL
        wait_exit(&mut child);
        let evs = open(&store).map(|b| events(&b, run)).unwrap_or_default();
        started = started || !evs.is_empty();
        // Killed after the run's end was committed: nothing to resume.
        if matches!(
            evs.last().map(|e| &e.kind),
            Some(EventKind::RunFinished { .. })
        ) {
            done = true;
            break;
        }
    }
    if !done {
        let mut child = cairn(dir, &["resume", run]);
        let status = wait_exit(&mut child);
        assert_eq!(
            status.code(),
            Some(0),
            "the final resume failed: {}",
            std::fs::read_to_string(dir.join("sessions.err")).unwrap_or_default()
        );
    }

    let b = open(&store).unwrap();
    let evs = events(&b, run);
    let Some(EventKind::RunFinished { output, .. }) = evs.last().map(|e| &e.kind) else {
        panic!("the run did not finish: {:?}", evs.last());
    };
    assert_eq!(output.as_ref().unwrap(), &serde_json::json!(40));
    let sessions = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    eprintln!("{sessions} sessions");
    // One child per call: three delegations and the workflow node.
    let kids = children(&b, run);
    assert_eq!(kids.len(), 4, "{kids:?}");
    let logs: BTreeMap<String, Vec<Event>> =
        kids.iter().map(|k| (k.clone(), events(&b, k))).collect();
    for (k, log) in &logs {
        assert!(
            matches!(
                log.last().map(|e| &e.kind),
                Some(EventKind::RunFinished { .. })
            ),
            "child {k} did not finish: {}\n{:#?}",
            std::fs::read_to_string(dir.join("sessions.err")).unwrap_or_default(),
            log.iter()
                .filter(|e| !matches!(
                    e.kind,
                    EventKind::NodeOutput { .. } | EventKind::NodeHeartbeat { .. }
                ))
                .map(|e| format!("{} {:?} {:?}", e.seq, e.scope.node_id, e.kind))
                .collect::<Vec<_>>()
        );
    }
    check_tree(&evs, &logs).unwrap();
    cairn_events::check_log(&evs).unwrap();
    for (k, log) in &logs {
        cairn_events::check_log(log).unwrap_or_else(|e| panic!("child {k}: {e}"));
    }
    // Every task ran to its end (a killed command runs again, so at least
    // once each).
    let side = std::fs::read_to_string(dir.join("side.log")).unwrap_or_default();
    for k in 1..=4 {
        assert!(
            side.lines().any(|l| l == format!("done-{k}")),
            "task {k} never ran: {side:?}"
        );
    }
}
