//! The HTTP client of a Cairn server (`cairn serve`): what `cairn status
//! --server URL`, `cairn logs --server URL` and the other commands that
//! read a server use, answering with the API's own types ([`cairn_api`]).
//! Plain HTTP/1.1 over TCP (no TLS; put a TLS proxy in front of a remote
//! server and reach it through a tunnel).
//!
//! ```no_run
//! # async fn demo() -> Result<(), cairn_client::ClientError> {
//! let client = cairn_client::Client::new("http://127.0.0.1:7700", None)?;
//! let run = cairn_client::RunId::parse("r1").expect("a valid run id");
//! let state = client.run(&run).await?;
//! println!("{}", state.status());
//! let mut events = client.events(&run, 0, false).await?;
//! while let Some(line) = events.next_event().await {
//!     println!("{}", line?);
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use cairn_api::{
    ActivityPage, AnswerBody, Answered, CancelBody, Cancelled, DecideBody, Decided, ErrorBody,
    EventsPage, ForkBody, Forked, Health, HijackBody, HijackRequested, Plan, ResumeBody,
    RevertBody, Reverted, RunAccepted, RunDetail, RunList, ScoreReport, Session, StartBody,
    ToolCalls,
};
/// The typed ids the methods take, so a caller needs no other crate to
/// name a run or a node.
pub use cairn_events::{NodePath, RunId};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpStream;

/// Why a request to a server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server URL cannot be used.
    #[error("server URL `{url}`: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not be reached.
    #[error("cannot reach the server at {addr}: {source}")]
    Connect {
        /// host:port.
        addr: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The connection failed mid-request.
    #[error("HTTP error talking to the server: {0}")]
    Http(#[from] hyper::Error),
    /// The server answered with an error.
    #[error("the server answered {status}: {message} ({code})")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The API's error code.
        code: String,
        /// The API's message.
        message: String,
        /// The API's details, for the codes that have them (the refused
        /// plan of a `files_conflict`, an `invalid_input`'s violations).
        details: Option<Value>,
    },
    /// The server stopped while the stream was open; reconnect (with
    /// `after = last_seq`) once it is back.
    #[error("the server is stopping; resume after seq {last_seq}")]
    ServerStopping {
        /// The last seq received.
        last_seq: u64,
    },
    /// The server sent something this client does not understand.
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
}

/// A server to talk to.
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    port: u16,
    prefix: String,
    token: Option<String>,
}

impl Client {
    /// A client for `http://HOST[:PORT][/PREFIX]` (port 80 by default) with
    /// an optional bearer token.
    pub fn new(url: &str, token: Option<String>) -> Result<Client, ClientError> {
        let bad = |reason: &str| ClientError::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            return Err(bad(
                "https is not supported; use http:// through a tunnel or a local TLS proxy",
            ));
        } else {
            return Err(bad("must start with http://"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        let bracketed_only = authority.starts_with('[') && authority.ends_with(']');
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !bracketed_only => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
                (h.to_string(), port)
            }
            _ => (authority.to_string(), 80),
        };
        Ok(Client {
            host,
            port,
            prefix: path.to_string(),
            token,
        })
    }

    fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    async fn send<B>(&self, req: Request<B>) -> Result<Response<Incoming>, ClientError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let addr = self.authority();
        let host = self
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let stream = TcpStream::connect((host.as_str(), self.port))
            .await
            .map_err(|source| ClientError::Connect {
                addr: addr.clone(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender.send_request(req).await?)
    }

    fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.prefix, path))
            .header(header::HOST, self.authority());
        if let Some(t) = &self.token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        b
    }

    /// GETs a JSON document; API errors become [`ClientError::Status`].
    /// For routes the typed methods do not cover, and for tests that look
    /// at the JSON itself.
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        self.get(path).await
    }

    /// POSTs a JSON body and reads the JSON answer (see [`Client::get_json`]).
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.post(path, body).await
    }

    /// DELETEs `path`; an answer without a body (204) is `Value::Null`.
    pub async fn delete(&self, path: &str) -> Result<Value, ClientError> {
        let req = self
            .request(Method::DELETE, path)
            .body(Empty::<Bytes>::new())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        if resp.status() == hyper::StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        json_of(resp).await
    }

    /// GETs `path` and reads the answer as a `T`.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let req = self
            .request(Method::GET, path)
            .body(Empty::<Bytes>::new())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        json_of(resp).await
    }

    /// POSTs `body` as JSON to `path` and reads the answer as a `T`.
    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let req = self
            .request(Method::POST, path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        json_of(resp).await
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get("/healthz").await
    }

    /// `GET /v1/session`: whether the server needs a token, and whether
    /// this client's is good.
    pub async fn session(&self) -> Result<Session, ClientError> {
        self.get("/v1/session").await
    }

    /// `GET /v1/runs`: a page of runs, newest first.
    pub async fn runs(&self, q: &RunsQuery) -> Result<RunList, ClientError> {
        let mut query = Query::default();
        query.opt("status", q.status.as_deref());
        query.opt("workflow", q.workflow.as_deref());
        query.opt("parent", q.parent.as_deref());
        query.opt("limit", q.limit.map(|n| n.to_string()).as_deref());
        query.opt("offset", q.offset.map(|n| n.to_string()).as_deref());
        self.get(&format!("/v1/runs{}", query.0)).await
    }

    /// `GET /v1/runs/{id}`: the run's state.
    pub async fn run(&self, run_id: &RunId) -> Result<RunDetail, ClientError> {
        self.get(&format!("/v1/runs/{}", segment(run_id))).await
    }

    /// `GET /v1/runs/{id}/activity`: the run's Activity view, its child
    /// runs' entries after the delegations that started them.
    pub async fn activity(&self, run_id: &RunId) -> Result<ActivityPage, ClientError> {
        self.get(&format!("/v1/runs/{}/activity", segment(run_id)))
            .await
    }

    /// `GET /v1/runs/{id}/plan`: the nodes of the workflow the run was
    /// started with.
    pub async fn plan(&self, run_id: &RunId) -> Result<Plan, ClientError> {
        self.get(&format!("/v1/runs/{}/plan", segment(run_id)))
            .await
    }

    /// `GET /v1/runs/{id}/nodes/{node}/tool-calls`: one node pass's tool
    /// calls with their arguments and results.
    pub async fn tool_calls(
        &self,
        run_id: &RunId,
        node: &NodePath,
        iteration: u32,
    ) -> Result<ToolCalls, ClientError> {
        self.get(&format!(
            "/v1/runs/{}/nodes/{}/tool-calls?iteration={iteration}",
            segment(run_id),
            segment(node)
        ))
        .await
    }

    /// `GET /v1/runs/{id}/events`: one page of the run's events, each as
    /// the store's text.
    pub async fn events_page(
        &self,
        run_id: &RunId,
        q: &EventsQuery,
    ) -> Result<EventsPage, ClientError> {
        let mut query = Query::default();
        query.opt("after", Some(&q.after.to_string()));
        query.opt("limit", q.limit.map(|n| n.to_string()).as_deref());
        if !q.types.is_empty() {
            query.opt("type", Some(&q.types.join(",")));
        }
        query.opt("node", q.node.as_deref());
        self.get(&format!("/v1/runs/{}/events{}", segment(run_id), query.0))
            .await
    }

    /// `POST /v1/runs`: starts a run of a workflow of the server's folder.
    pub async fn start(&self, body: &StartBody) -> Result<RunAccepted, ClientError> {
        self.post("/v1/runs", body).await
    }

    /// `POST /v1/runs/{id}/approvals/{node}`: approves or denies a node.
    pub async fn decide(
        &self,
        run_id: &RunId,
        node: &NodePath,
        body: &DecideBody,
    ) -> Result<Decided, ClientError> {
        let path = format!("/v1/runs/{}/approvals/{}", segment(run_id), segment(node));
        self.post(&path, body).await
    }

    /// `POST /v1/runs/{id}/inputs/{requestId}`: answers a question.
    pub async fn answer(
        &self,
        run_id: &RunId,
        request_id: &str,
        body: &AnswerBody,
    ) -> Result<Answered, ClientError> {
        let path = format!(
            "/v1/runs/{}/inputs/{}",
            segment(run_id),
            segment(request_id)
        );
        self.post(&path, body).await
    }

    /// `POST /v1/runs/{id}/cancel`.
    pub async fn cancel(
        &self,
        run_id: &RunId,
        body: &CancelBody,
    ) -> Result<Cancelled, ClientError> {
        self.post(&format!("/v1/runs/{}/cancel", segment(run_id)), body)
            .await
    }

    /// `POST /v1/runs/{id}/resume`.
    pub async fn resume(
        &self,
        run_id: &RunId,
        body: &ResumeBody,
    ) -> Result<RunAccepted, ClientError> {
        self.post(&format!("/v1/runs/{}/resume", segment(run_id)), body)
            .await
    }

    /// `POST /v1/runs/{id}/nodes/{node}/hijack`: asks the agent to stop
    /// at its next step boundary and take its turns from a person.
    pub async fn hijack(
        &self,
        run_id: &RunId,
        node: &NodePath,
        body: &HijackBody,
    ) -> Result<HijackRequested, ClientError> {
        let path = format!(
            "/v1/runs/{}/nodes/{}/hijack",
            segment(run_id),
            segment(node)
        );
        self.post(&path, body).await
    }

    /// `POST /v1/runs/{id}/revert`: puts the run's files back as they were
    /// before an attempt of a node. A plan refused for its conflicts is a
    /// [`ClientError::Status`] 409 `files_conflict` whose details are the
    /// refused [`Reverted`].
    pub async fn revert(&self, run_id: &RunId, body: &RevertBody) -> Result<Reverted, ClientError> {
        self.post(&format!("/v1/runs/{}/revert", segment(run_id)), body)
            .await
    }

    /// `POST /v1/runs/{id}/fork`: a new run from a point of this one, which
    /// the server drives. A plan refused for its conflicts is a
    /// [`ClientError::Status`] 409 `files_conflict` whose details are the
    /// refused [`Forked`].
    pub async fn fork(&self, run_id: &RunId, body: &ForkBody) -> Result<Forked, ClientError> {
        self.post(&format!("/v1/runs/{}/fork", segment(run_id)), body)
            .await
    }

    /// `GET /v1/scores`: what the scorers said across the server's runs,
    /// narrowed to a workflow and a node when given.
    pub async fn scores(
        &self,
        workflow: Option<&str>,
        node: Option<&str>,
    ) -> Result<ScoreReport, ClientError> {
        let mut query = Query::default();
        query.opt("workflow", workflow);
        query.opt("node", node);
        self.get(&format!("/v1/scores{}", query.0)).await
    }

    /// Opens the run's SSE stream after `after`. With `follow` the stream
    /// goes on across resumes; without, it ends after the terminal event.
    pub async fn events(
        &self,
        run_id: &RunId,
        after: u64,
        follow: bool,
    ) -> Result<EventStream, ClientError> {
        let mut s = EventStream {
            client: self.clone(),
            run_id: run_id.clone(),
            follow,
            last_seq: after,
            body: None,
            buf: Vec::new(),
            done: false,
        };
        s.connect().await?;
        Ok(s)
    }
}

/// The answer's body as a `T`, or the API's error as [`ClientError::Status`].
async fn json_of<T: DeserializeOwned>(resp: Response<Incoming>) -> Result<T, ClientError> {
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let not_json = |e: serde_json::Error| {
        ClientError::Protocol(format!(
            "status {status}, body is not the expected JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        ))
    };
    if status.is_success() {
        serde_json::from_slice(&bytes).map_err(not_json)
    } else {
        let v: Value = serde_json::from_slice(&bytes).map_err(not_json)?;
        Err(api_error(status, &v))
    }
}

/// The API's error (`{"error": {"code", "message"}}`) as a [`ClientError`];
/// a body of another shape still gives its status.
fn api_error(status: StatusCode, v: &Value) -> ClientError {
    let (code, message, details) = match ErrorBody::deserialize(v) {
        Ok(ErrorBody { error }) => (error.code, error.message, error.details),
        Err(_) => ("unknown".to_string(), "(no message)".to_string(), None),
    };
    ClientError::Status {
        status: status.as_u16(),
        code,
        message,
        details,
    }
}

/// `GET /v1/runs`'s filters and page; `None` leaves the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunsQuery {
    /// Only runs with this status.
    pub status: Option<String>,
    /// Only runs of this workflow (by name).
    pub workflow: Option<String>,
    /// Only the child runs of this run.
    pub parent: Option<RunId>,
    /// Runs per page (1 to 1000; the server's default is 50).
    pub limit: Option<usize>,
    /// Runs to skip.
    pub offset: Option<usize>,
}

/// `GET /v1/runs/{id}/events`'s filters and page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventsQuery {
    /// Events after this seq.
    pub after: u64,
    /// Only events of these types (the contract's names).
    pub types: Vec<String>,
    /// Only events of this node (its path). A filter, not a name: text
    /// that is no node path matches no event, as in the store's query.
    pub node: Option<String>,
    /// Events per page (1 to 10,000; the server's default is 1000).
    pub limit: Option<usize>,
}

/// A query string being built: `?a=1&b=2`, each value percent-encoded.
#[derive(Default)]
struct Query(String);

impl Query {
    fn opt(&mut self, name: &str, value: Option<&str>) {
        if let Some(v) = value {
            self.0.push(if self.0.is_empty() { '?' } else { '&' });
            self.0.push_str(name);
            self.0.push('=');
            self.0.push_str(&encode(v, b"-_.~"));
        }
    }
}

/// One path segment, percent-encoded: run ids, node paths (`[`, `]`) and
/// request ids go into a path whatever they hold, and never as `.` or `..`.
fn segment(s: &str) -> String {
    encode(s, b"-_~")
}

/// Percent-encodes all but ASCII letters, digits and `keep`.
fn encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A run's events from a server's SSE stream, as the event JSON lines the
/// store holds. A stream cut off for falling behind reconnects by itself
/// from the last seq received, so the caller sees every event once.
pub struct EventStream {
    client: Client,
    run_id: RunId,
    follow: bool,
    last_seq: u64,
    body: Option<Incoming>,
    buf: Vec<u8>,
    done: bool,
}

/// Times a lagging stream may reconnect in a row without progress.
const MAX_RECONNECTS: usize = 5;

impl EventStream {
    /// The seq of the last event returned (or the `after` asked for).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    async fn connect(&mut self) -> Result<(), ClientError> {
        let path = format!(
            "/v1/runs/{}/events/stream{}",
            segment(&self.run_id),
            if self.follow { "?follow=true" } else { "" }
        );
        let req = self
            .client
            .request(Method::GET, &path)
            .header("last-event-id", HeaderValue::from(self.last_seq))
            .header(header::ACCEPT, "text/event-stream")
            .body(Empty::<Bytes>::new())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.client.send(req).await?;
        if !resp.status().is_success() {
            return Err(json_of::<Value>(resp).await.err().unwrap_or_else(|| {
                ClientError::Protocol("error status with a success body".into())
            }));
        }
        self.body = Some(resp.into_body());
        self.buf.clear();
        Ok(())
    }

    /// The next event's JSON, `None` after the run's terminal event (or when
    /// the server closes the stream).
    pub async fn next_event(&mut self) -> Option<Result<String, ClientError>> {
        let mut reconnects = 0;
        loop {
            if self.done {
                return None;
            }
            match self.next_message().await {
                Ok(Some(m)) => match m.event.as_deref() {
                    None | Some("message") => {
                        if let Some(id) = m.id.and_then(|i| i.parse().ok()) {
                            self.last_seq = id;
                        }
                        return Some(Ok(m.data));
                    }
                    Some("end") => {
                        self.done = true;
                        return None;
                    }
                    Some("shutdown") => {
                        self.done = true;
                        return Some(Err(ClientError::ServerStopping {
                            last_seq: self.last_seq,
                        }));
                    }
                    Some("error") => {
                        let v: Value = serde_json::from_str(&m.data).unwrap_or(Value::Null);
                        if v["error"]["code"] == "lagged" && reconnects < MAX_RECONNECTS {
                            reconnects += 1;
                            if let Err(e) = self.connect().await {
                                self.done = true;
                                return Some(Err(e));
                            }
                            continue;
                        }
                        self.done = true;
                        return Some(Err(api_error(StatusCode::OK, &v)));
                    }
                    Some(_) => continue,
                },
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }

    async fn next_message(&mut self) -> Result<Option<SseMessage>, ClientError> {
        loop {
            if let Some(m) = take_message(&mut self.buf) {
                if m.data.is_empty() && m.event.is_none() {
                    // A comment (heartbeat).
                    continue;
                }
                return Ok(Some(m));
            }
            let Some(body) = self.body.as_mut() else {
                return Ok(None);
            };
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    self.body = None;
                    return Ok(None);
                }
            }
        }
    }
}

/// One SSE message.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct SseMessage {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// Takes the first complete message (ended by a blank line) off `buf`.
pub(crate) fn take_message(buf: &mut Vec<u8>) -> Option<SseMessage> {
    let end = buf.windows(2).position(|w| w == b"\n\n")?;
    let raw: Vec<u8> = buf.drain(..end + 2).collect();
    let text = String::from_utf8_lossy(&raw[..end]);
    let mut m = SseMessage::default();
    let mut data: Vec<&str> = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "id" => m.id = Some(value.to_string()),
            "event" => m.event = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    m.data = data.join("\n");
    Some(m)
}

/// How long [`wait_healthy`] waits between tries.
const HEALTH_POLL: Duration = Duration::from_millis(50);

/// Waits until the server answers `/healthz`, up to `timeout`; for scripts
/// and tests that start a server and must not race it.
pub async fn wait_healthy(url: &str, timeout: Duration) -> Result<(), ClientError> {
    let client = Client::new(url, None)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match client.health().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(HEALTH_POLL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = Client::new("http://127.0.0.1:7700", None).unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.prefix.as_str()),
            ("127.0.0.1", 7700, "")
        );
        let c = Client::new("http://example.org/cairn/", None).unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.prefix.as_str()),
            ("example.org", 80, "/cairn")
        );
        let c = Client::new("http://[::1]:9", None).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("[::1]", 9));
        assert!(Client::new("https://x", None)
            .unwrap_err()
            .to_string()
            .contains("https"));
        assert!(Client::new("x:1", None).is_err());
        assert!(Client::new("http://h:port", None)
            .unwrap_err()
            .to_string()
            .contains("port"));
    }

    #[test]
    fn path_segments_and_query_values_are_encoded() {
        assert_eq!(segment("run-1_a~"), "run-1_a~");
        assert_eq!(segment("loop[2].fix"), "loop%5B2%5D%2Efix");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("a/b?c"), "a%2Fb%3Fc");
        let mut q = Query::default();
        q.opt("after", Some("3"));
        q.opt("node", None);
        q.opt("type", Some("RunStarted,NodeFinished"));
        q.opt("node", Some("per_line[3].show"));
        assert_eq!(
            q.0,
            "?after=3&type=RunStarted%2CNodeFinished&node=per_line%5B3%5D.show"
        );
    }

    #[test]
    fn sse_messages_split_on_blank_lines() {
        let mut buf =
            b": heartbeat\n\nid: 3\ndata: {\"a\":1}\n\nevent: end\ndata: x\n\nid: 4\nda".to_vec();
        assert_eq!(take_message(&mut buf), Some(SseMessage::default()));
        let m = take_message(&mut buf).unwrap();
        assert_eq!((m.id.as_deref(), m.data.as_str()), (Some("3"), "{\"a\":1}"));
        assert_eq!(
            take_message(&mut buf).unwrap().event.as_deref(),
            Some("end")
        );
        assert_eq!(take_message(&mut buf), None);
        assert_eq!(buf, b"id: 4\nda");
    }
}
