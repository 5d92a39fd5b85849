//! A page of a run's log: `GET /v1/runs/{id}/events`.

use cairn_events::RunId;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// `GET /v1/runs/{id}/events`: events after a seq, in order, each the
/// store's JSON text byte for byte (the contract's form, as SSE and the
/// NDJSON mirror carry it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventsPage {
    /// The run.
    pub run_id: RunId,
    /// The events, as their stored text.
    pub events: Vec<Box<RawValue>>,
    /// The `after` of the next page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u64>,
}

/// An [`EventsPage`] written from the stored texts without reading them
/// again: a page holds up to 10,000 events, and each is already the JSON
/// the page must carry. Gives the same bytes as serializing the page.
pub fn events_page_json<'a>(
    run_id: &RunId,
    events: impl Iterator<Item = &'a str> + Clone,
    next_after: Option<u64>,
) -> String {
    let size: usize = events.clone().map(|e| e.len() + 1).sum();
    let mut body = String::with_capacity(size + run_id.len() + 64);
    body.push_str("{\"runId\":");
    body.push_str(&serde_json::to_string(run_id).expect("run ids serialize"));
    body.push_str(",\"events\":[");
    for (i, e) in events.enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(e);
    }
    body.push(']');
    if let Some(next) = next_after {
        body.push_str(",\"nextAfter\":");
        body.push_str(&next.to_string());
    }
    body.push('}');
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_and_the_type_give_the_same_bytes() {
        let texts = [
            r#"{"type":"RunStarted","runId":"r:1","seq":1,"timestampMs":5}"#,
            r#"{"type":"NodePending","runId":"r:1","seq":2,"timestampMs":6,"nodeId":"a"}"#,
        ];
        let run = RunId::parse("r:1").unwrap();
        for next in [None, Some(2)] {
            let written = events_page_json(&run, texts.iter().copied(), next);
            let page = EventsPage {
                run_id: run.clone(),
                events: texts
                    .iter()
                    .map(|t| RawValue::from_string(t.to_string()).unwrap())
                    .collect(),
                next_after: next,
            };
            assert_eq!(written, serde_json::to_string(&page).unwrap());
            let back: EventsPage = serde_json::from_str(&written).unwrap();
            assert_eq!(back.events[1].get(), texts[1]);
            assert_eq!(back.next_after, next);
        }
        assert_eq!(
            events_page_json(&RunId::parse("r").unwrap(), std::iter::empty(), None),
            r#"{"runId":"r","events":[]}"#
        );
    }
}
