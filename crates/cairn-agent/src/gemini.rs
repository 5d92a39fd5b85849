//! Google's Gemini API, streamed
//! (`POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`).
//!
//! Each event is a whole `GenerateContentResponse` chunk: the parts of the
//! first candidate (text, thought text when the model shares its
//! thoughts, function calls, which come whole), its `finishReason` on the
//! last one, and `usageMetadata`, whose figures are the call's totals so
//! far. The stream has no end event: the body ending after a chunk with a
//! `finishReason` is the end of the answer, and before one, a cut stream
//! ([`crate::ModelErrorKind::Interrupted`]).
//!
//! Gemini 2.5 and later put a `thoughtSignature` on some parts, which must
//! come back on the same part in the next request. So the model's turn is
//! kept as its parts ([`AssistantMessage::provider_data`],
//! `{"parts": [...]}`): as streamed, with a run of text pieces that carry
//! nothing else joined into one part, and sent back exactly. A turn
//! without them (another provider's answer) is rebuilt from its text and
//! tool calls.
//!
//! The key goes in the `x-goog-api-key` header, never in the address, so
//! that no error or log that shows the address shows the key.

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

/// Most parts of one answer kept (text pieces of one kind are joined, so
/// a real answer has a few).
const MAX_PARTS: usize = 4 * MAX_TOOL_CALLS;

/// A model behind the Gemini API.
pub struct Gemini {
    config: ModelConfig,
    key: String,
    url: String,
    http: http::HttpClient,
}

impl Gemini {
    /// A client of `config`'s model with `key` (empty: no key header, for
    /// a compatible server of one's own).
    pub fn new(config: &ModelConfig, key: String) -> Result<Gemini, ModelError> {
        let base = http::base_url(config);
        // The API names models `models/<id>`; either spelling is taken.
        let model = config
            .model
            .strip_prefix("models/")
            .unwrap_or(&config.model);
        Ok(Gemini {
            config: config.clone(),
            key,
            url: format!(
                "{base}/v1beta/models/{}:streamGenerateContent?alt=sse",
                path_segment(model)
            ),
            http: http::HttpClient::new()?,
        })
    }

    /// The request's JSON body: the same conversation gives the same bytes.
    pub fn body(&self, req: &ModelRequest<'_>) -> Value {
        let mut contents = Vec::new();
        for m in &req.conversation.messages {
            match m {
                Message::User { text } => {
                    contents.push(json!({"role": "user", "parts": [{"text": text}]}))
                }
                Message::Assistant(a) => {
                    let kept = a
                        .provider_data
                        .as_ref()
                        .and_then(|d| d["parts"].as_array())
                        .filter(|p| !p.is_empty());
                    let mut parts = match kept {
                        Some(p) => p.clone(),
                        None => rebuilt_parts(a),
                    };
                    if parts.is_empty() {
                        // A turn needs a part.
                        parts.push(json!({"text": "(no answer)"}));
                    }
                    contents.push(json!({"role": "model", "parts": parts}));
                }
                Message::ToolResults(results) => {
                    // `output` and `error` are the keys the API documents
                    // for a function's response. The id is the call's:
                    // Gemini's own when it gave one, else Cairn's, which
                    // it takes and ignores.
                    let parts: Vec<Value> = results
                        .iter()
                        .map(|r| {
                            let key = if r.is_error { "error" } else { "output" };
                            json!({"functionResponse": {
                                "id": r.call_id,
                                "name": r.name,
                                "response": {key: r.content},
                            }})
                        })
                        .collect();
                    contents.push(json!({"role": "user", "parts": parts}));
                }
            }
        }
        let mut body = json!({});
        if let Some(s) = &req.conversation.system {
            body["systemInstruction"] = json!({"parts": [{"text": s}]});
        }
        body["contents"] = Value::Array(contents);
        if !req.tools.is_empty() {
            // `parametersJsonSchema` takes JSON Schema as Cairn's tools
            // write it; `parameters` takes only an OpenAPI subset and
            // refuses `additionalProperties`, which they use.
            let declarations: Vec<Value> = req
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "parametersJsonSchema": t.parameters,
                    })
                })
                .collect();
            body["tools"] = json!([{ "functionDeclarations": declarations }]);
        }
        let mut generation = json!({});
        if let Some(n) = self.config.max_tokens {
            generation["maxOutputTokens"] = json!(n);
        }
        if let Some(t) = self.config.temperature {
            generation["temperature"] = json!(t);
        }
        if generation.as_object().is_some_and(|g| !g.is_empty()) {
            body["generationConfig"] = generation;
        }
        body
    }
}

/// The parts of a turn Gemini did not answer (no parts kept): its text,
/// then its calls. Arguments that are not a JSON object (only another
/// provider's answer can have them) go as `{}`, as Anthropic's client
/// sends them: the call's result already told the model they were wrong.
fn rebuilt_parts(a: &AssistantMessage) -> Vec<Value> {
    let mut parts = Vec::new();
    if let Some(t) = a.text.as_ref().filter(|t| !t.is_empty()) {
        parts.push(json!({"text": t}));
    }
    for c in &a.tool_calls {
        let args: Value = serde_json::from_str(&c.args)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        parts.push(json!({"functionCall": {"name": c.name, "args": args}}));
    }
    parts
}

/// `s` as one segment of a URL path: what is not a letter, a digit or
/// `-._~` is percent-encoded, so a model id cannot reach the query.
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[async_trait]
impl ModelClient for Gemini {
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
        let headers = http::json_headers(&self.key, http::KeyHeader::Named("x-goog-api-key"))?;
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
    /// The turn's parts, as the next request sends them back.
    parts: Vec<Value>,
    text: String,
    reasoning: String,
    calls: Vec<ToolCall>,
    finish: Option<String>,
    /// Why the prompt was refused (`promptFeedback.blockReason`).
    blocked: Option<String>,
    usage: Usage,
    bytes: usize,
}

impl http::Decoder for Answer {
    const END: &'static str = "a chunk with a `finishReason`";

    /// Takes one chunk; never the end by itself (the body's end is).
    fn take(
        &mut self,
        ev: &SseEvent,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<bool, ModelError> {
        let chunk: Value = serde_json::from_str(&ev.data).map_err(|e| {
            ModelError::new(
                ModelErrorKind::Protocol,
                format!("a chunk is not JSON ({e}): {}", cut(&ev.data, 200)),
            )
        })?;
        if let Some(err) = chunk.get("error") {
            let msg = err["message"].as_str().unwrap_or("no message");
            let status = err["status"].as_str().unwrap_or("error");
            return Err(ModelError::new(
                ModelErrorKind::StreamError,
                format!("the provider sent an error ({status}): {}", cut(msg, 500)),
            ));
        }
        if let Some(r) = chunk["promptFeedback"]["blockReason"].as_str() {
            self.blocked = Some(r.to_string());
        }
        self.usage_from(&chunk["usageMetadata"]);
        let candidate = &chunk["candidates"][0];
        if let Some(parts) = candidate["content"]["parts"].as_array() {
            for part in parts {
                self.part(part, on)?;
            }
        }
        if let Some(f) = candidate["finishReason"].as_str() {
            self.finish = Some(f.to_string());
        }
        Ok(false)
    }

    fn at_eof(&self) -> bool {
        self.finish.is_some() || self.blocked.is_some()
    }

    fn finish(self, config: &ModelConfig) -> Result<ModelResponse, ModelError> {
        let finish_reason = match self.finish.as_deref() {
            _ if self.blocked.is_some() => FinishReason::ContentFilter,
            Some("STOP") | None if self.calls.is_empty() => FinishReason::Stop,
            // Gemini stops with `STOP` after function calls too.
            Some("STOP") | None => FinishReason::ToolCalls,
            Some("MAX_TOKENS") => FinishReason::MaxTokens,
            Some(
                "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII"
                | "IMAGE_SAFETY",
            ) => FinishReason::ContentFilter,
            Some(other) => FinishReason::Other(other.to_string()),
        };
        let usage = self.usage;
        Ok(ModelResponse {
            message: AssistantMessage {
                text: (!self.text.is_empty()).then_some(self.text),
                reasoning: (!self.reasoning.is_empty()).then_some(self.reasoning),
                tool_calls: self.calls,
                provider_data: (!self.parts.is_empty()).then(|| json!({ "parts": self.parts })),
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

    /// One part of a chunk: streamed, taken into the message, and kept to
    /// be sent back.
    fn part(
        &mut self,
        part: &Value,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<(), ModelError> {
        if let Some(sig) = part["thoughtSignature"].as_str() {
            self.grow(sig.len())?;
        }
        if let Some(fc) = part.get("functionCall") {
            if self.calls.len() >= MAX_TOOL_CALLS {
                return Err(ModelError::new(
                    ModelErrorKind::TooLarge,
                    format!("the answer asks for more than {MAX_TOOL_CALLS} tool calls"),
                ));
            }
            let name = fc["name"].as_str().unwrap_or_default().to_string();
            let args = match fc.get("args") {
                Some(a) if a.is_object() => a.to_string(),
                _ => "{}".to_string(),
            };
            // Gemini gives ids only sometimes; results must name one.
            let id = match fc["id"].as_str() {
                Some(id) if !id.is_empty() => id.to_string(),
                _ => format!("call_{}", self.calls.len()),
            };
            self.grow(name.len() + args.len())?;
            self.calls.push(ToolCall { id, name, args });
            return self.keep(part.clone());
        }
        if let Some(t) = part["text"].as_str() {
            self.grow(t.len())?;
            let thought = part["thought"].as_bool() == Some(true);
            if !t.is_empty() {
                if thought {
                    self.reasoning.push_str(t);
                    on(StreamEvent::Reasoning(t));
                } else {
                    self.text.push_str(t);
                    on(StreamEvent::Text(t));
                }
            }
            // A piece that carries nothing but text joins the last part
            // when that is text of the same kind and carries nothing else
            // either; a signed part stays as it came.
            if let Some(kind) = plain_text(part) {
                if t.is_empty() {
                    // Nothing to send back (the API refuses empty text).
                    return Ok(());
                }
                if let Some(last) = self.parts.last_mut() {
                    if plain_text(last) == Some(kind) {
                        if let Some(Value::String(s)) = last.get_mut("text") {
                            s.push_str(t);
                            return Ok(());
                        }
                    }
                }
            }
            return self.keep(part.clone());
        }
        // Anything else (code the model ran, a file, ...) is kept as it
        // came.
        self.grow(part.to_string().len())?;
        self.keep(part.clone())
    }

    fn keep(&mut self, part: Value) -> Result<(), ModelError> {
        if self.parts.len() >= MAX_PARTS {
            return Err(too_large());
        }
        self.parts.push(part);
        Ok(())
    }

    /// The figures are the call's totals so far: each replaces the last.
    /// `promptTokenCount` includes the cached tokens; the output is the
    /// answer's tokens and the thoughts'.
    fn usage_from(&mut self, u: &Value) {
        if !u.is_object() {
            return;
        }
        let n = |f: &str| u[f].as_u64();
        let thoughts = n("thoughtsTokenCount");
        self.usage = Usage {
            input_tokens: n("promptTokenCount").unwrap_or(0),
            output_tokens: n("candidatesTokenCount").unwrap_or(0) + thoughts.unwrap_or(0),
            cache_read_tokens: n("cachedContentTokenCount"),
            cache_write_tokens: None,
            reasoning_tokens: thoughts,
        };
    }
}

/// Whether `part` is text and nothing else (`thought` apart), and then
/// whether it is a thought.
fn plain_text(part: &Value) -> Option<bool> {
    let obj = part.as_object()?;
    obj.get("text")?.as_str()?;
    if obj.keys().any(|k| k != "text" && k != "thought") {
        return None;
    }
    Some(obj.get("thought").and_then(Value::as_bool) == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_id_stays_one_segment_of_the_path() {
        assert_eq!(path_segment("gemini-2.5-flash"), "gemini-2.5-flash");
        assert_eq!(path_segment("a/b?key=x"), "a%2Fb%3Fkey%3Dx");
    }

    #[test]
    fn only_bare_text_of_one_kind_is_joined() {
        assert_eq!(plain_text(&json!({"text": "a"})), Some(false));
        assert_eq!(
            plain_text(&json!({"text": "a", "thought": true})),
            Some(true)
        );
        assert_eq!(
            plain_text(&json!({"text": "a", "thoughtSignature": "s"})),
            None
        );
        assert_eq!(plain_text(&json!({"functionCall": {}})), None);
    }
}
