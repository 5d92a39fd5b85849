//! How a run ends: why it stops (a cancel, a node's failure, the engine's
//! shutdown), and, when nothing is left to run or wait for, the nodes not
//! done cancelled and the run's summary and terminal event committed.

use super::*;

/// Why the run stops, when it does. Set once per cause: the first
/// failure fails the run, a second cancel changes nothing.
#[derive(Debug, Default)]
pub(super) struct Ending {
    /// The error the run fails with.
    failing: Option<ErrorInfo>,
    /// The cancel under way: how, and why.
    cancelling: Option<(CancelMechanism, Option<String>)>,
    /// The engine is shutting down: running nodes have this long to reach
    /// a safe point.
    shutdown_grace: Option<Duration>,
}

/// How the run ends, once nothing runs.
#[derive(Debug)]
pub(super) struct Terminal {
    pub status: RunStatus,
    pub outcome: RunOutcome,
    /// `RunFinished`, `RunFailed` or `RunCancelled`.
    pub event: EventKind,
}

impl Ending {
    /// A driver's start: `cancel_requested` is the reason of a cancel the
    /// log holds with no end after it (empty when none was given), which
    /// goes on as an immediate one, since whatever was running was stopped
    /// with the process that ran it.
    pub(super) fn new(cancel_requested: Option<String>) -> Ending {
        Ending {
            cancelling: cancel_requested.map(|reason| {
                (
                    CancelMechanism::Immediate,
                    (!reason.is_empty()).then_some(reason),
                )
            }),
            ..Ending::default()
        }
    }

    /// The run is being cancelled or fails: nothing new starts.
    pub(super) fn stopping(&self) -> bool {
        self.cancelling.is_some() || self.failing.is_some()
    }

    /// The run stops, or the engine does.
    pub(super) fn halted(&self) -> bool {
        self.stopping() || self.shutdown_grace.is_some()
    }

    /// The run fails (and no cancel came first).
    pub(super) fn failing(&self) -> bool {
        self.failing.is_some() && self.cancelling.is_none()
    }

    /// A cancel is under way.
    pub(super) fn is_cancelling(&self) -> bool {
        self.cancelling.is_some()
    }

    /// A graceful cancel is under way: running work finishes, gates stop.
    pub(super) fn graceful(&self) -> bool {
        matches!(self.cancelling, Some((CancelMechanism::Graceful, _)))
    }

    /// The engine is shutting down.
    pub(super) fn shutting_down(&self) -> bool {
        self.shutdown_grace.is_some()
    }

    /// The engine shuts down, giving running nodes `grace`.
    pub(super) fn shut_down(&mut self, grace: Duration) {
        self.shutdown_grace = Some(grace);
    }

    /// A cancel, once its `RunCancelRequested` is durable.
    pub(super) fn cancel(&mut self, mechanism: CancelMechanism, reason: Option<String>) {
        self.cancelling.get_or_insert((mechanism, reason));
    }

    /// Node `key` failed with `error`, failing the run: true when that is
    /// news (the run was neither failing nor being cancelled already).
    pub(super) fn node_failed(&mut self, key: &Key, error: ErrorInfo) -> bool {
        if self.stopping() {
            return false;
        }
        let mut info = ErrorInfo::new(
            "node-failed",
            format!("node `{}` failed: {}", key.0, error.message),
        );
        info.details = Some(json!({ "nodeId": key.0, "iteration": key.1, "error": error }));
        self.failing = Some(info);
        true
    }

    /// Nothing runs, nothing waits, and these nodes never ended: the run
    /// fails as stuck.
    pub(super) fn stuck(&mut self, not_done: &[Key]) {
        let names: Vec<&str> = not_done.iter().take(5).map(|k| k.0.as_str()).collect();
        self.failing = Some(ErrorInfo::new(
            "stuck",
            format!("nodes can never start: {}", names.join(", ")),
        ));
    }

    /// The reason an attempt the cancel stopped is cancelled with, when a
    /// cancel gave one.
    pub(super) fn cancel_reason(&self) -> Option<&str> {
        self.cancelling.as_ref().and_then(|c| c.1.as_deref())
    }

    /// Why the nodes not done when the run stops are cancelled.
    pub(super) fn leftover_reason(&self) -> &'static str {
        if self.cancelling.is_some() {
            "run cancelled"
        } else {
            "run failed"
        }
    }

    /// How the run ends: cancelled, failed, or finished with its output,
    /// rendered (`output`) only then.
    pub(super) fn terminal(
        &self,
        output: impl FnOnce() -> Result<Option<Value>, ErrorInfo>,
        duration_ms: u64,
    ) -> Terminal {
        if let Some((_, reason)) = &self.cancelling {
            return Terminal {
                status: RunStatus::Cancelled,
                outcome: RunOutcome::Cancelled,
                event: EventKind::RunCancelled {
                    reason: reason.clone(),
                },
            };
        }
        let failed = |err: ErrorInfo| Terminal {
            status: RunStatus::Failed,
            outcome: RunOutcome::Failed(err.clone()),
            event: EventKind::RunFailed { error: err },
        };
        if let Some(err) = &self.failing {
            return failed(err.clone());
        }
        match output() {
            Ok(output) => Terminal {
                status: RunStatus::Finished,
                outcome: RunOutcome::Finished(output.clone()),
                event: EventKind::RunFinished {
                    output,
                    duration_ms,
                },
            },
            Err(err) => failed(err),
        }
    }

    /// Why the run cannot take a new definition now, when it stops.
    pub(super) fn reload_blocker(&self) -> Option<String> {
        if let Some((_, reason)) = &self.cancelling {
            return Some(match reason {
                Some(r) => format!("the run is being cancelled ({r})"),
                None => "the run is being cancelled".into(),
            });
        }
        if self.failing.is_some() {
            return Some("the run is failing: it ends with the definition it failed with".into());
        }
        if self.shutdown_grace.is_some() {
            return Some(
                "the engine is stopping; the resume runs the definition the run has".into(),
            );
        }
        None
    }
}

impl Driver {
    /// Ends the run when nothing is left to run or wait for (or the engine
    /// stops); `None` while the run goes on.
    pub(super) async fn maybe_end(&mut self) -> Option<RunOutcome> {
        if self.attempts.count() > 0 || self.sched.has_checks() || self.scoring.busy() {
            return None;
        }
        if self.ending.shutting_down() {
            self.mcp.close("the engine stopped").await;
            return Some(RunOutcome::Interrupted);
        }
        let stopping = self.ending.stopping();
        if !stopping && (self.attempts.retries_pending() > 0 || self.sched.has_ready()) {
            return None;
        }
        if stopping {
            // The nodes that will not run are cancelled first; the failure
            // handlers that this lets be asked run before the run ends.
            let held = self.cancel_leftovers(false);
            if held > 0 {
                if self.sched.has_checks() || self.sched.has_ready() {
                    return None;
                }
                self.cancel_leftovers(true);
            }
        }
        let not_done: Vec<Key> = self
            .sched
            .plan()
            .order
            .iter()
            .filter(|i| !self.status_of(&i.key).is_some_and(|s| s.is_done()))
            .map(|i| i.key.clone())
            .collect();
        if !not_done.is_empty() && !stopping {
            // Applying commands starts nothing, and leaves the attempts a
            // stop interrupted open for the next resume: what has not ended
            // is that resume's to run, not a sign the run is stuck.
            if self.gates.approval_count() > 0 || self.mode == Mode::Apply {
                return None;
            }
            self.ending.stuck(&not_done);
        }
        self.mcp.close("the run ended").await;
        Some(self.finish().await)
    }

    /// The run stops: every node not done is cancelled (an attempt a stop
    /// left open closed as interrupted first), but for failure handlers
    /// unless `handlers_too`. Returns how many handlers it left.
    fn cancel_leftovers(&mut self, handlers_too: bool) -> usize {
        self.attempts.forget_retries();
        self.sched.stop();
        let reason = self.ending.leftover_reason();
        let mut held = 0;
        for key in self.plan_keys() {
            let Some(n) = self.state.node(&key.0, key.1).cloned() else {
                continue;
            };
            if n.status.is_done() {
                continue;
            }
            if !handlers_too
                && self
                    .sched
                    .inst(&key)
                    .is_some_and(|i| self.sched.is_handler(i))
            {
                held += 1;
                continue;
            }
            let open = n.open_attempt();
            if let Some(attempt) = open.filter(|_| self.attempts.close_left_open(&key)) {
                // An attempt a stop left open (the resume that would
                // have closed it was cut short by this end, or only
                // applies commands): closed as interrupted first, as
                // every resume closes one.
                if self.close_interrupted(&key, attempt) {
                    self.node_done(&key);
                    continue;
                }
            }
            let mut scope = self.node_scope(&key);
            if n.attempt > 0 {
                // The attempt that was running, or the last one that
                // ran when the cancel came between retries.
                scope = scope.with_attempt(n.attempt);
            }
            self.emit(
                scope,
                EventKind::NodeCancelled {
                    reason: Some(reason.into()),
                },
            );
            self.node_done(&key);
        }
        held
    }

    /// Commits the run's summary, its last status and its terminal event,
    /// and waits for them to be durable.
    pub(super) async fn finish(&mut self) -> RunOutcome {
        let terminal = self.ending.terminal(
            || match &self.wf.output {
                Some(t) => {
                    let ctx = self.run_context();
                    self.templates
                        .render_in(t, &ctx)
                        .map(Some)
                        .map_err(|e| ErrorInfo::new("template", format!("workflow output: {e}")))
                }
                None => Ok(None),
            },
            self.duration_ms(),
        );
        // The summary of a large run takes a while to build: the durations
        // are taken after it, so they cover the run up to its end.
        let mut summary = tallies::summary(&self.state, self.spend.session(), self.duration_ms());
        let Terminal {
            status,
            outcome,
            event: mut kind,
        } = terminal;
        let end = self.duration_ms();
        if let EventKind::RunSummary { duration_ms, .. } = &mut summary {
            *duration_ms = end;
        }
        if let EventKind::RunFinished { duration_ms, .. } = &mut kind {
            *duration_ms = end;
        }
        self.emit(Scope::run(), summary);
        self.emit(Scope::run(), EventKind::RunStatusChanged { status });
        self.emit(Scope::run(), kind);
        if let Err(e) = self.log.sync().await {
            return RunOutcome::Failed(ErrorInfo::new("store", e.to_string()));
        }
        outcome
    }

    /// How long the run has taken, from its first `RunStarted`.
    pub(super) fn duration_ms(&self) -> u64 {
        self.state
            .started_ms
            .map_or(0, |s| (crate::node::now_ms() - s).max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::testing::key;

    #[test]
    fn the_first_failure_fails_the_run_and_a_cancel_wins_over_it() {
        let mut e = Ending::default();
        assert!(!e.halted());
        assert!(e.node_failed(&key("a"), ErrorInfo::new("x", "broke")));
        assert!(!e.node_failed(&key("b"), ErrorInfo::new("y", "broke too")));
        assert!(e.stopping() && !e.is_cancelling());
        assert_eq!(e.leftover_reason(), "run failed");
        let t = e.terminal(|| panic!("a failing run renders no output"), 5);
        match t.event {
            EventKind::RunFailed { error } => {
                assert_eq!(error.kind, "node-failed");
                assert_eq!(error.message, "node `a` failed: broke");
                assert_eq!(error.details.unwrap()["error"]["kind"], "x");
            }
            other => panic!("{other:?}"),
        }
        assert!(e.reload_blocker().unwrap().contains("failing"));

        e.cancel(CancelMechanism::Graceful, Some("enough".into()));
        assert!(e.graceful());
        assert_eq!(e.cancel_reason(), Some("enough"));
        // A second cancel changes nothing.
        e.cancel(CancelMechanism::Immediate, None);
        assert!(e.graceful());
        let t = e.terminal(|| Ok(None), 5);
        assert_eq!(t.status, RunStatus::Cancelled);
        assert_eq!(
            t.event,
            EventKind::RunCancelled {
                reason: Some("enough".into())
            }
        );
    }

    #[test]
    fn a_cancel_the_log_holds_goes_on_at_once() {
        let e = Ending::new(Some(String::new()));
        assert!(e.is_cancelling() && !e.graceful());
        assert_eq!(e.cancel_reason(), None);
        assert_eq!(e.leftover_reason(), "run cancelled");
        assert_eq!(
            e.reload_blocker().as_deref(),
            Some("the run is being cancelled")
        );
    }

    #[test]
    fn a_run_finishes_with_its_output_or_fails_rendering_it() {
        let mut e = Ending::default();
        let t = e.terminal(|| Ok(Some(json!(1))), 7);
        assert_eq!(t.status, RunStatus::Finished);
        assert_eq!(
            t.event,
            EventKind::RunFinished {
                output: Some(json!(1)),
                duration_ms: 7
            }
        );
        let t = e.terminal(|| Err(ErrorInfo::new("template", "bad")), 7);
        assert_eq!(t.status, RunStatus::Failed);
        e.stuck(&[key("a"), key("b")]);
        let t = e.terminal(|| Ok(None), 7);
        match t.event {
            EventKind::RunFailed { error } => {
                assert_eq!(error.message, "nodes can never start: a, b")
            }
            other => panic!("{other:?}"),
        }
        e.shut_down(Duration::from_secs(1));
        assert!(e.shutting_down());
    }
}
