//! Anthropic's Messages API, streamed.
//!
//! Blocks arrive by index (`text`, `tool_use`, `thinking`,
//! `redacted_thinking`) and grow by deltas (`text_delta`,
//! `input_json_delta`, `thinking_delta`, `signature_delta`). Usage comes
//! from `message_start` and then `message_delta`, whose figures are
//! cumulative: the latest value is kept, never added. Thinking blocks go
//! back to the model, with their signatures, in the next request
//! ([`AssistantMessage::provider_data`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::client::{ModelClient, ModelRequest, StreamEvent};
use cairn_models::ModelConfig;

use crate::error::{ModelError, ModelErrorKind};
use crate::http::{self, cut, too_large};
use crate::message::{AssistantMessage, FinishReason, Message, ModelResponse, ToolCall, Usage};
use crate::price::Cost;
use crate::sse::SseEvent;
use crate::{MAX_ANSWER_BYTES, MAX_TOOL_CALLS};

/// `max_tokens` when the model gives none (the API requires one).
const DEFAULT_MAX_TOKENS: u32 = 8192;

/// A model behind the Messages API.
pub struct Anthropic {
    config: ModelConfig,
    key: String,
    url: String,
    http: http::HttpClient,
}

impl Anthropic {
    /// A client of `config`'s model with `key`.
    pub fn new(config: &ModelConfig, key: String) -> Result<Anthropic, ModelError> {
        let base = http::base_url(config);
        Ok(Anthropic {
            config: config.clone(),
            key,
            url: format!("{base}/v1/messages"),
            http: http::HttpClient::new()?,
        })
    }

    /// The request's JSON body: the same conversation gives the same bytes.
    pub fn body(&self, req: &ModelRequest<'_>) -> Value {
        let mut messages = Vec::new();
        for m in &req.conversation.messages {
            match m {
                Message::User { text } => messages.push(json!({"role": "user", "content": text})),
                Message::Assistant(a) => {
                    let mut content: Vec<Value> = a
                        .provider_data
                        .as_ref()
                        .and_then(|d| d["thinking"].as_array())
                        .cloned()
                        .unwrap_or_default();
                    if let Some(t) = a.text.as_ref().filter(|t| !t.is_empty()) {
                        content.push(json!({"type": "text", "text": t}));
                    }
                    for c in &a.tool_calls {
                        let input: Value = serde_json::from_str(&c.args)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({}));
                        content.push(
                            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                        );
                    }
                    if content.is_empty() {
                        content.push(json!({"type": "text", "text": "(no answer)"}));
                    }
                    messages.push(json!({"role": "assistant", "content": content}));
                }
                Message::ToolResults(results) => {
                    let content: Vec<Value> = results
                        .iter()
                        .map(|r| {
                            json!({
                                "type": "tool_result",
                                "tool_use_id": r.call_id,
                                "content": r.content,
                                "is_error": r.is_error,
                            })
                        })
                        .collect();
                    messages.push(json!({"role": "user", "content": content}));
                }
            }
        }
        let cache = self.config.prompt_cache_on();
        if cache {
            mark_history(&mut messages);
        }
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": self.config.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            "stream": true,
        });
        if let Some(s) = &req.conversation.system {
            body["system"] = if cache {
                json!([{"type": "text", "text": s, "cache_control": ephemeral()}])
            } else {
                json!(s)
            };
        }
        body["messages"] = Value::Array(messages);
        if !req.tools.is_empty() {
            let mut tools: Vec<Value> = req
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
            if let (true, Some(last)) = (cache, tools.last_mut()) {
                last["cache_control"] = ephemeral();
            }
            body["tools"] = Value::Array(tools);
        }
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        body
    }
}

/// Anthropic's mark of a cache breakpoint: the prompt up to and including
/// the marked block is cached for five minutes.
fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// Marks the stable prefix of the history for the prompt cache: the last
/// block of the last message (what the next step will find cached) and of
/// the message the previous step ended with (what that step cached, read
/// now). With the tools' and the system prompt's, that is the API's
/// limit of four breakpoints. The marks depend on the conversation alone,
/// so a conversation rebuilt after a crash gives the same bytes.
fn mark_history(messages: &mut [Value]) {
    let last = messages.len().checked_sub(1);
    // The previous request ended just before the latest answer.
    let previous = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .and_then(|i| i.checked_sub(1));
    for i in [previous, last].into_iter().flatten() {
        let m = &mut messages[i];
        if let Some(text) = m["content"].as_str() {
            m["content"] = json!([{"type": "text", "text": text}]);
        }
        if let Some(block) = m["content"].as_array_mut().and_then(|c| c.last_mut()) {
            block["cache_control"] = ephemeral();
        }
    }
}

#[async_trait]
impl ModelClient for Anthropic {
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
        let mut headers = http::json_headers(&self.key, http::KeyHeader::Named("x-api-key"))?;
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static("2023-06-01"),
        );
        let body = serde_json::to_vec(&self.body(req)).expect("JSON values serialize");
        http::call_sse::<Answer>(
            &self.http,
            &self.config,
            &self.url,
            headers,
            body,
            &self.key,
            on,
        )
        .await
    }
}

/// One content block as its deltas build it.
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(Value),
    Other,
}

/// The answer as its events build it.
#[derive(Default)]
struct Answer {
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    stop: Option<String>,
    bytes: usize,
}

impl http::Decoder for Answer {
    const END: &'static str = "message_stop";

    /// Takes one event; true at `message_stop`.
    fn take(
        &mut self,
        ev: &SseEvent,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<bool, ModelError> {
        let data: Value = match ev.event.as_str() {
            "ping" => return Ok(false),
            _ => serde_json::from_str(&ev.data).map_err(|e| {
                ModelError::new(
                    ModelErrorKind::Protocol,
                    format!("an event is not JSON ({e}): {}", cut(&ev.data, 200)),
                )
            })?,
        };
        let kind = if ev.event.is_empty() {
            data["type"].as_str().unwrap_or("")
        } else {
            ev.event.as_str()
        };
        match kind {
            "message_start" => self.usage_from(&data["message"]["usage"]),
            "content_block_start" => {
                let index = data["index"].as_u64().unwrap_or(0);
                if self.blocks.len() >= MAX_TOOL_CALLS * 2 {
                    return Err(too_large());
                }
                let b = &data["content_block"];
                let block = match b["type"].as_str() {
                    Some("text") => Block::Text(b["text"].as_str().unwrap_or("").to_string()),
                    Some("tool_use") => Block::ToolUse {
                        id: b["id"].as_str().unwrap_or("").to_string(),
                        name: b["name"].as_str().unwrap_or("").to_string(),
                        json: String::new(),
                    },
                    Some("thinking") => Block::Thinking {
                        thinking: b["thinking"].as_str().unwrap_or("").to_string(),
                        signature: b["signature"].as_str().unwrap_or("").to_string(),
                    },
                    Some("redacted_thinking") => Block::Redacted(b.clone()),
                    _ => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let index = data["index"].as_u64().unwrap_or(0);
                let d = &data["delta"];
                let piece = |f: &str| d[f].as_str().unwrap_or("").to_string();
                let grown = match (self.blocks.get_mut(&index), d["type"].as_str()) {
                    (Some(Block::Text(t)), Some("text_delta")) => {
                        let p = piece("text");
                        on(StreamEvent::Text(&p));
                        t.push_str(&p);
                        p.len()
                    }
                    (Some(Block::ToolUse { json, .. }), Some("input_json_delta")) => {
                        let p = piece("partial_json");
                        json.push_str(&p);
                        p.len()
                    }
                    (Some(Block::Thinking { thinking, .. }), Some("thinking_delta")) => {
                        let p = piece("thinking");
                        on(StreamEvent::Reasoning(&p));
                        thinking.push_str(&p);
                        p.len()
                    }
                    (Some(Block::Thinking { signature, .. }), Some("signature_delta")) => {
                        let p = piece("signature");
                        signature.push_str(&p);
                        p.len()
                    }
                    _ => 0,
                };
                self.bytes += grown;
                if self.bytes > MAX_ANSWER_BYTES {
                    return Err(too_large());
                }
            }
            "message_delta" => {
                if let Some(s) = data["delta"]["stop_reason"].as_str() {
                    self.stop = Some(s.to_string());
                }
                self.usage_from(&data["usage"]);
            }
            "message_stop" => return Ok(true),
            "error" => {
                let msg = data["error"]["message"].as_str().unwrap_or("no message");
                let kind = data["error"]["type"].as_str().unwrap_or("error");
                return Err(ModelError::new(
                    ModelErrorKind::StreamError,
                    format!("the provider sent an error ({kind}): {}", cut(msg, 500)),
                ));
            }
            _ => {}
        }
        Ok(false)
    }

    fn finish(self, config: &ModelConfig) -> Result<ModelResponse, ModelError> {
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        let mut thinking = Vec::new();
        for block in self.blocks.into_values() {
            match block {
                Block::Text(t) => text.push_str(&t),
                Block::ToolUse { id, name, json } => calls.push(ToolCall {
                    id,
                    name,
                    args: if json.is_empty() { "{}".into() } else { json },
                }),
                Block::Thinking {
                    thinking: t,
                    signature,
                } => {
                    reasoning.push_str(&t);
                    thinking
                        .push(json!({"type": "thinking", "thinking": t, "signature": signature}));
                }
                Block::Redacted(b) => thinking.push(b),
                Block::Other => {}
            }
        }
        let finish_reason = match self.stop.as_deref() {
            Some("end_turn") | Some("stop_sequence") | None => {
                if calls.is_empty() {
                    FinishReason::Stop
                } else {
                    FinishReason::ToolCalls
                }
            }
            Some("tool_use") => FinishReason::ToolCalls,
            Some("max_tokens") => FinishReason::MaxTokens,
            Some("refusal") => FinishReason::ContentFilter,
            Some(other) => FinishReason::Other(other.to_string()),
        };
        let usage = self.usage;
        Ok(ModelResponse {
            message: AssistantMessage {
                text: (!text.is_empty()).then_some(text),
                reasoning: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls: calls,
                provider_data: (!thinking.is_empty()).then(|| json!({ "thinking": thinking })),
            },
            cost_usd: config
                .effective_price()
                .map(|p| p.cost(config.provider, &usage)),
            usage,
            finish_reason,
        })
    }
}

impl Answer {
    /// Usage figures are the call's totals so far: each replaces the last.
    fn usage_from(&mut self, u: &Value) {
        if !u.is_object() {
            return;
        }
        if let Some(n) = u["input_tokens"].as_u64() {
            self.usage.input_tokens = n;
        }
        if let Some(n) = u["output_tokens"].as_u64() {
            self.usage.output_tokens = n;
        }
        if let Some(n) = u["cache_read_input_tokens"].as_u64() {
            self.usage.cache_read_tokens = Some(n);
        }
        if let Some(n) = u["cache_creation_input_tokens"].as_u64() {
            self.usage.cache_write_tokens = Some(n);
        }
    }
}
