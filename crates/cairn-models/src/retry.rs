//! How often and how patiently something is retried: a node (`retry`,
//! `defaults.retry`) or a model call (`models.<name>.retry`).

use std::time::Duration;

/// How retries space out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backoff {
    /// The same delay each time.
    Fixed,
    /// The delay doubles each time, up to `max_delay`.
    #[default]
    Exponential,
}

/// `retry.delay` when not written.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(1);
/// `retry.max_delay` when not written.
pub const DEFAULT_RETRY_MAX_DELAY: Duration = Duration::from_secs(60);

/// How often and how patiently a node or a model call is retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts, at least 1.
    pub attempts: u32,
    /// How the delay grows.
    pub backoff: Backoff,
    /// Base delay.
    pub delay: Duration,
    /// Cap on one delay.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Delay before attempt `next_attempt` (2, 3, ...), with jitter in [0.5x, 1x] from a
    /// caller-given fraction so tests are deterministic.
    ///
    /// `jitter` is clamped to [0, 1] and maps linearly onto a factor in [0.5, 1], so a
    /// crowd of failing nodes does not retry in lockstep yet never waits longer than the
    /// policy says. Exponential backoff doubles `delay` per earlier retry; both kinds are
    /// capped at `max_delay`.
    pub fn delay_before(&self, next_attempt: u32, jitter: f64) -> Duration {
        let retries_before = next_attempt.saturating_sub(2);
        let base = match self.backoff {
            Backoff::Fixed => self.delay,
            Backoff::Exponential => {
                // Past 2^32 the cap has long been reached; saturate instead of overflowing.
                let factor = 2u32.checked_pow(retries_before).unwrap_or(u32::MAX);
                self.delay.checked_mul(factor).unwrap_or(Duration::MAX)
            }
        };
        let capped = base.min(self.max_delay);
        let j = if jitter.is_nan() {
            1.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        capped.mul_f64(0.5 + 0.5 * j)
    }

    /// The policy used when a node sets none: one attempt, no retry.
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            backoff: Backoff::Exponential,
            delay: DEFAULT_RETRY_DELAY,
            max_delay: DEFAULT_RETRY_MAX_DELAY,
        }
    }
}
