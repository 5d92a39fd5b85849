//! Cairn's model providers: one model call, streamed, in a provider's wire
//! format, below the engine's agent loop.
//!
//! The engine keeps a [`Conversation`] (a system prompt, user messages, the
//! model's [`AssistantMessage`]s and the tools' results) and asks a
//! [`ModelClient`] for the next message; the client streams the text and
//! reasoning to a callback ([`StreamEvent`]) and returns the whole message
//! with its [`Usage`], [`FinishReason`] and cost. Five providers, in four
//! wire formats and a script:
//!
//! - [`openai`]: Chat Completions, as OpenAI, vLLM, Ollama, llama.cpp's
//!   server and OpenRouter speak it;
//! - [`openai_responses`]: OpenAI's Responses API, stateless, reasoning
//!   items sent back with their encrypted content;
//! - [`anthropic`]: the Messages API, thinking blocks and their signatures
//!   sent back as the API requires;
//! - [`gemini`]: Google's Gemini API, parts sent back with their thought
//!   signatures;
//! - [`scripted`]: a file of turns, for demos and tests.
//!
//! Before an answer begins, a call is retried on 429, 5xx and dropped or
//! silent connections, honouring `retry-after` ([`RetryPolicy`]); each
//! retry is reported ([`StreamEvent::Retrying`]). After it began, nothing
//! is sent again: a broken stream is [`ModelErrorKind::Interrupted`]. No
//! byte for `idle_timeout` fails the call. Keys come from the environment
//! and never appear in an error. Memory is bounded: a line of the stream
//! by [`sse::MAX_LINE`], an answer by [`MAX_ANSWER_BYTES`].
//!
//! This crate knows nothing of the engine, the store or workflow files.

pub mod anthropic;
mod client;
mod config;
mod digest;
mod error;
pub mod gemini;
mod http;
pub mod limits;
mod message;
pub mod openai;
pub mod openai_responses;
mod price;
pub mod scripted;
pub mod sse;
#[cfg(feature = "testing")]
pub mod testing;

pub use cairn_models::{
    builtin_price, Backoff, Limits, ModelConfig, Price, Provider, ProviderKind, RetryPolicy,
    WireFormat, PROVIDERS,
};
pub use client::{client_for, ModelClient, ModelRequest, StreamEvent};
pub use config::{DEFAULT_IDLE_TIMEOUT, DEFAULT_RETRY};
pub use digest::{canonical_json, request_hash, tool_hash};
pub use error::{ModelError, ModelErrorKind};
pub use limits::{budget_key, gate_for, Gate, Permit, WaitReason};
pub use message::{
    AssistantMessage, Conversation, FinishReason, Message, ModelResponse, ToolCall, ToolDef,
    ToolResult, Usage,
};
pub use scripted::Script;

/// Most bytes of one answer kept (text, reasoning and tool arguments).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Most tool calls one answer may ask for.
pub const MAX_TOOL_CALLS: usize = 128;
