//! A real server on an ephemeral port over a real store in a temp folder.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cairn_client::Client;
use cairn_events::{EventKind, Scope};
use cairn_server::{Engine, EngineOptions, ServeConfig, Server};
use cairn_store::{EventQuery, Journal, JournalOptions, RunLog, RunRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A run id the test names or the server answered with; the client takes
/// typed ids.
pub fn run_id(text: &str) -> cairn_client::RunId {
    cairn_client::RunId::parse(text).unwrap()
}

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub journal: Journal,
    pub engine: Engine,
    pub addr: SocketAddr,
    pub url: String,
    pub token: Option<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(token: Option<&str>) -> TestServer {
        Self::start_with(token, |_| {}).await
    }

    pub async fn start_with(
        token: Option<&str>,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("workflows")).unwrap();
        let journal = Journal::open_sqlite(
            &dir.path().join("cairn.db"),
            JournalOptions {
                log_dir: Some(dir.path().join("logs")),
            },
        )
        .unwrap();
        let engine = Engine::new(journal.clone(), EngineOptions::default());
        let mut cfg = ServeConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            token: token.map(str::to_string),
            workflows_dir: Some(dir.path().join("workflows")),
            grace: Duration::from_secs(2),
            ..ServeConfig::default()
        };
        tweak(&mut cfg);
        let server = Server::bind(cfg, engine.clone()).await.unwrap();
        let addr = server.local_addr();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        // Serving starts after the resume of interrupted runs: once healthy,
        // runs written here cannot be taken for interrupted ones.
        let url = format!("http://{addr}");
        cairn_client::wait_healthy(&url, Duration::from_secs(30))
            .await
            .unwrap();
        TestServer {
            dir,
            journal,
            engine,
            addr,
            url,
            token: token.map(str::to_string),
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url, self.token.clone()).unwrap()
    }

    pub fn workflow(&self, name: &str, yaml: &str) -> PathBuf {
        let p = self
            .dir
            .path()
            .join("workflows")
            .join(format!("{name}.yaml"));
        std::fs::write(&p, yaml).unwrap();
        p
    }

    /// A run written directly through the store, for tests of the read side
    /// that need exact control over the log.
    pub fn manual_run(&self, run_id: &str) -> RunLog {
        self.journal
            .backend()
            .create_run(&RunRecord {
                run_id: cairn_events::RunId::parse(run_id).unwrap(),
                workflow: "manual".into(),
                workflow_path: "/dev/null".into(),
                workflow_hash: "h".into(),
                workflow_source: String::new(),
                input: serde_json::json!({}),
                status: cairn_store::RecordStatus::Run(cairn_events::RunStatus::Running),
                created_ms: 0,
                updated_ms: 0,
                parent_run_id: None,
            })
            .unwrap();
        let log = self
            .journal
            .run_log(&cairn_events::RunId::parse(run_id).unwrap())
            .unwrap();
        log.append(
            Scope::run(),
            EventKind::RunStarted {
                workflow: "manual".into(),
                workflow_hash: "h".into(),
                input: None,
                resumed: false,
                parent_run_id: None,
                parent_node_id: None,
                depth: 0,
                forked_from: None,
                trigger: None,
                replay_of: None,
            },
        );
        log
    }

    /// The run's log as the store holds it, one JSON text per event.
    pub fn stored(&self, run_id: &str) -> Vec<String> {
        self.journal
            .backend()
            .read_events(
                &cairn_events::RunId::parse(run_id).unwrap(),
                &EventQuery::default(),
            )
            .unwrap()
            .into_iter()
            .map(|e| e.json.to_string())
            .collect()
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("server stops")
                .unwrap();
        }
    }
}

pub fn output(log: &RunLog, node: &str, text: &str) {
    log.append(
        Scope::node(node, 0).with_attempt(1),
        EventKind::NodeOutput {
            text: text.into(),
            stream: cairn_events::OutputStream::Stdout,
        },
    );
}

pub async fn finish(log: &RunLog) {
    log.append_durable(
        Scope::run(),
        EventKind::RunFinished {
            output: None,
            duration_ms: 1,
        },
    )
    .await
    .unwrap();
}

/// A raw HTTP/1.1 exchange, for requests a well-behaved client would not
/// send. Returns (status, body).
///
/// A request without a `Host` header gets the server's own address as its
/// `Host`, as any client would send.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let request = with_host(addr, request);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

/// `request` with `Host: <addr>` after its request line, unless the head
/// already has a `Host` header.
pub fn with_host(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if head.contains("\r\nhost:") {
        return request.to_vec();
    }
    let line_end = text.find("\r\n").expect("a request line");
    let mut out = request[..line_end + 2].to_vec();
    out.extend_from_slice(format!("Host: {addr}\r\n").as_bytes());
    out.extend_from_slice(&request[line_end + 2..]);
    out
}

/// A request without a `Host` header (`raw` adds the server's).
pub fn request(method: &str, path: &str, token: Option<&str>, body: &str) -> Vec<u8> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Waits until `f` holds, polling; panics with `what` after 30 s.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut f: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
