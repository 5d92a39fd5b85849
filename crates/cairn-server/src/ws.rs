//! `GET /v1/ws`: one WebSocket per client, JSON messages both ways.
//!
//! The client sends requests `{"type": ..., "id": ..., ...}`; the server
//! answers each with `{"kind":"reply","id":...,"ok":true,"result":...}` or
//! `{"kind":"reply","id":...,"ok":false,"error":{"code","message"}}` and
//! pushes events as `{"kind":"event","event":<the store's JSON>}`.
//!
//! `{"type":"subscribe","runId":...,"tree":true}` follows a tree of runs:
//! each child run the run starts (its `DelegationStarted`), and theirs, is
//! subscribed to from its first event, announced by
//! `{"kind":"subscribed","runId":<child>}`; every event names its run.
//!
//! One writer task per socket sends replies and every subscription's events,
//! polling the subscriptions itself. A subscription whose events pile up
//! while the socket is busy (see [`crate::feed`]) sends a `lagged` error and
//! the socket is closed with code 4000 and the run and seq to resume from.
//! The engine never waits on a socket.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::stream::{BoxStream, SelectAll, SplitSink, TakeUntil};
use futures::{FutureExt, SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::api::{existing_run, AppState};
use crate::auth::{self, Check};
use crate::error::ApiError;
use crate::feed::{Cut, Watcher};
use crate::frames::ws_event_text;

/// Close code for a client that fell behind (application range).
pub const CLOSE_LAGGED: u16 = 4000;
/// Close code for a policy violation (RFC 6455): no or wrong token.
pub const CLOSE_POLICY: u16 = 1008;
/// Close code for a server going away (RFC 6455).
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// How long a client that has not authenticated gets to send its token.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write to the client may block before the client is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let authed = match auth::check(&state, &headers) {
        Check::Allowed => true,
        Check::Missing => false,
        Check::Wrong => return auth::unauthorized(false),
    };
    let ws = match ws {
        Ok(ws) => ws,
        // A token may come as the first message only over a WebSocket;
        // anything else without one is simply unauthorized.
        Err(_) if !authed => return auth::unauthorized(true),
        // In the API's error shape, like every other refusal.
        Err(r) => {
            return ApiError::bad_request(r.body_text())
                .with_code("bad_websocket_request")
                .into_response()
        }
    };
    let limit = state.cfg().ws_message_limit;
    // Clients send small requests: the default 128 KiB read buffer, zeroed
    // when first read into, would cost that much memory per socket.
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .read_buffer_size(4096)
        .on_upgrade(move |socket| session(state, socket, authed))
}

enum Out {
    /// Shared with every other watcher when it is an event.
    Text(Utf8Bytes),
    Close(u16, String),
    /// Start sending a subscription's events, after everything queued
    /// before (its reply first).
    Watch(Subscribed),
}

/// One subscription's messages; ends when its sender in the session's map is
/// dropped (unsubscribe, or the session ends).
type Subscribed = TakeUntil<BoxStream<'static, Out>, oneshot::Receiver<()>>;

/// Messages other than subscribed events (replies, replays, the all-runs
/// feed) queued for the socket before their senders wait.
const CONTROL_QUEUE: usize = 256;
/// Most messages written before one flush.
const MAX_BATCH: usize = 64;

/// Owns the socket's sending half: writes the session's messages and every
/// subscription's events. Subscriptions are polled here, not by tasks of
/// their own, so an event costs one wake-up of this task and nothing else.
async fn write_loop(mut sink: SplitSink<WebSocket, Message>, mut rx: mpsc::Receiver<Out>) {
    let mut subs: SelectAll<Subscribed> = SelectAll::new();
    loop {
        let first = tokio::select! {
            biased;
            m = rx.recv() => match m {
                Some(m) => m,
                // The session ended.
                None => break,
            },
            Some(m) = subs.next(), if !subs.is_empty() => m,
        };
        let write = async {
            let mut next = Some(first);
            let mut written = 0;
            while let Some(out) = next.take() {
                let msg = match out {
                    Out::Watch(s) => {
                        subs.push(s);
                        None
                    }
                    Out::Text(t) => Some(Message::Text(t)),
                    Out::Close(code, reason) => {
                        sink.feed(Message::Close(Some(CloseFrame {
                            code,
                            reason: Utf8Bytes::from(close_reason(&reason)),
                        })))
                        .await?;
                        return sink.flush().await.map(|()| true);
                    }
                };
                if let Some(msg) = msg {
                    sink.feed(msg).await?;
                    written += 1;
                }
                if written == MAX_BATCH {
                    break;
                }
                // Whatever else is ready goes out with the same flush.
                next = match rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(_) => subs.next().now_or_never().flatten(),
                };
            }
            sink.flush().await.map(|()| false)
        };
        tokio::pin!(write);
        // A write the socket takes at once needs no deadline; arming a
        // timer for every batch would cost more than the write.
        let sent = match futures::poll!(&mut write) {
            std::task::Poll::Ready(r) => Ok(r),
            std::task::Poll::Pending => tokio::time::timeout(WRITE_TIMEOUT, write).await,
        };
        match sent {
            Ok(Ok(false)) => {}
            _ => break,
        }
    }
    let _ = sink.close().await;
}

/// A subscription's messages: its events, then `end` (or a `lagged` error
/// and the close that cuts the client off).
/// With `tree`, the ids of the child runs the run starts (its
/// `DelegationStarted` events) go to the session, which subscribes to them.
fn subscription(
    feed: Watcher,
    run_id: String,
    tree: Option<mpsc::UnboundedSender<(String, u32)>>,
) -> BoxStream<'static, Out> {
    enum St {
        Live(Watcher, String),
        Closing(String),
        Done,
    }
    futures::stream::unfold(St::Live(feed, run_id), move |st| {
        let tree = tree.clone();
        async move {
        match st {
            St::Done => None,
            St::Closing(msg) => Some((Out::Close(CLOSE_LAGGED, msg), St::Done)),
            St::Live(mut feed, run_id) => match feed.next().await {
                Some(Ok(f)) => {
                    if let Some(tx) = &tree {
                        if let Some(child) = delegated_child(&f.ws) {
                            let _ = tx.send((child, 0));
                        }
                    }
                    Some((Out::Text(f.ws.clone()), St::Live(feed, run_id)))
                }
                Some(Err(Cut::Lagged)) => {
                    let last_seq = feed.last_seq();
                    let msg = format!(
                        "lagged: run {run_id} after seq {last_seq}; resubscribe from there"
                    );
                    let err = json!({"kind": "error", "error": {
                        "code": "lagged",
                        "message": format!("this client fell behind run `{run_id}` and was cut off after seq {last_seq}; resubscribe with afterSeq {last_seq}"),
                        "runId": run_id,
                        "lastSeq": last_seq,
                    }});
                    Some((Out::Text(err.to_string().into()), St::Closing(msg)))
                }
                // The session closes the socket with its own reason.
                Some(Err(Cut::Closed)) => None,
                Some(Err(Cut::Failed(e))) => {
                    let err = json!({"kind": "error", "error": {"code": "store", "message": e, "runId": run_id, "lastSeq": feed.last_seq()}});
                    Some((Out::Text(err.to_string().into()), St::Done))
                }
                None => {
                    let end = json!({"kind": "end", "runId": run_id, "lastSeq": feed.last_seq()});
                    Some((Out::Text(end.to_string().into()), St::Done))
                }
            },
        }
    }})
    .boxed()
}

/// How often, and how far apart, a tree subscription looks for a child run
/// its parent announced but has not created yet.
const CHILD_TRIES: u32 = 200;
const CHILD_RETRY: Duration = Duration::from_millis(50);

/// The child run a `DelegationStarted` frame names.
fn delegated_child(ws: &str) -> Option<String> {
    if !ws.contains("\"DelegationStarted\"") {
        return None;
    }
    let v: Value = serde_json::from_str(ws).ok()?;
    let ev = &v["event"];
    (ev["type"] == "DelegationStarted")
        .then(|| ev["childRunId"].as_str().map(str::to_string))
        .flatten()
}

#[derive(Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
enum Request {
    Auth {
        token: String,
    },
    Subscribe {
        run_id: String,
        #[serde(default)]
        after_seq: u64,
        #[serde(default)]
        follow: bool,
        /// Also every child run the run starts, and theirs.
        #[serde(default)]
        tree: bool,
    },
    Unsubscribe {
        run_id: String,
    },
    SubscribeAll {},
    UnsubscribeAll {},
    Replay {
        run_id: String,
        #[serde(default)]
        after_seq: u64,
        #[serde(default)]
        limit: Option<usize>,
    },
    ListRuns {
        #[serde(default)]
        status: Option<String>,
        #[serde(default)]
        workflow: Option<String>,
        #[serde(default)]
        parent: Option<String>,
        #[serde(default)]
        limit: Option<usize>,
        #[serde(default)]
        offset: Option<usize>,
    },
    Cancel {
        run_id: String,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        graceful: bool,
        #[serde(default)]
        by: Option<String>,
    },
    Approve {
        run_id: String,
        node_id: String,
        #[serde(default)]
        note: Option<String>,
        #[serde(default)]
        by: Option<String>,
    },
    Deny {
        run_id: String,
        node_id: String,
        #[serde(default)]
        note: Option<String>,
        #[serde(default)]
        by: Option<String>,
    },
    Answer {
        run_id: String,
        request_id: String,
        value: Value,
        #[serde(default)]
        by: Option<String>,
    },
    Ping {},
}

fn reply_ok(id: &Value, result: Value) -> Utf8Bytes {
    json!({"kind": "reply", "id": id, "ok": true, "result": result})
        .to_string()
        .into()
}

fn reply_err(id: &Value, e: &ApiError) -> Utf8Bytes {
    json!({"kind": "reply", "id": id, "ok": false, "error": e.body()})
        .to_string()
        .into()
}

/// A close reason fits in a control frame (123 bytes).
fn close_reason(s: &str) -> String {
    let mut end = s.len().min(123);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

struct Session {
    state: AppState,
    tx: mpsc::Sender<Out>,
    /// Dropping a run's sender ends its subscription.
    subs: HashMap<String, oneshot::Sender<()>>,
    all: Option<JoinHandle<()>>,
    /// A subscription to hand to the writer once its reply is queued.
    pending: Option<Out>,
    /// Child runs that tree subscriptions found, to subscribe to (with how
    /// often it was tried).
    children: mpsc::UnboundedSender<(String, u32)>,
    /// Whether tree subscriptions follow each run past its end.
    tree_follow: bool,
}

/// What the session's loop does after a step.
enum Step {
    /// Read the next message.
    Next,
    /// Close the session.
    Stop,
}

async fn session(state: AppState, socket: WebSocket, mut authed: bool) {
    let (sink, mut stream) = socket.split();
    let (tx, rx) = mpsc::channel::<Out>(CONTROL_QUEUE);
    let writer = tokio::spawn(write_loop(sink, rx));
    let (children_tx, mut children_rx) = mpsc::unbounded_channel::<(String, u32)>();
    let mut s = Session {
        state: state.clone(),
        tx: tx.clone(),
        subs: HashMap::new(),
        all: None,
        pending: None,
        children: children_tx,
        tree_follow: false,
    };
    let mut closing = state.closing();
    loop {
        let wait = if authed { Duration::MAX } else { AUTH_TIMEOUT };
        let msg = tokio::select! {
            _ = crate::api::closed(&mut closing) => {
                let _ = tx.send(Out::Close(CLOSE_GOING_AWAY, "the server is stopping; resubscribe from your last seq".into())).await;
                break;
            }
            Some((child, tries)) = children_rx.recv(), if authed => {
                match s.follow_child(child, tries).await {
                    Step::Next => continue,
                    Step::Stop => break,
                }
            }
            m = tokio::time::timeout(wait, stream.next()) => match m {
                Err(_) => {
                    let _ = tx.send(Out::Close(CLOSE_POLICY, "no token sent in time".into())).await;
                    break;
                }
                Ok(None) | Ok(Some(Err(_))) => break,
                Ok(Some(Ok(m))) => m,
            }
        };
        let step = match s.text_of(msg).await {
            Ok(text) => s.on_text(text.as_str(), &mut authed).await,
            Err(step) => step,
        };
        if let Step::Stop = step {
            break;
        }
    }
    s.subs.clear();
    if let Some(h) = s.all.take() {
        h.abort();
    }
    drop(s);
    drop(tx);
    let _ = writer.await;
}

impl Session {
    /// Subscribes to a child run that a followed tree delegated to, and
    /// says so; a child not created yet is looked for again shortly.
    async fn follow_child(&mut self, child: String, tries: u32) -> Step {
        if self.subs.contains_key(&child) {
            return Step::Next;
        }
        let follow = self.tree_follow;
        match self.subscribe(child.clone(), 0, follow, true).await {
            Ok(_) => {
                let note = json!({"kind": "subscribed", "runId": child});
                if self
                    .tx
                    .send(Out::Text(note.to_string().into()))
                    .await
                    .is_err()
                {
                    return Step::Stop;
                }
                self.send_pending().await
            }
            // `DelegationStarted` is committed before the child is
            // created: look again shortly.
            Err(e) if e.code == "not_found" && tries < CHILD_TRIES => {
                let again = self.children.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(CHILD_RETRY).await;
                    let _ = again.send((child, tries + 1));
                });
                Step::Next
            }
            Err(e) => {
                tracing::debug!(child, error = ?e.body(), "cannot follow a child run");
                Step::Next
            }
        }
    }

    /// Sends what a request left to send after its reply (a watcher's
    /// first frame).
    async fn send_pending(&mut self) -> Step {
        if let Some(w) = self.pending.take() {
            if self.tx.send(w).await.is_err() {
                return Step::Stop;
            }
        }
        Step::Next
    }

    /// A message's text; what is not text is answered (binary) or ends the
    /// session (close), or needs nothing (pings, which the WebSocket layer
    /// answers). `&mut`: the session is not `Sync`, and its future must
    /// be `Send`.
    async fn text_of(&mut self, msg: Message) -> Result<axum::extract::ws::Utf8Bytes, Step> {
        match msg {
            Message::Text(t) => Ok(t),
            Message::Binary(_) => {
                let e = ApiError::bad_request("binary messages are not understood; send JSON text");
                let _ = self
                    .tx
                    .send(Out::Text(
                        reply_err(&Value::Null, &e)
                            .as_str()
                            .replace("bad_request", "bad_message")
                            .into(),
                    ))
                    .await;
                Err(Step::Next)
            }
            Message::Close(_) => Err(Step::Stop),
            Message::Ping(_) | Message::Pong(_) => Err(Step::Next),
        }
    }

    /// One request: parsed, authenticated first when it must be, handled,
    /// answered.
    async fn on_text(&mut self, text: &str, authed: &mut bool) -> Step {
        let tx = self.tx.clone();
        let (id, parsed) = parse(text);
        let req = match parsed {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Out::Text(reply_err(&id, &e))).await;
                if !*authed {
                    let _ = tx
                        .send(Out::Close(
                            CLOSE_POLICY,
                            "authenticate first: {\"type\":\"auth\",\"token\":...}".into(),
                        ))
                        .await;
                    return Step::Stop;
                }
                return Step::Next;
            }
        };
        if !*authed {
            return match self.authenticate(&id, &req).await {
                Step::Next => {
                    *authed = true;
                    Step::Next
                }
                Step::Stop => Step::Stop,
            };
        }
        let out = match self.handle(req).await {
            Ok(v) => reply_ok(&id, v),
            Err(e) => reply_err(&id, &e),
        };
        if tx.send(Out::Text(out)).await.is_err() {
            return Step::Stop;
        }
        self.send_pending().await
    }

    /// The first request of a session that must authenticate: the right
    /// token, or the session ends.
    async fn authenticate(&mut self, id: &Value, req: &Request) -> Step {
        let ok = match (req, self.state.token()) {
            (Request::Auth { token }, Some(expected)) => {
                auth::ct_eq(token.as_bytes(), expected.as_bytes())
            }
            _ => false,
        };
        if ok {
            let _ = self
                .tx
                .send(Out::Text(reply_ok(id, json!({"authenticated": true}))))
                .await;
            return Step::Next;
        }
        let e = ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send {\"type\":\"auth\",\"token\":...} with the right token first",
        );
        let _ = self.tx.send(Out::Text(reply_err(id, &e))).await;
        let _ = self
            .tx
            .send(Out::Close(CLOSE_POLICY, "unauthorized".into()))
            .await;
        Step::Stop
    }
}

/// Reads the request id first, so even a request that does not parse gets
/// an answer its sender can match.
fn parse(text: &str) -> (Value, Result<Request, ApiError>) {
    let mut v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return (
                Value::Null,
                Err(ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "bad_json",
                    format!("message is not JSON: {e}"),
                )),
            )
        }
    };
    let id = v
        .as_object_mut()
        .and_then(|m| m.remove("id"))
        .unwrap_or(Value::Null);
    let r = serde_json::from_value::<Request>(v).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "bad_message",
            format!("message: {e}"),
        )
    });
    (id, r)
}

impl Session {
    /// Subscribes to a run's events from `after_seq`; the subscription is
    /// left in `pending` for the writer.
    async fn subscribe(
        &mut self,
        run_id: String,
        after_seq: u64,
        follow: bool,
        tree: bool,
    ) -> Result<Value, ApiError> {
        let state = self.state.clone();
        self.subs.retain(|_, c| !c.is_closed());
        if self.subs.contains_key(&run_id) {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "already_subscribed",
                format!("already subscribed to run `{run_id}`; unsubscribe first"),
            ));
        }
        let rec = existing_run(&state, &run_id).await?;
        let feed = state.watch(&rec.run_id, after_seq, follow).await?;
        let (stop, stopped) = oneshot::channel();
        let children = tree.then(|| self.children.clone());
        // Handed to the writer after the reply, so a client always
        // sees the reply before the first event.
        self.pending = Some(Out::Watch(
            subscription(feed, run_id.clone(), children).take_until(stopped),
        ));
        self.subs.insert(run_id.clone(), stop);
        Ok(json!({"runId": run_id, "afterSeq": after_seq}))
    }

    async fn handle(&mut self, req: Request) -> Result<Value, ApiError> {
        let state = self.state.clone();
        match req {
            Request::Auth { .. } => Ok(json!({"authenticated": true})),
            Request::Ping {} => Ok(json!({"pong": true})),
            Request::Subscribe {
                run_id,
                after_seq,
                follow,
                tree,
            } => {
                if tree {
                    self.tree_follow = follow;
                }
                self.subscribe(run_id, after_seq, follow, tree).await
            }
            Request::Unsubscribe { run_id } => match self.subs.remove(&run_id) {
                Some(_stop) => Ok(json!({"runId": run_id})),
                None => Err(ApiError::not_found(format!(
                    "not subscribed to run `{run_id}`"
                ))),
            },
            Request::SubscribeAll {} => self.subscribe_all(),
            Request::UnsubscribeAll {} => {
                if let Some(h) = self.all.take() {
                    h.abort();
                }
                Ok(json!({}))
            }
            Request::Replay {
                run_id,
                after_seq,
                limit,
            } => self.replay(run_id, after_seq, limit).await,
            Request::ListRuns {
                status,
                workflow,
                parent,
                limit,
                offset,
            } => {
                let q = [
                    ("status", status),
                    ("workflow", workflow),
                    ("parent", parent),
                    ("limit", limit.map(|l| l.to_string())),
                    ("offset", offset.map(|o| o.to_string())),
                ];
                let q: HashMap<String, String> = q
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.to_string(), v?)))
                    .collect();
                crate::api::list_runs_value(&state, q).await
            }
            Request::Cancel {
                run_id,
                reason,
                graceful,
                by,
            } => {
                let run = existing_run(&state, &run_id).await?.run_id;
                state.engine().cancel(&run, graceful, reason, by).await?;
                Ok(reply(cairn_api::Cancelled {
                    run_id: run,
                    mechanism: cairn_api::CancelMechanism::of(graceful),
                }))
            }
            Request::Approve {
                run_id,
                node_id,
                note,
                by,
            } => decide(&state, run_id, node_id, true, note, by).await,
            Request::Deny {
                run_id,
                node_id,
                note,
                by,
            } => decide(&state, run_id, node_id, false, note, by).await,
            Request::Answer {
                run_id,
                request_id,
                value,
                by,
            } => {
                let run = existing_run(&state, &run_id).await?.run_id;
                state.engine().answer(&run, &request_id, value, by).await?;
                Ok(reply(cairn_api::Answered {
                    run_id: run,
                    request_id,
                }))
            }
        }
    }
}

impl Session {
    /// Forwards every run's events to this session, once.
    fn subscribe_all(&mut self) -> Result<Value, ApiError> {
        if self.all.as_ref().is_some_and(|h| !h.is_finished()) {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "already_subscribed",
                "already subscribed to every run",
            ));
        }
        let rx = self.state.journal().subscribe_all();
        let tx = self.tx.clone();
        self.all = Some(tokio::spawn(forward_all(rx, tx)));
        Ok(json!({}))
    }

    /// Sends a page of a run's stored events, then says where it ended.
    async fn replay(
        &mut self,
        run_id: String,
        after_seq: u64,
        limit: Option<usize>,
    ) -> Result<Value, ApiError> {
        let state = self.state.clone();
        let run = existing_run(&state, &run_id).await?.run_id;
        let limit = limit.unwrap_or(1000).clamp(1, 10_000);
        let q = cairn_store::EventQuery {
            after: after_seq,
            limit: Some(limit),
            ..Default::default()
        };
        let events = state
            .journal()
            .backend()
            .read_events_async(&run, &q)
            .await?;
        let count = events.len();
        let last = events.last().map_or(after_seq, |e| e.seq);
        for e in &events {
            if self
                .tx
                .send(Out::Text(ws_event_text(&e.json).into()))
                .await
                .is_err()
            {
                break;
            }
        }
        Ok(json!({"runId": run_id, "count": count, "lastSeq": last, "more": count == limit}))
    }
}

async fn decide(
    state: &AppState,
    run_id: String,
    node_id: String,
    approved: bool,
    note: Option<String>,
    by: Option<String>,
) -> Result<Value, ApiError> {
    let run = existing_run(state, &run_id).await?.run_id;
    state
        .engine()
        .decide(&run, &node_id, approved, note, by)
        .await?;
    Ok(reply(cairn_api::Decided {
        run_id: run,
        node_id,
        approved,
    }))
}

/// A reply's `result` that is the same body as the HTTP route's.
fn reply(body: impl serde::Serialize) -> Value {
    serde_json::to_value(body).expect("API bodies serialize to JSON")
}

async fn forward_all(
    mut rx: tokio::sync::broadcast::Receiver<std::sync::Arc<cairn_store::StoredEvent>>,
    tx: mpsc::Sender<Out>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(ev) => {
                if tx
                    .send(Out::Text(ws_event_text(&ev.json).into()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(RecvError::Lagged(n)) => {
                let err = json!({"kind": "error", "error": {
                    "code": "lagged",
                    "message": format!("this client fell behind the all-runs feed and missed {n} events; reconnect and subscribe to the runs you need"),
                }});
                let _ = tx.send(Out::Text(err.to_string().into())).await;
                let _ = tx
                    .send(Out::Close(CLOSE_LAGGED, "lagged: the all-runs feed".into()))
                    .await;
                return;
            }
            Err(RecvError::Closed) => return,
        }
    }
}
