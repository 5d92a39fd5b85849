//! Stopping a process whose runs wait for a person: a question or an
//! approval is a safe point already (the log holds it, a resume asks
//! again), so SIGTERM does not wait out the grace given to running work.
//!
//! The bounds below are the grace itself (5 s for `cairn run`, 10 s for
//! `cairn serve`), not a speed target: a stop that waited for the grace is
//! the bug.

mod common;
use common::*;

use std::time::{Duration, Instant};

const ASKS: &str = r#"
name: asks
nodes:
  - id: branch
    ask: "Which branch?"
    schema: { type: string, enum: [main, release] }
  - id: gate
    approval: "Ship it?"
  - id: after
    needs: [branch, gate]
    value: "{{ nodes.branch.output }}"
"#;

fn waits_for_both(dir: &std::path::Path, run: &str) -> bool {
    let evs = events(dir, run);
    let has = |t: &str| evs.iter().any(|e| e.kind.type_name() == t);
    has("InputRequested") && has("ApprovalRequested")
}

/// SIGTERM to `pid`, then how long the process took to exit.
fn term_and_time(child: &mut std::process::Child) -> Duration {
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    wait_exit(child);
    t0.elapsed()
}

#[test]
fn sigterm_of_a_run_waiting_for_people_exits_without_the_grace_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("asks.yaml"), ASKS).unwrap();
    let mut run = cairn_session(dir.path(), &["run", "asks.yaml", "--run-id", "w1"]);
    let t0 = Instant::now();
    // The mirror is written once the run has started, so the store is
    // whole by then: opening it earlier could race the run's creating it.
    let started = dir.path().join(".cairn/logs/w1/events.ndjson");
    while !(started.exists() && waits_for_both(dir.path(), "w1")) {
        if t0.elapsed() > Duration::from_secs(60) || run.try_wait().unwrap().is_some() {
            let _ = run.kill();
            let types: Vec<&str> = if started.exists() {
                events(dir.path(), "w1")
                    .iter()
                    .map(|e| e.kind.type_name())
                    .collect()
            } else {
                Vec::new()
            };
            panic!(
                "the run did not wait for both (exited: {:?}); its events: {types:?}; its stderr: {}",
                run.try_wait().unwrap(),
                sessions_err(dir.path())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = term_and_time(&mut run);
    assert!(
        took < Duration::from_secs(4),
        "`cairn run` took {took:?} to stop: it waited out the grace"
    );
    // The question and the approval survive: answered from another
    // process, the run resumes to its end.
    let evs = events(dir.path(), "w1");
    let rid = evs
        .iter()
        .find_map(|e| match &e.kind {
            cairn_events::EventKind::InputRequested { request_id, .. } => Some(request_id.clone()),
            _ => None,
        })
        .expect("a request id");
    expect_code(&cairn(dir.path(), &["answer", "w1", &rid, "release"]), 0);
    expect_code(&cairn(dir.path(), &["approve", "w1", "gate"]), 0);
    let out = cairn(dir.path(), &["resume", "w1"]);
    expect_code(&out, 0);
    let state = cairn(dir.path(), &["status", "w1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&state.stdout).unwrap();
    assert_eq!(v["status"], "finished", "{v}");
}

// A stop that came while the resumed run's first round was being decided
// once missed the attempts that round queued for a person (they were
// spawned after it), and the server waited out its grace: about 1 stop in
// 20 here.
#[test]
fn sigterm_of_a_server_whose_runs_wait_for_people_exits_without_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("asks.yaml"), ASKS).unwrap();
    // A run left waiting, which the server takes up at its start.
    let out = cairn(
        dir.path(),
        &["run", "asks.yaml", "--run-id", "w2", "--exit-on-wait"],
    );
    expect_code(&out, 3);
    let port = free_port();
    let mut server = serve(dir.path(), &["--store", ".cairn/cairn.db"], port);
    wait_until("the server", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // The server drives the run once it has resumed it: its second start.
    wait_until("the server's resume", || {
        events(dir.path(), "w2")
            .iter()
            .filter(|e| e.kind.type_name() == "RunStarted")
            .count()
            == 2
    });
    let took = term_and_time(&mut server);
    assert!(
        took < Duration::from_secs(8),
        "`cairn serve` took {took:?} to stop: it waited out the grace"
    );
}
