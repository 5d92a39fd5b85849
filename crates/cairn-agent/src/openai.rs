//! OpenAI's Chat Completions, streamed: what OpenAI, vLLM, Ollama,
//! llama.cpp's server and OpenRouter speak.
//!
//! Tool-call deltas are keyed by `index`, with `id` and `name` only on the
//! first delta of a call; usage comes in a last chunk when
//! `stream_options.include_usage` is set (some servers never send one:
//! the usage is then zero). `reasoning_content` deltas (vLLM, DeepSeek)
//! are reasoning.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::client::{ModelClient, ModelRequest, StreamEvent};
use cairn_models::ModelConfig;

use crate::error::{ModelError, ModelErrorKind};
use crate::http::{self, cut, too_large};
use crate::message::{AssistantMessage, FinishReason, Message, ModelResponse, ToolCall, Usage};
use crate::price::Cost;
use crate::sse::SseEvent;
use crate::{MAX_ANSWER_BYTES, MAX_TOOL_CALLS};

/// A model behind a Chat Completions endpoint.
pub struct OpenAi {
    config: ModelConfig,
    key: String,
    url: String,
    http: http::HttpClient,
}

impl OpenAi {
    /// A client of `config`'s model with `key` (empty: no `Authorization`).
    pub fn new(config: &ModelConfig, key: String) -> Result<OpenAi, ModelError> {
        let base = http::base_url(config);
        Ok(OpenAi {
            config: config.clone(),
            key,
            url: format!("{base}/chat/completions"),
            http: http::HttpClient::new()?,
        })
    }

    /// The request's JSON body: the same conversation gives the same bytes.
    pub fn body(&self, req: &ModelRequest<'_>) -> Value {
        let mut messages = Vec::new();
        if let Some(s) = &req.conversation.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        for m in &req.conversation.messages {
            match m {
                Message::User { text } => messages.push(json!({"role": "user", "content": text})),
                Message::Assistant(a) => {
                    let mut msg = json!({"role": "assistant", "content": a.text});
                    if !a.tool_calls.is_empty() {
                        msg["tool_calls"] = a
                            .tool_calls
                            .iter()
                            .map(|c| {
                                json!({
                                    "id": c.id,
                                    "type": "function",
                                    "function": {"name": c.name, "arguments": c.args},
                                })
                            })
                            .collect();
                    }
                    messages.push(msg);
                }
                Message::ToolResults(results) => {
                    for r in results {
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": r.call_id,
                            "content": r.content,
                        }));
                    }
                }
            }
        }
        let mut body = json!({
            "model": self.config.model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": messages,
        });
        if !req.tools.is_empty() {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "function",
                        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                    })
                })
                .collect();
        }
        if let (true, Some(k)) = (self.config.prompt_cache_on(), req.cache_key) {
            // OpenAI caches every long prefix by itself; the key keeps one
            // conversation's requests where its prefix is cached.
            body["prompt_cache_key"] = json!(k);
        }
        if let Some(n) = self.config.max_tokens {
            body["max_tokens"] = json!(n);
        }
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        body
    }
}

#[async_trait]
impl ModelClient for OpenAi {
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
        let headers = http::json_headers(&self.key, http::KeyHeader::Bearer)?;
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

/// The answer as its chunks build it.
#[derive(Default)]
struct Answer {
    text: String,
    reasoning: String,
    calls: BTreeMap<u64, ToolCall>,
    finish: Option<String>,
    usage: Option<Usage>,
    bytes: usize,
}

impl http::Decoder for Answer {
    const END: &'static str = "[DONE]";

    /// Takes one event; true at `[DONE]`.
    fn take(
        &mut self,
        ev: &SseEvent,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<bool, ModelError> {
        if ev.data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk: Value = serde_json::from_str(&ev.data).map_err(|e| {
            ModelError::new(
                ModelErrorKind::Protocol,
                format!("a chunk is not JSON ({e}): {}", cut(&ev.data, 200)),
            )
        })?;
        if let Some(err) = chunk.get("error") {
            let msg = err["message"].as_str().unwrap_or("no message");
            return Err(ModelError::new(
                ModelErrorKind::StreamError,
                format!("the provider sent an error: {}", cut(msg, 500)),
            ));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            // Each usage chunk is the call's whole usage: the last wins.
            self.usage = Some(Usage {
                input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
                output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
                cache_read_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
                cache_write_tokens: None,
                reasoning_tokens: u["completion_tokens_details"]["reasoning_tokens"].as_u64(),
            });
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return Ok(false);
        };
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.grow(t.len())?;
            self.text.push_str(t);
            on(StreamEvent::Text(t));
        }
        for field in ["reasoning_content", "reasoning"] {
            if let Some(t) = delta[field].as_str().filter(|t| !t.is_empty()) {
                self.grow(t.len())?;
                self.reasoning.push_str(t);
                on(StreamEvent::Reasoning(t));
            }
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for (pos, c) in calls.iter().enumerate() {
                let index = c["index"].as_u64().unwrap_or(pos as u64);
                if !self.calls.contains_key(&index) && self.calls.len() >= MAX_TOOL_CALLS {
                    return Err(ModelError::new(
                        ModelErrorKind::TooLarge,
                        format!("the answer asks for more than {MAX_TOOL_CALLS} tool calls"),
                    ));
                }
                let call = self.calls.entry(index).or_insert_with(|| ToolCall {
                    id: String::new(),
                    name: String::new(),
                    args: String::new(),
                });
                if let Some(id) = c["id"].as_str() {
                    call.id = id.to_string();
                }
                if let Some(name) = c["function"]["name"].as_str() {
                    call.name.push_str(name);
                    self.bytes += name.len();
                }
                if let Some(a) = c["function"]["arguments"].as_str() {
                    call.args.push_str(a);
                    self.bytes += a.len();
                }
            }
            if self.bytes > MAX_ANSWER_BYTES {
                return Err(too_large());
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_string());
        }
        Ok(false)
    }

    fn finish(self, config: &ModelConfig) -> Result<ModelResponse, ModelError> {
        let mut calls: Vec<ToolCall> = self.calls.into_values().collect();
        for (i, c) in calls.iter_mut().enumerate() {
            if c.id.is_empty() {
                // Some local servers leave ids out; results must name one.
                c.id = format!("call_{i}");
            }
        }
        let finish_reason = match self.finish.as_deref() {
            Some("stop") | None if calls.is_empty() => FinishReason::Stop,
            Some("tool_calls") | Some("function_call") => FinishReason::ToolCalls,
            Some("stop") | None => FinishReason::ToolCalls,
            Some("length") => FinishReason::MaxTokens,
            Some("content_filter") => FinishReason::ContentFilter,
            Some(other) => FinishReason::Other(other.to_string()),
        };
        let usage = self.usage.unwrap_or_default();
        Ok(ModelResponse {
            message: AssistantMessage {
                text: (!self.text.is_empty()).then_some(self.text),
                reasoning: (!self.reasoning.is_empty()).then_some(self.reasoning),
                tool_calls: calls,
                provider_data: None,
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
    fn grow(&mut self, n: usize) -> Result<(), ModelError> {
        self.bytes += n;
        if self.bytes > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        Ok(())
    }
}
