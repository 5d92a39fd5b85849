//! `GET /v1/runs/{id}/events/stream`: a run's events as Server-Sent Events.
//!
//! Each event is one SSE message whose `id:` is its seq and whose `data:` is
//! the store's JSON text unchanged, so a client reconnecting with
//! `Last-Event-ID` resumes right after the last event it saw (contract,
//! guarantee 3). The body is pulled by the connection as the client reads:
//! a client that stops reading stops pulling, falls behind the store's live
//! buffer and gets a final `event: error` (code `lagged`, with the last seq
//! it was sent) before the stream closes. The engine never waits for it.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use cairn_store::{SubscribeError, Subscription};
use serde_json::json;

use crate::api::{blocking, existing_run, known_params, parse_bool, AppState};
use crate::error::ApiError;

pub(crate) async fn stream(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    known_params(&q, &["after", "follow"])?;
    let after = match headers.get("last-event-id") {
        Some(v) => {
            let s = v.to_str().unwrap_or("").trim();
            s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("header `Last-Event-ID`: `{s}` is not a seq"))
            })?
        }
        None => match q.get("after") {
            Some(s) => s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("query parameter `after`: `{s}` is not a seq"))
            })?,
            None => 0,
        },
    };
    let follow = parse_bool(&q, "follow")?;
    existing_run(&state, &id).await?;
    let journal = state.journal().clone();
    let run = id.clone();
    let sub = blocking(move || Ok(journal.subscribe(&run, after)?)).await?;
    let sub = sub.stop_at_terminal(!follow);
    let body = Body::from_stream(events(state, id, sub));
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

type Next = Option<Result<std::sync::Arc<cairn_store::StoredEvent>, SubscribeError>>;

struct Watch {
    sub: Subscription,
    closing: tokio::sync::watch::Receiver<bool>,
    run_id: String,
    /// An outcome read ahead while batching, to deliver next.
    pending: Option<Next>,
    done: bool,
}

impl Watch {
    /// The bytes for one outcome of the subscription, and whether the
    /// stream ends after them.
    fn outcome(&mut self, next: Next, out: &mut String) -> bool {
        match next {
            Some(Ok(ev)) => {
                push_frame(out, ev.seq, &ev.json);
                false
            }
            Some(Err(SubscribeError::Lagged { last_seq })) => {
                let data = json!({"error": {
                    "code": "lagged",
                    "message": format!("this watcher fell behind the run and was cut off after seq {last_seq}; reconnect with Last-Event-ID: {last_seq}"),
                    "lastSeq": last_seq,
                }});
                out.push_str(&format!("event: error\ndata: {data}\n\n"));
                true
            }
            Some(Err(SubscribeError::Store(e))) => {
                let data = json!({"error": {"code": "store", "message": e.to_string(), "lastSeq": self.sub.last_seq()}});
                out.push_str(&format!("event: error\ndata: {data}\n\n"));
                true
            }
            None => {
                // Tells EventSource clients not to reconnect.
                let data = json!({"runId": self.run_id, "lastSeq": self.sub.last_seq()});
                out.push_str(&format!("event: end\ndata: {data}\n\n"));
                true
            }
        }
    }
}

fn push_frame(out: &mut String, seq: u64, json: &str) {
    out.push_str("id: ");
    out.push_str(&seq.to_string());
    out.push_str("\ndata: ");
    out.push_str(json);
    out.push_str("\n\n");
}

fn events(
    state: AppState,
    run_id: String,
    sub: Subscription,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    use futures::FutureExt;
    let heartbeat = state.cfg().heartbeat;
    let w = Watch {
        sub,
        closing: state.closing(),
        run_id,
        pending: None,
        done: false,
    };
    futures::stream::unfold(w, move |mut w| async move {
        if w.done {
            return None;
        }
        let mut out = String::new();
        let first = match w.pending.take() {
            Some(next) => Some(next),
            None => tokio::select! {
                biased;
                _ = crate::api::closed(&mut w.closing) => {
                    let data = json!({"runId": w.run_id, "lastSeq": w.sub.last_seq(), "reason": "the server is stopping; reconnect with Last-Event-ID"});
                    out.push_str(&format!("event: shutdown\ndata: {data}\n\n"));
                    w.done = true;
                    None
                }
                next = w.sub.next() => Some(next),
                _ = tokio::time::sleep(heartbeat) => {
                    out.push_str(": heartbeat\n\n");
                    None
                }
            },
        };
        if let Some(next) = first {
            w.done = w.outcome(next, &mut out);
            let mut n = 1;
            // Whatever else is ready goes in the same chunk.
            while !w.done && n < MAX_BATCH {
                match w.sub.next().now_or_never() {
                    Some(Some(Ok(ev))) => {
                        push_frame(&mut out, ev.seq, &ev.json);
                        n += 1;
                    }
                    Some(other) => {
                        w.pending = Some(other);
                        break;
                    }
                    None => break,
                }
            }
        }
        Some((Ok(Bytes::from(out)), w))
    })
}
