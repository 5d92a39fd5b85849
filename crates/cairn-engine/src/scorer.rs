//! Running one scorer of a node: a command or a model that grades the
//! node's output with a number from 0 to 1 (WORKFLOW.md, "Scorers").
//!
//! A scorer runs after its node's attempt ended, so it writes nothing into
//! that attempt: its process streams no output, its model call no step
//! events. What the log says of it, `ScorerStarted` and then
//! `ScorerFinished` or `ScorerFailed`, is the driver's to write
//! (`driver/scoring.rs`).

use cairn_agent::{Conversation, Message, ModelRequest, StreamEvent};
use cairn_events::ErrorInfo;
use cairn_workflow::{NodeSpec, ScorerAgent, ScorerKind, ScorerSpec};
use serde_json::Value;

use crate::agent::strip_fence;
use crate::kinds::run_command;
use crate::node::EventObserver;
use crate::node::{NodeCtx, NodeError};

/// What a scorer said of an output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Score {
    /// From 0 to 1.
    pub score: f64,
    /// Why, when the scorer said.
    pub reason: Option<String>,
}

/// Why a scorer gave no score. Its `kind` is the `error.kind` of
/// `ScorerFailed`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScoreError {
    /// It printed (or answered) something that is not a score.
    #[error("the scorer's output is not a score (a number, or {{\"score\", \"reason\"}}): {0}")]
    BadOutput(String),
    /// It gave a number outside 0..1 (or not a number at all: NaN, infinity).
    #[error("the score {0} is outside 0..1")]
    OutOfRange(String),
    /// It could not run, or did not end well: the command's or the
    /// model's own error (`exit`, `spawn`, `sandbox`, `timeout`, `auth`, ...).
    #[error("{}", .0.info.message)]
    Run(NodeError),
}

impl ScoreError {
    /// The error as `ScorerFailed` carries it.
    pub(crate) fn into_info(self) -> ErrorInfo {
        match self {
            ScoreError::BadOutput(_) => ErrorInfo::new("bad_output", self.to_string()),
            ScoreError::OutOfRange(_) => ErrorInfo::new("out_of_range", self.to_string()),
            ScoreError::Run(e) => *e.info,
        }
    }

    /// Whether a cancel (the run's, or the engine's stop) ended it.
    pub(crate) fn is_cancelled(&self) -> bool {
        matches!(self, ScoreError::Run(e) if e.cancelled)
    }
}

impl From<NodeError> for ScoreError {
    fn from(e: NodeError) -> Self {
        ScoreError::Run(e)
    }
}

/// Runs `scorer` of node `node` on `output`. `ctx` is a context of the
/// node's own (its template scope with `output` added, the run's
/// services), whose events are run-scoped; its cancel token stops the
/// scorer.
pub(crate) async fn run(
    scorer: &ScorerSpec,
    node: &NodeSpec,
    ctx: &NodeCtx,
    output: &Value,
) -> Result<Score, ScoreError> {
    match &scorer.kind {
        ScorerKind::Command(argv) => {
            let input = serde_json::to_vec(output)
                .map_err(|e| NodeError::fatal("internal", e.to_string()))?;
            let stdout =
                run_command(node, argv, ctx, Some(input), EventObserver::quiet(ctx)).await?;
            parse_score(&stdout)
        }
        ScorerKind::Agent(agent) => ask_model(agent, ctx).await,
    }
}

/// An agent scorer: one call of its model, without tools, whose answer
/// must be a score.
async fn ask_model(agent: &ScorerAgent, ctx: &NodeCtx) -> Result<Score, ScoreError> {
    let name = agent.model.as_str();
    let def = ctx.workflow.models.get(name).ok_or_else(|| {
        NodeError::fatal(
            "config",
            format!("the workflow has no model named `{name}`"),
        )
    })?;
    let script = crate::agent::models::script(&ctx.workflow, name, def)?;
    let client = cairn_agent::client_for(def, script)
        .map_err(|e| NodeError::fatal(e.kind.as_str(), format!("model `{name}`: {e}")))?;
    let text = |t: &str| -> Result<String, NodeError> {
        Ok(match ctx.render(t)? {
            Value::String(s) => s,
            other => other.to_string(),
        })
    };
    let convo = Conversation {
        system: agent.system.as_deref().map(text).transpose()?,
        messages: vec![Message::User {
            text: text(&agent.prompt)?,
        }],
    };
    let req = ModelRequest {
        conversation: &convo,
        tools: &[],
        cache_key: None,
    };
    let mut on = |_: StreamEvent<'_>| {};
    let response = tokio::select! {
        r = client.complete(&req, &mut on) => r,
        _ = ctx.cancel.cancelled() => {
            return Err(NodeError::cancelled("cancelled while the model answered").into());
        }
    };
    let response = response
        .map_err(|e| NodeError::new(e.kind.as_str(), format!("model `{}`: {e}", client.model())))?;
    // The run's spend and summary count the call like an agent's.
    ctx.spend.add(&response.usage, response.cost_usd);
    parse_score(response.message.text.as_deref().unwrap_or_default())
}

/// A score from what a scorer printed or answered: a bare number, or a
/// JSON object with a number `score` and an optional `reason` (a Markdown
/// code fence around it is allowed).
pub(crate) fn parse_score(text: &str) -> Result<Score, ScoreError> {
    let t = strip_fence(text);
    let (score, reason) = match serde_json::from_str::<Value>(t) {
        Ok(Value::Number(n)) => (n.as_f64(), None),
        Ok(Value::Object(map)) => {
            let reason = match map.get("reason") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => Some(other.to_string()),
            };
            (map.get("score").and_then(Value::as_f64), reason)
        }
        // JSON has no NaN or infinity; a bare `nan` or `inf` is still a
        // number the scorer meant, and out of range.
        _ => (t.parse::<f64>().ok(), None),
    };
    let Some(score) = score else {
        return Err(ScoreError::BadOutput(head(t, 200)));
    };
    if !(0.0..=1.0).contains(&score) {
        return Err(ScoreError::OutOfRange(score.to_string()));
    }
    Ok(Score { score, reason })
}

/// At most `max` bytes of `s`, cut at a character boundary, quoted.
fn head(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < s.len() { "…" } else { "" };
    format!("{:?}{more}", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_read_from_objects_and_bare_numbers() {
        let s = parse_score("{\"score\": 0.75, \"reason\": \"short\"}\n").unwrap();
        assert_eq!((s.score, s.reason.as_deref()), (0.75, Some("short")));
        assert_eq!(parse_score(" 1\n").unwrap().score, 1.0);
        assert_eq!(
            parse_score("```json\n{\"score\": 0}\n```").unwrap().score,
            0.0
        );
        assert_eq!(parse_score(".5").unwrap().score, 0.5);
    }

    #[test]
    fn what_is_not_a_score_in_range_is_an_error_of_its_kind() {
        let kind = |t: &str| parse_score(t).unwrap_err().into_info().kind;
        assert_eq!(kind("garbage"), "bad_output");
        assert_eq!(kind(""), "bad_output");
        assert_eq!(kind("{\"reason\": \"no score\"}"), "bad_output");
        assert_eq!(kind("{\"score\": \"0.5\"}"), "bad_output");
        assert_eq!(kind("1.5"), "out_of_range");
        assert_eq!(kind("-0.1"), "out_of_range");
        assert_eq!(kind("NaN"), "out_of_range");
        assert_eq!(kind("inf"), "out_of_range");
    }
}
