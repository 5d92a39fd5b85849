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

/// One SSE message carrying a stored event.
pub(crate) fn frame(seq: u64, json: &str) -> Bytes {
    let mut s = String::with_capacity(json.len() + 32);
    s.push_str("id: ");
    s.push_str(&seq.to_string());
    s.push_str("\ndata: ");
    s.push_str(json);
    s.push_str("\n\n");
    Bytes::from(s)
}

fn named(event: &str, data: serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

enum Step {
    Open,
    Done,
}

fn events(
    state: AppState,
    run_id: String,
    sub: Subscription,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let heartbeat = state.cfg().heartbeat;
    let closing = state.closing();
    futures::stream::unfold(
        (sub, closing, Step::Open, run_id),
        move |(mut sub, mut closing, step, run_id)| async move {
            if let Step::Done = step {
                return None;
            }
            loop {
                let out = tokio::select! {
                    biased;
                    _ = crate::api::closed(&mut closing) => {
                        let data = json!({"runId": run_id, "lastSeq": sub.last_seq(), "reason": "the server is stopping; reconnect with Last-Event-ID"});
                        Some((named("shutdown", data), Step::Done))
                    }
                    next = sub.next() => match next {
                        Some(Ok(ev)) => Some((frame(ev.seq, &ev.json), Step::Open)),
                        Some(Err(SubscribeError::Lagged { last_seq })) => {
                            let data = json!({"error": {
                                "code": "lagged",
                                "message": format!("this watcher fell behind the run and was cut off after seq {last_seq}; reconnect with Last-Event-ID: {last_seq}"),
                                "lastSeq": last_seq,
                            }});
                            Some((named("error", data), Step::Done))
                        }
                        Some(Err(SubscribeError::Store(e))) => {
                            let data = json!({"error": {"code": "store", "message": e.to_string(), "lastSeq": sub.last_seq()}});
                            Some((named("error", data), Step::Done))
                        }
                        None => {
                            // Tells EventSource clients not to reconnect.
                            let data = json!({"runId": run_id, "lastSeq": sub.last_seq()});
                            Some((named("end", data), Step::Done))
                        }
                    },
                    _ = tokio::time::sleep(heartbeat) => Some((Bytes::from_static(b": heartbeat\n\n"), Step::Open)),
                };
                if let Some((bytes, step)) = out {
                    return Some((Ok(bytes), (sub, closing, step, run_id)));
                }
            }
        },
    )
}
