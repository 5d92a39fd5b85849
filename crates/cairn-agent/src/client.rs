//! The one trait every provider implements, and how a model's client is
//! made from its configuration.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use cairn_models::{ModelConfig, WireFormat};

use crate::error::{ModelError, ModelErrorKind};
use crate::message::{Conversation, ModelResponse, ToolDef};
use crate::scripted::Script;

/// One model call's input.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The conversation so far.
    pub conversation: &'a Conversation,
    /// The tools the model may call.
    pub tools: &'a [ToolDef],
    /// A key that stays the same for every call of one conversation, for
    /// the provider's prompt cache (OpenAI's `prompt_cache_key`).
    pub cache_key: Option<&'a str>,
}

/// What a call reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent<'a> {
    /// A piece of the answer's text.
    Text(&'a str),
    /// A piece of the model's reasoning.
    Reasoning(&'a str),
    /// The call is made again before any byte of its answer arrived (429,
    /// 5xx, a connection refused or dropped, no answer in time): logged as
    /// `AgentGenerationRetried`. `reason` never holds the key.
    Retrying {
        /// The call about to be made (2 for the first retry).
        attempt: u32,
        /// Why, in a few words: `http 429`, `connection: ...`.
        reason: String,
        /// How long Cairn waits first.
        delay: Duration,
    },
}

/// A model, as the agent loop calls it.
#[async_trait]
pub trait ModelClient: Send + Sync {
    /// The provider's name as workflows write it: `openai`, `anthropic`,
    /// `gemini`, ...
    fn provider(&self) -> &'static str;

    /// The model's id.
    fn model(&self) -> &str;

    /// Makes one model call, streaming what arrives to `on`. Retries
    /// before the answer begins follow the model's retry policy; once it
    /// began, a failure is returned (`Interrupted`), never re-sent.
    async fn complete(
        &self,
        req: &ModelRequest<'_>,
        on: &mut (dyn for<'e> FnMut(StreamEvent<'e>) + Send),
    ) -> Result<ModelResponse, ModelError>;
}

/// The client of a configured model, chosen by the wire format its
/// provider speaks; `script` is a scripted model's turns (read by the
/// caller from the file `config.script` names). The key is read from the
/// environment here: a missing one is an `Auth` error naming the variable,
/// never the value.
pub fn client_for(
    config: &ModelConfig,
    script: Option<Arc<Script>>,
) -> Result<Arc<dyn ModelClient>, ModelError> {
    match config.provider.def().wire {
        WireFormat::Script => Ok(Arc::new(crate::scripted::Scripted::new(config, script)?)),
        WireFormat::ChatCompletions => {
            Ok(Arc::new(crate::openai::OpenAi::new(config, key(config)?)?))
        }
        WireFormat::Messages => Ok(Arc::new(crate::anthropic::Anthropic::new(
            config,
            key(config)?,
        )?)),
        WireFormat::Responses => Ok(Arc::new(crate::openai_responses::OpenAiResponses::new(
            config,
            key(config)?,
        )?)),
        WireFormat::GenerateContent => {
            Ok(Arc::new(crate::gemini::Gemini::new(config, key(config)?)?))
        }
    }
}

/// The API key from the variable the model names (or the provider's
/// default). A local OpenAI-compatible server often needs none: with a
/// `base_url` and no variable set, the key is empty.
fn key(config: &ModelConfig) -> Result<String, ModelError> {
    if let Some(k) = &config.api_key {
        return Ok(k.0.clone());
    }
    let var = config
        .api_key_env
        .as_deref()
        .or(config.provider.default_key_env())
        .unwrap_or_default();
    match std::env::var(var) {
        Ok(k) if !k.is_empty() => Ok(k),
        _ if config.base_url.is_some() && config.api_key_env.is_none() => Ok(String::new()),
        _ => Err(ModelError::new(
            ModelErrorKind::Auth,
            format!(
                "model `{}` needs an API key in the environment variable {var}, which is not set",
                config.model
            ),
        )),
    }
}
