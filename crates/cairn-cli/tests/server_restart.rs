//! `cairn serve` killed mid-run (SIGKILL) and started again: the run
//! resumes and completes, and watchers that reconnect see the whole log
//! once.

mod common;
use common::free_port;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn_client::{wait_healthy, Client, RunId};
use serde_json::{json, Value};

const WORKFLOW: &str = r#"
name: restart
nodes:
  - id: first
    command: ["sh", "-c", "echo one"]
  - id: hold
    needs: [first]
    # The attempt the kill interrupts fails; the resume runs the next one.
    retry: { attempts: 2, delay: 10ms }
    command: ["sh", "-c", "while [ ! -f go ]; do sleep 0.05; done; echo held"]
  - id: last
    needs: [hold]
    value: { done: true }
"#;

fn serve(dir: &Path, port: u16) -> Child {
    let store = dir.join("cairn.db");
    common::serve(dir, &["--store", store.to_str().unwrap()], port)
}

async fn whole_log(c: &Client, run: &str) -> Vec<Value> {
    let page = c
        .get_json(&format!("/v1/runs/{run}/events?limit=10000"))
        .await
        .unwrap();
    page["events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_resumes_the_run_and_watchers_see_the_log_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("restart.yaml"), WORKFLOW).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = serve(dir.path(), port);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let c = Client::new(&url, None).unwrap();
    let run = c
        .post_json("/v1/runs", &json!({"workflow": "restart"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .parse::<RunId>()
        .unwrap();

    // Watch until `hold` is running, then kill the server under the watcher.
    let mut seen: Vec<Value> = Vec::new();
    let mut stream = c.events(&run, 0, false).await.unwrap();
    while let Some(line) = stream.next_event().await {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let hold_started = v["type"] == "NodeStarted" && v["nodeId"] == "hold";
        seen.push(v);
        if hold_started {
            break;
        }
    }
    let last_seen = stream.last_seq();
    server.kill().unwrap();
    server.wait().unwrap();
    // The connection is gone: the stream ends or fails, nothing more.
    while let Some(Ok(line)) = stream.next_event().await {
        seen.push(serde_json::from_str(&line).unwrap());
    }

    std::fs::write(dir.path().join("go"), "").unwrap();
    let mut server = serve(dir.path(), port);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();

    // The watcher reconnects from its last seq and reads to the end.
    let mut stream = c
        .events(
            &run,
            seen.last()
                .map_or(last_seen, |v| v["seq"].as_u64().unwrap()),
            false,
        )
        .await
        .unwrap();
    while let Some(line) = stream.next_event().await {
        seen.push(serde_json::from_str(&line.unwrap()).unwrap());
    }
    let log = whole_log(&c, &run).await;
    assert_eq!(log.last().unwrap()["type"], "RunFinished", "{log:#?}");
    assert!(
        log.iter()
            .any(|e| e["type"] == "RunStarted" && e["resumed"] == true),
        "the second server resumed the run"
    );
    assert_eq!(seen, log, "the reconnecting watcher saw the whole log once");
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // A new watcher from the start sees the same.
    let mut fresh = Vec::new();
    let mut stream = c.events(&run, 0, false).await.unwrap();
    while let Some(line) = stream.next_event().await {
        fresh.push(serde_json::from_str::<Value>(&line.unwrap()).unwrap());
    }
    assert_eq!(fresh, log);
    assert_eq!(c.run(&run).await.unwrap()["status"], "finished");

    // SIGTERM stops it cleanly.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    let status = tokio::task::spawn_blocking(move || server.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

const GATED: &str = r#"
name: gated
nodes:
  - id: gate
    approval: "ship?"
  - id: after
    needs: [gate]
    command: ["sh", "-c", "echo shipped"]
"#;

async fn stop(mut server: Child) {
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    let status = tokio::task::spawn_blocking(move || server.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// A run that waits for a person when the server stops is driven again by
/// the next server, and a decision sent to it takes effect at once (no
/// `resume` needed). The same holds when the waiting run was left by a
/// `cairn run --exit-on-wait`, which no server ever drove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_outlives_a_server_restart_and_takes_its_decision() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gated.yaml"), GATED).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let server = serve(dir.path(), port);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    let c = Client::new(&url, None).unwrap();
    let run = c
        .post_json("/v1/runs", &json!({"workflow": "gated"}))
        .await
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .parse::<RunId>()
        .unwrap();
    let mut stream = c.events(&run, 0, false).await.unwrap();
    while let Some(line) = stream.next_event().await {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["type"] == "NodeWaitingApproval" {
            break;
        }
    }
    drop(stream);
    stop(server).await;

    // A second waiting run, left by the CLI with nobody driving it.
    let cli = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--store")
        .arg(dir.path().join("cairn.db"))
        .args(["run", "gated.yaml", "--run-id", "cli-run", "--exit-on-wait"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(3), "{cli:?}");

    let server = serve(dir.path(), port);
    wait_healthy(&url, Duration::from_secs(30)).await.unwrap();
    // A third, left waiting by the CLI while this server runs: the server
    // does not drive it until a command comes for it.
    let late = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--store")
        .arg(dir.path().join("cairn.db"))
        .args([
            "run",
            "gated.yaml",
            "--run-id",
            "cli-late",
            "--exit-on-wait",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(3), "{late:?}");
    for id in [run.as_str(), "cli-run", "cli-late"] {
        let ok = c
            .post_json(
                &format!("/v1/runs/{id}/approvals/gate"),
                &json!({"approved": true, "by": "ann"}),
            )
            .await
            .unwrap();
        assert!(ok.is_object(), "{ok}");
        // The run goes on by itself to its end.
        let mut stream = c
            .events(&RunId::parse(id).unwrap(), 0, false)
            .await
            .unwrap();
        let mut last = Value::Null;
        while let Some(line) = stream.next_event().await {
            last = serde_json::from_str(&line.unwrap()).unwrap();
        }
        assert_eq!(last["type"], "RunFinished", "{id}: {last}");
        let log = whole_log(&c, id).await;
        let granted: Vec<&Value> = log
            .iter()
            .filter(|e| e["type"] == "ApprovalGranted")
            .collect();
        assert_eq!(granted.len(), 1, "{id}");
        assert_eq!(granted[0]["decidedBy"], "ann");
        assert!(log
            .iter()
            .any(|e| e["type"] == "NodeFinished" && e["nodeId"] == "after"));
    }
    stop(server).await;
}
