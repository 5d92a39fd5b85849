//! The scripted model: replays a file of turns. It is the model of the
//! examples, the docs and most tests: no key, no network, the same run
//! every time.
//!
//! Turn k is played for the call whose conversation holds k model
//! messages already, whatever the tools answered, so a conversation
//! rebuilt after a crash, or begun again by a retry, replays the same way.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use crate::client::{ModelClient, ModelRequest, StreamEvent};
use std::sync::Arc;

use cairn_models::ModelConfig;

use crate::error::{ModelError, ModelErrorKind};
use crate::message::{AssistantMessage, FinishReason, Message, ModelResponse, ToolCall, Usage};
use crate::price::Cost;

/// A script: the turns, and how their text is streamed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The model's answers in order.
    pub turns: Vec<Turn>,
    /// Stream text in pieces of this many characters (default: whole).
    #[serde(default)]
    pub chunk_chars: Option<usize>,
    /// Pause between two pieces, e.g. `20ms` (default: none).
    #[serde(default, deserialize_with = "duration")]
    pub chunk_delay: Option<Duration>,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// The answer's text.
    #[serde(default)]
    pub text: Option<String>,
    /// The model's reasoning.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// The tool calls asked for.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// The tokens reported (default: estimated from the texts' lengths).
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
}

/// A scripted tool call: `args` as an object, or `args_raw` as the text
/// the model "wrote" (to script broken arguments).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// The tool's name.
    pub name: String,
    /// The arguments.
    #[serde(default)]
    pub args: Option<Value>,
    /// The arguments' text, verbatim.
    #[serde(default)]
    pub args_raw: Option<String>,
}

/// Scripted token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from a cache.
    #[serde(default)]
    pub cache_read: Option<u64>,
}

fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    let Some(text) = text else { return Ok(None) };
    let t = text.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a duration like 20ms")))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => {
            return Err(serde::de::Error::custom(format!(
                "`{text}` is not a duration like 20ms or 1s"
            )))
        }
    };
    Ok(Some(d.min(Duration::from_secs(10))))
}

impl Script {
    /// A script from its parsed file (YAML or JSON); errors name the turn.
    pub fn from_value(v: Value) -> Result<Script, String> {
        let turns = v.get("turns").and_then(Value::as_array).cloned();
        let script: Script = serde_json::from_value(v).map_err(|e| {
            // Name the turn at fault: serde's message alone does not.
            if let Some(turns) = &turns {
                for (i, t) in turns.iter().enumerate() {
                    if let Err(e) = serde_json::from_value::<Turn>(t.clone()) {
                        return format!("turn {}: {e}", i + 1);
                    }
                }
            }
            e.to_string()
        })?;
        for (i, t) in script.turns.iter().enumerate() {
            for c in &t.tool_calls {
                if c.args.is_some() && c.args_raw.is_some() {
                    return Err(format!(
                        "turn {}: tool call `{}` has both `args` and `args_raw`",
                        i + 1,
                        c.name
                    ));
                }
            }
        }
        if script.turns.is_empty() {
            return Err("the script has no turns".into());
        }
        Ok(script)
    }
}

/// The scripted model.
pub struct Scripted {
    config: ModelConfig,
    script: Script,
}

impl Scripted {
    /// The scripted model of `config`, replaying `script` (its turns,
    /// read from the file `config.script` names).
    pub fn new(config: &ModelConfig, script: Option<Arc<Script>>) -> Result<Scripted, ModelError> {
        let script = script.ok_or_else(|| {
            ModelError::new(
                ModelErrorKind::Config,
                format!("scripted model `{}` has no script", config.model),
            )
        })?;
        Ok(Scripted {
            config: config.clone(),
            script: (*script).clone(),
        })
    }
}

#[async_trait]
impl ModelClient for Scripted {
    fn provider(&self) -> &'static str {
        self.config.provider.as_str()
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    async fn complete(
        &self,
        req: &ModelRequest<'_>,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<ModelResponse, ModelError> {
        let k = req
            .conversation
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        let turn = self.script.turns.get(k).ok_or_else(|| {
            ModelError::new(
                ModelErrorKind::Config,
                format!(
                    "the script of model `{}` has {} turns and was asked for turn {}",
                    self.config.model,
                    self.script.turns.len(),
                    k + 1
                ),
            )
        })?;
        if let Some(r) = &turn.reasoning {
            self.stream(r, &mut |p| on(StreamEvent::Reasoning(p))).await;
        }
        if let Some(t) = &turn.text {
            self.stream(t, &mut |p| on(StreamEvent::Text(p))).await;
        }
        let tool_calls: Vec<ToolCall> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: format!("call_{}_{}", k + 1, i),
                name: c.name.clone(),
                args: match (&c.args_raw, &c.args) {
                    (Some(raw), _) => raw.clone(),
                    (None, Some(v)) => v.to_string(),
                    (None, None) => "{}".into(),
                },
            })
            .collect();
        let usage = match turn.usage {
            Some(u) => Usage {
                input_tokens: u.input,
                output_tokens: u.output,
                cache_read_tokens: u.cache_read,
                ..Usage::default()
            },
            None => estimate(req, turn),
        };
        let finish_reason = if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        Ok(ModelResponse {
            message: AssistantMessage {
                text: turn.text.clone(),
                reasoning: turn.reasoning.clone(),
                tool_calls,
                provider_data: None,
            },
            cost_usd: self
                .config
                .price
                .map(|p| p.cost(self.config.provider, &usage)),
            usage,
            finish_reason,
        })
    }
}

impl Scripted {
    async fn stream(&self, text: &str, emit: &mut (dyn FnMut(&str) + Send)) {
        let Some(n) = self.script.chunk_chars.filter(|n| *n > 0) else {
            emit(text);
            return;
        };
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let mut start = 0;
        for piece in chars.chunks(n) {
            let end = piece.last().map_or(start, |(i, c)| i + c.len_utf8());
            emit(&text[start..end]);
            start = end;
            if let Some(d) = self.script.chunk_delay {
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// Token counts for a turn without `usage`: about four characters a
/// token, the same for the same conversation.
fn estimate(req: &ModelRequest<'_>, turn: &Turn) -> Usage {
    let c = req.conversation;
    let mut input = c.system.as_ref().map_or(0, String::len);
    for m in &c.messages {
        input += match m {
            Message::User { text } => text.len(),
            Message::Assistant(a) => {
                a.text.as_ref().map_or(0, String::len)
                    + a.tool_calls.iter().map(|t| t.args.len()).sum::<usize>()
            }
            Message::ToolResults(r) => r.iter().map(|r| r.content.len()).sum(),
        };
    }
    let output = turn.text.as_ref().map_or(0, String::len)
        + turn.reasoning.as_ref().map_or(0, String::len)
        + turn
            .tool_calls
            .iter()
            .map(|c| c.name.len() + 16)
            .sum::<usize>();
    Usage {
        input_tokens: (input as u64).div_ceil(4),
        output_tokens: (output as u64).div_ceil(4).max(1),
        ..Usage::default()
    }
}
