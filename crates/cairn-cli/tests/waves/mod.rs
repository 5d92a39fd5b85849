//! Waves of runs against one real `cairn serve`: what the memory test
//! (`tests/server_memory.rs`) and the bench (`benches/serve_memory.rs`)
//! share. Each run is a workflow with a command node and two streaming
//! agent nodes on the scripted model (no key, no network, the same run
//! every time); a wave starts its runs over HTTP, follows each one's SSE
//! stream to its end, and checks that every run finished.

// The test and the bench each use their own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cairn_client::{wait_healthy, Client, RunId};
use serde_json::{json, Value};

/// The workflow every run of a wave runs.
pub const WORKFLOW: &str = r#"
name: wave
models:
  script: { provider: scripted, script: turns.yaml }
nodes:
  - id: prepare
    command: ["sh", "-c", "echo ready"]
  - id: read
    needs: [prepare]
    agent:
      model: script
      prompt: "Read notes.txt and say what it holds."
      tools: [read]
      max_steps: 4
  - id: summary
    needs: [prepare]
    agent:
      model: script
      prompt: "Read notes.txt and summarise it."
      tools: [read]
      max_steps: 4
output: "{{ nodes.summary.output }}"
"#;

/// The scripted model's turns: a tool call, then an answer streamed in
/// small pieces over several lines.
pub const TURNS: &str = r#"
chunk_chars: 24
chunk_delay: 2ms
turns:
  - text: "Let me read the notes first.\n"
    tool_calls:
      - { name: read, args: { path: notes.txt } }
    usage: { input: 120, output: 12 }
  - text: "The notes hold three lines.\nThe first says what the project is.\nThe second lists who works on it.\nThe third says when it ships.\nNothing else is in the file.\n"
    usage: { input: 240, output: 48 }
"#;

/// The folder a server's workflows (and their sandbox root) live in.
pub fn workflows(dir: &Path) -> PathBuf {
    let wf = dir.join("workflows");
    std::fs::create_dir_all(&wf).unwrap();
    std::fs::write(wf.join("wave.yaml"), WORKFLOW).unwrap();
    std::fs::write(wf.join("turns.yaml"), TURNS).unwrap();
    std::fs::write(wf.join("notes.txt"), "Cairn.\nThe team.\nNext spring.\n").unwrap();
    wf
}

/// Raises this process's soft limit of open files to the hard one; the
/// server started from here inherits it (it holds a few files per run and
/// a connection per watcher).
pub fn raise_fd_limit() {
    // SAFETY: plain calls on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `cairn serve` on a SQLite store in `dir`, killed when dropped.
pub struct Served {
    pub child: Child,
    pub url: String,
}

impl Served {
    /// Starts `cairn serve` (the binary at `cairn`) with the store
    /// `dir/cairn.db` and the workflows of [`workflows`], room for
    /// `connections` clients, and waits until it answers.
    pub async fn start(cairn: &Path, dir: &Path, connections: usize) -> Served {
        let wf = workflows(dir);
        let port = free_port();
        let child = Command::new(cairn)
            .arg("--store")
            .arg(dir.join("cairn.db"))
            .arg("serve")
            .arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--workflows")
            .arg(&wf)
            .arg("--max-connections")
            .arg(connections.to_string())
            // Every watcher comes from this one address.
            .arg("--max-connections-per-client")
            .arg(connections.to_string())
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_LOG_DIR")
            .env_remove("CAIRN_STORE")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("serve.err")).unwrap(),
            ))
            .spawn()
            .expect("start cairn serve");
        let url = format!("http://127.0.0.1:{port}");
        wait_healthy(&url, Duration::from_secs(60))
            .await
            .expect("cairn serve answers");
        Served { child, url }
    }

    /// The server's resident memory now (VmRSS), in KiB.
    pub fn rss_kb(&self) -> u64 {
        self.status("VmRSS")
    }

    /// A number from the server's `/proc/<pid>/status` (`VmRSS`,
    /// `RssAnon`, `Threads`...).
    pub fn status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server is still running");
        status
            .lines()
            .find(|l| l.split(':').next() == Some(field))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/<pid>/status"))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a wave went.
#[derive(Debug, Default)]
pub struct Wave {
    /// Runs whose stream ended with `RunFinished`.
    pub finished: usize,
    /// Runs that did not finish: their id and how their stream ended.
    pub failed: Vec<(String, String)>,
    /// Events the watchers received, over all runs.
    pub events: usize,
}

/// Starts `runs` runs of the wave workflow on the server at `url` (at
/// most `starts` requests in flight), follows each run's SSE stream from
/// its first event to its terminal one, and returns once every run ended.
pub async fn wave(url: &str, runs: usize, starts: usize) -> Wave {
    let client = Client::new(url, None).unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(starts.max(1)));
    let mut watchers = Vec::with_capacity(runs);
    for _ in 0..runs {
        let permit = gate.clone().acquire_owned().await.unwrap();
        let client = client.clone();
        watchers.push(tokio::spawn(async move {
            let started = client
                .post_json("/v1/runs", &json!({"workflow": "wave"}))
                .await;
            drop(permit);
            let run = match started {
                Ok(v) => v["runId"].as_str().unwrap_or_default().to_string(),
                Err(e) => return (String::new(), 0, format!("start: {e}")),
            };
            follow(&client, run).await
        }));
    }
    let mut w = Wave::default();
    for h in watchers {
        let (run, events, end) = h.await.unwrap();
        w.events += events;
        if end == "RunFinished" {
            w.finished += 1;
        } else {
            w.failed.push((run, end));
        }
    }
    w
}

/// Reads a run's stream to its end: the run, the events seen, and the
/// type of the last one (or what went wrong: an error, or an event out of
/// order, missing or seen twice).
async fn follow(client: &Client, run: String) -> (String, usize, String) {
    let id = match RunId::parse(&run) {
        Ok(id) => id,
        Err(e) => return (run, 0, format!("run id: {e}")),
    };
    let mut stream = match client.events(&id, 0, false).await {
        Ok(s) => s,
        Err(e) => return (run, 0, format!("stream: {e}")),
    };
    let (mut n, mut last) = (0, String::from("(no event)"));
    let mut error = None;
    while let Some(line) = stream.next_event().await {
        match line {
            Ok(l) => {
                n += 1;
                let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
                if v["seq"].as_u64() != Some(n as u64) {
                    last = format!("event {n} has seq {}: a gap or a duplicate", v["seq"]);
                    break;
                }
                last = v["type"].as_str().unwrap_or("?").to_string();
                // The first error says why a run failed.
                if let (None, Some(m)) = (&error, v["error"]["message"].as_str()) {
                    error = Some(m.to_string());
                }
            }
            Err(e) => {
                last = format!("stream: {e}");
                break;
            }
        }
    }
    if let (false, Some(e)) = (last == "RunFinished", error) {
        last = format!("{last}: {e}");
    }
    (run, n, last)
}
