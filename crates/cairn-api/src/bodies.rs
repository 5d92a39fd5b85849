//! The bodies of the routes that act (start, decide, answer, cancel,
//! resume, hijack, log in) and their small answers.
//!
//! Requests refuse fields they do not know, so a typo is an error rather
//! than a silently ignored option; the client leaves out what it does not
//! set. The type names are part of what a malformed body's error says
//! (`expected struct StartBody`), so they stay as they are.

use cairn_events::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/runs`: start a run of a workflow of the server's folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StartBody {
    /// A file of the server's workflows folder, by name (`review`,
    /// `review.yaml`, `team/review`), never a path.
    pub workflow: String,
    /// The run's input; `{}` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The run's id; one is made when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Nodes that may run at once.
    #[serde(
        default,
        deserialize_with = "count",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrency: Option<usize>,
}

/// `POST /v1/runs/{id}/resume`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResumeBody {
    /// Nodes that may run at once.
    #[serde(
        default,
        deserialize_with = "count",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrency: Option<usize>,
}

/// A count of at least 1, written as an integer (`4`, or `4.0`, which JSON
/// Schema calls an integer too); `null` reads as absent.
fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let whole = n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64)
            .map(|f| f as u64)
    });
    match whole.and_then(|w| usize::try_from(w).ok()) {
        Some(c) if c >= 1 => Ok(Some(c)),
        _ => Err(D::Error::custom(format!(
            "`maxConcurrency`: {n} is not a whole number of at least 1"
        ))),
    }
}

/// `POST /v1/runs/{id}/approvals/{node}`: a person's decision on a node
/// waiting for approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// Approved or denied.
    pub approved: bool,
    /// Why, for the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Who decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `POST /v1/runs/{id}/inputs/{requestId}`: the answer to a question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    /// The answer, checked against the question's schema.
    pub value: Value,
    /// Who answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `POST /v1/runs/{id}/cancel`; may be empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Let running nodes reach a safe point first.
    #[serde(default)]
    pub graceful: bool,
    /// Why, for the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `POST /v1/runs/{id}/nodes/{node}/hijack`; may be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HijackBody {
    /// Who takes the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `POST /v1/runs/{id}/nodes/{node}/hijack` (202): the agent was asked to
/// stop at its next step boundary; what follows is in the run's events
/// after `seq` (the person's turns are questions whose ids start `h-`,
/// answered at `POST /v1/runs/{id}/inputs/{requestId}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HijackRequested {
    /// The run.
    pub run_id: RunId,
    /// The agent node.
    pub node_id: String,
    /// The seq of the `RunHijackRequested` that took the request.
    pub seq: u64,
}

/// `POST /v1/session`: a login with the server's token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginBody {
    /// The server's token.
    pub token: String,
}

/// `POST /v1/runs` (201) and `POST /v1/runs/{id}/resume` (202): the run
/// that goes on in the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAccepted {
    /// Its id.
    pub run_id: RunId,
}

/// `POST /v1/runs/{id}/approvals/{node}`: the decision taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decided {
    /// The run.
    pub run_id: RunId,
    /// The node decided on.
    pub node_id: String,
    /// The decision.
    pub approved: bool,
}

/// `POST /v1/runs/{id}/inputs/{requestId}`: the answer taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answered {
    /// The run.
    pub run_id: RunId,
    /// The question answered.
    pub request_id: String,
}

/// `POST /v1/runs/{id}/cancel` (202): the cancel asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    /// The run.
    pub run_id: RunId,
    /// How it is being cancelled.
    pub mechanism: CancelMechanism,
}

/// How a run is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelMechanism {
    /// Running nodes are stopped now.
    Immediate,
    /// Running nodes reach a safe point first.
    Graceful,
}

impl CancelMechanism {
    /// The mechanism a cancel asks for.
    pub fn of(graceful: bool) -> Self {
        if graceful {
            CancelMechanism::Graceful
        } else {
            CancelMechanism::Immediate
        }
    }
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

impl Health {
    /// The server answers.
    pub fn ok() -> Self {
        Health {
            status: "ok".into(),
        }
    }
}

/// `GET` and `POST /v1/session`: whether the server needs a token and
/// whether this request may use the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// Whether the server has a token.
    pub token_required: bool,
    /// Whether this request may use the API (always true without a token).
    pub authenticated: bool,
}
