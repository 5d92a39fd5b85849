//! What model calls cost: USD per million tokens, built in for the
//! well-known models and overridable per model in the workflow.

use crate::config::ProviderKind;
use crate::message::Usage;

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

impl Price {
    /// What one call cost. OpenAI counts cached tokens inside its input
    /// tokens (so they are taken out and priced as cache reads); Anthropic
    /// counts them apart.
    pub fn cost(&self, provider: ProviderKind, usage: &Usage) -> f64 {
        let read = usage.cache_read_tokens.unwrap_or(0);
        let write = usage.cache_write_tokens.unwrap_or(0);
        let full = match provider {
            ProviderKind::OpenAi => usage.input_tokens.saturating_sub(read + write),
            _ => usage.input_tokens,
        };
        (full as f64 * self.input
            + read as f64 * self.cache_read
            + write as f64 * self.cache_write
            + usage.output_tokens as f64 * self.output)
            / 1e6
    }
}

/// (model id prefix, input, output, cache read, cache write), USD per
/// million tokens, from the providers' price lists.
const ANTHROPIC: &[(&str, f64, f64, f64, f64)] = &[
    ("claude-opus-4", 15.0, 75.0, 1.50, 18.75),
    ("claude-sonnet-4", 3.0, 15.0, 0.30, 3.75),
    ("claude-3-7-sonnet", 3.0, 15.0, 0.30, 3.75),
    ("claude-3-5-sonnet", 3.0, 15.0, 0.30, 3.75),
    ("claude-haiku-4", 1.0, 5.0, 0.10, 1.25),
    ("claude-3-5-haiku", 0.80, 4.0, 0.08, 1.0),
    ("claude-3-haiku", 0.25, 1.25, 0.03, 0.30),
];

const OPENAI: &[(&str, f64, f64, f64, f64)] = &[
    ("gpt-4o-mini", 0.15, 0.60, 0.075, 0.0),
    ("gpt-4o", 2.50, 10.0, 1.25, 0.0),
    ("gpt-4.1-nano", 0.10, 0.40, 0.025, 0.0),
    ("gpt-4.1-mini", 0.40, 1.60, 0.10, 0.0),
    ("gpt-4.1", 2.0, 8.0, 0.50, 0.0),
    ("gpt-5-nano", 0.05, 0.40, 0.005, 0.0),
    ("gpt-5-mini", 0.25, 2.0, 0.025, 0.0),
    ("gpt-5", 1.25, 10.0, 0.125, 0.0),
    ("o4-mini", 1.10, 4.40, 0.275, 0.0),
    ("o3-mini", 1.10, 4.40, 0.55, 0.0),
    ("o3", 2.0, 8.0, 0.50, 0.0),
];

/// The built-in price of a model: the longest known prefix of its id
/// (`claude-sonnet-4-5-20250929` is priced as `claude-sonnet-4`).
pub fn builtin(provider: ProviderKind, model: &str) -> Option<Price> {
    let table = match provider {
        ProviderKind::Anthropic => ANTHROPIC,
        ProviderKind::OpenAi => OPENAI,
        ProviderKind::Scripted => return None,
    };
    // An OpenAI-compatible router may prefix the vendor: `openai/gpt-4o`.
    let id = model.rsplit('/').next().unwrap_or(model);
    table
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_ids_take_their_family_price() {
        let p = builtin(ProviderKind::Anthropic, "claude-sonnet-4-5-20250929").unwrap();
        assert_eq!(p.input, 3.0);
        let mini = builtin(ProviderKind::OpenAi, "gpt-4o-mini-2024-07-18").unwrap();
        assert_eq!(mini.input, 0.15);
        assert_eq!(
            builtin(ProviderKind::OpenAi, "openai/gpt-4o")
                .unwrap()
                .input,
            2.5
        );
        assert!(builtin(ProviderKind::OpenAi, "qwen2.5-coder").is_none());
    }

    #[test]
    fn cached_tokens_are_priced_as_each_provider_counts_them() {
        let p = Price {
            input: 2.0,
            output: 10.0,
            cache_read: 0.5,
            cache_write: 4.0,
        };
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_tokens: Some(400_000),
            cache_write_tokens: None,
            reasoning_tokens: None,
        };
        // OpenAI: 600k full + 400k cached + 100k out.
        assert!((p.cost(ProviderKind::OpenAi, &u) - (1.2 + 0.2 + 1.0)).abs() < 1e-9);
        // Anthropic: the 1M input excludes the 400k cache reads.
        assert!((p.cost(ProviderKind::Anthropic, &u) - (2.0 + 0.2 + 1.0)).abs() < 1e-9);
    }
}
