//! One attempt of a leaf node: its task (timeout, heartbeats), and what the
//! driver makes of its result (finished, cancelled, failed, retried).

use super::*;

impl Driver {
    pub(super) fn spawn_attempt(&mut self, key: Key, attempt: u32) {
        let inst = self.plan.insts[&key].clone();
        let Some(runner) = runner_for(&inst.spec.kind) else {
            return;
        };
        let vars = self.vars_for(&inst, false);
        let cancel = self.run_cancel.child_token();
        let timeout = inst.spec.timeout.or(self.wf.defaults.timeout);
        let scope = self.node_scope(&key).with_attempt(attempt);
        let mut ctx = NodeCtx::new(
            self.run_id.clone(),
            &key,
            attempt,
            scope.clone(),
            vars,
            self.wf.clone(),
            self.templates.clone(),
            cancel.clone(),
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
        ctx.hijack = self.hijack_flag(&key, &inst);
        self.running.insert(key.clone(), cancel.clone());
        let tx = self.msg_tx.clone();
        let log = self.log.clone();
        let after = self.end_snapshot_of(&inst);
        ctx.step_snapshots = after.clone();
        let spec = inst.spec.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let fut = runner.run(&spec, &ctx);
            tokio::pin!(fut);
            let mut beat =
                tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
            let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
            let mut timed_out = false;
            let result = loop {
                tokio::select! {
                    r = &mut fut => break r,
                    _ = beat.tick() => {
                        let elapsed_ms = t0.elapsed().as_millis() as u64;
                        let timeout_ms = timeout.map(|t| t.as_millis() as u64);
                        log.append(scope.clone(), EventKind::NodeHeartbeat {
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
            let duration_ms = t0.elapsed().as_millis() as u64;
            // The files the attempt left, unless a cancel or a stop cut it
            // short (the next attempt's own snapshot says what they are).
            let snapshot = match (&after, &result) {
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

    pub(super) fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::Done {
                key,
                attempt,
                result,
                duration_ms,
                snapshot,
            } => {
                self.running.remove(&key);
                self.waiting.remove(&key);
                self.child_waits.remove(&key);
                self.hijack_done(&key);
                let Some(inst) = self.plan.insts.get(&key).cloned() else {
                    return;
                };
                if self.shutdown_grace.is_some() && matches!(&result, Err(e) if e.cancelled) {
                    // Stopped by the engine's shutdown: the resume decides.
                    return;
                }
                match result {
                    Ok(output) => {
                        let scope = self.node_scope(&key).with_attempt(attempt);
                        self.emit(
                            scope,
                            EventKind::NodeFinished {
                                duration_ms,
                                output: Some(output.into()),
                                cached: None,
                                snapshot,
                            },
                        );
                        self.node_done(&key);
                    }
                    Err(e) if e.cancelled => {
                        let scope = self.node_scope(&key).with_attempt(attempt);
                        let reason = self
                            .cancelling
                            .as_ref()
                            .and_then(|c| c.1.clone())
                            .unwrap_or(e.info.message);
                        self.emit(
                            scope,
                            EventKind::NodeCancelled {
                                reason: Some(reason),
                            },
                        );
                        self.node_done(&key);
                    }
                    Err(e) => self.fail_attempt_with(&key, &inst, attempt, e, snapshot),
                }
            }
            Msg::ScorerDone(end) => self.scorer_done(*end),
            Msg::Snapshotted(s) => self.snapshotted(*s),
            Msg::RetryDue(key) => {
                self.retry_pending = self.retry_pending.saturating_sub(1);
                if self.cancelling.is_none() && self.failing.is_none() {
                    self.ready.push_back(key);
                }
            }
        }
    }

    /// Closes an attempt that a crash interrupted. A crash is not the
    /// node's failure, so the attempt runs again whatever its retry budget,
    /// unless the node says its work must never run twice.
    pub(super) fn interrupted(&mut self, key: &Key, inst: &Inst, attempt: u32) {
        if self.cancelling.is_some() {
            // The run is being cancelled: the run's end closes the attempt
            // as interrupted, then cancels the node, with every node not done.
            self.left_open.insert(key.clone());
            return;
        }
        let err = NodeError::new(
            "interrupted",
            "the process driving the run stopped while this attempt was running",
        );
        if inst.spec.on_interrupt == OnInterrupt::Fail {
            let err = NodeError {
                retryable: false,
                ..err
            };
            self.fail_attempt(key, inst, attempt, err, Duration::ZERO);
            return;
        }
        let scope = self.node_scope(key).with_attempt(attempt);
        self.emit(
            scope.clone(),
            EventKind::NodeFailed {
                error: *err.info,
                will_retry: true,
                snapshot: None,
            },
        );
        self.emit(
            scope.with_attempt(attempt + 1),
            EventKind::NodeRetrying { delay_ms: 0 },
        );
        self.ready.push_back(key.clone());
    }

    /// Closes an attempt a stop left open as interrupted, without running
    /// it again: the run is ending. Returns whether that failed the node
    /// (`on_interrupt: fail`); otherwise its rerun is announced, and the
    /// run's end cancels it between the two attempts.
    pub(super) fn close_interrupted(&mut self, key: &Key, attempt: u32) -> bool {
        let fails = self
            .plan
            .insts
            .get(key)
            .is_some_and(|i| i.spec.on_interrupt == OnInterrupt::Fail);
        let scope = self.node_scope(key).with_attempt(attempt);
        self.emit(
            scope,
            EventKind::NodeFailed {
                error: ErrorInfo::new(
                    "interrupted",
                    "the process driving the run stopped while this attempt was running",
                ),
                will_retry: !fails,
                snapshot: None,
            },
        );
        if !fails {
            // The next attempt is announced as every rerun's is; the run's
            // end cancels the node before it starts.
            self.emit(
                self.node_scope(key).with_attempt(attempt + 1),
                EventKind::NodeRetrying { delay_ms: 0 },
            );
        }
        fails
    }

    pub(super) fn retry_policy(&self, spec: &NodeSpec) -> Option<RetryPolicy> {
        spec.retry
            .clone()
            .or_else(|| self.wf.defaults.retry.clone())
    }

    pub(super) fn fail_attempt(
        &mut self,
        key: &Key,
        inst: &Inst,
        attempt: u32,
        e: NodeError,
        _d: Duration,
    ) {
        self.fail_attempt_with(key, inst, attempt, e, None);
    }

    /// [`Driver::fail_attempt`] with the snapshot of the files the attempt
    /// left.
    pub(super) fn fail_attempt_with(
        &mut self,
        key: &Key,
        inst: &Inst,
        attempt: u32,
        e: NodeError,
        snapshot: Option<String>,
    ) {
        let policy = self.retry_policy(&inst.spec);
        let attempts = policy.as_ref().map_or(1, |p| p.attempts);
        let will_retry = e.retryable
            && attempt < attempts
            && self.cancelling.is_none()
            && self.failing.is_none()
            && inst.spec.kind.children().is_none();
        let scope = self.node_scope(key).with_attempt(attempt);
        self.emit(
            scope.clone(),
            EventKind::NodeFailed {
                error: (*e.info).clone(),
                will_retry,
                snapshot,
            },
        );
        if will_retry {
            let delay = policy
                .map(|p| p.delay_before(attempt + 1, rand::random::<f64>()))
                .unwrap_or_default();
            self.emit(
                scope.with_attempt(attempt + 1),
                EventKind::NodeRetrying {
                    delay_ms: delay.as_millis() as u64,
                },
            );
            self.retry_pending += 1;
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
        if self.failing.is_some() || self.cancelling.is_some() {
            return;
        }
        let mut info = ErrorInfo::new(
            "node-failed",
            format!("node `{}` failed: {}", key.0, error.message),
        );
        info.details = Some(json!({ "nodeId": key.0, "iteration": key.1, "error": error }));
        self.failing = Some(info);
        self.run_cancel.cancel();
    }
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
