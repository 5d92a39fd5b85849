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
use cairn_events::NodeState;
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

/// The scorers of the run's finished nodes: which nodes had theirs
/// started, which are held for blocking ones, which run, which wait to be
/// spawned. It decides; the driver appends what it answers and spawns.
#[derive(Default)]
pub(super) struct Scoring {
    /// Finished nodes whose scorers this driver started (or found ended).
    scored: KeySet,
    /// Finished nodes held for blocking scorers, with how many are left.
    holding: KeyMap<usize>,
    /// Scorers running now: the run ends only once none is.
    running: usize,
    /// Scorers to spawn once their `ScorerStarted` is durable.
    queue: Vec<ScorerJob>,
}

/// What starting a node's scorers asks for.
#[derive(Debug, Default)]
pub(super) struct Started {
    /// To append, in order.
    pub events: Vec<(Scope, EventKind)>,
    /// The node is held for a blocking scorer: its bookkeeping waits.
    pub held: bool,
}

/// How far a driver may go with scorers now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MayScore {
    /// Start them.
    Yes,
    /// The run stops: nothing starts (a resume starts what is open).
    Halted,
    /// The driver only applies commands: nothing starts, but a node held
    /// before stays held.
    ApplyOnly,
}

/// The scorers of `inst`'s node (`node`, which finished) that have not
/// ended.
fn open_scorers<'a>(inst: &'a Inst, node: Option<&NodeState>) -> Vec<&'a ScorerSpec> {
    let scores = node.map(|n| n.scores()).unwrap_or_default();
    inst.spec
        .scorers
        .iter()
        .filter(|s| !scores.iter().any(|st| st.scorer_id == s.id && st.is_done()))
        .collect()
}

impl Scoring {
    /// Whether the node of `inst` finished and a blocking scorer of it has
    /// not ended: its dependents wait. `node` is asked for only when the
    /// node has a blocking scorer (mounting asks this of every need, and
    /// most nodes have none).
    pub(super) fn holds<'s>(
        &self,
        inst: &Inst,
        node: impl FnOnce() -> Option<&'s NodeState>,
    ) -> bool {
        if !inst.spec.scorers.iter().any(|s| s.block) {
            return false;
        }
        if self.holding.contains_key(&inst.key) {
            return true;
        }
        if self.scored.contains(&inst.key) {
            return false;
        }
        let node = node();
        node.is_some_and(|n| n.status == NodeStatus::Finished)
            && open_scorers(inst, node).iter().any(|s| s.block)
    }

    /// Whether the node `key` is held for a blocking scorer this driver
    /// started.
    pub(super) fn is_holding(&self, key: &Key) -> bool {
        self.holding.contains_key(key)
    }

    /// The scorers of `inst`'s node, which just finished (or finished
    /// before a resume): `ScorerStarted` for each that never started, a
    /// `Diagnostic` for each a stop cut short, and every one not ended
    /// queued to run. `node` is the node's state.
    pub(super) fn start(
        &mut self,
        inst: &Inst,
        node: Option<&NodeState>,
        may: MayScore,
    ) -> Started {
        let key = &inst.key;
        if self.scored.contains(key) {
            return Started {
                events: Vec::new(),
                held: self.holding.contains_key(key),
            };
        }
        let finished = node.is_some_and(|n| n.status == NodeStatus::Finished);
        if inst.spec.scorers.is_empty() || !finished {
            return Started::default();
        }
        match may {
            MayScore::Yes => {}
            MayScore::Halted => return Started::default(),
            MayScore::ApplyOnly => {
                return Started {
                    events: Vec::new(),
                    held: self.holds(inst, || node),
                }
            }
        }
        self.scored.insert(key.clone());
        let started: Vec<&str> = node
            .map(|n| n.scores().iter().map(|s| s.scorer_id.as_str()).collect())
            .unwrap_or_default();
        let mut out = Started::default();
        let mut blocking = 0;
        for s in open_scorers(inst, node) {
            if started.contains(&s.id.as_str()) {
                out.events.push((
                    Scope::run(),
                    EventKind::Diagnostic {
                        level: Level::Info,
                        source: "resume".into(),
                        message: format!(
                            "scorer `{}` of node `{}` was interrupted; it runs again",
                            s.id, key.0
                        ),
                    },
                ));
            } else {
                out.events.push((
                    scope_of(inst),
                    EventKind::ScorerStarted {
                        scorer_id: s.id.clone(),
                        scorer_name: s.name.clone(),
                    },
                ));
            }
            blocking += usize::from(s.block);
            self.queue.push(ScorerJob {
                key: key.clone(),
                scorer: s.clone(),
            });
        }
        if blocking > 0 {
            self.holding.insert(key.clone(), blocking);
        }
        out.held = blocking > 0;
        out
    }

    /// The scorers to spawn now (their `ScorerStarted` is durable), each
    /// counted as running.
    fn take_queue(&mut self) -> Vec<ScorerJob> {
        let jobs = std::mem::take(&mut self.queue);
        self.running += jobs.len();
        jobs
    }

    /// A job taken from the queue could not be spawned after all.
    fn not_spawned(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// Scorers queued and not spawned are left open in the log (the
    /// resume runs them): the driver stops.
    pub(super) fn abandon_queue(&mut self) {
        self.queue.clear();
    }

    /// A scorer ended while the driver stops, its end not logged.
    pub(super) fn lost(&mut self) {
        self.running = self.running.saturating_sub(1);
    }

    /// Scorers running now.
    pub(super) fn running(&self) -> usize {
        self.running
    }

    /// Whether a scorer runs or waits to be spawned: the run cannot end.
    pub(super) fn busy(&self) -> bool {
        self.running > 0 || !self.queue.is_empty()
    }

    /// A scorer ended: the event that says how (none when it was stopped
    /// with the engine or the run's stop, `stopped`: the resume runs it
    /// again), in `scope`, the node's; and whether that let the node go
    /// on (its last blocking scorer ended).
    pub(super) fn ended(
        &mut self,
        end: ScorerEnd,
        stopped: bool,
        scope: Scope,
    ) -> (Option<(Scope, EventKind)>, bool) {
        self.running = self.running.saturating_sub(1);
        let ScorerEnd {
            key,
            scorer,
            result,
        } = end;
        if stopped && matches!(&result, Err(e) if e.is_cancelled()) {
            return (None, false);
        }
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
        let event = Some((scope, kind));
        if !scorer.block {
            return (event, false);
        }
        let Some(left) = self.holding.get_mut(&key) else {
            return (event, false);
        };
        *left = left.saturating_sub(1);
        if *left > 0 {
            return (event, false);
        }
        self.holding.remove(&key);
        (event, true)
    }
}

impl Driver {
    /// Whether node `key` finished and a blocking scorer of it has not
    /// ended: its dependents wait.
    pub(super) fn held_by_scorers(&self, key: &Key) -> bool {
        let Some(inst) = self.sched.plan().insts.get(key) else {
            return false;
        };
        self.scoring.holds(inst, || self.state.node(&key.0, key.1))
    }

    /// Starts the scorers of `key`, which just finished (or finished before
    /// a resume), and returns whether the node is held for a blocking one.
    /// Nothing starts while the run stops, and a driver that only applies
    /// commands starts nothing (the next resume does).
    pub(super) fn start_scorers(&mut self, key: &Key) -> bool {
        let Some(inst) = self.sched.plan().insts.get(key).cloned() else {
            return self.scoring.is_holding(key);
        };
        let may = if self.ending.halted() {
            MayScore::Halted
        } else if self.mode == Mode::Apply {
            MayScore::ApplyOnly
        } else {
            MayScore::Yes
        };
        let started = self
            .scoring
            .start(&inst, self.state.node(&key.0, key.1), may);
        self.emit_all(started.events);
        started.held
    }

    /// After a resume: the scorers of finished nodes that a stop cut short
    /// or kept from starting. A node held for one ends its bookkeeping when
    /// they end (mounting counted it as not done).
    pub(super) fn recover_scorers(&mut self) {
        for key in self.plan_keys() {
            let Some(inst) = self.sched.plan().insts.get(&key) else {
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
        for job in self.scoring.take_queue() {
            if !self.spawn_scorer(job) {
                self.scoring.not_spawned();
            }
        }
    }

    /// Spawns one scorer's task; false when its node is gone.
    fn spawn_scorer(&mut self, job: ScorerJob) -> bool {
        let ScorerJob { key, scorer } = job;
        let Some(inst) = self.sched.plan().insts.get(&key).cloned() else {
            return false;
        };
        let Some(n) = self.state.node(&key.0, key.1) else {
            return false;
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
        true
    }

    /// Logs how a scorer ended, and lets a node held for it go on once its
    /// last blocking scorer ended. A scorer stopped with the engine (or
    /// the run stopping to wait) is left open for the resume.
    pub(super) fn scorer_done(&mut self, end: ScorerEnd) {
        let parked = self.parking.load(std::sync::atomic::Ordering::SeqCst);
        let stopped = self.ending.shutting_down() || parked;
        let scope = self.node_scope(&end.key);
        let key = end.key.clone();
        let (event, release) = self.scoring.ended(end, stopped, scope);
        if let Some((scope, kind)) = event {
            self.emit(scope, kind);
        }
        if release {
            self.node_done(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::testing::{apply, finished, key, plan_of};

    const SCORED: &str = r#"
name: scored
nodes:
  - id: a
    value: 1
    scorers:
      - id: quick
        command: ["true"]
      - id: judge
        command: ["true"]
        block: true
  - id: b
    needs: [a]
    value: 2
"#;

    fn end(key: &Key, scorer: &ScorerSpec, result: Result<Score, ScoreError>) -> ScorerEnd {
        ScorerEnd {
            key: key.clone(),
            scorer: scorer.clone(),
            result,
        }
    }

    fn score(score: f64) -> Result<Score, ScoreError> {
        Ok(Score {
            score,
            reason: None,
        })
    }

    #[test]
    fn a_blocking_scorer_holds_its_node_until_it_ends() {
        let plan = plan_of(SCORED);
        let a = key("a");
        let inst = &plan.insts[&a];
        let mut state = RunState::new(RunId::parse("r").unwrap());
        finished(&mut state, &a);
        let mut scoring = Scoring::default();
        assert!(scoring.holds(inst, || state.node("a", 0)));

        let started = scoring.start(inst, state.node("a", 0), MayScore::Yes);
        assert!(started.held);
        let kinds: Vec<_> = started
            .events
            .iter()
            .map(|(s, k)| (s.clone(), k.type_name()))
            .collect();
        assert_eq!(
            kinds,
            [
                (scope_of(inst), "ScorerStarted"),
                (scope_of(inst), "ScorerStarted")
            ]
        );
        // Started once: asking again starts nothing and still holds.
        let again = scoring.start(inst, state.node("a", 0), MayScore::Yes);
        assert!(again.events.is_empty() && again.held);
        assert!(scoring.busy());
        assert_eq!(scoring.take_queue().len(), 2);
        assert_eq!(scoring.running(), 2);

        let (quick, judge) = (&inst.spec.scorers[0], &inst.spec.scorers[1]);
        let (ev, release) = scoring.ended(end(&a, quick, score(0.5)), false, scope_of(inst));
        assert!(matches!(ev, Some((_, EventKind::ScorerFinished { .. }))));
        assert!(!release, "a scorer that does not block releases nothing");
        assert!(scoring.holds(inst, || state.node("a", 0)));
        let failed = Err(ScoreError::Run(NodeError::new("x", "broke")));
        let (ev, release) = scoring.ended(end(&a, judge, failed), false, scope_of(inst));
        assert!(matches!(ev, Some((_, EventKind::ScorerFailed { .. }))));
        assert!(
            release,
            "the last blocking scorer's end lets the node go on"
        );
        assert!(!scoring.holds(inst, || state.node("a", 0)));
        assert!(!scoring.busy());
    }

    #[test]
    fn a_scorer_a_stop_cut_short_runs_again_without_a_second_start() {
        let plan = plan_of(SCORED);
        let a = key("a");
        let inst = &plan.insts[&a];
        let mut state = RunState::new(RunId::parse("r").unwrap());
        finished(&mut state, &a);
        let scope = scope_of(inst);
        apply(
            &mut state,
            scope.clone(),
            EventKind::ScorerStarted {
                scorer_id: "quick".into(),
                scorer_name: "quick".into(),
            },
        );
        apply(
            &mut state,
            scope.clone(),
            EventKind::ScorerStarted {
                scorer_id: "judge".into(),
                scorer_name: "judge".into(),
            },
        );
        apply(
            &mut state,
            scope,
            EventKind::ScorerFinished {
                scorer_id: "judge".into(),
                scorer_name: "judge".into(),
                score: 1.0,
                reason: None,
            },
        );
        let mut scoring = Scoring::default();
        // The blocking one ended before the stop: nothing holds the node.
        assert!(!scoring.holds(inst, || state.node("a", 0)));
        let started = scoring.start(inst, state.node("a", 0), MayScore::Yes);
        assert!(!started.held);
        match &started.events[..] {
            [(scope, EventKind::Diagnostic { message, .. })] => {
                assert_eq!(*scope, Scope::run());
                assert!(message.contains("`quick`"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(scoring.take_queue().len(), 1);
    }

    #[test]
    fn nothing_starts_while_the_run_stops_or_only_applies_commands() {
        let plan = plan_of(SCORED);
        let a = key("a");
        let inst = &plan.insts[&a];
        let mut state = RunState::new(RunId::parse("r").unwrap());
        finished(&mut state, &a);
        let mut scoring = Scoring::default();
        let halted = scoring.start(inst, state.node("a", 0), MayScore::Halted);
        assert!(halted.events.is_empty() && !halted.held);
        let applying = scoring.start(inst, state.node("a", 0), MayScore::ApplyOnly);
        assert!(applying.events.is_empty());
        assert!(applying.held, "its blocking scorer is open in the log");
        assert!(!scoring.busy());
        // A node that did not finish has no scorer to start.
        let b = key("b");
        let none = scoring.start(&plan.insts[&b], None, MayScore::Yes);
        assert!(none.events.is_empty() && !none.held);
    }

    #[test]
    fn a_scorer_stopped_with_the_run_is_left_open() {
        let plan = plan_of(SCORED);
        let a = key("a");
        let inst = &plan.insts[&a];
        let mut state = RunState::new(RunId::parse("r").unwrap());
        finished(&mut state, &a);
        let mut scoring = Scoring::default();
        scoring.start(inst, state.node("a", 0), MayScore::Yes);
        scoring.take_queue();
        let judge = &inst.spec.scorers[1];
        let stopped = Err(ScoreError::Run(NodeError::cancelled("stop")));
        let (ev, release) = scoring.ended(end(&a, judge, stopped), true, scope_of(inst));
        assert!(ev.is_none() && !release);
        assert_eq!(scoring.running(), 1);
        assert!(scoring.is_holding(&a));
    }
}
