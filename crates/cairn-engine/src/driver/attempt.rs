//! The attempts of leaf nodes: which run now, which a resume continues or
//! left open, which wait for a retry's delay, and what an attempt's result
//! becomes (finished, cancelled, failed, retried).
//!
//! [`Attempts`] keeps the attempts' handles (their cancel tokens, their
//! hijack flags) and counts; the functions beside it turn a result or an
//! interruption into the events to append. The driver spawns the
//! attempts' tasks and appends what these say.

use std::sync::atomic::AtomicBool;

use super::*;

/// The attempts this driver runs or is about to.
#[derive(Default)]
pub(super) struct Attempts {
    /// Attempts running (or taking their snapshot before they start), with
    /// the token that stops each.
    running: KeyMap<CancellationToken>,
    /// Attempts to continue without a new `NodeStarted` (approvals after a
    /// resume).
    resumed: KeyMap<u32>,
    /// Attempts a stop left open that this resume has not closed because a
    /// cancel came first: the run's end closes them as interrupted before
    /// it cancels their nodes. (A driver that only applies commands starts
    /// no session, and leaves them to the next resume.)
    left_open: KeySet,
    /// Attempts whose snapshot is taken and whose `NodeStarted` is
    /// appended: spawned once it is durable.
    snapshot_ready: Vec<(Key, u32)>,
    /// Retries waiting for their delay.
    retries_pending: usize,
    /// The hijack flags of the agent attempts running now.
    hijack: KeyMap<Arc<AtomicBool>>,
}

impl Attempts {
    /// The attempt of `key` runs (or takes its snapshot), stopped by
    /// `token`.
    pub(super) fn begin(&mut self, key: Key, token: CancellationToken) {
        self.running.insert(key, token);
    }

    /// The attempt of `key` is over (or never started).
    pub(super) fn end(&mut self, key: &Key) {
        self.running.remove(key);
    }

    /// Whether an attempt of `key` runs now.
    pub(super) fn is_running(&self, key: &Key) -> bool {
        self.running.contains_key(key)
    }

    /// Stops the attempt of `key`, if it runs.
    pub(super) fn stop(&self, key: &Key) {
        if let Some(t) = self.running.get(key) {
            t.cancel();
        }
    }

    /// How many attempts run.
    pub(super) fn count(&self) -> usize {
        self.running.len()
    }

    /// The attempts that run.
    pub(super) fn running_keys(&self) -> impl Iterator<Item = &Key> {
        self.running.keys()
    }

    /// The attempt of `key` continues where a stop left it (a gate), as
    /// attempt `attempt`, without a new start.
    pub(super) fn resume(&mut self, key: Key, attempt: u32) {
        self.resumed.insert(key, attempt);
    }

    /// Whether `key`'s attempt is one to continue.
    pub(super) fn is_resumed(&self, key: &Key) -> bool {
        self.resumed.contains_key(key)
    }

    /// The attempt of `key` to continue, taken.
    pub(super) fn take_resumed(&mut self, key: &Key) -> Option<u32> {
        self.resumed.remove(key)
    }

    /// The open attempt of `key` is left for the run's end to close.
    pub(super) fn leave_open(&mut self, key: Key) {
        self.left_open.insert(key);
    }

    /// Whether the run's end must close `key`'s open attempt, taken.
    pub(super) fn close_left_open(&mut self, key: &Key) -> bool {
        self.left_open.remove(key)
    }

    /// The attempt `attempt` of `key` has its snapshot and its
    /// `NodeStarted`: it is spawned once they are durable.
    pub(super) fn snapshot_taken(&mut self, key: Key, attempt: u32) {
        self.snapshot_ready.push((key, attempt));
    }

    /// Moves the attempts ready to spawn to `to_spawn`.
    pub(super) fn take_snapshot_ready(&mut self, to_spawn: &mut Vec<(Key, u32)>) {
        to_spawn.append(&mut self.snapshot_ready);
    }

    /// A retry waits for its delay.
    pub(super) fn retry_scheduled(&mut self) {
        self.retries_pending += 1;
    }

    /// A retry's delay is over.
    pub(super) fn retry_due(&mut self) {
        self.retries_pending = self.retries_pending.saturating_sub(1);
    }

    /// Retries waiting for their delay.
    pub(super) fn retries_pending(&self) -> usize {
        self.retries_pending
    }

    /// The run stops: the retries waiting will not start.
    pub(super) fn forget_retries(&mut self) {
        self.retries_pending = 0;
    }

    /// The hijack flag of `key`'s agent attempt, raised already when
    /// `raised` (the log holds a hijack never handed back).
    pub(super) fn hijack_flag(&mut self, key: Key, raised: bool) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(raised));
        self.hijack.insert(key, flag.clone());
        flag
    }

    /// The attempt of `key` ended: whether it had a hijack flag (which
    /// goes with it).
    pub(super) fn hijack_ended(&mut self, key: &Key) -> bool {
        self.hijack.remove(key).is_some()
    }

    /// The running agent attempt of `node_id` a person may take over (its
    /// latest pass).
    pub(super) fn hijackable(&self, node_id: &str) -> Option<Key> {
        self.hijack
            .keys()
            .filter(|k| k.0 == node_id)
            .max_by_key(|k| k.1)
            .cloned()
    }

    /// Raises the hijack flag of `key`; false when it was raised already.
    /// (The flag, not the fold: the attempt logs its own `RunHijacked`,
    /// which the driver's state does not see.)
    pub(super) fn raise_hijack(&self, key: &Key) -> bool {
        use std::sync::atomic::Ordering;
        match self.hijack.get(key) {
            Some(f) => !f.swap(true, Ordering::SeqCst),
            None => false,
        }
    }

    /// Whether `key`'s hijack flag is up.
    pub(super) fn hijack_raised(&self, key: &Key) -> bool {
        use std::sync::atomic::Ordering;
        self.hijack
            .get(key)
            .is_some_and(|f| f.load(Ordering::SeqCst))
    }
}

/// What an attempt's result becomes.
#[derive(Debug)]
pub(super) enum Outcome {
    /// `NodeFinished` or `NodeCancelled`, which ends the node.
    Ended(EventKind),
    /// A failure, with the snapshot of the files the attempt left:
    /// retried or not, by the node's policy.
    Failed(NodeError, Option<String>),
}

/// What the result of an attempt that ran for `duration_ms`, leaving the
/// files as `snapshot` has them, becomes; `cancel_reason` is the run's
/// cancel's, which names an attempt a cancel stopped.
pub(super) fn outcome(
    result: Result<Value, NodeError>,
    duration_ms: u64,
    snapshot: Option<String>,
    cancel_reason: Option<&str>,
) -> Outcome {
    match result {
        Ok(output) => Outcome::Ended(EventKind::NodeFinished {
            duration_ms,
            output: Some(output.into()),
            cached: None,
            snapshot,
        }),
        Err(e) if e.cancelled => Outcome::Ended(EventKind::NodeCancelled {
            reason: Some(cancel_reason.map_or(e.info.message, str::to_string)),
        }),
        Err(e) => Outcome::Failed(e, snapshot),
    }
}

/// Whether attempt `attempt`, which failed with `e`, is tried again under
/// `policy`: a group's attempt never is, nor any once the run stops.
pub(super) fn will_retry(
    e: &NodeError,
    attempt: u32,
    policy: Option<&RetryPolicy>,
    stopping: bool,
    is_group: bool,
) -> bool {
    let attempts = policy.map_or(1, |p| p.attempts);
    e.retryable && attempt < attempts && !stopping && !is_group
}

/// A failed attempt's events: `NodeFailed` in `scope` (the attempt's),
/// then, when it is retried, `NodeRetrying` for the next attempt after
/// `delay`.
pub(super) fn failure_events(
    scope: Scope,
    attempt: u32,
    error: ErrorInfo,
    retry: Option<Duration>,
    snapshot: Option<String>,
) -> Vec<(Scope, EventKind)> {
    let mut events = vec![(
        scope.clone(),
        EventKind::NodeFailed {
            error,
            will_retry: retry.is_some(),
            snapshot,
        },
    )];
    if let Some(delay) = retry {
        events.push((
            scope.with_attempt(attempt + 1),
            EventKind::NodeRetrying {
                delay_ms: delay.as_millis() as u64,
            },
        ));
    }
    events
}

/// The error of an attempt a stop of the process interrupted.
pub(super) fn interrupted_error() -> NodeError {
    NodeError::new(
        "interrupted",
        "the process driving the run stopped while this attempt was running",
    )
}

impl Driver {
    /// Spawns the task of attempt `attempt` of the leaf `key`.
    pub(super) fn spawn_attempt(&mut self, key: Key, attempt: u32) {
        let inst = self.sched.plan().insts[&key].clone();
        let Some(runner) = runner_for(&inst.spec.kind) else {
            return;
        };
        let ctx = self.attempt_ctx(&inst, attempt);
        self.attempts.begin(key.clone(), ctx.cancel.clone());
        let tx = self.msg_tx.clone();
        let spec = inst.spec.clone();
        tokio::spawn(async move {
            let (result, duration_ms) = run_attempt(runner, &spec, &ctx).await;
            // The files the attempt left, unless a cancel or a stop cut it
            // short (the next attempt's own snapshot says what they are).
            let snapshot = match (&ctx.step_snapshots, &result) {
                (Some(w), Ok(_)) => w.take().await,
                (Some(w), Err(e)) if !e.cancelled => w.take().await,
                _ => None,
            };
            let _ = tx.send(Msg::Done {
                key,
                attempt,
                result,
                duration_ms,
                snapshot,
            });
        });
    }

    /// What an attempt of `inst` gets to run with.
    fn attempt_ctx(&mut self, inst: &Inst, attempt: u32) -> NodeCtx {
        let key = &inst.key;
        let vars = self.vars_for(inst, false);
        let cancel = match &self.stopped {
            Some(stopped) if !self.sched.is_handler(inst) => stopped.child_token(),
            _ => self.run_cancel.child_token(),
        };
        let timeout = inst.spec.timeout.or(self.wf.defaults.timeout);
        let scope = self.node_scope(key).with_attempt(attempt);
        let mut ctx = NodeCtx::new(
            self.run_id.clone(),
            key,
            attempt,
            scope,
            vars,
            self.wf.clone(),
            self.templates.clone(),
            cancel,
            timeout,
            self.services.clone(),
            self.log.clone(),
            self.ask_tx.clone(),
        );
        ctx.max_output_bytes = inst.spec.max_output_bytes.map(|b| b as usize);
        ctx.spend = self.spend.clone();
        ctx.depth = self.state.depth;
        ctx.child_slots = self.child_slots.clone();
        ctx.parking = self.parking.clone();
        ctx.mcp = Some(self.mcp.clone());
        ctx.exit_on_wait = self.exit_on_wait;
        ctx.forked_from = self.state.forked_from.clone();
        ctx.hijack = self.hijack_flag(key, inst);
        ctx.step_snapshots = self.end_snapshot_of(inst);
        ctx.process_env = self.secrets.process_env(&self.wf, &inst.spec);
        ctx.secrets = self.secrets.clone();
        ctx.replay = self.replay.clone();
        ctx
    }

    /// An attempt's task reported its result.
    pub(super) fn attempt_done(
        &mut self,
        key: Key,
        attempt: u32,
        result: Result<Value, NodeError>,
        duration_ms: u64,
        snapshot: Option<String>,
    ) {
        self.attempts.end(&key);
        self.gates.attempt_ended(&key);
        self.hijack_done(&key);
        let Some(inst) = self.sched.plan().insts.get(&key).cloned() else {
            return;
        };
        if self.ending.shutting_down() && matches!(&result, Err(e) if e.cancelled) {
            // Stopped by the engine's shutdown: the resume decides.
            return;
        }
        let reason = self.ending.cancel_reason();
        match outcome(result, duration_ms, snapshot, reason) {
            Outcome::Ended(kind) => {
                let scope = self.node_scope(&key).with_attempt(attempt);
                self.emit(scope, kind);
                self.node_done(&key);
            }
            Outcome::Failed(e, snapshot) => {
                self.fail_attempt_with(&key, &inst, attempt, e, snapshot)
            }
        }
    }

    /// A retry's delay is over: it starts when the run goes on.
    pub(super) fn retry_due(&mut self, key: Key) {
        self.attempts.retry_due();
        if !self.ending.stopping() {
            self.sched.requeue(key);
        }
    }

    /// Closes an attempt that a crash interrupted. A crash is not the
    /// node's failure, so the attempt runs again whatever its retry budget,
    /// unless the node says its work must never run twice.
    pub(super) fn interrupted(&mut self, key: &Key, inst: &Inst, attempt: u32) {
        if self.ending.is_cancelling() {
            // The run is being cancelled: the run's end closes the attempt
            // as interrupted, then cancels the node, with every node not done.
            self.attempts.leave_open(key.clone());
            return;
        }
        let err = interrupted_error();
        if inst.spec.on_interrupt == OnInterrupt::Fail {
            let err = NodeError {
                retryable: false,
                ..err
            };
            self.fail_attempt(key, inst, attempt, err);
            return;
        }
        let scope = self.node_scope(key).with_attempt(attempt);
        self.emit_all(failure_events(
            scope,
            attempt,
            *err.info,
            Some(Duration::ZERO),
            None,
        ));
        self.sched.requeue(key.clone());
    }

    /// Closes an attempt a stop left open as interrupted, without running
    /// it again: the run is ending. Returns whether that failed the node
    /// (`on_interrupt: fail`); otherwise its rerun is announced, and the
    /// run's end cancels it between the two attempts.
    pub(super) fn close_interrupted(&mut self, key: &Key, attempt: u32) -> bool {
        let fails = self
            .sched
            .plan()
            .insts
            .get(key)
            .is_some_and(|i| i.spec.on_interrupt == OnInterrupt::Fail);
        let scope = self.node_scope(key).with_attempt(attempt);
        let rerun = (!fails).then_some(Duration::ZERO);
        self.emit_all(failure_events(
            scope,
            attempt,
            *interrupted_error().info,
            rerun,
            None,
        ));
        fails
    }

    /// Fails attempt `attempt` of `inst` with `e`.
    pub(super) fn fail_attempt(&mut self, key: &Key, inst: &Inst, attempt: u32, e: NodeError) {
        self.fail_attempt_with(key, inst, attempt, e, None);
    }

    /// [`Driver::fail_attempt`] with the snapshot of the files the attempt
    /// left: retried after the policy's delay, or the node ends failed
    /// (failing the run unless it says `on_failure: continue`).
    pub(super) fn fail_attempt_with(
        &mut self,
        key: &Key,
        inst: &Inst,
        attempt: u32,
        e: NodeError,
        snapshot: Option<String>,
    ) {
        let policy = inst
            .spec
            .retry
            .clone()
            .or_else(|| self.wf.defaults.retry.clone());
        let is_group = inst.spec.kind.children().is_some();
        let retry = will_retry(
            &e,
            attempt,
            policy.as_ref(),
            self.ending.stopping(),
            is_group,
        )
        .then(|| {
            policy
                .map(|p| p.delay_before(attempt + 1, rand::random::<f64>()))
                .unwrap_or_default()
        });
        let scope = self.node_scope(key).with_attempt(attempt);
        let info = (*e.info).clone();
        self.emit_all(failure_events(scope, attempt, info, retry, snapshot));
        if let Some(delay) = retry {
            self.attempts.retry_scheduled();
            let tx = self.msg_tx.clone();
            let key = key.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = tx.send(Msg::RetryDue(key));
            });
            return;
        }
        if inst.spec.on_failure == OnFailure::Fail {
            self.fail_run(key, *e.info);
        }
        self.node_done(key);
    }

    /// The run fails because node `key` failed with `error`, unless it is
    /// already failing or being cancelled.
    pub(super) fn fail_run(&mut self, key: &Key, error: ErrorInfo) {
        if self.ending.node_failed(key, error) {
            self.run_cancel.cancel();
        }
    }
}

/// Runs an attempt in its task: its heartbeats, its timeout. Returns its
/// result and how long it took.
async fn run_attempt(
    runner: &'static dyn crate::node::NodeRunner,
    spec: &cairn_workflow::NodeSpec,
    ctx: &NodeCtx,
) -> (Result<Value, NodeError>, u64) {
    let t0 = Instant::now();
    let timeout = ctx.timeout;
    let fut = runner.run(spec, ctx);
    tokio::pin!(fut);
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut timed_out = false;
    let result = loop {
        tokio::select! {
            r = &mut fut => break r,
            _ = beat.tick() => {
                let elapsed_ms = t0.elapsed().as_millis() as u64;
                let timeout_ms = timeout.map(|t| t.as_millis() as u64);
                ctx.log.append(ctx.scope.clone(), EventKind::NodeHeartbeat {
                    elapsed_ms,
                    timeout_ms,
                    percent_elapsed: timeout_ms.map(|t| (elapsed_ms as f64 * 100.0 / t.max(1) as f64).min(100.0)),
                });
            }
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() && !timed_out => {
                timed_out = true;
                ctx.cancel.cancel();
            }
        }
    };
    let result = if timed_out {
        Err(NodeError::new(
            "timeout",
            format!(
                "timed out after {}",
                fmt_duration(timeout.unwrap_or_default())
            ),
        ))
    } else {
        result
    };
    (result, t0.elapsed().as_millis() as u64)
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if !ms.is_multiple_of(60_000) || ms == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::testing::key;
    use cairn_workflow::Backoff;
    use serde_json::json;

    fn policy(attempts: u32) -> RetryPolicy {
        RetryPolicy {
            attempts,
            backoff: Backoff::Fixed,
            delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_result_becomes_an_end_or_a_failure() {
        match outcome(Ok(json!(1)), 3, Some("s".into()), None) {
            Outcome::Ended(EventKind::NodeFinished {
                duration_ms: 3,
                snapshot: Some(s),
                ..
            }) => assert_eq!(s, "s"),
            other => panic!("{other:?}"),
        }
        // A cancel's own reason names the attempt it stopped.
        let stopped = Err(NodeError::cancelled("stopped"));
        match outcome(stopped, 3, None, Some("enough")) {
            Outcome::Ended(EventKind::NodeCancelled { reason }) => {
                assert_eq!(reason.as_deref(), Some("enough"))
            }
            other => panic!("{other:?}"),
        }
        let stopped = Err(NodeError::cancelled("stopped"));
        match outcome(stopped, 3, None, None) {
            Outcome::Ended(EventKind::NodeCancelled { reason }) => {
                assert_eq!(reason.as_deref(), Some("stopped"))
            }
            other => panic!("{other:?}"),
        }
        let broke = Err(NodeError::new("x", "broke"));
        assert!(matches!(
            outcome(broke, 3, Some("s".into()), None),
            Outcome::Failed(_, Some(_))
        ));
    }

    #[test]
    fn an_attempt_is_retried_within_its_budget_unless_the_run_stops() {
        let e = NodeError::new("x", "broke");
        assert!(will_retry(&e, 1, Some(&policy(2)), false, false));
        assert!(!will_retry(&e, 2, Some(&policy(2)), false, false));
        assert!(!will_retry(&e, 1, None, false, false));
        assert!(!will_retry(&e, 1, Some(&policy(2)), true, false));
        assert!(!will_retry(&e, 1, Some(&policy(2)), false, true));
        let fatal = NodeError::fatal("x", "broke");
        assert!(!will_retry(&fatal, 1, Some(&policy(3)), false, false));
    }

    #[test]
    fn a_retry_is_announced_for_the_next_attempt() {
        let scope = Scope::node("a", 0).with_attempt(2);
        let events = failure_events(
            scope.clone(),
            2,
            ErrorInfo::new("x", "broke"),
            Some(Duration::from_millis(1500)),
            None,
        );
        assert_eq!(
            events,
            vec![
                (
                    scope.clone(),
                    EventKind::NodeFailed {
                        error: ErrorInfo::new("x", "broke"),
                        will_retry: true,
                        snapshot: None
                    }
                ),
                (
                    scope.with_attempt(3),
                    EventKind::NodeRetrying { delay_ms: 1500 }
                ),
            ]
        );
        let last = failure_events(Scope::node("a", 0), 3, ErrorInfo::new("x", "y"), None, None);
        assert!(matches!(
            &last[..],
            [(
                _,
                EventKind::NodeFailed {
                    will_retry: false,
                    ..
                }
            )]
        ));
    }

    #[test]
    fn attempts_count_what_runs_and_what_waits() {
        let mut a = Attempts::default();
        let (x, y) = (key("x"), key("y"));
        let token = CancellationToken::new();
        a.begin(x.clone(), token.clone());
        assert!(a.is_running(&x) && a.count() == 1);
        a.stop(&x);
        assert!(token.is_cancelled());
        a.end(&x);
        assert_eq!(a.count(), 0);

        a.resume(y.clone(), 2);
        assert!(a.is_resumed(&y));
        assert_eq!(a.take_resumed(&y), Some(2));
        assert!(!a.is_resumed(&y));

        a.leave_open(x.clone());
        assert!(a.close_left_open(&x));
        assert!(!a.close_left_open(&x));

        a.retry_scheduled();
        a.retry_scheduled();
        a.retry_due();
        assert_eq!(a.retries_pending(), 1);
        a.forget_retries();
        assert_eq!(a.retries_pending(), 0);

        a.snapshot_taken(x.clone(), 1);
        let mut to_spawn = Vec::new();
        a.take_snapshot_ready(&mut to_spawn);
        assert_eq!(to_spawn, vec![(x, 1)]);
    }

    #[test]
    fn a_hijack_raises_the_latest_passs_flag_once() {
        let mut a = Attempts::default();
        let (p0, p1) = (("agent".into(), 0), ("agent".into(), 1));
        a.hijack_flag(p0, false);
        let flag = a.hijack_flag(p1, false);
        let target = a.hijackable("agent").unwrap();
        assert_eq!(target.1, 1);
        assert!(a.raise_hijack(&target));
        assert!(flag.load(std::sync::atomic::Ordering::SeqCst));
        assert!(a.hijack_raised(&target));
        assert!(!a.raise_hijack(&target), "raised already");
        assert!(a.hijack_ended(&target));
        assert!(!a.hijack_ended(&target));
        assert_eq!(a.hijackable("other"), None);
    }
}
