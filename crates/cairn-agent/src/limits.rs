//! The budget every agent of the process draws from when it calls one
//! model: calls in flight, calls begun per minute, tokens per minute
//! (`max_concurrency`, `requests_per_minute`, `tokens_per_minute`), and a
//! pause all of them keep when the provider answered 429 with a wait.
//!
//! A hundred agents on one model that each met the provider's limit on
//! their own would each retry their own 429s; a [`Gate`] makes them queue
//! instead, first come first served, and says why each waits so that the
//! engine can log it (`AgentWaiting`). Agents share a gate when their
//! models name the same provider, address, model id and limits
//! ([`gate_for`]); the gates live as long as the process.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use cairn_models::{Limits, ModelConfig};

/// The window `requests_per_minute` and `tokens_per_minute` count over.
const WINDOW: Duration = Duration::from_secs(60);

/// Why a call waits, as `AgentWaiting.reason` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// `max_concurrency` calls are in flight.
    Concurrency,
    /// `requests_per_minute` calls began in the last minute, or the
    /// provider asked everyone to wait (a 429 with `retry-after`).
    RequestsPerMinute,
    /// The last minute's tokens and this call's would pass
    /// `tokens_per_minute`.
    TokensPerMinute,
}

impl WaitReason {
    /// As the event writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Concurrency => "concurrency",
            WaitReason::RequestsPerMinute => "requests_per_minute",
            WaitReason::TokensPerMinute => "tokens_per_minute",
        }
    }
}

/// One model's shared budget.
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    /// `max_concurrency`'s slots, handed out in the order asked (tokio's
    /// semaphore is fair).
    slots: Option<Arc<Semaphore>>,
    /// The turn to look at the windows: one caller at a time waits for
    /// them, the others queue behind it, so a freed minute wakes one
    /// caller, not every one.
    turn: tokio::sync::Mutex<()>,
    windows: Mutex<Windows>,
}

#[derive(Debug, Default)]
struct Windows {
    /// When each call of the last minute began.
    starts: VecDeque<Instant>,
    /// (when, tokens, ticket) of each call of the last minute: the
    /// estimate until the call reports its usage.
    tokens: VecDeque<(Instant, u64, u64)>,
    next_ticket: u64,
    /// No call begins before this (the provider asked for a wait).
    paused_until: Option<Instant>,
    /// Why the caller whose turn it is waits, for those behind it.
    blocked: Option<WaitReason>,
}

impl Windows {
    fn expire(&mut self, now: Instant) {
        while self.starts.front().is_some_and(|t| now >= *t + WINDOW) {
            self.starts.pop_front();
        }
        while self
            .tokens
            .front()
            .is_some_and(|(t, ..)| now >= *t + WINDOW)
        {
            self.tokens.pop_front();
        }
    }

    /// How long a call of `estimate` tokens must wait, and why; `None`
    /// when it may begin now.
    fn wait(
        &mut self,
        limits: &Limits,
        estimate: u64,
        now: Instant,
    ) -> Option<(WaitReason, Duration)> {
        self.expire(now);
        if let Some(until) = self.paused_until.filter(|u| *u > now) {
            return Some((WaitReason::RequestsPerMinute, until - now));
        }
        if let Some(rpm) = limits.requests_per_minute {
            if self.starts.len() >= rpm as usize {
                // The oldest start leaves the window first.
                let oldest = self.starts[self.starts.len() - rpm as usize];
                return Some((WaitReason::RequestsPerMinute, oldest + WINDOW - now));
            }
        }
        if let Some(tpm) = limits.tokens_per_minute {
            let used: u64 = self.tokens.iter().map(|(_, n, _)| n).sum();
            // A call larger than the whole budget goes alone, when the
            // window is empty: waiting would never help it.
            if used > 0 && used.saturating_add(estimate) > tpm {
                let mut freed = 0;
                let need = used.saturating_add(estimate) - tpm;
                for (t, n, _) in &self.tokens {
                    freed += n;
                    if freed >= need {
                        return Some((WaitReason::TokensPerMinute, *t + WINDOW - now));
                    }
                }
                let last = self.tokens.back().map_or(now, |(t, ..)| *t);
                return Some((WaitReason::TokensPerMinute, last + WINDOW - now));
            }
        }
        None
    }
}

/// A call's place in its model's budget, held while the call runs: its
/// concurrency slot is given back when it drops.
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
    ticket: Option<u64>,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Permit {
    /// Counts what the call really used instead of its estimate.
    pub fn settle(&mut self, tokens: u64) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let mut w = self.gate.lock();
        if let Some(entry) = w.tokens.iter_mut().find(|(_, _, t)| *t == ticket) {
            entry.1 = tokens;
        }
    }
}

impl Gate {
    /// A budget of `limits`.
    pub fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            slots: limits
                .max_concurrency
                .map(|n| Arc::new(Semaphore::new(n.max(1) as usize))),
            turn: tokio::sync::Mutex::new(()),
            windows: Mutex::new(Windows::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a share of the budget for a call of about `estimate`
    /// tokens; `on_wait` hears each time the call has to wait, why, and
    /// for how long when that is known. Dropping the future gives back
    /// whatever it held.
    pub async fn acquire(
        self: &Arc<Self>,
        estimate: u64,
        on_wait: &mut (dyn FnMut(WaitReason, Option<Duration>) + Send),
    ) -> Permit {
        let slot = match &self.slots {
            None => None,
            Some(s) => Some(match s.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    on_wait(WaitReason::Concurrency, None);
                    s.clone()
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed")
                }
            }),
        };
        let turn = match self.turn.try_lock() {
            Ok(t) => t,
            Err(_) => {
                let why = self.lock().blocked;
                if let Some(why) = why {
                    on_wait(why, None);
                }
                self.turn.lock().await
            }
        };
        let mut last: Option<WaitReason> = None;
        let ticket = loop {
            match self.try_begin(estimate) {
                Ok(ticket) => break ticket,
                Err((why, d)) => {
                    if last != Some(why) {
                        on_wait(why, Some(d));
                        last = Some(why);
                    }
                    tokio::time::sleep(d).await;
                }
            }
        };
        drop(turn);
        Permit {
            gate: self.clone(),
            ticket,
            _slot: slot,
        }
    }

    /// Counts a call that begins now, or says how long it must wait.
    fn try_begin(&self, estimate: u64) -> Result<Option<u64>, (WaitReason, Duration)> {
        let now = Instant::now();
        let mut w = self.lock();
        if let Some(blocked) = w.wait(&self.limits, estimate, now) {
            w.blocked = Some(blocked.0);
            return Err(blocked);
        }
        w.blocked = None;
        w.starts.push_back(now);
        Ok(self.limits.tokens_per_minute.map(|_| {
            w.next_ticket += 1;
            let t = w.next_ticket;
            w.tokens.push_back((now, estimate, t));
            t
        }))
    }

    /// No call of this model begins for `d`: the provider answered one
    /// with 429 and asked for that wait, which every agent keeps rather
    /// than each meeting the limit again.
    pub fn pause(&self, d: Duration) {
        let until = Instant::now() + d.min(WINDOW);
        let mut w = self.lock();
        if w.paused_until.is_none_or(|u| u < until) {
            w.paused_until = Some(until);
        }
    }
}

/// What makes two models share a budget, as text: the provider, its
/// address, the model id and the limits. The same in every process, so a
/// store that many processes share keys its budgets by it too.
pub fn budget_key(config: &ModelConfig) -> String {
    let base = config
        .base_url
        .as_deref()
        .or(config.provider.def().base_url)
        .unwrap_or("");
    let l = &config.limits;
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    format!(
        "{} {base} {} c{} r{} t{}",
        config.provider.as_str(),
        config.model,
        n(l.max_concurrency.map(u64::from)),
        n(l.requests_per_minute.map(u64::from)),
        n(l.tokens_per_minute),
    )
}

/// The gate of `config`'s model, shared by every model of the process
/// with the same provider, address, model id and limits
/// ([`budget_key`]).
pub fn gate_for(config: &ModelConfig) -> Arc<Gate> {
    static GATES: OnceLock<Mutex<HashMap<String, Arc<Gate>>>> = OnceLock::new();
    let mut gates = GATES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    gates
        .entry(budget_key(config))
        .or_insert_with(|| Arc::new(Gate::new(config.limits)))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(c: Option<u32>, rpm: Option<u32>, tpm: Option<u64>) -> Limits {
        Limits {
            max_concurrency: c,
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_past_the_concurrency_wait_for_a_slot_in_order() {
        let gate = Arc::new(Gate::new(limits(Some(2), None, None)));
        let mut waits = Vec::new();
        let a = gate.acquire(10, &mut |r, d| waits.push((r, d))).await;
        let _b = gate.acquire(10, &mut |r, d| waits.push((r, d))).await;
        assert!(waits.is_empty());
        let g = gate.clone();
        let third = tokio::spawn(async move {
            let mut w = Vec::new();
            let _p = g.acquire(10, &mut |r, d| w.push((r, d))).await;
            w
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!third.is_finished());
        drop(a);
        let w = third.await.unwrap();
        assert_eq!(w, vec![(WaitReason::Concurrency, None)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_minutes_requests_and_tokens_are_waited_out() {
        let gate = Arc::new(Gate::new(limits(None, Some(2), None)));
        let t0 = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..3 {
            let _p = gate.acquire(1, &mut |r, d| waits.push((r, d))).await;
        }
        assert_eq!(waits.len(), 1);
        assert_eq!(waits[0].0, WaitReason::RequestsPerMinute);
        assert!(Instant::now() - t0 >= WINDOW);

        let gate = Arc::new(Gate::new(limits(None, None, Some(1000))));
        let mut waits = Vec::new();
        let mut p = gate.acquire(800, &mut |r, d| waits.push((r, d))).await;
        // The call used less than estimated: the rest is free again.
        p.settle(300);
        let _q = gate.acquire(600, &mut |r, d| waits.push((r, d))).await;
        assert!(waits.is_empty());
        let t1 = Instant::now();
        let _r = gate.acquire(500, &mut |r, d| waits.push((r, d))).await;
        assert_eq!(waits.len(), 1);
        assert_eq!(waits[0].0, WaitReason::TokensPerMinute);
        assert!(Instant::now() - t1 >= WINDOW - Duration::from_millis(1));
        // One call larger than the whole budget goes alone.
        let big = Arc::new(Gate::new(limits(None, None, Some(100))));
        let _b = big.acquire(5000, &mut |_, _| panic!("no wait")).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_providers_429_pauses_every_caller() {
        let gate = Arc::new(Gate::new(Limits::default()));
        gate.pause(Duration::from_secs(3));
        let t0 = Instant::now();
        let mut waits = Vec::new();
        let _p = gate.acquire(1, &mut |r, d| waits.push((r, d))).await;
        assert_eq!(waits.len(), 1);
        assert!(Instant::now() - t0 >= Duration::from_secs(3));
    }

    #[test]
    fn models_with_the_same_endpoint_and_limits_share_a_gate() {
        let mut a = ModelConfig::new(cairn_models::ProviderKind::OpenAi, "gpt-4o");
        a.limits = limits(Some(3), None, None);
        let b = a.clone();
        assert!(Arc::ptr_eq(&gate_for(&a), &gate_for(&b)));
        let mut c = a.clone();
        c.base_url = Some("http://127.0.0.1:1".into());
        assert!(!Arc::ptr_eq(&gate_for(&a), &gate_for(&c)));
    }
}
