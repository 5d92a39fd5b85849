//! The providers Cairn speaks to, each defined once.

/// Which provider a model is called through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI's Chat Completions (also vLLM, Ollama, llama.cpp's server,
    /// OpenRouter).
    OpenAi,
    /// Anthropic's Messages.
    Anthropic,
    /// OpenAI's Responses, with reasoning items sent back statelessly.
    OpenAiResponses,
    /// Google's Gemini API (`streamGenerateContent`).
    Gemini,
    /// Replays a file of turns: demos and tests.
    Scripted,
}

/// The wire format a provider speaks: what decides the client that calls it
/// (a provider that speaks an existing format is one entry of
/// [`PROVIDERS`] and one variant of [`ProviderKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireFormat {
    /// OpenAI's Chat Completions, streamed.
    ChatCompletions,
    /// Anthropic's Messages, streamed.
    Messages,
    /// OpenAI's Responses, streamed.
    Responses,
    /// Google's `streamGenerateContent`, as server-sent events.
    GenerateContent,
    /// No wire: turns read from a file.
    Script,
}

impl WireFormat {
    /// Whether the usage a call reports counts the tokens read from the
    /// prompt cache inside its input tokens (OpenAI's) rather than beside
    /// them (Anthropic's). Gemini's `promptTokenCount` includes its
    /// `cachedContentTokenCount`, as OpenAI's do.
    pub fn cache_in_input(self) -> bool {
        match self {
            WireFormat::ChatCompletions | WireFormat::Responses | WireFormat::GenerateContent => {
                true
            }
            WireFormat::Messages | WireFormat::Script => false,
        }
    }
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Input tokens at the full price.
    pub input: f64,
    /// Output tokens (reasoning included).
    pub output: f64,
    /// Input tokens read from the prompt cache.
    pub cache_read: f64,
    /// Input tokens written to the prompt cache.
    pub cache_write: f64,
}

/// One provider: everything Cairn knows of it but its client.
#[derive(Debug)]
pub struct Provider {
    /// Which one.
    pub kind: ProviderKind,
    /// Its name in workflows (`provider:`) and events.
    pub name: &'static str,
    /// What else speaks its format, for the hint of an unknown provider.
    pub also_for: Option<&'static str>,
    /// The wire format.
    pub wire: WireFormat,
    /// The environment variable the key is read from when the model names
    /// none.
    pub key_env: Option<&'static str>,
    /// Its address when the model gives no `base_url`.
    pub base_url: Option<&'static str>,
    /// Where its prices are published (the source of [`Provider::prices`]).
    pub prices_url: Option<&'static str>,
    /// (model id prefix, input, output, cache read, cache write), USD per
    /// million tokens.
    pub prices: &'static [(&'static str, f64, f64, f64, f64)],
    /// (model id prefix, context window in tokens): what one request may
    /// hold, its answer included.
    pub windows: &'static [(&'static str, u64)],
}

/// Every provider, in the order messages list them.
pub static PROVIDERS: &[&Provider] = &[&ANTHROPIC, &GEMINI, &OPENAI, &OPENAI_RESPONSES, &SCRIPTED];

static ANTHROPIC: Provider = Provider {
    kind: ProviderKind::Anthropic,
    name: "anthropic",
    also_for: None,
    wire: WireFormat::Messages,
    key_env: Some("ANTHROPIC_API_KEY"),
    base_url: Some("https://api.anthropic.com"),
    prices_url: Some("https://www.anthropic.com/pricing#api"),
    prices: &[
        ("claude-opus-4", 15.0, 75.0, 1.50, 18.75),
        ("claude-sonnet-4", 3.0, 15.0, 0.30, 3.75),
        ("claude-3-7-sonnet", 3.0, 15.0, 0.30, 3.75),
        ("claude-3-5-sonnet", 3.0, 15.0, 0.30, 3.75),
        ("claude-haiku-4", 1.0, 5.0, 0.10, 1.25),
        ("claude-3-5-haiku", 0.80, 4.0, 0.08, 1.0),
        ("claude-3-haiku", 0.25, 1.25, 0.03, 0.30),
    ],
    windows: &[("claude-", 200_000)],
};

static OPENAI: Provider = Provider {
    kind: ProviderKind::OpenAi,
    name: "openai",
    also_for: Some("vLLM, Ollama, llama.cpp, OpenRouter"),
    wire: WireFormat::ChatCompletions,
    key_env: Some("OPENAI_API_KEY"),
    base_url: Some("https://api.openai.com/v1"),
    prices_url: Some("https://openai.com/api/pricing/"),
    prices: OPENAI_PRICES,
    windows: OPENAI_WINDOWS,
};

/// The prices of OpenAI's models (USD per million tokens: input, output,
/// cache read, cache write), whichever API they are called through.
static OPENAI_PRICES: &[(&str, f64, f64, f64, f64)] = &[
    ("gpt-4o-mini", 0.15, 0.60, 0.075, 0.0),
    ("gpt-4o", 2.50, 10.0, 1.25, 0.0),
    ("gpt-4.1-nano", 0.10, 0.40, 0.025, 0.0),
    ("gpt-4.1-mini", 0.40, 1.60, 0.10, 0.0),
    ("gpt-4.1", 2.0, 8.0, 0.50, 0.0),
    ("gpt-5-nano", 0.05, 0.40, 0.005, 0.0),
    ("gpt-5-mini", 0.25, 2.0, 0.025, 0.0),
    ("gpt-5", 1.25, 10.0, 0.125, 0.0),
    ("gpt-5.1", 1.25, 10.0, 0.125, 0.0),
    ("o4-mini", 1.10, 4.40, 0.275, 0.0),
    ("o3-mini", 1.10, 4.40, 0.55, 0.0),
    ("o3", 2.0, 8.0, 0.50, 0.0),
    ("o1-mini", 1.10, 4.40, 0.55, 0.0),
    ("o1", 15.0, 60.0, 7.50, 0.0),
    ("codex-mini", 1.50, 6.0, 0.375, 0.0),
];

/// The context windows of OpenAI's models, whichever API they are called
/// through.
static OPENAI_WINDOWS: &[(&str, u64)] = &[
    ("gpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("codex-mini", 200_000),
];

static OPENAI_RESPONSES: Provider = Provider {
    kind: ProviderKind::OpenAiResponses,
    name: "openai-responses",
    also_for: None,
    wire: WireFormat::Responses,
    key_env: Some("OPENAI_API_KEY"),
    base_url: Some("https://api.openai.com/v1"),
    prices_url: Some("https://openai.com/api/pricing/"),
    prices: OPENAI_PRICES,
    windows: OPENAI_WINDOWS,
};

static GEMINI: Provider = Provider {
    kind: ProviderKind::Gemini,
    name: "gemini",
    also_for: None,
    wire: WireFormat::GenerateContent,
    key_env: Some("GEMINI_API_KEY"),
    base_url: Some("https://generativelanguage.googleapis.com"),
    prices_url: Some("https://ai.google.dev/gemini-api/docs/pricing"),
    // Prompts up to 200k tokens (2.5 Pro costs more past them); cache
    // reads only, since an implicit cache costs nothing to write.
    prices: &[
        ("gemini-2.5-pro", 1.25, 10.0, 0.31, 0.0),
        ("gemini-2.5-flash", 0.30, 2.50, 0.075, 0.0),
        ("gemini-2.5-flash-lite", 0.10, 0.40, 0.025, 0.0),
        ("gemini-2.0-flash", 0.10, 0.40, 0.025, 0.0),
    ],
    windows: &[("gemini-", 1_048_576)],
};

static SCRIPTED: Provider = Provider {
    kind: ProviderKind::Scripted,
    name: "scripted",
    also_for: None,
    wire: WireFormat::Script,
    key_env: None,
    base_url: None,
    prices_url: None,
    prices: &[],
    windows: &[],
};

impl ProviderKind {
    /// The provider's definition.
    pub fn def(self) -> &'static Provider {
        match self {
            ProviderKind::OpenAi => &OPENAI,
            ProviderKind::Anthropic => &ANTHROPIC,
            ProviderKind::OpenAiResponses => &OPENAI_RESPONSES,
            ProviderKind::Gemini => &GEMINI,
            ProviderKind::Scripted => &SCRIPTED,
        }
    }

    /// The name as workflows and events write it.
    pub fn as_str(self) -> &'static str {
        self.def().name
    }

    /// The provider a workflow names.
    pub fn parse(name: &str) -> Option<ProviderKind> {
        PROVIDERS.iter().find(|p| p.name == name).map(|p| p.kind)
    }

    /// The environment variable the key is read from by default.
    pub fn default_key_env(self) -> Option<&'static str> {
        self.def().key_env
    }
}

/// The built-in price of a model: the longest known prefix of its id
/// (`claude-sonnet-4-5-20250929` is priced as `claude-sonnet-4`).
pub fn builtin_price(provider: ProviderKind, model: &str) -> Option<Price> {
    // An OpenAI-compatible router may prefix the vendor: `openai/gpt-4o`.
    let id = model.rsplit('/').next().unwrap_or(model);
    provider
        .def()
        .prices
        .iter()
        .filter(|(p, ..)| id.starts_with(p))
        .max_by_key(|(p, ..)| p.len())
        .map(|&(_, input, output, cache_read, cache_write)| Price {
            input,
            output,
            cache_read,
            cache_write,
        })
}

/// The built-in context window of a model: the longest known prefix of
/// its id, as for prices.
pub fn builtin_window(provider: ProviderKind, model: &str) -> Option<u64> {
    let id = model.rsplit('/').next().unwrap_or(model);
    provider
        .def()
        .windows
        .iter()
        .filter(|(p, _)| id.starts_with(p))
        .max_by_key(|(p, _)| p.len())
        .map(|&(_, w)| w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_provider_is_listed_once_under_its_kind() {
        for (i, p) in PROVIDERS.iter().enumerate() {
            assert!(std::ptr::eq(p.kind.def(), *p), "{}", p.name);
            assert_eq!(ProviderKind::parse(p.name), Some(p.kind));
            assert!(PROVIDERS[i + 1..].iter().all(|q| q.name != p.name));
        }
    }

    #[test]
    fn dated_ids_take_their_family_price() {
        let p = builtin_price(ProviderKind::Anthropic, "claude-sonnet-4-5-20250929").unwrap();
        assert_eq!(p.input, 3.0);
        let mini = builtin_price(ProviderKind::OpenAi, "gpt-4o-mini-2024-07-18").unwrap();
        assert_eq!(mini.input, 0.15);
        assert_eq!(
            builtin_price(ProviderKind::OpenAi, "openai/gpt-4o")
                .unwrap()
                .input,
            2.5
        );
        assert!(builtin_price(ProviderKind::OpenAi, "qwen2.5-coder").is_none());
        assert!(builtin_price(ProviderKind::Scripted, "gpt-4o").is_none());
    }

    #[test]
    fn the_new_wire_formats_price_their_families() {
        let r = |m| builtin_price(ProviderKind::OpenAiResponses, m).unwrap();
        assert_eq!(r("gpt-5.1-2025-11-13").input, 1.25);
        assert_eq!(r("o1-2024-12-17").output, 60.0);
        assert_eq!(r("o1-mini").input, 1.10);
        assert_eq!(r("gpt-4o").cache_read, 1.25);
        let g = |m| builtin_price(ProviderKind::Gemini, m).unwrap();
        assert_eq!(g("gemini-2.5-flash-lite-preview-06-17").input, 0.10);
        assert_eq!(g("gemini-2.5-flash").input, 0.30);
        assert_eq!(g("models/gemini-2.5-pro").cache_read, 0.31);
        assert!(builtin_price(ProviderKind::Gemini, "gemma-3").is_none());
        for p in [ProviderKind::OpenAiResponses, ProviderKind::Gemini] {
            assert!(p.def().wire.cache_in_input(), "{}", p.as_str());
        }
        assert_eq!(
            ProviderKind::parse("openai-responses"),
            Some(ProviderKind::OpenAiResponses)
        );
        assert_eq!(
            ProviderKind::Gemini.default_key_env(),
            Some("GEMINI_API_KEY")
        );
    }
}
