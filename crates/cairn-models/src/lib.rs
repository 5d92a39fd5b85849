//! The models a workflow declares, as both the parser and the providers see
//! them.
//!
//! A provider is defined once, in [`PROVIDERS`]: its name in files and
//! events, the wire format it speaks, the variable its key is read from, its
//! address, and the prices Cairn knows for its models. A model's settings
//! (`models.<name>` in a workflow) are one type, [`ModelConfig`], which
//! `cairn-workflow` fills from the file and `cairn-agent` calls the model
//! with. Both crates sit above this one and beside each other: the parser
//! must not pull in an HTTP client, nor the providers a YAML parser, so what
//! they share lives here, with nothing below it. How often a thing is
//! retried ([`RetryPolicy`]) is here too: a model's `retry` is written as a
//! node's is.

mod providers;
mod retry;

pub use providers::{
    builtin_price, builtin_window, Price, Provider, ProviderKind, WireFormat, PROVIDERS,
};
pub use retry::{Backoff, RetryPolicy, DEFAULT_RETRY_DELAY, DEFAULT_RETRY_MAX_DELAY};

use std::time::Duration;

/// An API key held in memory (a secret's value): compared, cloned, never
/// shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// One named model (`models.<name>`), as the file gives it: what the file
/// leaves out stays `None`, and the provider's client applies its default
/// (an external agent CLI has defaults of its own).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The provider (`provider`).
    pub provider: ProviderKind,
    /// The provider's model id (`model`; a scripted model's defaults to its
    /// name).
    pub model: String,
    /// The environment variable holding the key (default: the provider's,
    /// [`Provider::key_env`]).
    pub api_key_env: Option<String>,
    /// The declared secret holding the key (`api_key_secret`), which
    /// the engine reads into [`ModelConfig::api_key`].
    pub api_key_secret: Option<String>,
    /// The key itself, when the engine was given it (a secret's value);
    /// before any environment variable.
    pub api_key: Option<ApiKey>,
    /// A server that speaks the provider's wire format (default: the
    /// provider's own, [`Provider::base_url`]).
    pub base_url: Option<String>,
    /// Most tokens of one answer.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Longest silence inside a streamed answer, and before it begins.
    pub idle_timeout: Option<Duration>,
    /// Longest one call may take, retries apart (`timeout`).
    pub timeout: Option<Duration>,
    /// Retries before an answer begins.
    pub retry: Option<RetryPolicy>,
    /// USD per million tokens, overriding the built-in prices.
    pub price: Option<Price>,
    /// A scripted model's file of turns, relative to the workflow's folder.
    pub script: Option<String>,
    /// Whether requests mark what the provider may cache (`prompt_cache`;
    /// default on): Anthropic's `cache_control` breakpoints, OpenAI's
    /// `prompt_cache_key`.
    pub prompt_cache: Option<bool>,
    /// The most tokens a request may hold (`context_window`; default the
    /// built-in figure of a known model): past it, the agent compacts the
    /// conversation first.
    pub context_window: Option<u64>,
    /// Limits every agent of the process shares on this model.
    pub limits: Limits,
    /// The models of the same workflow asked instead, in order, once the
    /// retries of a rate limit or a server error ran out (`fallback`).
    pub fallback: Vec<String>,
}

/// What every agent calling one model shares (`max_concurrency`,
/// `requests_per_minute`, `tokens_per_minute`): a call waits for its share
/// rather than failing at the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Most calls in flight at once.
    pub max_concurrency: Option<u32>,
    /// Most calls begun in any minute.
    pub requests_per_minute: Option<u32>,
    /// Most tokens (the request's estimate, then what the provider
    /// reported) in any minute.
    pub tokens_per_minute: Option<u64>,
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.max_concurrency.is_some()
            || self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
    }
}

impl ModelConfig {
    /// A model of `provider` named `model`, everything else left to the
    /// defaults.
    pub fn new(provider: ProviderKind, model: impl Into<String>) -> ModelConfig {
        ModelConfig {
            provider,
            model: model.into(),
            api_key_env: None,
            api_key_secret: None,
            api_key: None,
            base_url: None,
            max_tokens: None,
            temperature: None,
            idle_timeout: None,
            timeout: None,
            retry: None,
            price: None,
            script: None,
            prompt_cache: None,
            context_window: None,
            limits: Limits::default(),
            fallback: Vec::new(),
        }
    }

    /// The context window Cairn knows for this model, if any.
    pub fn builtin_context_window(&self) -> Option<u64> {
        builtin_window(self.provider, &self.model)
    }

    /// Whether requests mark what the provider may cache.
    pub fn prompt_cache_on(&self) -> bool {
        self.prompt_cache.unwrap_or(true)
    }

    /// The price of this model: its own, else the built-in table's.
    pub fn effective_price(&self) -> Option<Price> {
        self.price
            .or_else(|| builtin_price(self.provider, &self.model))
    }
}
