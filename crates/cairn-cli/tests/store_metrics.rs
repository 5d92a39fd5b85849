//! `/metrics` counts every run in the store: those a `cairn run` on the
//! same store drove, before the server started and while it serves, and
//! again after the server restarts.

mod common;
use common::{cairn, free_port, metrics};

use std::time::Duration;

/// A workflow of two command nodes, the second failing when `fail`.
fn workflow(fail: bool) -> String {
    let last = if fail { "false" } else { "true" };
    format!(
        "name: counted\nnodes:\n  - id: build\n    command: [\"sh\", \"-c\", \"echo built\"]\n  - id: check\n    needs: [build]\n    command: [\"{last}\"]\n"
    )
}

/// The value of a sample line (`name{labels} value`).
fn sample(text: &str, line: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn run(dir: &std::path::Path, fail: bool) {
    let file = if fail { "bad.yaml" } else { "ok.yaml" };
    let out = cairn(dir, &["run", file]);
    assert_eq!(out.status.code(), Some(if fail { 1 } else { 0 }), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_runs_other_processes_drove_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.yaml"), workflow(false)).unwrap();
    std::fs::write(dir.path().join("bad.yaml"), workflow(true)).unwrap();
    // Two runs before any server: one finishes, one fails.
    run(dir.path(), false);
    run(dir.path(), true);

    let store = ["--store", ".cairn/cairn.db"];
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = common::serve(dir.path(), &store, port);
    cairn_client::wait_healthy(&url, Duration::from_secs(30))
        .await
        .unwrap();
    let text = metrics(port);
    assert_eq!(sample(&text, "cairn_runs_total"), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, "cairn_runs_ended_total{status=\"failed\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "cairn_nodes_started_total"), Some(4.0));
    assert_eq!(sample(&text, "cairn_store_runs"), Some(2.0));
    assert!(sample(&text, "cairn_metrics_start_time_seconds").unwrap() > 1e9);

    // A run another process drives while the server serves.
    run(dir.path(), false);
    let text = metrics(port);
    assert_eq!(sample(&text, "cairn_runs_total"), Some(3.0), "{text}");
    assert_eq!(
        sample(&text, "cairn_runs_ended_total{status=\"finished\"}"),
        Some(2.0)
    );
    assert_eq!(sample(&text, "cairn_nodes_finished_total"), Some(5.0));
    // Asked again, nothing is counted twice.
    let body = |t: &str| t.split_once("\r\n\r\n").unwrap().1.to_string();
    assert_eq!(body(&metrics(port)), body(&text));

    // Restarted, the server counts the same runs from the store.
    server.kill().unwrap();
    server.wait().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = common::serve(dir.path(), &store, port);
    cairn_client::wait_healthy(&url, Duration::from_secs(30))
        .await
        .unwrap();
    let again = metrics(port);
    for line in [
        "cairn_runs_total",
        "cairn_nodes_started_total",
        "cairn_nodes_finished_total",
        "cairn_nodes_failed_total",
        "cairn_runs_ended_total{status=\"failed\"}",
    ] {
        assert_eq!(sample(&again, line), sample(&text, line), "{line}");
    }
    server.kill().unwrap();
    server.wait().unwrap();
}
