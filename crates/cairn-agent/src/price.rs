//! What model calls cost. The prices (USD per million tokens, built in for
//! the well-known models, overridable per model in the workflow) are the
//! providers' definitions in `cairn-models`; how a call's usage is counted
//! against them is here.

use cairn_models::{Price, ProviderKind};

use crate::message::Usage;

/// The cost of one call at a price.
pub(crate) trait Cost {
    /// What one call cost. OpenAI's format counts cached tokens inside its
    /// input tokens (so they are taken out and priced as cache reads);
    /// Anthropic's counts them apart.
    fn cost(&self, provider: ProviderKind, usage: &Usage) -> f64;
}

impl Cost for Price {
    fn cost(&self, provider: ProviderKind, usage: &Usage) -> f64 {
        let read = usage.cache_read_tokens.unwrap_or(0);
        let write = usage.cache_write_tokens.unwrap_or(0);
        let full = if provider.def().wire.cache_in_input() {
            usage.input_tokens.saturating_sub(read + write)
        } else {
            usage.input_tokens
        };
        (full as f64 * self.input
            + read as f64 * self.cache_read
            + write as f64 * self.cache_write
            + usage.output_tokens as f64 * self.output)
            / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
