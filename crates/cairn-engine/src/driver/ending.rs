//! How a run ends: when nothing is left to run or wait for, the nodes not
//! done are cancelled (a cancel, a failure) and the run's summary and
//! terminal event are committed.

use super::*;

impl Driver {
    pub(super) async fn maybe_end(&mut self) -> Option<RunOutcome> {
        if !self.running.is_empty()
            || !self.check_queue.is_empty()
            || self.scorers_running > 0
            || !self.scorer_queue.is_empty()
        {
            return None;
        }
        if self.shutdown_grace.is_some() {
            self.mcp.close("the engine stopped").await;
            return Some(RunOutcome::Interrupted);
        }
        let stopping = self.cancelling.is_some() || self.failing.is_some();
        if !stopping && (self.retry_pending > 0 || !self.ready.is_empty()) {
            return None;
        }
        if stopping {
            self.retry_pending = 0;
            self.ready.clear();
            self.queued.clear();
            let reason = if self.cancelling.is_some() {
                "run cancelled"
            } else {
                "run failed"
            };
            for key in self.plan_keys() {
                let Some(n) = self.state.node(&key.0, key.1).cloned() else {
                    continue;
                };
                if n.status.is_done() {
                    continue;
                }
                if let Some(attempt) = n.open_attempt().filter(|_| self.left_open.remove(&key)) {
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
        }
        let not_done: Vec<Key> = self
            .plan
            .order
            .iter()
            .filter(|i| !self.status_of(&i.key).is_some_and(|s| s.is_done()))
            .map(|i| i.key.clone())
            .collect();
        if !not_done.is_empty() && !stopping {
            // Applying commands starts nothing, and leaves the attempts a
            // stop interrupted open for the next resume: what has not ended
            // is that resume's to run, not a sign the run is stuck.
            if !self.waiting.is_empty() || self.mode == Mode::Apply {
                return None;
            }
            let names: Vec<&str> = not_done.iter().take(5).map(|k| k.0.as_str()).collect();
            self.failing = Some(ErrorInfo::new(
                "stuck",
                format!("nodes can never start: {}", names.join(", ")),
            ));
        }
        self.mcp.close("the run ended").await;
        Some(self.finish().await)
    }

    pub(super) async fn finish(&mut self) -> RunOutcome {
        let (status, outcome, kind) = if let Some((_, reason)) = self.cancelling.clone() {
            (
                RunStatus::Cancelled,
                RunOutcome::Cancelled,
                EventKind::RunCancelled { reason },
            )
        } else if let Some(err) = self.failing.clone() {
            (
                RunStatus::Failed,
                RunOutcome::Failed(err.clone()),
                EventKind::RunFailed { error: err },
            )
        } else {
            let output = match &self.wf.output {
                Some(t) => {
                    let ctx = self.run_context();
                    self.templates
                        .render_in(t, &ctx)
                        .map(Some)
                        .map_err(|e| ErrorInfo::new("template", format!("workflow output: {e}")))
                }
                None => Ok(None),
            };
            match output {
                Ok(output) => {
                    let duration_ms = self.duration_ms();
                    (
                        RunStatus::Finished,
                        RunOutcome::Finished(output.clone()),
                        EventKind::RunFinished {
                            output,
                            duration_ms,
                        },
                    )
                }
                Err(err) => (
                    RunStatus::Failed,
                    RunOutcome::Failed(err.clone()),
                    EventKind::RunFailed { error: err },
                ),
            }
        };
        // The summary of a large run takes a while to build: the durations
        // are taken after it, so they cover the run up to its end.
        let mut summary = self.summary();
        let mut kind = kind;
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
}
