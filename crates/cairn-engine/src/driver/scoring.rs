//! A node's scorers: started once its pass finished, run beside the rest
//! of the run, their ends logged by the driver.
//!
//! Order in the log: the pass's `NodeFinished`, then one `ScorerStarted`
//! per scorer (durable before the scorer runs), then, whenever each ends,
//! its `ScorerFinished` or `ScorerFailed`. A node with a `block: true`
//! scorer is held: its bookkeeping (dependents, its group's pass, the
//! layer's tally) waits until every blocking scorer ended, so a dependent's
//! `NodeStarted` comes after those scorers' ends. The run ends only once
//! every scorer ended.
//!
//! A scorer never fails its node or its run. After a crash, a scorer the
//! log shows started and not ended runs again, under the same
//! `ScorerStarted`: scorers only read the node's output, so running one
//! twice is harmless, and its end is logged once. One the crash kept from
//! starting starts then.

use super::*;
use crate::scorer::{self, Score, ScoreError};
use cairn_workflow::ScorerSpec;

/// A scorer to start once the events before it are durable.
pub(super) struct ScorerJob {
    key: Key,
    scorer: ScorerSpec,
}

/// How one scorer ended, as its task reports it to the driver.
pub(super) struct ScorerEnd {
    pub key: Key,
    pub scorer: ScorerSpec,
    pub result: Result<Score, ScoreError>,
}

impl Driver {
    /// The scorers of `key`, which finished, that have not ended.
    fn open_scorers<'a>(&self, key: &Key, inst: &'a Inst) -> Vec<&'a ScorerSpec> {
        let scores = self
            .state
            .node(&key.0, key.1)
            .map(|n| n.scores())
            .unwrap_or_default();
        inst.spec
            .scorers
            .iter()
            .filter(|s| !scores.iter().any(|st| st.scorer_id == s.id && st.is_done()))
            .collect()
    }

    /// Whether node `key` finished and a blocking scorer of it has not
    /// ended: its dependents wait.
    pub(super) fn held_by_scorers(&self, key: &Key) -> bool {
        // Most nodes have no scorer: they cost one lookup here (mounting
        // asks this of every need).
        let Some(inst) = self.plan.insts.get(key) else {
            return false;
        };
        if !inst.spec.scorers.iter().any(|s| s.block) {
            return false;
        }
        if self.holding.contains_key(key) {
            return true;
        }
        !self.scored.contains(key)
            && self.status_of(key) == Some(NodeStatus::Finished)
            && self.open_scorers(key, inst).iter().any(|s| s.block)
    }

    /// Starts the scorers of `key`, which just finished (or finished before
    /// a resume): logs `ScorerStarted` for each that never started and
    /// queues every one not ended to run. Returns whether the node is held
    /// for a blocking one. Nothing starts while the run stops, and a driver
    /// that only applies commands starts nothing (the next resume does).
    pub(super) fn start_scorers(&mut self, key: &Key) -> bool {
        if self.scored.contains(key) {
            return self.holding.contains_key(key);
        }
        let Some(inst) = self.plan.insts.get(key).cloned() else {
            return false;
        };
        if inst.spec.scorers.is_empty() || self.status_of(key) != Some(NodeStatus::Finished) {
            return false;
        }
        if self.cancelling.is_some() || self.failing.is_some() || self.shutdown_grace.is_some() {
            return false;
        }
        if self.mode == Mode::Apply {
            return self.held_by_scorers(key);
        }
        self.scored.insert(key.clone());
        let started: Vec<String> = self
            .state
            .node(&key.0, key.1)
            .map(|n| n.scores().iter().map(|s| s.scorer_id.clone()).collect())
            .unwrap_or_default();
        let mut blocking = 0;
        for s in self.open_scorers(key, &inst) {
            let scope = self.node_scope(key);
            if started.contains(&s.id) {
                self.emit(
                    Scope::run(),
                    EventKind::Diagnostic {
                        level: Level::Info,
                        source: "resume".into(),
                        message: format!(
                            "scorer `{}` of node `{}` was interrupted; it runs again",
                            s.id, key.0
                        ),
                    },
                );
            } else {
                self.emit(
                    scope,
                    EventKind::ScorerStarted {
                        scorer_id: s.id.clone(),
                        scorer_name: s.name.clone(),
                    },
                );
            }
            blocking += usize::from(s.block);
            self.scorer_queue.push(ScorerJob {
                key: key.clone(),
                scorer: s.clone(),
            });
        }
        if blocking > 0 {
            self.holding.insert(key.clone(), blocking);
        }
        blocking > 0
    }

    /// After a resume: the scorers of finished nodes that a stop cut short
    /// or kept from starting. A node held for one ends its bookkeeping when
    /// they end (mounting counted it as not done).
    pub(super) fn recover_scorers(&mut self) {
        for key in self.plan_keys() {
            let Some(inst) = self.plan.insts.get(&key) else {
                continue;
            };
            if inst.spec.scorers.is_empty() || self.status_of(&key) != Some(NodeStatus::Finished) {
                continue;
            }
            if self.held_by_scorers(&key) {
                self.node_done(&key);
            } else {
                self.start_scorers(&key);
            }
        }
    }

    /// Spawns the queued scorers (their `ScorerStarted` is durable by now).
    pub(super) fn spawn_scorers(&mut self) {
        for job in std::mem::take(&mut self.scorer_queue) {
            self.spawn_scorer(job);
        }
    }

    fn spawn_scorer(&mut self, job: ScorerJob) {
        let ScorerJob { key, scorer } = job;
        let Some(inst) = self.plan.insts.get(&key).cloned() else {
            return;
        };
        let Some(n) = self.state.node(&key.0, key.1) else {
            return;
        };
        let output = n.output.as_ref().map_or(Value::Null, |o| o.to_value());
        let attempt = n.attempt;
        let mut vars = self.vars_for(&inst, true);
        if let Value::Object(m) = &mut vars {
            m.insert("output".into(), output.clone());
        }
        let cancel = self.run_cancel.child_token();
        let timeout = inst.spec.timeout.or(self.wf.defaults.timeout);
        // Its events are the run's: the node's attempt has ended.
        let mut ctx = NodeCtx::new(
            self.run_id.clone(),
            &key,
            attempt,
            Scope::run(),
            vars,
            self.wf.clone(),
            self.templates.clone(),
            cancel,
            timeout,
            self.services.clone(),
            self.log.clone(),
            self.ask_tx.clone(),
        );
        ctx.spend = self.spend.clone();
        self.scorers_running += 1;
        let tx = self.msg_tx.clone();
        let spec = inst.spec.clone();
        tokio::spawn(async move {
            let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
            let mut timed_out = false;
            let result = {
                let fut = scorer::run(&scorer, &spec, &ctx, &output);
                tokio::pin!(fut);
                // On its timeout the scorer is cancelled and waited for, so
                // that its process is gone before its end is logged.
                loop {
                    tokio::select! {
                        r = &mut fut => break r,
                        _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() && !timed_out => {
                            timed_out = true;
                            ctx.cancel.cancel();
                        }
                    }
                }
            };
            let result = match (timed_out, timeout) {
                (true, Some(t)) => Err(ScoreError::Run(NodeError::new(
                    "timeout",
                    format!("timed out after {}", attempt::fmt_duration(t)),
                ))),
                _ => result,
            };
            let _ = tx.send(Msg::ScorerDone(Box::new(ScorerEnd {
                key,
                scorer,
                result,
            })));
        });
    }

    /// Logs how a scorer ended, and lets a node held for it go on once its
    /// last blocking scorer ended. A scorer stopped with the engine (or
    /// the run stopping to wait) is left open for the resume.
    pub(super) fn scorer_done(&mut self, end: ScorerEnd) {
        self.scorers_running = self.scorers_running.saturating_sub(1);
        let ScorerEnd {
            key,
            scorer,
            result,
        } = end;
        let parked = self.parking.load(std::sync::atomic::Ordering::SeqCst);
        let stopped = matches!(&result, Err(e) if e.is_cancelled())
            && (self.shutdown_grace.is_some() || parked);
        if stopped {
            return;
        }
        let scope = self.node_scope(&key);
        let kind = match result {
            Ok(s) => EventKind::ScorerFinished {
                scorer_id: scorer.id.clone(),
                scorer_name: scorer.name.clone(),
                score: s.score,
                reason: s.reason,
            },
            Err(e) => EventKind::ScorerFailed {
                scorer_id: scorer.id.clone(),
                scorer_name: scorer.name.clone(),
                error: e.into_info(),
            },
        };
        self.emit(scope, kind);
        if !scorer.block {
            return;
        }
        let Some(left) = self.holding.get_mut(&key) else {
            return;
        };
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.holding.remove(&key);
            self.node_done(&key);
        }
    }
}
