//! `cairn serve` out of file descriptors: started with a small hard limit
//! (so raising the soft one to it does not help), it is sent many run
//! starts at once. Each is answered 201 or 503 with `Retry-After`, never a
//! 403 or a 500 that names another cause; no run row is left without its
//! events; every run accepted finishes.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The descriptor limit of the server (soft and hard): its own baseline
/// is a few dozen, and the reserve it keeps for running runs is 64.
const LIMIT: u64 = 160;

/// Run starts sent at once.
const STARTS: usize = 120;

const WORKFLOW: &str = r#"
name: hold
sandbox: { isolation: none }
nodes:
  - id: a
    command: ["sh", "-c", "sleep 0.3; echo a"]
  - id: b
    needs: [a]
    command: ["sh", "-c", "echo b"]
"#;

fn serve_limited(dir: &Path, port: u16) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(["--store", dir.join("cairn.db").to_str().unwrap()])
        .arg("serve")
        .arg("--addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--workflows")
        .arg(dir)
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_LOG_DIR")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("serve.err")).unwrap());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// An HTTP answer: status, headers (lower-cased names), body.
type Answer = (u16, Vec<(String, String)>, String);

/// One HTTP/1.1 exchange on a fresh connection.
fn exchange(port: u16, method: &str, path: &str, body: &str) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(common::PATIENCE)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn get_json(port: u16, path: &str) -> Value {
    let (status, _, body) = exchange(port, "GET", path, "");
    assert_eq!(status, 200, "GET {path}: {body}");
    // A chunked body: the JSON is what lies between the chunk sizes.
    let start = body.find('{').expect("a JSON body");
    let end = body.rfind('}').expect("a JSON body");
    serde_json::from_str(&body[start..=end]).expect("JSON")
}

fn healthy(port: u16, within: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if TcpStream::connect(("127.0.0.1", port)).is_ok()
            && exchange(port, "GET", "/healthz", "").0 == 200
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server did not become healthy");
}

#[test]
fn out_of_descriptors_starts_are_refused_with_retry_after_and_accepted_runs_finish() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hold.yaml"), WORKFLOW).unwrap();
    let port = common::free_port();
    let mut server = serve_limited(dir.path(), port);
    healthy(port, Duration::from_secs(30));

    let answers: Vec<Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..STARTS)
            .map(|_| s.spawn(|| exchange(port, "POST", "/v1/runs", r#"{"workflow":"hold"}"#)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut accepted = BTreeSet::new();
    let mut refused = 0;
    for (status, headers, body) in &answers {
        match status {
            201 => {
                let v: Value = serde_json::from_str(body).expect("a run id");
                accepted.insert(v["runId"].as_str().unwrap().to_string());
            }
            503 => {
                assert!(
                    headers.iter().any(|(k, _)| k == "retry-after"),
                    "503 without Retry-After: {headers:?} {body}"
                );
                refused += 1;
            }
            other => panic!("a start was answered {other}: {body}"),
        }
    }
    let said = std::fs::read_to_string(dir.path().join("serve.err")).unwrap();
    eprintln!("{} accepted, {refused} refused", accepted.len());
    assert!(!accepted.is_empty(), "no start was accepted: {said}");
    assert!(
        refused > 0,
        "no start was refused: the test did not reach the limit"
    );
    assert!(
        said.contains("file descriptors: 160"),
        "serve did not say its limit: {said}"
    );

    // Every accepted run finishes; no other run row exists (a start cut
    // short left nothing behind).
    let t0 = Instant::now();
    loop {
        let list = get_json(port, "/v1/runs?limit=1000");
        let runs = list["runs"].as_array().unwrap();
        let ids: BTreeSet<String> = runs
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, accepted, "run rows other than the accepted starts");
        let open: Vec<&Value> = runs.iter().filter(|r| r["status"] != "finished").collect();
        if open.is_empty() {
            break;
        }
        assert!(
            !open.iter().any(|r| r["status"] == "failed"),
            "a run failed: {:?}",
            open.iter()
                .find(|r| r["status"] == "failed")
                .map(|r| get_json(port, &format!("/v1/runs/{}", r["runId"].as_str().unwrap())))
        );
        assert!(
            t0.elapsed() < common::PATIENCE,
            "runs did not finish: {open:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The refusals passed with the crowd: sent again one at a time, the
    // starts are accepted and their runs finish.
    let mut again = BTreeSet::new();
    let t0 = Instant::now();
    for _ in 0..refused.min(10) {
        // As a client would: again after `Retry-After` while refused.
        let (status, body) = loop {
            let (status, _, body) = exchange(port, "POST", "/v1/runs", r#"{"workflow":"hold"}"#);
            if status != 503 || t0.elapsed() > common::PATIENCE {
                break (status, body);
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        assert_eq!(status, 201, "a start alone was answered {status}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        again.insert(v["runId"].as_str().unwrap().to_string());
    }
    let t0 = Instant::now();
    for id in &again {
        loop {
            let st = get_json(port, &format!("/v1/runs/{id}"));
            if st["status"] == "finished" {
                break;
            }
            assert_ne!(st["status"], "failed", "{st}");
            assert!(t0.elapsed() < common::PATIENCE, "{id} did not finish");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // SAFETY: signalling the child started above.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    common::wait_exit(&mut server);
}
