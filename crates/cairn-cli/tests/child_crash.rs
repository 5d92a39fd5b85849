//! The delegation crash test: the real `cairn` binary runs a lead agent
//! (scripted model, streamed slowly) that delegates three tasks side by
//! side, then a `workflow` node; the process is SIGKILLed at random moments
//! while children run, and resumed until the run is done. Every child runs
//! to its end once, no call starts a second child, and the tree of logs
//! keeps the contract's parent and child rules. On PostgreSQL too (when
//! `CAIRN_TEST_PG` is set), resuming right after each kill: the parent's
//! lease and each running child's are taken over at once.

mod common;
use common::store::Store;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;

use cairn_events::{check_tree, Event, EventKind};
use cairn_store::{Backend, RunFilter};

const KILLS: usize = 12;

fn events(b: &dyn Backend, run: &str) -> Vec<Event> {
    common::store::decoded_events(b, run)
}

fn children(b: &dyn Backend, run: &str) -> Vec<String> {
    b.list_runs(&RunFilter {
        parent: Some(cairn_events::RunId::parse(run).unwrap()),
        ..RunFilter::default()
    })
    .unwrap()
    .into_iter()
    .map(|r| r.run_id.to_string())
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
    let store = Store::Sqlite(dir.path().join(".cairn/cairn.db"));
    lead_crash(dir.path(), &store);
}

/// The same on PostgreSQL, in a database of the test's own.
#[test]
fn a_parent_killed_while_children_run_starts_each_child_once_on_postgres() {
    let Some(server) = cairn_postgres::testing::server_or_skip() else {
        return;
    };
    let name = format!("cairn_child_crash_{}", std::process::id());
    let url = cairn_postgres::testing::create_database(server, &name);
    let dir = tempfile::tempdir().unwrap();
    lead_crash(dir.path(), &Store::Pg(url));
    cairn_postgres::testing::drop_database(server, &name);
}

fn lead_crash(dir: &Path, store: &Store) {
    std::fs::write(dir.join("task.yaml"), TASK).unwrap();
    std::fs::write(dir.join("turns.yaml"), TURNS).unwrap();
    std::fs::write(dir.join("lead.yaml"), LEAD).unwrap();
    let run = "lead-crash";
    let ended = || {
        let evs = store
            .try_open()
            .map(|b| events(&*b, run))
            .unwrap_or_default();
        let end = matches!(
            evs.last().map(|e| &e.kind),
            Some(EventKind::RunFinished { .. })
        );
        (!evs.is_empty() || store.run_exists(run), end)
    };
    // Why a session failed: its words, and the tree's logs.
    let explain = |code: Option<i32>| {
        let Some(b) = store.try_open() else {
            return sessions_err(dir);
        };
        let logs: Vec<String> = std::iter::once(run.to_string())
            .chain(children(&*b, run))
            .map(|k| {
                let evs: Vec<String> = events(&*b, &k)
                    .iter()
                    .filter(|e| !matches!(e.kind, EventKind::NodeOutput { .. }))
                    .map(|e| format!("{} {:?} {:?}", e.seq, e.scope.node_id, e.kind))
                    .collect();
                format!("{k}:\n  {}", evs.join("\n  "))
            })
            .collect();
        format!("exit {code:?}: {}\n{}", sessions_err(dir), logs.join("\n"))
    };
    let store_args = store.args();
    let store_args: Vec<&str> = store_args.iter().map(String::as_str).collect();
    kill_and_resume_on(
        dir,
        &store_args,
        &["run", "lead.yaml", "--run-id", run],
        run,
        KILLS,
        (80, 300),
        ended,
        explain,
    );

    let b = store.try_open().unwrap();
    let evs = events(&*b, run);
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
    let kids = children(&*b, run);
    assert_eq!(kids.len(), 4, "{kids:?}");
    let logs: BTreeMap<String, Vec<Event>> =
        kids.iter().map(|k| (k.clone(), events(&*b, k))).collect();
    for (k, log) in &logs {
        assert!(
            matches!(
                log.last().map(|e| &e.kind),
                Some(EventKind::RunFinished { .. })
            ),
            "child {k} did not finish: {}\n{:#?}",
            sessions_err(dir),
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
