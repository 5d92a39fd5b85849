//! A model as a workflow's `models:` section declares it.

use std::sync::Arc;
use std::time::Duration;

use crate::price::Price;
use crate::scripted::Script;

/// Which wire format a model speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI's Chat Completions (also vLLM, Ollama, llama.cpp's server,
    /// OpenRouter).
    OpenAi,
    /// Anthropic's Messages.
    Anthropic,
    /// Replays a file of turns: demos and tests.
    Scripted,
}

impl ProviderKind {
    /// The name as workflows and events write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Scripted => "scripted",
        }
    }

    /// The kind a workflow names.
    pub fn parse(name: &str) -> Option<ProviderKind> {
        match name {
            "openai" => Some(ProviderKind::OpenAi),
            "anthropic" => Some(ProviderKind::Anthropic),
            "scripted" => Some(ProviderKind::Scripted),
            _ => None,
        }
    }

    /// The environment variable the key is read from by default.
    pub fn default_key_env(self) -> Option<&'static str> {
        match self {
            ProviderKind::OpenAi => Some("OPENAI_API_KEY"),
            ProviderKind::Anthropic => Some("ANTHROPIC_API_KEY"),
            ProviderKind::Scripted => None,
        }
    }
}

/// How a call is retried before its answer begins: on 429, 5xx, and a
/// connection that fails or drops before the first byte of the body.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Calls in all, the first included.
    pub attempts: u32,
    /// Wait before the second call.
    pub delay: Duration,
    /// Double the wait each time (else keep it).
    pub exponential: bool,
    /// Longest wait between two calls (a `retry-after` may ask for more,
    /// up to [`RetryPolicy::max_honoured`]).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            delay: Duration::from_secs(1),
            exponential: true,
            max_delay: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The longest `retry-after` honoured: a server asking for more is
    /// waited for this long, and the wait is logged as such.
    pub fn max_honoured(&self) -> Duration {
        self.max_delay.max(Duration::from_secs(60))
    }

    /// The wait before call `n` (2 for the first retry), with up to a
    /// quarter of jitter so that many agents do not retry in step.
    pub fn backoff(&self, n: u32) -> Duration {
        let base = if self.exponential {
            self.delay
                .saturating_mul(1u32 << (n.saturating_sub(2)).min(20))
        } else {
            self.delay
        };
        let base = base.min(self.max_delay);
        let jitter = base.mul_f64(rand::random::<f64>() * 0.25);
        base.saturating_sub(jitter)
    }
}

/// One named model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The wire format.
    pub provider: ProviderKind,
    /// The provider's model id.
    pub model: String,
    /// Where the key is read from (default per provider).
    pub api_key_env: Option<String>,
    /// The server (default: the provider's own).
    pub base_url: Option<String>,
    /// Most tokens of one answer (Anthropic needs one: 8192 by default).
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Longest silence inside a streamed answer, and before it begins.
    pub idle_timeout: Duration,
    /// Longest one call may take, retries apart.
    pub call_timeout: Option<Duration>,
    /// Retries before the answer begins.
    pub retry: RetryPolicy,
    /// Overrides the built-in prices.
    pub price: Option<Price>,
    /// The scripted model's turns (its file, parsed).
    pub script: Option<Arc<Script>>,
}

impl ModelConfig {
    /// A model of `provider` named `model`, everything else by default.
    pub fn new(provider: ProviderKind, model: impl Into<String>) -> ModelConfig {
        ModelConfig {
            provider,
            model: model.into(),
            api_key_env: None,
            base_url: None,
            max_tokens: None,
            temperature: None,
            idle_timeout: Duration::from_secs(60),
            call_timeout: None,
            retry: RetryPolicy::default(),
            price: None,
            script: None,
        }
    }

    /// The price of this model: its own, else the built-in table's.
    pub fn effective_price(&self) -> Option<Price> {
        self.price
            .or_else(|| crate::price::builtin(self.provider, &self.model))
    }
}
