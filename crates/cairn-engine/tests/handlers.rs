//! Failure handlers (`if:` with `success()`, `failure()`, `cancelled()`,
//! `always()`) on a real SQLite store, through real child processes.

mod common;
use common::setup;

use cairn_engine::{RunOutcome, StartOptions};
use cairn_events::RunState;
use serde_json::json;

async fn run(yaml: &str) -> (RunOutcome, RunState) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(dir.path(), yaml);
    let handle = engine
        .start(wf, json!({}), StartOptions::default())
        .await
        .unwrap();
    let run_id = handle.run_id.clone();
    let outcome = handle.wait().await;
    (outcome, engine.state(&run_id).unwrap())
}

fn status(st: &RunState, node: &str) -> String {
    st.node(node, 0)
        .unwrap_or_else(|| panic!("no node {node}"))
        .status
        .as_str()
        .to_string()
}

fn output(st: &RunState, node: &str) -> serde_json::Value {
    st.node(node, 0)
        .and_then(|n| n.output.as_ref())
        .map(|o| o.to_value())
        .unwrap_or_default()
}

/// A failed node fails the run, but its handlers run first: `failure()`
/// after it, `always()` after what its failure cancelled, each reading the
/// error; a plain dependent is cancelled and a `success()` one skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_run_before_a_failed_run_ends() {
    let (outcome, st) = run(r#"
name: handlers
nodes:
  - id: deploy
    command: ["sh", "-c", "echo 'disk full' >&2; exit 3"]
  - id: publish
    needs: [deploy]
    value: published
  - id: notify
    needs: [deploy]
    if: "failure()"
    value: "deploy {{ nodes.deploy.status }}: {{ nodes.deploy.error.kind }}"
  - id: on_success
    needs: [deploy]
    if: "success()"
    value: never
  - id: cleanup
    needs: [publish]
    if: "always()"
    command: ["echo", "cleaned after {{ nodes.publish.status }}"]
  - id: told
    needs: [publish]
    if: "failure()"
    value: "failure reaches past {{ nodes.publish.status }}"
  - id: after_notify
    needs: [notify]
    value: "plain dependents of a handler run too"
"#)
    .await;
    let RunOutcome::Failed(err) = &outcome else {
        panic!("{outcome:?}")
    };
    assert!(err.message.contains("deploy"), "{err:?}");
    assert_eq!(status(&st, "deploy"), "failed");
    assert_eq!(status(&st, "publish"), "cancelled");
    assert_eq!(status(&st, "notify"), "finished");
    assert_eq!(output(&st, "notify"), json!("deploy failed: exit"));
    assert_eq!(status(&st, "on_success"), "skipped");
    assert_eq!(status(&st, "cleanup"), "finished");
    assert_eq!(output(&st, "cleanup"), json!("cleaned after cancelled"));
    assert_eq!(output(&st, "told"), json!("failure reaches past cancelled"));
    // A node after a handler is not one: the failing run cancels it.
    assert_eq!(status(&st, "after_notify"), "cancelled");
}

/// With `on_failure: continue` the run goes on: a `failure()` handler runs
/// and the run finishes; `if` without a status function means `success()
/// and (...)`, so it is skipped when a need failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_of_a_tolerated_failure_lets_the_run_finish() {
    let (outcome, st) = run(r#"
name: tolerated
nodes:
  - id: flaky
    on_failure: continue
    command: ["false"]
  - id: notify
    needs: [flaky]
    if: "failure() and nodes.flaky.error is not none"
    value: "{{ nodes.flaky.error.message }}"
  - id: plain_if
    needs: [flaky]
    if: "nodes.flaky.status == 'failed'"
    value: skipped because the need failed
  - id: always_last
    needs: [notify, plain_if]
    if: "always()"
    value: "{{ nodes.notify.status }}/{{ nodes.plain_if.status }}"
  - id: ok
    value: 1
  - id: not_on_success
    needs: [ok]
    if: "failure()"
    value: never
"#)
    .await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    assert_eq!(status(&st, "notify"), "finished");
    assert!(
        output(&st, "notify").as_str().unwrap().contains("exit"),
        "{:?}",
        output(&st, "notify")
    );
    assert_eq!(status(&st, "plain_if"), "skipped");
    assert_eq!(output(&st, "always_last"), json!("finished/skipped"));
    assert_eq!(status(&st, "not_on_success"), "skipped");
}

/// A cancel runs the `cancelled()` and `always()` handlers of what it
/// stopped, and the run still ends cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_runs_its_handlers() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: cancelled
nodes:
  - id: slow
    command: ["sleep", "30"]
  - id: on_cancel
    needs: [slow]
    if: "cancelled()"
    command: ["echo", "stopped"]
  - id: on_failure
    needs: [slow]
    if: "failure()"
    value: never
"#,
    );
    let handle = engine
        .start(wf, json!({}), StartOptions::default())
        .await
        .unwrap();
    let run_id = handle.run_id.clone();
    // Wait for the command to start before cancelling it.
    for _ in 0..200 {
        let st = engine.state(&run_id).unwrap();
        if st
            .node("slow", 0)
            .is_some_and(|n| n.status.as_str() == "running")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    engine
        .cancel(&run_id, false, Some("enough".into()), None)
        .await
        .unwrap();
    let outcome = handle.wait().await;
    assert_eq!(outcome, RunOutcome::Cancelled);
    let st = engine.state(&run_id).unwrap();
    assert_eq!(status(&st, "slow"), "cancelled");
    assert_eq!(status(&st, "on_cancel"), "finished");
    assert_eq!(output(&st, "on_cancel"), json!("stopped"));
    assert_eq!(status(&st, "on_failure"), "skipped");
}

const PARKED: &str = r#"
name: parked
secrets:
  TOKEN: { env: CAIRN_TEST_HANDLER_TOKEN }
nodes:
  - id: gate
    approval: "Ship?"
  - id: ship
    needs: [gate]
    value: shipped
  - id: on_cancel
    needs: [gate]
    if: "cancelled()"
    secrets: [TOKEN]
    command: ["sh", "-c", "echo \"cleaned with $TOKEN\" > cleaned.txt; echo cleaned"]
  - id: on_failure
    needs: [gate]
    if: "failure()"
    value: "told of the denial"
  - id: always
    needs: [gate]
    if: "always()"
    value: "always ran"
"#;

/// A run parked at an approval (its process stopped waiting): `dir`, the
/// engine, and the run.
async fn parked(dir: &std::path::Path) -> (cairn_engine::Engine, cairn_events::RunId) {
    let (engine, wf) = setup(dir, PARKED);
    let handle = engine
        .start(
            wf,
            json!({}),
            StartOptions {
                exit_on_wait: true,
                ..StartOptions::default()
            },
        )
        .await
        .unwrap();
    let run_id = handle.run_id.clone();
    assert_eq!(handle.wait().await, RunOutcome::Waiting);
    (engine, run_id)
}

/// A cancel of a run nobody drives (a `cairn cancel` of a run whose
/// process stopped at a gate) runs its `cancelled()` and `always()`
/// handlers, with their secrets, before the run ends cancelled, as in a
/// driven run; a denial runs the `failure()` ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_or_denial_of_a_run_nobody_drives_runs_its_handlers() {
    // SAFETY: this test binary's tests do not read this variable elsewhere.
    unsafe { std::env::set_var("CAIRN_TEST_HANDLER_TOKEN", "t0k3n-value") };
    let dir = tempfile::tempdir().unwrap();
    let (engine, run_id) = parked(dir.path()).await;
    engine
        .cancel(&run_id, false, Some("not today".into()), None)
        .await
        .unwrap();
    let st = engine.state(&run_id).unwrap();
    assert_eq!(st.status.map(|s| s.as_str()), Some("cancelled"));
    assert_eq!(status(&st, "gate"), "cancelled");
    assert_eq!(status(&st, "ship"), "cancelled");
    assert_eq!(status(&st, "on_cancel"), "finished");
    assert_eq!(output(&st, "on_cancel"), json!("cleaned"));
    assert_eq!(status(&st, "always"), "finished");
    assert_eq!(status(&st, "on_failure"), "skipped");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("cleaned.txt")).unwrap(),
        "cleaned with t0k3n-value\n"
    );
    common::stored(&engine, run_id.as_str());

    let dir = tempfile::tempdir().unwrap();
    let (engine, run_id) = parked(dir.path()).await;
    engine
        .decide(&run_id, "gate", false, Some("no".into()), None)
        .await
        .unwrap();
    let st = engine.state(&run_id).unwrap();
    assert_eq!(st.status.map(|s| s.as_str()), Some("failed"));
    assert_eq!(status(&st, "on_failure"), "finished");
    assert_eq!(output(&st, "on_failure"), json!("told of the denial"));
    assert_eq!(status(&st, "always"), "finished");
    assert_eq!(status(&st, "on_cancel"), "skipped");
    common::stored(&engine, run_id.as_str());
}

/// A handler that is a group runs its members while the run stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_group_runs_its_members() {
    let (outcome, st) = run(r#"
name: group_handler
nodes:
  - id: a
    command: ["false"]
  - id: report
    needs: [a]
    if: "always()"
    for_each: "[1, 2]"
    nodes:
      - id: say
        value: "{{ item }}"
"#)
    .await;
    assert!(matches!(outcome, RunOutcome::Failed(_)), "{outcome:?}");
    assert_eq!(status(&st, "report"), "finished");
    assert_eq!(output(&st, "report[1].say"), json!(2));
}

/// A `switch` chooses a branch from a node's output: `BranchResolved` says
/// which of which, its output is the label, the other branches and their
/// dependents are skipped with the switch's reason, and a node the
/// branches do not list runs as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_runs_one_branch() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, wf) = setup(
        dir.path(),
        r#"
name: route
nodes:
  - id: classify
    command: ["echo", '{"kind": "feature"}']
    output: json
  - id: route
    needs: [classify]
    switch:
      on: "nodes.classify.output.kind"
      cases:
        bug: [fix]
        feature: [plan, shared]
      default: [triage]
  - id: fix
    needs: [route]
    value: fixing
  - id: plan
    needs: [route]
    value: planning
  - id: shared
    needs: [route]
    value: in one branch only
  - id: triage
    needs: [route]
    value: triaging
  - id: after_fix
    needs: [fix]
    value: never
  - id: unlisted
    needs: [route]
    value: "route chose {{ nodes.route.output }}"
"#,
    );
    let handle = engine
        .start(wf, json!({}), StartOptions::default())
        .await
        .unwrap();
    let run_id = handle.run_id.clone();
    let outcome = handle.wait().await;
    assert!(matches!(outcome, RunOutcome::Finished(_)), "{outcome:?}");
    let st = engine.state(&run_id).unwrap();
    assert_eq!(output(&st, "route"), json!("feature"));
    assert_eq!(status(&st, "plan"), "finished");
    assert_eq!(status(&st, "shared"), "finished");
    for skipped in ["fix", "triage"] {
        assert_eq!(status(&st, skipped), "skipped", "{skipped}");
        assert_eq!(
            st.node(skipped, 0)
                .unwrap()
                .notes
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("branch route chose feature")
        );
    }
    assert_eq!(status(&st, "after_fix"), "skipped");
    assert_eq!(output(&st, "unlisted"), json!("route chose feature"));
    let events = common::stored(&engine, run_id.as_str());
    let resolved: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            cairn_events::EventKind::BranchResolved { chosen, candidates } => {
                Some((e.scope.node_id.clone(), chosen.clone(), candidates.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].1, "feature");
    assert_eq!(resolved[0].2, ["bug", "feature", "default"]);
}

/// No case matches and no `default`: the switch fails, naming the value
/// and the cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_without_a_match_fails() {
    let (outcome, st) = run(r#"
name: nomatch
nodes:
  - id: route
    switch:
      on: "'question'"
      cases: { bug: [fix] }
  - id: fix
    needs: [route]
    value: 1
"#)
    .await;
    assert!(matches!(outcome, RunOutcome::Failed(_)), "{outcome:?}");
    let err = st.node("route", 0).unwrap().error().unwrap().clone();
    assert_eq!(err.kind, "switch");
    assert!(
        err.message.contains("no case for `question`"),
        "{}",
        err.message
    );
}
