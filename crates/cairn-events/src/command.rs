//! Commands: what people and other processes ask of a run.
//!
//! Every front end (the CLI, HTTP, WebSocket, the Rust API) sends the same
//! [`RunCommand`] the same way: it is recorded durably in the run's inbox,
//! the process driving the run is woken, and the caller's acknowledgement is
//! the event that the command produced ([`RunCommand::is_result`]), or a
//! `Diagnostic` from the inbox naming the command when it was refused
//! ([`InboxReply::parse`]). Nothing here does I/O.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{Event, EventKind, Level};

/// One request to a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum RunCommand {
    /// Grant the approval a node waits for.
    Approve {
        /// The gate's node id (its latest waiting pass).
        node_id: String,
        /// A note kept with the decision.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        /// Who decided.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Deny the approval a node waits for.
    Deny {
        /// The gate's node id (its latest waiting pass).
        node_id: String,
        /// A note kept with the decision.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        /// Who decided.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Answer a question a node asked.
    Answer {
        /// The question's `requestId`.
        request_id: String,
        /// The answer, as JSON.
        answer: Value,
        /// Who answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Take a running agent's conversation: it stops at its next step
    /// boundary and asks a person for each turn until handed back.
    Hijack {
        /// The agent node's id (its latest running pass).
        node_id: String,
        /// Who asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Cancel the run.
    Cancel {
        /// Let running nodes finish instead of killing them.
        #[serde(default)]
        graceful: bool,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Who asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
}

impl RunCommand {
    /// The command's name as people type it: approve, deny, answer,
    /// cancel, hijack.
    pub fn name(&self) -> &'static str {
        match self {
            RunCommand::Approve { .. } => "approve",
            RunCommand::Deny { .. } => "deny",
            RunCommand::Answer { .. } => "answer",
            RunCommand::Cancel { .. } => "cancel",
            RunCommand::Hijack { .. } => "hijack",
        }
    }

    /// Whether `ev` is the event that carrying out this command appends.
    /// Two commands for the same gate cannot both succeed (the second finds
    /// it decided), so matching by type and node is unambiguous.
    pub fn is_result(&self, ev: &Event) -> bool {
        match (self, &ev.kind) {
            (RunCommand::Approve { node_id, .. }, EventKind::ApprovalGranted { .. })
            | (RunCommand::Deny { node_id, .. }, EventKind::ApprovalDenied { .. }) => {
                ev.scope.node_id.as_deref() == Some(node_id)
            }
            (
                RunCommand::Answer { request_id, .. },
                EventKind::InputReceived { request_id: r, .. },
            ) => r == request_id,
            (RunCommand::Cancel { .. }, EventKind::RunCancelRequested { .. }) => true,
            (
                RunCommand::Hijack { node_id, .. },
                EventKind::RunHijackRequested { node_id: n, .. },
            ) => n == node_id,
            _ => false,
        }
    }
}

/// The `source` of the `Diagnostic` events in which a run's driver says
/// what became of a command that produced no event of its own.
pub const INBOX_SOURCE: &str = "inbox";

/// What a driver said about one command in a `Diagnostic` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxReply {
    /// The command's id in the inbox.
    pub id: u64,
    /// False when the command was refused (`level: warn`); true when it was
    /// taken without an event of its own (a second cancel).
    pub accepted: bool,
    /// Why, for people.
    pub message: String,
}

impl InboxReply {
    /// The event that carries this reply.
    pub fn to_event_kind(&self) -> EventKind {
        EventKind::Diagnostic {
            level: if self.accepted {
                Level::Info
            } else {
                Level::Warn
            },
            source: INBOX_SOURCE.to_string(),
            message: format!("command {}: {}", self.id, self.message),
        }
    }

    /// The reply an event carries, if it is one.
    pub fn parse(ev: &Event) -> Option<InboxReply> {
        let EventKind::Diagnostic {
            level,
            source,
            message,
        } = &ev.kind
        else {
            return None;
        };
        if source != INBOX_SOURCE {
            return None;
        }
        let rest = message.strip_prefix("command ")?;
        let (id, text) = rest.split_once(": ")?;
        Some(InboxReply {
            id: id.parse().ok()?,
            accepted: !matches!(level, Level::Warn | Level::Error),
            message: text.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Scope;

    #[test]
    fn commands_round_trip_in_camel_case() {
        let c = RunCommand::Answer {
            request_id: "q1".into(),
            answer: serde_json::json!({"ok": true}),
            by: Some("ann".into()),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(
            text,
            r#"{"type":"answer","requestId":"q1","answer":{"ok":true},"by":"ann"}"#
        );
        assert_eq!(serde_json::from_str::<RunCommand>(&text).unwrap(), c);
    }

    #[test]
    fn replies_round_trip_through_a_diagnostic() {
        let r = InboxReply {
            id: 42,
            accepted: false,
            message: "node `gate` is not waiting: it has finished".into(),
        };
        let ev = Event {
            run_id: crate::RunId::parse("r").unwrap(),
            seq: crate::Seq(9),
            timestamp_ms: 0,
            scope: Scope::run(),
            kind: r.to_event_kind(),
        };
        assert_eq!(InboxReply::parse(&ev), Some(r));
    }

    #[test]
    fn results_match_by_node() {
        let c = RunCommand::Approve {
            node_id: "gate".into(),
            note: None,
            by: None,
        };
        let ev = |node: &str, kind| Event {
            run_id: crate::RunId::parse("r").unwrap(),
            seq: crate::Seq(1),
            timestamp_ms: 0,
            scope: Scope::node(node, 0),
            kind,
        };
        let granted = || EventKind::ApprovalGranted {
            decided_by: None,
            note: None,
        };
        assert!(c.is_result(&ev("gate", granted())));
        assert!(!c.is_result(&ev("other", granted())));
        assert!(!c.is_result(&ev(
            "gate",
            EventKind::ApprovalDenied {
                decided_by: None,
                note: None
            }
        )));
    }
}
