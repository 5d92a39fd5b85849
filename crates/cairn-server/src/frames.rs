//! Each event's wire forms (its SSE message and its WebSocket text), built
//! once and shared by every watcher of the run.
//!
//! A run with a thousand watchers would otherwise format, allocate and copy
//! every event a thousand times, and keep a thousand copies in the
//! WebSocket queues of slow clients. Watchers of one run share a window of
//! the latest frames; a watcher replaying older events builds its own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use axum::body::Bytes;
use axum::extract::ws::Utf8Bytes;
use cairn_store::StoredEvent;

/// Frames a run keeps for watchers that are a little behind the others.
const WINDOW: usize = 1024;

/// One event, ready to write.
pub(crate) struct Frame {
    seq: u64,
    /// The store's JSON text, to tell this event from another with the same
    /// seq (a run deleted and started again under the same id).
    json: Arc<str>,
    /// `id: <seq>\ndata: <json>\n\n`
    pub sse: Bytes,
    /// `{"kind":"event","event":<json>}`
    pub ws: Utf8Bytes,
}

impl Frame {
    fn build(ev: &StoredEvent) -> Arc<Frame> {
        let json = &*ev.json;
        let mut sse = String::with_capacity(json.len() + 32);
        sse.push_str("id: ");
        sse.push_str(itoa(ev.seq, &mut [0; 20]));
        sse.push_str("\ndata: ");
        sse.push_str(json);
        sse.push_str("\n\n");
        Arc::new(Frame {
            seq: ev.seq,
            json: ev.json.clone(),
            sse: Bytes::from(sse),
            ws: Utf8Bytes::from(ws_event_text(json)),
        })
    }

    fn is(&self, ev: &StoredEvent) -> bool {
        self.seq == ev.seq && (Arc::ptr_eq(&self.json, &ev.json) || self.json == ev.json)
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

/// The shared frames of one run.
pub(crate) struct RunFrames {
    window: Mutex<VecDeque<Arc<Frame>>>,
}

impl RunFrames {
    /// The frame of `ev`: the shared one when another watcher built it
    /// already, else built now (and shared when it is among the latest).
    pub fn get(&self, ev: &StoredEvent) -> Arc<Frame> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(first), Some(last)) = (w.front(), w.back()) {
            let (first, last) = (first.seq, last.seq);
            if (first..=last).contains(&ev.seq) {
                let f = &w[(ev.seq - first) as usize];
                if f.is(ev) {
                    return f.clone();
                }
                // Not the event this window holds: start afresh.
                w.clear();
            } else if ev.seq < first {
                // A replay of older events: nobody else needs this frame.
                drop(w);
                return Frame::build(ev);
            } else if ev.seq != last + 1 {
                w.clear();
            }
        }
        let f = Frame::build(ev);
        if w.len() == WINDOW {
            w.pop_front();
        }
        w.push_back(f.clone());
        f
    }
}

/// Every run's shared frames, while some watcher holds them.
#[derive(Default)]
pub(crate) struct Registry {
    runs: Mutex<HashMap<String, Weak<RunFrames>>>,
}

impl Registry {
    /// The frames of `run_id`, shared with its other watchers.
    pub fn run(&self, run_id: &str) -> Arc<RunFrames> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = runs.get(run_id).and_then(Weak::upgrade) {
            return f;
        }
        // Forget runs nobody watches any more before adding one.
        runs.retain(|_, w| w.strong_count() > 0);
        let f = Arc::new(RunFrames {
            window: Mutex::new(VecDeque::new()),
        });
        runs.insert(run_id.to_string(), Arc::downgrade(&f));
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_events::{Event, EventKind, OutputStream, Scope};

    fn ev(seq: u64, text: &str) -> StoredEvent {
        StoredEvent::from_event(&Event {
            run_id: "r".into(),
            seq,
            timestamp_ms: 1,
            scope: Scope::node("n", 0).with_attempt(1),
            kind: EventKind::NodeOutput {
                text: text.into(),
                stream: OutputStream::Stdout,
            },
        })
    }

    #[test]
    fn frames_are_the_store_text_and_shared() {
        let reg = Registry::default();
        let a = reg.run("r");
        let b = reg.run("r");
        let e = ev(7, "hi");
        let fa = a.get(&e);
        let fb = b.get(&e);
        assert!(Arc::ptr_eq(&fa, &fb));
        assert_eq!(
            &fa.sse[..],
            format!("id: 7\ndata: {}\n\n", e.json).as_bytes()
        );
        assert_eq!(
            fa.ws.as_str(),
            format!("{{\"kind\":\"event\",\"event\":{}}}", e.json)
        );
    }

    #[test]
    fn a_different_event_under_a_cached_seq_gets_its_own_frame() {
        let reg = Registry::default();
        let r = reg.run("r");
        let old = r.get(&ev(1, "old"));
        let new = r.get(&ev(1, "new"));
        assert!(!Arc::ptr_eq(&old, &new));
        assert!(std::str::from_utf8(&new.sse).unwrap().contains("new"));
    }

    #[test]
    fn gaps_and_replays_never_mix_frames() {
        let reg = Registry::default();
        let r = reg.run("r");
        for s in 10..20 {
            r.get(&ev(s, &format!("e{s}")));
        }
        // Older than the window, and after a gap: still the right text.
        assert!(std::str::from_utf8(&r.get(&ev(3, "e3")).sse)
            .unwrap()
            .starts_with("id: 3\n"));
        let f = r.get(&ev(40, "e40"));
        assert!(std::str::from_utf8(&f.sse).unwrap().contains("e40"));
        assert!(std::str::from_utf8(&r.get(&ev(15, "e15")).sse)
            .unwrap()
            .contains("e15"));
        drop((r, f));
        assert!(reg.run("r").window.lock().unwrap().is_empty());
    }
}
