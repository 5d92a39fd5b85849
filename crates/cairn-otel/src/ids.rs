//! Trace and span ids derived from what a span is, never drawn at random:
//! a run exported again (after a resume, or by `cairn trace`) gives the same
//! ids, so a backend sees one trace however many times it was sent.

use sha2::{Digest, Sha256};

/// What a span stands for. Its id hashes these fields with the root run's
/// id, so the same thing in the same tree always gets the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKey<'a> {
    /// A whole run, across its sessions.
    Run {
        /// The run.
        run_id: &'a str,
    },
    /// One attempt of one pass of a node.
    Attempt {
        /// The run.
        run_id: &'a str,
        /// The node instance's path.
        node_id: &'a str,
        /// The loop pass.
        iteration: u32,
        /// The attempt, from 1.
        attempt: u32,
    },
    /// One model call of an agent attempt.
    ModelCall {
        /// The run.
        run_id: &'a str,
        /// The node instance's path.
        node_id: &'a str,
        /// The loop pass.
        iteration: u32,
        /// The attempt, from 1.
        attempt: u32,
        /// The conversation's step, from 1.
        step: u32,
    },
    /// One tool call of an attempt.
    ToolCall {
        /// The run.
        run_id: &'a str,
        /// The node instance's path.
        node_id: &'a str,
        /// The loop pass.
        iteration: u32,
        /// The attempt, from 1.
        attempt: u32,
        /// The call's place in the attempt, from 1.
        tool_seq: u32,
    },
}

/// Feeds a field with its length first, so that no two different lists of
/// fields hash the same bytes (`"ab","c"` against `"a","bc"`).
fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The trace of a tree of runs: its root run's id, hashed.
pub fn trace_id(root_run_id: &str) -> [u8; 16] {
    let mut h = Sha256::new();
    field(&mut h, b"cairn.trace");
    field(&mut h, root_run_id.as_bytes());
    let digest = h.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    nonzero(&mut id);
    id
}

/// The id of the span `key` stands for, in the trace of `root_run_id`.
pub fn span_id(root_run_id: &str, key: &SpanKey<'_>) -> [u8; 8] {
    let mut h = Sha256::new();
    field(&mut h, b"cairn.span");
    field(&mut h, root_run_id.as_bytes());
    let num = |h: &mut Sha256, n: u32| field(h, &n.to_le_bytes());
    match *key {
        SpanKey::Run { run_id } => {
            field(&mut h, b"run");
            field(&mut h, run_id.as_bytes());
        }
        SpanKey::Attempt {
            run_id,
            node_id,
            iteration,
            attempt,
        } => {
            field(&mut h, b"attempt");
            field(&mut h, run_id.as_bytes());
            field(&mut h, node_id.as_bytes());
            num(&mut h, iteration);
            num(&mut h, attempt);
        }
        SpanKey::ModelCall {
            run_id,
            node_id,
            iteration,
            attempt,
            step,
        } => {
            field(&mut h, b"model");
            field(&mut h, run_id.as_bytes());
            field(&mut h, node_id.as_bytes());
            num(&mut h, iteration);
            num(&mut h, attempt);
            num(&mut h, step);
        }
        SpanKey::ToolCall {
            run_id,
            node_id,
            iteration,
            attempt,
            tool_seq,
        } => {
            field(&mut h, b"tool");
            field(&mut h, run_id.as_bytes());
            field(&mut h, node_id.as_bytes());
            num(&mut h, iteration);
            num(&mut h, attempt);
            num(&mut h, tool_seq);
        }
    }
    let digest = h.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    nonzero(&mut id);
    id
}

/// An id of all zeros means "no id" in OTLP; a hash that comes out so
/// (one chance in 2^64) is nudged.
fn nonzero(id: &mut [u8]) {
    if id.iter().all(|&b| b == 0) {
        if let Some(last) = id.last_mut() {
            *last = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_tell_spans_apart() {
        assert_eq!(trace_id("r"), trace_id("r"));
        assert_ne!(trace_id("r"), trace_id("s"));
        let a = SpanKey::Attempt {
            run_id: "r",
            node_id: "n",
            iteration: 0,
            attempt: 1,
        };
        let b = SpanKey::Attempt {
            run_id: "r",
            node_id: "n",
            iteration: 0,
            attempt: 2,
        };
        assert_eq!(span_id("r", &a), span_id("r", &a));
        assert_ne!(span_id("r", &a), span_id("r", &b));
        // The same attempt in another tree is another span.
        assert_ne!(span_id("r", &a), span_id("q", &a));
        // Field boundaries count.
        let c = SpanKey::Run { run_id: "ab" };
        let d = SpanKey::Attempt {
            run_id: "a",
            node_id: "b",
            iteration: 0,
            attempt: 0,
        };
        assert_ne!(span_id("r", &c), span_id("r", &d));
    }
}
