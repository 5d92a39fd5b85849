//! OpenAI's Responses API, streamed (`POST {base}/responses`).
//!
//! Stateless: every request carries the whole conversation with
//! `store: false`, so nothing of it is kept by the server. A reasoning
//! model's reasoning items come back with their `encrypted_content`
//! (`include`), are kept whole in [`AssistantMessage::provider_data`]
//! (`{"reasoning": [items...]}`) and go back, exactly as received, before
//! the other items of their turn: that is how the model keeps its
//! reasoning across tool calls without a stored response.
//!
//! The answer's items arrive by `output_index`: `response.output_item.added`
//! and `.done` carry function calls and reasoning items whole, deltas grow
//! the text, the reasoning (its summary, or its text where a server streams
//! it) and a call's arguments. The stream ends at `response.completed` or
//! `response.incomplete`; `response.failed` and `error` fail the call.

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

/// A model behind a Responses endpoint.
pub struct OpenAiResponses {
    config: ModelConfig,
    key: String,
    url: String,
    http: http::HttpClient,
}

impl OpenAiResponses {
    /// A client of `config`'s model with `key` (empty: no `Authorization`).
    pub fn new(config: &ModelConfig, key: String) -> Result<OpenAiResponses, ModelError> {
        let base = http::base_url(config);
        Ok(OpenAiResponses {
            config: config.clone(),
            key,
            url: format!("{base}/responses"),
            http: http::HttpClient::new()?,
        })
    }

    /// The request's JSON body: the same conversation gives the same bytes.
    pub fn body(&self, req: &ModelRequest<'_>) -> Value {
        let mut input = Vec::new();
        for m in &req.conversation.messages {
            match m {
                Message::User { text } => input.push(json!({"role": "user", "content": text})),
                Message::Assistant(a) => {
                    // The reasoning first: the API wants each reasoning item
                    // before the item it led to.
                    if let Some(items) = a
                        .provider_data
                        .as_ref()
                        .and_then(|d| d["reasoning"].as_array())
                    {
                        input.extend(items.iter().cloned());
                    }
                    if let Some(t) = a.text.as_ref().filter(|t| !t.is_empty()) {
                        input.push(json!({
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": t}],
                        }));
                    }
                    for c in &a.tool_calls {
                        input.push(json!({
                            "type": "function_call",
                            "call_id": c.id,
                            "name": c.name,
                            "arguments": c.args,
                        }));
                    }
                }
                Message::ToolResults(results) => {
                    // No error flag in this format: the text says so.
                    for r in results {
                        input.push(json!({
                            "type": "function_call_output",
                            "call_id": r.call_id,
                            "output": r.content,
                        }));
                    }
                }
            }
        }
        let mut body = json!({
            "model": self.config.model,
            "stream": true,
            "store": false,
        });
        if may_reason(&self.config.model) {
            body["include"] = json!(["reasoning.encrypted_content"]);
        }
        if let Some(s) = &req.conversation.system {
            body["instructions"] = json!(s);
        }
        body["input"] = Value::Array(input);
        if !req.tools.is_empty() {
            // `strict` defaults to true here (unlike Chat Completions), and
            // strict mode refuses schemas with optional properties, as
            // Cairn's tools have.
            body["tools"] = req
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "type": "function",
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                        "strict": false,
                    })
                })
                .collect();
        }
        if let Some(n) = self.config.max_tokens {
            body["max_output_tokens"] = json!(n);
        }
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        if let (true, Some(k)) = (self.config.prompt_cache_on(), req.cache_key) {
            body["prompt_cache_key"] = json!(k);
        }
        body
    }
}

/// Whether to ask for the reasoning items' `encrypted_content`: for every
/// model but OpenAI's families that never reason, which may refuse the
/// request for it. A model that reasons without it would get back items the
/// server did not store, and a later request naming them would fail.
fn may_reason(model: &str) -> bool {
    // A router may prefix the vendor: `openai/gpt-4o`.
    let id = model.rsplit('/').next().unwrap_or(model);
    !["gpt-4", "gpt-3.5", "chatgpt-"]
        .iter()
        .any(|p| id.starts_with(p))
}

#[async_trait]
impl ModelClient for OpenAiResponses {
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

/// One output item as its events build it.
enum Item {
    /// A function call.
    Call(ToolCall),
    /// A reasoning item: the whole item once `.done` brought it.
    Reasoning(Option<Value>),
    /// A message (its text grows by deltas, kept apart) or anything else.
    Other,
}

/// How the stream ended.
enum Ended {
    /// `response.completed`.
    Completed,
    /// `response.incomplete`, with its reason.
    Incomplete(String),
}

/// The answer as its events build it.
#[derive(Default)]
struct Answer {
    items: BTreeMap<u64, Item>,
    text: String,
    reasoning: String,
    /// Which reasoning part the last reasoning delta belonged to: a new
    /// part is set apart from the last by a blank line.
    part: Option<(u64, u64)>,
    refused: bool,
    ended: Option<Ended>,
    usage: Usage,
    bytes: usize,
}

impl http::Decoder for Answer {
    const END: &'static str = "response.completed";

    /// Takes one event; true at `response.completed` or
    /// `response.incomplete`.
    fn take(
        &mut self,
        ev: &SseEvent,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<bool, ModelError> {
        let data: Value = serde_json::from_str(&ev.data).map_err(|e| {
            ModelError::new(
                ModelErrorKind::Protocol,
                format!("an event is not JSON ({e}): {}", cut(&ev.data, 200)),
            )
        })?;
        let kind = match data["type"].as_str() {
            Some(t) if !t.is_empty() => t,
            _ => ev.event.as_str(),
        };
        let delta = || data["delta"].as_str().unwrap_or("");
        let index = data["output_index"].as_u64().unwrap_or(0);
        match kind {
            "response.output_text.delta" => self.text(delta(), on)?,
            "response.refusal.delta" => {
                self.refused = true;
                self.text(delta(), on)?;
            }
            "response.reasoning_summary_text.delta" => {
                let part = data["summary_index"].as_u64().unwrap_or(0);
                self.reasoning((index, part), delta(), on)?;
            }
            "response.reasoning_text.delta" => {
                let part = data["content_index"].as_u64().unwrap_or(0);
                self.reasoning((index, part), delta(), on)?;
            }
            "response.output_item.added" | "response.output_item.done" => {
                // A reasoning item is kept whole, its encrypted content too.
                self.grow(ev.data.len())?;
                self.item(index, &data["item"], kind.ends_with(".done"))?;
            }
            "response.function_call_arguments.delta" => {
                let d = delta();
                if let Some(Item::Call(c)) = self.items.get_mut(&index) {
                    c.args.push_str(d);
                }
                self.grow(d.len())?;
            }
            "response.function_call_arguments.done" => {
                if let (Some(Item::Call(c)), Some(a)) =
                    (self.items.get_mut(&index), data["arguments"].as_str())
                {
                    c.args = a.to_string();
                }
            }
            "response.completed" => {
                self.usage_from(&data["response"]["usage"]);
                self.ended = Some(Ended::Completed);
                return Ok(true);
            }
            "response.incomplete" => {
                self.usage_from(&data["response"]["usage"]);
                let reason = data["response"]["incomplete_details"]["reason"]
                    .as_str()
                    .unwrap_or("incomplete");
                self.ended = Some(Ended::Incomplete(reason.to_string()));
                return Ok(true);
            }
            "response.failed" => {
                let e = &data["response"]["error"];
                return Err(stream_error(e["code"].as_str(), e["message"].as_str()));
            }
            "error" => {
                // The documented event has its fields at the top; some
                // servers nest them under `error`.
                let e = if data["error"].is_object() {
                    &data["error"]
                } else {
                    &data
                };
                let code = e["code"].as_str().or(e["type"].as_str());
                return Err(stream_error(code, e["message"].as_str()));
            }
            _ => {}
        }
        Ok(false)
    }

    fn finish(self, config: &ModelConfig) -> Result<ModelResponse, ModelError> {
        let mut calls = Vec::new();
        let mut reasoning_items = Vec::new();
        for item in self.items.into_values() {
            match item {
                Item::Call(c) => calls.push(c),
                Item::Reasoning(Some(v)) => reasoning_items.push(v),
                Item::Reasoning(None) | Item::Other => {}
            }
        }
        for (i, c) in calls.iter_mut().enumerate() {
            if c.id.is_empty() {
                // A compatible server may leave it out; results must name one.
                c.id = format!("call_{i}");
            }
        }
        let finish_reason = match self.ended {
            Some(Ended::Incomplete(r)) => match r.as_str() {
                "max_output_tokens" => FinishReason::MaxTokens,
                "content_filter" => FinishReason::ContentFilter,
                _ => FinishReason::Other(r),
            },
            _ if self.refused => FinishReason::ContentFilter,
            _ if !calls.is_empty() => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        let usage = self.usage;
        Ok(ModelResponse {
            message: AssistantMessage {
                text: (!self.text.is_empty()).then_some(self.text),
                reasoning: (!self.reasoning.is_empty()).then_some(self.reasoning),
                tool_calls: calls,
                provider_data: (!reasoning_items.is_empty())
                    .then(|| json!({ "reasoning": reasoning_items })),
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

    fn text(
        &mut self,
        t: &str,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<(), ModelError> {
        if t.is_empty() {
            return Ok(());
        }
        self.grow(t.len())?;
        self.text.push_str(t);
        on(StreamEvent::Text(t));
        Ok(())
    }

    /// A piece of reasoning of `part` (output item, summary or content
    /// index): the summary of one item comes in several parts, each a
    /// paragraph of its own.
    fn reasoning(
        &mut self,
        part: (u64, u64),
        t: &str,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<(), ModelError> {
        if t.is_empty() {
            return Ok(());
        }
        if self.part != Some(part) && !self.reasoning.is_empty() {
            self.reasoning.push_str("\n\n");
            on(StreamEvent::Reasoning("\n\n"));
        }
        self.part = Some(part);
        self.grow(t.len())?;
        self.reasoning.push_str(t);
        on(StreamEvent::Reasoning(t));
        Ok(())
    }

    /// An output item as `.added` (its start) or `.done` (whole) gives it.
    fn item(&mut self, index: u64, item: &Value, done: bool) -> Result<(), ModelError> {
        if !self.items.contains_key(&index) && self.items.len() >= MAX_TOOL_CALLS * 2 {
            return Err(too_large());
        }
        match item["type"].as_str() {
            Some("function_call") => {
                if !matches!(self.items.get(&index), Some(Item::Call(_))) {
                    let calls = self
                        .items
                        .values()
                        .filter(|i| matches!(i, Item::Call(_)))
                        .count();
                    if calls >= MAX_TOOL_CALLS {
                        return Err(ModelError::new(
                            ModelErrorKind::TooLarge,
                            format!("the answer asks for more than {MAX_TOOL_CALLS} tool calls"),
                        ));
                    }
                    self.items.insert(
                        index,
                        Item::Call(ToolCall {
                            id: String::new(),
                            name: String::new(),
                            args: String::new(),
                        }),
                    );
                }
                if let Some(Item::Call(c)) = self.items.get_mut(&index) {
                    if let Some(id) = item["call_id"].as_str() {
                        c.id = id.to_string();
                    }
                    if let Some(name) = item["name"].as_str() {
                        c.name = name.to_string();
                    }
                    // `.added` starts the arguments (usually empty), `.done`
                    // has them whole.
                    if let Some(a) = item["arguments"].as_str() {
                        if done || c.args.is_empty() {
                            c.args = a.to_string();
                        }
                    }
                }
            }
            Some("reasoning") if done => {
                self.items
                    .insert(index, Item::Reasoning(Some(item.clone())));
            }
            Some("reasoning") => {
                self.items.entry(index).or_insert(Item::Reasoning(None));
            }
            _ => {
                self.items.entry(index).or_insert(Item::Other);
            }
        }
        Ok(())
    }

    /// The call's usage, in `response.completed`'s (or `.incomplete`'s)
    /// response: input tokens include the cached ones.
    fn usage_from(&mut self, u: &Value) {
        if !u.is_object() {
            return;
        }
        self.usage = Usage {
            input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
            cache_read_tokens: u["input_tokens_details"]["cached_tokens"].as_u64(),
            cache_write_tokens: None,
            reasoning_tokens: u["output_tokens_details"]["reasoning_tokens"].as_u64(),
        };
    }
}

/// The error a failed response or an `error` event reports.
fn stream_error(code: Option<&str>, message: Option<&str>) -> ModelError {
    let msg = message.unwrap_or("no message");
    let code = code.unwrap_or("error");
    ModelError::new(
        ModelErrorKind::StreamError,
        format!("the provider sent an error ({code}): {}", cut(msg, 500)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_models_that_may_reason_are_asked_for_encrypted_reasoning() {
        for m in ["gpt-5.1", "o3-mini", "openai/o4-mini", "codex-mini-latest"] {
            assert!(may_reason(m), "{m}");
        }
        for m in [
            "gpt-4o",
            "gpt-4.1-mini",
            "openai/gpt-4o",
            "chatgpt-4o-latest",
        ] {
            assert!(!may_reason(m), "{m}");
        }
    }
}
