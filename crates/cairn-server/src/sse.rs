//! `GET /v1/runs/{id}/events/stream`: a run's events as Server-Sent Events.
//!
//! Each event is one SSE message whose `id:` is its seq and whose `data:` is
//! the store's JSON text unchanged, so a client reconnecting with
//! `Last-Event-ID` resumes right after the last event it saw (contract,
//! guarantee 3). The body is pulled by the connection as the client reads:
//! a client that stops reading stops pulling, falls behind the store's live
//! queue and gets a final `event: error` (code `lagged`, with the last seq
//! it was sent) before the stream closes. The engine never waits for it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::{Body, Bytes};

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::{existing_run, known_params, parse_bool, AppState};
use crate::error::ApiError;
use crate::feed::{Cut, Watcher};
use crate::frames::Frame;
use bytes::BytesMut;

pub(crate) async fn stream(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    known_params(&q, &["after", "follow"])?;
    // Both are checked although the header wins: a malformed parameter is
    // an error whether or not it ends up used.
    let after_param = match q.get("after") {
        Some(s) => s.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("query parameter `after`: `{s}` is not a seq"))
        })?,
        None => 0,
    };
    let after = match headers.get("last-event-id") {
        Some(v) => {
            let s = String::from_utf8_lossy(v.as_bytes());
            let s = s.trim();
            s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("header `Last-Event-ID`: `{s}` is not a seq"))
            })?
        }
        None => after_param,
    };
    let follow = parse_bool(&q, "follow")?;
    let rec = existing_run(&state, &id).await?;
    let feed = state.watch(&rec.run_id, after, follow).await?;
    let body = Body::from_stream(events(state, id, feed));
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        body,
    )
        .into_response())
}

/// Most events written to the socket in one chunk. Batching what is
/// already available saves a write per event when a watcher (or the whole
/// server) is busy, without delaying anything: nothing waits to fill a batch.
const MAX_BATCH: usize = 256;

type Next = Option<Result<Arc<Frame>, Cut>>;

struct Watch {
    /// Ends with [`Cut::Closed`] when the server stops: waiting on the
    /// server-wide signal here too would take its lock at every event.
    feed: Watcher,
    /// Fires a heartbeat period after the last write. It is moved when it
    /// fires early (something was written meanwhile), not at every event, so
    /// a busy stream does not touch the timer per event.
    heartbeat: Pin<Box<tokio::time::Sleep>>,
    period: std::time::Duration,
    last_write: tokio::time::Instant,
    run_id: String,
    /// An outcome read ahead while batching, to deliver next.
    pending: Option<Next>,
    done: bool,
}

impl Watch {
    /// The bytes for one outcome of the subscription that is not an event,
    /// after which the stream ends.
    fn ending(&mut self, next: Next) -> Bytes {
        let text = match next {
            Some(Ok(_)) => unreachable!("events are framed by the caller"),
            Some(Err(Cut::Lagged)) => {
                let last_seq = self.feed.last_seq();
                let data = json!({"error": {
                    "code": "lagged",
                    "message": format!("this watcher fell behind the run and was cut off after seq {last_seq}; reconnect with Last-Event-ID: {last_seq}"),
                    "lastSeq": last_seq,
                }});
                format!("event: error\ndata: {data}\n\n")
            }
            Some(Err(Cut::Failed(e))) => {
                let data = json!({"error": {"code": "store", "message": e, "lastSeq": self.feed.last_seq()}});
                format!("event: error\ndata: {data}\n\n")
            }
            Some(Err(Cut::Closed)) => {
                let data = json!({"runId": self.run_id, "lastSeq": self.feed.last_seq(), "reason": "the server is stopping; reconnect with Last-Event-ID"});
                format!("event: shutdown\ndata: {data}\n\n")
            }
            None => {
                // Tells EventSource clients not to reconnect.
                let data = json!({"runId": self.run_id, "lastSeq": self.feed.last_seq()});
                format!("event: end\ndata: {data}\n\n")
            }
        };
        self.done = true;
        Bytes::from(text)
    }

    /// The next chunk for the socket: the first event (or ending) plus
    /// everything else the subscription already has. A lone event is its
    /// shared frame as is, with no copy.
    fn chunk(&mut self, first: Next) -> Bytes {
        let ev = match first {
            Some(Ok(ev)) => ev,
            other => return self.ending(other),
        };
        let one = ev.sse.clone();
        let mut more: Option<BytesMut> = None;
        let mut n = 1;
        // Whatever else is ready goes in the same chunk.
        while n < MAX_BATCH {
            let next = match self.feed.try_next() {
                Some(next) => next,
                None => break,
            };
            let buf = more.get_or_insert_with(|| {
                let mut b = BytesMut::with_capacity(one.len() * 8);
                b.extend_from_slice(&one);
                b
            });
            match next {
                Some(Ok(ev)) => {
                    buf.extend_from_slice(&ev.sse);
                    n += 1;
                }
                other => {
                    self.pending = Some(other);
                    break;
                }
            }
        }
        match more {
            Some(b) => b.freeze(),
            None => one,
        }
    }
}

fn events(
    state: AppState,
    run_id: String,
    feed: Watcher,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let period = state.cfg().heartbeat;
    let now = tokio::time::Instant::now();
    let w = Watch {
        feed,
        heartbeat: Box::pin(tokio::time::sleep_until(now + period)),
        period,
        last_write: now,
        run_id,
        pending: None,
        done: false,
    };
    futures::stream::unfold(w, move |mut w| async move {
        if w.done {
            return None;
        }
        let first = match w.pending.take() {
            Some(next) => next,
            None => loop {
                tokio::select! {
                    // An event ready leaves the timer unpolled.
                    biased;
                    next = w.feed.next() => break next,
                    _ = &mut w.heartbeat => {
                        let due = w.last_write + w.period;
                        let now = tokio::time::Instant::now();
                        if due > now {
                            w.heartbeat.as_mut().reset(due);
                        } else {
                            w.last_write = now;
                            w.heartbeat.as_mut().reset(now + w.period);
                            return Some((Ok(Bytes::from_static(b": heartbeat\n\n")), w));
                        }
                    }
                }
            },
        };
        w.last_write = tokio::time::Instant::now();
        let chunk = w.chunk(first);
        Some((Ok(chunk), w))
    })
}
