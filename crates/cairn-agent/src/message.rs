//! The normalized conversation: what every provider's wire format is
//! translated from and to, and what the engine keeps in the log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A conversation with a model: a system prompt and the messages so far.
/// Rebuilt from the log after a crash, it must produce the same request
/// bytes, so providers serialize it deterministically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    /// The system prompt, if any.
    pub system: Option<String>,
    /// The messages in order.
    pub messages: Vec<Message>,
}

impl Conversation {
    /// About how many tokens a request of this conversation and `tools`
    /// holds: a quarter of its bytes, and a few for each message's
    /// framing. Rough on purpose (every model counts its own way); what
    /// the provider reports corrects it where that matters.
    pub fn estimated_tokens(&self, tools: &[ToolDef]) -> u64 {
        let mut bytes = self.system.as_ref().map_or(0, String::len);
        let mut framing = 0usize;
        for m in &self.messages {
            framing += 1;
            bytes += match m {
                Message::User { text } => text.len(),
                Message::Assistant(a) => {
                    a.text.as_ref().map_or(0, String::len)
                        + a.reasoning.as_ref().map_or(0, String::len)
                        + a.tool_calls
                            .iter()
                            .map(|c| c.name.len() + c.args.len() + c.id.len())
                            .sum::<usize>()
                }
                Message::ToolResults(rs) => {
                    framing += rs.len();
                    rs.iter().map(|r| r.content.len() + r.call_id.len()).sum()
                }
            };
        }
        for t in tools {
            bytes += t.name.len() + t.description.len() + t.parameters.to_string().len();
        }
        (bytes as u64).div_ceil(4) + 4 * framing as u64
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// What the user (the workflow) says.
    User {
        /// The text.
        text: String,
    },
    /// The model's answer.
    Assistant(AssistantMessage),
    /// The results of one assistant message's tool calls, in call order.
    ToolResults(Vec<ToolResult>),
}

/// A model's whole answer: what `AgentStepFinished.message` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssistantMessage {
    /// The answer's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The model's reasoning, where the provider streams it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The tools the model asks to call, in its order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// What the provider needs back verbatim on the next request
    /// (Anthropic's thinking blocks with their signatures, redacted
    /// thinking): opaque, provider-specific.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_data: Option<Value>,
}

/// One tool call a model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id of the call, which its result must name.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments exactly as the model wrote them (JSON text, possibly
    /// broken: the tool layer says so to the model).
    pub args: String,
}

/// The result of one tool call, as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The result's text.
    pub content: String,
    /// The call failed (the text says why).
    pub is_error: bool,
}

/// A tool as a model is told of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// Tokens of one model call, as the provider reported them.
///
/// `input_tokens` is the provider's own figure: OpenAI's `prompt_tokens`
/// includes the tokens read from its cache (`cache_read_tokens`), while
/// Anthropic's `input_tokens` excludes both cache reads and cache writes.
/// The prices ([`crate::Price::cost`]) know which is which.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write_tokens: Option<u64>,
    /// Output tokens spent on reasoning.
    pub reasoning_tokens: Option<u64>,
}

/// Why a model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// It answered.
    Stop,
    /// It asked for tool calls.
    ToolCalls,
    /// It ran out of `max_tokens`.
    MaxTokens,
    /// The provider's filter stopped it.
    ContentFilter,
    /// Anything else, as the provider said it.
    Other(String),
}

impl FinishReason {
    /// As `AgentStepFinished.finishReason` writes it.
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::MaxTokens => "max_tokens",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(s) => s,
        }
    }
}

/// One model call's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The model's whole message.
    pub message: AssistantMessage,
    /// The call's tokens.
    pub usage: Usage,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// What the call cost, when the model's price is known.
    pub cost_usd: Option<f64>,
}
