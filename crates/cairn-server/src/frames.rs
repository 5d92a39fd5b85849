//! Each event's wire forms (its SSE message and its WebSocket text), built
//! once and shared by every watcher of the run.
//!
//! A run with a thousand watchers would otherwise format, allocate and copy
//! every event a thousand times, and keep a thousand copies in the queues
//! of slow clients. The run's feed ([`crate::feed`]) builds each live
//! event's frame once; a watcher replaying older events builds its own.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::ws::Utf8Bytes;
use cairn_store::StoredEvent;

/// One event, ready to write.
pub(crate) struct Frame {
    pub seq: u64,
    /// `RunFinished`, `RunFailed` or `RunCancelled`.
    pub terminal: bool,
    /// `id: <seq>\ndata: <json>\n\n`
    pub sse: Bytes,
    /// `{"kind":"event","event":<json>}`
    pub ws: Utf8Bytes,
}

impl Frame {
    pub fn build(ev: &StoredEvent) -> Arc<Frame> {
        let json = &*ev.json;
        let mut sse = String::with_capacity(json.len() + 32);
        sse.push_str("id: ");
        sse.push_str(itoa(ev.seq, &mut [0; 20]));
        sse.push_str("\ndata: ");
        sse.push_str(json);
        sse.push_str("\n\n");
        Arc::new(Frame {
            seq: ev.seq,
            terminal: ev.is_terminal(),
            sse: Bytes::from(sse),
            ws: Utf8Bytes::from(ws_event_text(json)),
        })
    }
}

/// The WebSocket message that carries one event.
pub(crate) fn ws_event_text(json: &str) -> String {
    let mut s = String::with_capacity(json.len() + 28);
    s.push_str("{\"kind\":\"event\",\"event\":");
    s.push_str(json);
    s.push('}');
    s
}

fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{Event, EventKind, OutputStream, Scope};

    fn ev(seq: u64, text: &str) -> StoredEvent {
        StoredEvent::from_event(&Event {
            run_id: cairn_events::RunId::parse("r").unwrap(),
            seq: cairn_events::Seq(seq),
            timestamp_ms: 1,
            scope: Scope::node("n", 0).with_attempt(1),
            kind: EventKind::NodeOutput {
                text: text.into(),
                stream: OutputStream::Stdout,
            },
        })
    }

    #[test]
    fn frames_are_the_store_text() {
        let e = ev(7, "hi");
        let f = Frame::build(&e);
        assert_eq!(f.seq, 7);
        assert!(!f.terminal);
        assert_eq!(
            &f.sse[..],
            format!("id: 7\ndata: {}\n\n", e.json).as_bytes()
        );
        assert_eq!(
            f.ws.as_str(),
            format!("{{\"kind\":\"event\",\"event\":{}}}", e.json)
        );
    }
}
