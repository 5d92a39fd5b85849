//! What Cairn does with a model's settings that the workflow leaves out:
//! the defaults of a call ([`ModelConfig`] itself is `cairn-models`', shared
//! with the workflow parser).

use std::time::Duration;

use cairn_models::{Backoff, ModelConfig, RetryPolicy};

/// A call's retries when the model sets none: five calls in all, a second
/// apart at first, doubling up to a minute.
pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy {
    attempts: 5,
    backoff: Backoff::Exponential,
    delay: Duration::from_secs(1),
    max_delay: Duration::from_secs(60),
};

/// Longest silence inside a streamed answer, and before it begins, when
/// the model sets none.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The retries of `config`'s calls.
pub(crate) fn retry_of(config: &ModelConfig) -> RetryPolicy {
    let mut r = config.retry.clone().unwrap_or(DEFAULT_RETRY);
    r.attempts = r.attempts.max(1);
    r
}

/// The idle timeout of `config`'s calls.
pub(crate) fn idle_of(config: &ModelConfig) -> Duration {
    config.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT)
}

/// The longest `retry-after` honoured: a server asking for more is waited
/// for this long, and the wait is logged as such.
pub(crate) fn max_honoured(retry: &RetryPolicy) -> Duration {
    retry.max_delay.max(Duration::from_secs(60))
}

/// The wait before call `n` (2 for the first retry), with up to a quarter
/// of jitter so that many agents do not retry in step.
pub(crate) fn backoff(retry: &RetryPolicy, n: u32) -> Duration {
    let base = match retry.backoff {
        Backoff::Exponential => retry
            .delay
            .saturating_mul(1u32 << (n.saturating_sub(2)).min(20)),
        Backoff::Fixed => retry.delay,
    };
    let base = base.min(retry.max_delay);
    let jitter = base.mul_f64(rand::random::<f64>() * 0.25);
    base.saturating_sub(jitter)
}
