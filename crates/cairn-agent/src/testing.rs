//! A fake model provider for tests: a real HTTP server on 127.0.0.1 that
//! answers each request with the next reply of a queue (a status, headers
//! and body chunks with delays, or silence), and records every request.
//! It speaks whatever the replies say, so one server serves every wire
//! formats.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Router;
use futures::StreamExt;
use serde_json::Value;

/// How a reply's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The body ends normally after its chunks.
    Close,
    /// The connection breaks after the chunks.
    Abort,
    /// Nothing more is sent, and the body never ends.
    Hang,
}

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body pieces, each sent after its delay.
    pub chunks: Vec<(Duration, Vec<u8>)>,
    /// How the body ends.
    pub end: End,
    /// Wait this long before answering at all (no status, no headers).
    pub silence: Option<Duration>,
}

impl Reply {
    /// A 200 streaming `text/event-stream` with these raw pieces.
    pub fn chunks<I, S>(pieces: I) -> Reply
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: pieces
                .into_iter()
                .map(|p| (Duration::ZERO, p.as_ref().to_vec()))
                .collect(),
            end: End::Close,
            silence: None,
        }
    }

    /// A 200 stream of SSE `data:` events, one chunk each.
    pub fn sse<I, S>(datas: I) -> Reply
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Reply::chunks(
            datas
                .into_iter()
                .map(|d| format!("data: {}\n\n", d.as_ref())),
        )
    }

    /// A 200 stream of named SSE events (`event:` and `data:`).
    pub fn named_sse<I, S, T>(events: I) -> Reply
    where
        I: IntoIterator<Item = (S, T)>,
        S: AsRef<str>,
        T: AsRef<str>,
    {
        Reply::chunks(
            events
                .into_iter()
                .map(|(e, d)| format!("event: {}\ndata: {}\n\n", e.as_ref(), d.as_ref())),
        )
    }

    /// An error answer with a JSON body.
    pub fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![(Duration::ZERO, body.as_bytes().to_vec())],
            end: End::Close,
            silence: None,
        }
    }

    /// No answer for `d` (then an empty 200).
    pub fn silent(d: Duration) -> Reply {
        Reply {
            silence: Some(d),
            ..Reply::chunks(Vec::<Vec<u8>>::new())
        }
    }

    /// The same reply with a header added.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The same reply with `d` before every chunk.
    pub fn every(mut self, d: Duration) -> Reply {
        for c in &mut self.chunks {
            c.0 = d;
        }
        self
    }

    /// The same reply, ending as `end` says.
    pub fn ending(mut self, end: End) -> Reply {
        self.end = end;
        self
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Its path.
    pub path: String,
    /// Its query string, without the `?` (empty when none).
    pub query: String,
    /// Its headers, lower-case names.
    pub headers: Vec<(String, String)>,
    /// Its body as JSON (`Null` when not JSON).
    pub body: Value,
}

impl Recorded {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Chooses a reply from the request (a model that answers by the
/// conversation, however often it is asked).
type Responder = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

#[derive(Default)]
struct Shared {
    responder: Mutex<Option<Responder>>,
    replies: Mutex<VecDeque<Reply>>,
    /// Played when the queue is empty.
    fallback: Mutex<Option<Reply>>,
    requests: Mutex<Vec<Recorded>>,
}

/// The fake provider; it stops when dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProvider {
    /// Starts a server on a free port of 127.0.0.1 (inside a tokio runtime).
    pub async fn start() -> FakeProvider {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(serve).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues a reply.
    pub fn push(&self, reply: Reply) {
        self.shared.replies.lock().unwrap().push_back(reply);
    }

    /// Sets the reply played once the queue is empty.
    pub fn fallback(&self, reply: Reply) {
        *self.shared.fallback.lock().unwrap() = Some(reply);
    }

    /// Answers every request with what `f` makes of it (the queue and the
    /// fallback are not used then).
    pub fn respond_with(&self, f: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) {
        *self.shared.responder.lock().unwrap() = Some(Arc::new(f));
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }
}

async fn serve(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let body = axum::body::to_bytes(req.into_body(), 64 << 20)
        .await
        .unwrap_or_default();
    let recorded = Recorded {
        path,
        query,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let responder = shared.responder.lock().unwrap().clone();
    let chosen = responder.map(|f| f(&recorded));
    shared.requests.lock().unwrap().push(recorded);
    let reply = chosen.or_else(|| shared.replies.lock().unwrap().pop_front());
    let reply = reply
        .or_else(|| shared.fallback.lock().unwrap().clone())
        .unwrap_or_else(|| {
            Reply::status(
                500,
                r#"{"error":{"message":"the fake provider has no reply queued"}}"#,
            )
        });
    if let Some(d) = reply.silence {
        tokio::time::sleep(d).await;
    }
    let end = reply.end;
    let pieces = futures::stream::iter(reply.chunks).then(|(delay, bytes)| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok::<Bytes, std::io::Error>(Bytes::from(bytes))
    });
    let tail = futures::stream::once(async move {
        match end {
            End::Close => None,
            End::Abort => {
                // Give the pieces before it time to reach the client.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some(Err(std::io::Error::other(
                    "the fake provider drops the connection",
                )))
            }
            End::Hang => {
                futures::future::pending::<()>().await;
                None
            }
        }
    })
    .filter_map(|x| async move { x });
    let mut resp = Response::new(Body::from_stream(pieces.chain(tail)));
    *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    for (n, v) in reply.headers {
        if let (Ok(n), Ok(v)) = (HeaderName::try_from(n), HeaderValue::from_str(&v)) {
            resp.headers_mut().append(n, v);
        }
    }
    resp
}
