//! Node scorers with the real binary: a command scorer (the node's output
//! on its stdin) and an agent scorer (the scripted model), a scorer whose
//! output is not a score, `block: true` holding a dependent until the score
//! is in while a non-blocking scorer holds nothing, `cairn scores` and
//! `GET /v1/scores` over runs of two generations of a workflow, parse
//! errors with their line and field, a scorer cut short by SIGKILL that
//! ends exactly once after `cairn resume`, one past its node's timeout, and
//! one running when the run is cancelled.

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_events::{Event, EventKind};
use serde_json::Value;

/// `cairn run FILE --run-id RUN`, which must finish.
fn run_ok(dir: &Path, file: &str, run: &str, input: &str) {
    let out = cairn(
        dir,
        &["run", file, "--run-id", run, "--input", input, "--json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "cairn run {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The seq of the first event `pred` picks.
fn seq_of(evs: &[Event], what: &str, pred: impl Fn(&Event) -> bool) -> u64 {
    evs.iter()
        .find(|e| pred(e))
        .unwrap_or_else(|| panic!("no {what} in the log"))
        .seq
        .get()
}

fn is_node(e: &Event, node: &str) -> bool {
    e.scope.node_id.as_deref() == Some(node)
}

fn scorer_end<'a>(evs: &'a [Event], id: &str) -> &'a EventKind {
    let ends: Vec<&EventKind> = evs
        .iter()
        .map(|e| &e.kind)
        .filter(|k| {
            matches!(k, EventKind::ScorerFinished { scorer_id, .. }
                | EventKind::ScorerFailed { scorer_id, .. } if scorer_id == id)
        })
        .collect();
    assert_eq!(ends.len(), 1, "scorer `{id}` ends once: {ends:?}");
    ends[0]
}

const SCORED: &str = r#"
name: scored
models:
  judge: { provider: scripted, script: judge.yaml }
nodes:
  - id: answer
    command: ["sh", "-c", "echo hello world"]
    scorers:
      - id: length
        name: Length of the answer
        command: ["./score.sh"]
      - id: garbage
        command: ["sh", "-c", "echo this is not a score"]
      - id: judge
        agent: { model: judge, prompt: "Rate this answer: {{ output }}" }
        block: true
  - id: after
    needs: [answer]
    value: "{{ nodes.answer.output }}"
  - id: free
    command: ["sh", "-c", "echo free"]
    scorers:
      - id: slow
        command: ["sh", "-c", "sleep 1; echo 0.5"]
  - id: after_free
    needs: [free]
    value: ok
"#;

/// A command scorer reads the output on stdin: it reports its length.
const SCORE_SH: &str = "#!/bin/sh\nread -r line\nn=$(printf %s \"$line\" | wc -c | tr -d ' ')\necho \"{\\\"score\\\": 0.25, \\\"reason\\\": \\\"$n bytes\\\"}\"\n";

fn write_scored(dir: &Path) {
    std::fs::write(dir.join("scored.yaml"), SCORED).unwrap();
    std::fs::write(dir.join("score.sh"), SCORE_SH).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("score.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("judge.yaml"),
        "turns:\n  - text: '{\"score\": 0.8, \"reason\": \"polite\"}'\n",
    )
    .unwrap();
}

#[test]
fn command_and_agent_scorers_score_and_a_blocking_one_holds_dependents() {
    let dir = tempfile::tempdir().unwrap();
    write_scored(dir.path());
    run_ok(dir.path(), "scored.yaml", "s1", "{}");
    let evs = events(dir.path(), "s1");

    match scorer_end(&evs, "length") {
        EventKind::ScorerFinished {
            scorer_name,
            score,
            reason,
            ..
        } => {
            assert_eq!(scorer_name, "Length of the answer");
            assert_eq!(*score, 0.25);
            // The output `hello world` as JSON: `"hello world"`.
            assert_eq!(reason.as_deref(), Some("13 bytes"));
        }
        other => panic!("length: {other:?}"),
    }
    match scorer_end(&evs, "judge") {
        EventKind::ScorerFinished { score, reason, .. } => {
            assert_eq!((*score, reason.as_deref()), (0.8, Some("polite")));
        }
        other => panic!("judge: {other:?}"),
    }
    match scorer_end(&evs, "garbage") {
        EventKind::ScorerFailed { error, .. } => assert_eq!(error.kind, "bad_output"),
        other => panic!("garbage: {other:?}"),
    }
    // A failed scorer fails neither its node nor the run.
    assert!(matches!(
        evs.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));

    // `block: true`: `after` starts once the judge's score is in.
    let judged = seq_of(
        &evs,
        "judge's end",
        |e| matches!(&e.kind, EventKind::ScorerFinished { scorer_id, .. } if scorer_id == "judge"),
    );
    let after = seq_of(&evs, "after's start", |e| {
        is_node(e, "after") && matches!(e.kind, EventKind::NodeStarted { .. })
    });
    assert!(
        judged < after,
        "judge ended at {judged}, after started at {after}"
    );
    // Not blocking: `after_free` starts while `slow` still sleeps.
    let slow = seq_of(
        &evs,
        "slow's end",
        |e| matches!(&e.kind, EventKind::ScorerFinished { scorer_id, .. } if scorer_id == "slow"),
    );
    let after_free = seq_of(&evs, "after_free's start", |e| {
        is_node(e, "after_free") && matches!(e.kind, EventKind::NodeStarted { .. })
    });
    assert!(
        after_free < slow,
        "after_free started at {after_free}, slow ended at {slow}"
    );

    // `cairn status --json` shows the node's scores.
    let out = cairn(dir.path(), &["status", "s1", "--json"]);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let answer = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["nodeId"] == "answer")
        .unwrap();
    let ids: Vec<&str> = answer["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scorerId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{answer}");
}

const AGG: &str = r#"
name: agg
nodes:
  - id: answer
    value: "{{ input.s }}"
    scorers:
      - id: echo
        command: ["sh", "-c", "echo {{ output }}"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_are_aggregated_per_generation_in_the_cli_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("agg.yaml"), AGG).unwrap();
    run_ok(d, "agg.yaml", "g1a", r#"{"s": "0.2"}"#);
    run_ok(d, "agg.yaml", "g1b", r#"{"s": "0.4"}"#);
    // A changed file is a new generation.
    std::fs::write(d.join("agg.yaml"), format!("# the second prompt\n{AGG}")).unwrap();
    run_ok(d, "agg.yaml", "g2a", r#"{"s": "0.9"}"#);
    run_ok(d, "agg.yaml", "g2b", r#"{"s": "0.7"}"#);

    let out = cairn(d, &["scores", "--workflow", "agg", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    let wf = &cli["workflows"][0];
    assert_eq!(wf["workflow"], "agg");
    assert_eq!(wf["scorers"][0]["count"], 4);
    let gens = wf["generations"].as_array().unwrap();
    assert_eq!(gens.len(), 2);
    let mean = |g: &Value| g["scorers"][0]["mean"].as_f64().unwrap();
    assert!(
        (mean(&gens[0]) - 0.8).abs() < 1e-9,
        "newest first: {}",
        gens[0]
    );
    assert!((mean(&gens[1]) - 0.3).abs() < 1e-9);
    assert!((gens[1]["scorers"][0]["stddev"].as_f64().unwrap() - 0.1).abs() < 1e-9);
    assert_eq!(gens[0]["scorers"][0]["min"], 0.7);
    assert_eq!(gens[0]["scorers"][0]["max"], 0.9);
    assert_ne!(gens[0]["workflowHash"], gens[1]["workflowHash"]);

    let table = cairn(d, &["scores"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("agg") && text.contains("generation"),
        "{text}"
    );

    // The same report over HTTP.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = serve(d, &["--store", ".cairn/cairn.db"], port);
    cairn_client::wait_healthy(&url, Duration::from_secs(30))
        .await
        .unwrap();
    let c = cairn_client::Client::new(&url, None).unwrap();
    let http = c.get_json("/v1/scores?workflow=agg").await.unwrap();
    assert_eq!(http, cli);
    let one = c
        .get_json("/v1/scores?workflow=agg&node=nobody")
        .await
        .unwrap();
    assert_eq!(one["workflows"].as_array().unwrap().len(), 0);
    assert!(c.get_json("/v1/scores?bogus=1").await.is_err());
    server.kill().unwrap();
    server.wait().unwrap();
}

#[test]
fn scorer_mistakes_are_reported_with_their_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = r#"name: bad
models:
  m: { provider: scripted, script: t.yaml }
nodes:
  - id: a
    value: 1
    scorers:
      - id: x
        command: ["true"]
      - id: x
        command: ["true"]
      - id: "no.dots"
        command: ["true"]
      - id: both
        command: ["true"]
        agent: { model: m, prompt: p }
      - id: neither
      - id: notbool
        command: ["true"]
        block: "yes"
      - id: model
        agent: { model: nope, prompt: p }
      - id: typo
        comand: ["true"]
"#;
    std::fs::write(dir.path().join("bad.yaml"), bad).unwrap();
    let out = cairn(dir.path(), &["validate", "bad.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    for (line, field, what) in [
        (10, "nodes[0].scorers[1].id", "duplicate scorer id `x`"),
        (12, "nodes[0].scorers[2].id", "not a valid scorer id"),
        (16, "nodes[0].scorers[3].agent", "not both"),
        (17, "nodes[0].scorers[4]", "needs `command` or `agent`"),
        (20, "nodes[0].scorers[5].block", "expected true or false"),
        (24, "nodes[0].scorers[7].comand", "unknown field `comand`"),
    ] {
        let hit = err
            .lines()
            .any(|l| l.contains(&format!(":{line}")) && l.contains(field) && l.contains(what));
        assert!(hit, "no problem at line {line}, {field}: {what}\n{err}");
    }
    // Models are checked once the rest of the file reads well.
    let unknown = "name: m\nnodes:\n  - id: a\n    value: 1\n    scorers:\n      - id: j\n        agent: { model: nope, prompt: p }\n";
    std::fs::write(dir.path().join("model.yaml"), unknown).unwrap();
    let out = cairn(dir.path(), &["validate", "model.yaml"]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model.yaml:6:")
            && err.contains("nodes[0].scorers[0].agent.model")
            && err.contains("names model `nope`"),
        "{err}"
    );
}

const SLOW: &str = r#"
name: slow
nodes:
  - id: answer
    value: 42
    scorers:
      - id: slow
        command: ["sh", "-c", "echo ran >> scorer-runs.txt; sleep 2; echo 0.6"]
        block: true
  - id: after
    needs: [answer]
    value: done
"#;

#[test]
fn a_scorer_cut_short_by_a_crash_ends_exactly_once_after_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("slow.yaml"), SLOW).unwrap();
    let mut child = cairn_session(d, &["run", "slow.yaml", "--run-id", "k1"]);
    // Kill once the scorer runs (its process wrote its line).
    let t0 = Instant::now();
    while !d.join("scorer-runs.txt").exists() {
        assert!(
            t0.elapsed() < PATIENCE,
            "the scorer never ran: {}",
            sessions_err(d)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    wait_exit(&mut child);
    let before = events(d, "k1");
    assert!(before
        .iter()
        .any(|e| matches!(e.kind, EventKind::ScorerStarted { .. })));
    assert!(!before
        .iter()
        .any(|e| matches!(e.kind, EventKind::ScorerFinished { .. })));

    let mut resume = cairn_session(d, &["resume", "k1"]);
    let status = wait_exit(&mut resume);
    assert_eq!(status.code(), Some(0), "{}", sessions_err(d));
    let evs = events(d, "k1");
    let started = evs
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ScorerStarted { .. }))
        .count();
    assert_eq!(started, 1, "one ScorerStarted, taken up by the resume");
    match scorer_end(&evs, "slow") {
        EventKind::ScorerFinished { score, .. } => assert_eq!(*score, 0.6),
        other => panic!("slow: {other:?}"),
    }
    // It ran again after the crash, and still held its dependent.
    let runs = std::fs::read_to_string(d.join("scorer-runs.txt")).unwrap();
    assert_eq!(runs.lines().count(), 2);
    let ended = seq_of(&evs, "slow's end", |e| {
        matches!(e.kind, EventKind::ScorerFinished { .. })
    });
    let after = seq_of(&evs, "after's start", |e| {
        is_node(e, "after") && matches!(e.kind, EventKind::NodeStarted { .. })
    });
    assert!(ended < after);
    assert!(matches!(
        evs.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
}

/// A scorer that outlives its node's `timeout` fails as `timeout`, and the
/// run finishes all the same.
#[test]
fn a_scorer_past_the_nodes_timeout_fails_and_the_run_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("late.yaml"),
        r#"
name: late
nodes:
  - id: answer
    command: ["sh", "-c", "echo hi"]
    timeout: 500ms
    scorers:
      - id: sleepy
        command: ["sh", "-c", "sleep 30; echo 1"]
        block: true
  - id: after
    needs: [answer]
    value: done
"#,
    )
    .unwrap();
    run_ok(d, "late.yaml", "t1", "{}");
    let evs = events(d, "t1");
    match scorer_end(&evs, "sleepy") {
        EventKind::ScorerFailed { error, .. } => assert_eq!(error.kind, "timeout", "{error:?}"),
        other => panic!("sleepy: {other:?}"),
    }
    assert!(matches!(
        evs.last().unwrap().kind,
        EventKind::RunFinished { .. }
    ));
}

/// A run cancelled while a blocking scorer runs: the scorer ends as
/// `cancelled`, its dependent never starts, and the log keeps the contract.
#[test]
fn a_cancel_during_a_blocking_scorer_ends_it_as_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("held.yaml"),
        r#"
name: held
nodes:
  - id: answer
    command: ["sh", "-c", "echo hi"]
    scorers:
      - id: stuck
        command: ["sh", "-c", "touch scoring; sleep 30; echo 1"]
        block: true
  - id: after
    needs: [answer]
    value: never
"#,
    )
    .unwrap();
    let mut child = cairn_session(d, &["run", "held.yaml", "--run-id", "c1"]);
    let t0 = Instant::now();
    while !d.join("scoring").exists() {
        assert!(
            t0.elapsed() < PATIENCE,
            "the scorer never ran: {}",
            sessions_err(d)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = cairn(d, &["cancel", "c1"]);
    assert!(
        out.status.success(),
        "cairn cancel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_exit(&mut child);
    let evs = events(d, "c1");
    match scorer_end(&evs, "stuck") {
        EventKind::ScorerFailed { error, .. } => assert_eq!(error.kind, "cancelled", "{error:?}"),
        other => panic!("stuck: {other:?}"),
    }
    assert!(!evs
        .iter()
        .any(|e| is_node(e, "after") && matches!(e.kind, EventKind::NodeStarted { .. })));
    assert!(matches!(
        evs.last().unwrap().kind,
        EventKind::RunCancelled { .. }
    ));
}
