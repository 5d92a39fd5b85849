//! One run's driver: the single task that owns the run's state, decides what
//! happens next, and appends the lifecycle events in one order.
//!
//! Node attempts run in their own tasks and report back through a channel;
//! only the driver turns their results into lifecycle events, so the log's
//! order is the order of the driver's decisions. Before anything acts on an
//! event (a node starts, a decision is acknowledged, the run reports its end)
//! the driver waits for the log to be durable (contract, guarantee 2); it does
//! so once per round, so that many events share one commit.
//!
//! This file is the scheduler: the round loop (`run`, `settle`) and what
//! may start (`check`, `start_ready`). Around it, one file per seam: `mount`
//! (the plan's frames), `ending` (how the run ends), `attempt` (an attempt's
//! task and what its result becomes), `groups` (loops and `for_each`),
//! `tallies` (layers, chapters, the summary), `context` (templates'
//! context), `inbox` (people and commands), `recovery` (what a resume does
//! first), `reload` (a watched run taking a new definition).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_events::{
    CancelMechanism, ErrorInfo, Event, EventKind, Level, NodeStatus, RunState, RunStatus, Scope,
};
use cairn_events::{InboxReply, RunCommand};
use cairn_store::{Listener, RunLog, Topic};
use cairn_workflow::{
    Context, NodeKind, NodeSpec, OnFailure, OnInterrupt, RetryPolicy, Templates, Workflow,
};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::node::{runner_for, Ask, Decision, NodeCtx, NodeError};
use crate::plan::{self, GroupVars, Inst, Key, KeyMap, KeySet, Paths, Plan, Shape, SpecTree};
use crate::services::Services;
use crate::{EngineError, RunOutcome, Shutdown};

mod attempt;
mod context;
mod ending;
mod gates;
mod groups;
mod hijack;
mod inbox;
mod mount;
mod recovery;
mod reload;
mod scoring;
mod tallies;
mod workspace;

pub(crate) use workspace::{restore_paths, revert_files, Snapshotter};

use context::{node_ctx_entry, NodesCtx};
use inbox::wait_for;

/// The scope of an instance's node-scoped events: its path and pass, and
/// its chapter when it belongs to a stage.
pub(super) fn scope_of(inst: &Inst) -> Scope {
    Scope::node(inst.key.0.clone(), inst.key.1).with_chapter(inst.spec.stage.clone())
}

const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often the driver reads its inbox when no wake-up came: wake-ups are
/// best effort, the inbox in the store is the truth.
const INBOX_POLL: Duration = Duration::from_secs(1);
/// Most checks or starts decided between two looks at the inbox and the
/// shutdown signal, so that a cancel or a SIGTERM takes effect within a
/// round however large the round is.
const ROUND_SLICE: usize = 2048;
/// Events a round may append before it waits for the log: value nodes end in
/// the round that starts them, so without a bound a large workflow would
/// queue all its events in memory ahead of the store.
const MAX_BACKLOG: u64 = 4096;

/// What a driver is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Drive the run: start nodes, apply commands, until it ends (or waits,
    /// with `exit_on_wait`).
    Drive,
    /// Nobody drives the run: apply the commands in its inbox, then stop at
    /// the next wait without starting anything new. The same driver, so a
    /// decision or a cancel takes effect exactly as it would in a live run.
    Apply,
}

enum Msg {
    Done {
        key: Key,
        attempt: u32,
        result: Result<Value, NodeError>,
        duration_ms: u64,
        /// The workspace snapshot taken once the attempt ended, for a node
        /// that can change files.
        snapshot: Option<String>,
    },
    RetryDue(Key),
    /// A scorer ended (boxed: its spec and result are large).
    ScorerDone(Box<scoring::ScorerEnd>),
    /// The workspace snapshot before an attempt is taken.
    Snapshotted(Box<workspace::Snapshotted>),
}

pub(crate) struct Driver {
    run_id: String,
    wf: Arc<Workflow>,
    tree: SpecTree,
    templates: Arc<Templates>,
    log: Arc<RunLog>,
    services: Arc<Services>,
    state: RunState,
    shape: Shape,
    plan: Plan,
    /// Every instance path mounted so far, shared by each render.
    paths: Paths,
    frame_no: u64,
    /// What the run has spent on models, shared with its agents' attempts.
    spend: Arc<crate::agent::Spend>,
    dependents: KeyMap<Vec<Key>>,
    /// How many of each mounted instance's needs have not ended, so that a
    /// join is looked at in full once, not once per finished need.
    unmet: KeyMap<usize>,
    group_remaining: KeyMap<usize>,
    nodes_ctx: NodesCtx,
    templated: HashMap<usize, bool>,
    check_queue: VecDeque<Key>,
    ready: VecDeque<Key>,
    /// Pending nodes already in `ready`, so a node checked once per finished
    /// dependency is queued once (a `VecDeque::contains` would be quadratic).
    queued: KeySet,
    /// The attempts running, continued, left open or waiting for a retry.
    attempts: attempt::Attempts,
    /// Approvals, questions and child runs waiting for a person, and the
    /// run's status as last announced.
    gates: gates::Gates,
    /// How many child runs the run's agents may have going at once: the
    /// run's concurrency.
    child_slots: Arc<tokio::sync::Semaphore>,
    /// Set when the driver stops its attempts to stop and wait for a
    /// person: their child runs wait too, rather than being cancelled.
    parking: Arc<std::sync::atomic::AtomicBool>,
    /// The run's MCP servers, started when a node first needs one.
    mcp: Arc<crate::mcp::McpPool>,
    msg_tx: mpsc::UnboundedSender<Msg>,
    msg_rx: mpsc::UnboundedReceiver<Msg>,
    ask_tx: mpsc::UnboundedSender<Ask>,
    ask_rx: mpsc::UnboundedReceiver<Ask>,
    /// Wake-ups for commands in the run's inbox.
    inbox: Option<Box<dyn Listener>>,
    mode: Mode,
    run_cancel: CancellationToken,
    shutdown: Shutdown,
    concurrency: usize,
    /// Why the run stops, when it does.
    ending: ending::Ending,
    exit_on_wait: bool,
    /// Layers and chapters.
    tallies: tallies::Tallies,
    store_error: Option<String>,
    /// The log's last seq when the driver last waited for a backlog.
    synced_at: u64,
    /// The scorers of finished nodes.
    scoring: scoring::Scoring,
    /// What the watcher of the run's files says (`--watch`); `None` for a
    /// run not watched.
    reloads: Option<mpsc::UnboundedReceiver<crate::reload::Note>>,
}

pub(crate) struct DriverInit {
    pub run_id: String,
    pub wf: Arc<Workflow>,
    pub templates: Arc<Templates>,
    pub log: Arc<RunLog>,
    pub services: Arc<Services>,
    pub state: RunState,
    pub mode: Mode,
    pub shutdown: Shutdown,
    pub max_concurrency: Option<usize>,
    pub exit_on_wait: bool,
    /// The reason of a cancel the log holds with no end after it (empty
    /// when none was given): the driver goes on cancelling the run.
    pub cancel_requested: Option<String>,
    /// The watcher of the run's files, for a watched run.
    pub reloads: Option<mpsc::UnboundedReceiver<crate::reload::Note>>,
}

impl Driver {
    pub(crate) fn new(init: DriverInit) -> Driver {
        let (msg_tx, msg_rx) = mpsc::unbounded_channel();
        let (ask_tx, ask_rx) = mpsc::unbounded_channel();
        let tree = SpecTree::new(&init.wf);
        let mcp = Arc::new(crate::mcp::McpPool::new(
            init.wf.clone(),
            init.services.clone(),
            init.log.clone(),
        ));
        let concurrency = init
            .max_concurrency
            .or(init.wf.concurrency)
            .unwrap_or(8)
            .max(1);
        let frame_no = init.state.frame_no;
        let spend = Arc::new(crate::agent::Spend::new(init.state.cost_usd.unwrap_or(0.0)));
        // A run that stopped while waiting for a person still waits.
        let announced = match init.state.status {
            Some(s @ (RunStatus::WaitingApproval | RunStatus::WaitingInput)) => s,
            _ => RunStatus::Running,
        };
        let ending = ending::Ending::new(init.cancel_requested);
        let run_cancel = CancellationToken::new();
        if ending.is_cancelling() {
            // Whatever was running was stopped with the process that ran
            // it: the cancel goes on as an immediate one.
            run_cancel.cancel();
        }
        Driver {
            run_id: init.run_id,
            tree,
            templates: init.templates,
            log: init.log,
            services: init.services,
            state: init.state,
            shape: Shape::default(),
            plan: Plan::default(),
            paths: Paths::default(),
            frame_no,
            spend,
            dependents: Default::default(),
            unmet: Default::default(),
            group_remaining: Default::default(),
            nodes_ctx: NodesCtx::default(),
            templated: HashMap::new(),
            check_queue: VecDeque::new(),
            ready: VecDeque::new(),
            queued: Default::default(),
            attempts: Default::default(),
            gates: gates::Gates::new(announced),
            child_slots: Arc::new(tokio::sync::Semaphore::new(concurrency)),
            parking: Default::default(),
            mcp,
            msg_tx,
            msg_rx,
            ask_tx,
            ask_rx,
            inbox: None,
            mode: init.mode,
            run_cancel,
            shutdown: init.shutdown,
            concurrency,
            ending,
            exit_on_wait: init.exit_on_wait,
            tallies: Default::default(),
            store_error: None,
            synced_at: 0,
            scoring: Default::default(),
            reloads: init.reloads,
            wf: init.wf,
        }
    }

    fn emit(&mut self, scope: Scope, kind: EventKind) -> Event {
        let ev = self.log.append(scope, kind);
        self.state.apply(&ev);
        ev
    }

    /// Appends run-scoped events a part asked for, in its order.
    fn emit_run(&mut self, kinds: Vec<EventKind>) {
        for kind in kinds {
            self.emit(Scope::run(), kind);
        }
    }

    /// A node instance of `inst` ended with `status`: its layer's and
    /// chapter's tallies count it.
    fn count_done(&mut self, inst: &Inst, status: NodeStatus) {
        let ended = self
            .tallies
            .ended(inst.layer, inst.spec.stage.as_deref(), status);
        self.emit_run(ended);
    }

    /// The scope of `key`'s events, with its chapter.
    fn node_scope(&self, key: &Key) -> Scope {
        let chapter = self.plan.insts.get(key).and_then(|i| i.spec.stage.clone());
        Scope::node(key.0.clone(), key.1).with_chapter(chapter)
    }

    /// The mounted instances' keys in mount order, as a list of their own
    /// (the walks that use it change the plan as they go).
    fn plan_keys(&self) -> Vec<Key> {
        self.plan.order.iter().map(|i| i.key.clone()).collect()
    }

    fn status_of(&self, key: &Key) -> Option<NodeStatus> {
        self.state.node(&key.0, key.1).map(|n| n.status)
    }

    /// Drives the run until it ends, waits for a person (with
    /// `exit_on_wait`), or the engine shuts down; in [`Mode::Apply`], until
    /// the commands in the inbox are applied.
    pub(crate) async fn run(mut self, resumed: bool) -> RunOutcome {
        match self
            .services
            .journal
            .backend()
            .listen(Topic::Inbox(&self.run_id))
        {
            Ok(l) => self.inbox = Some(l),
            Err(e) => self.warn(
                "inbox",
                format!(
                    "no wake-ups for commands ({e}); reading the inbox every {}s",
                    INBOX_POLL.as_secs()
                ),
            ),
        }
        // Seed the template context with what the log already holds.
        for n in &self.state.nodes {
            if n.status.is_done() {
                self.nodes_ctx.insert(&n.node_id, node_ctx_entry(n));
            }
        }
        if resumed {
            let now_ms = crate::node::now_ms();
            let state = &self.state;
            self.tallies
                .reopen(&state.open_layers, &state.open_chapters, now_ms);
        }
        self.rerender();
        if resumed {
            self.recover();
        }
        // A resumed run may have commands that came while nobody listened
        // for their wake-up: the first look at the inbox is at once.
        let first_poll = if resumed { Duration::ZERO } else { INBOX_POLL };
        let mut poll =
            tokio::time::interval_at(tokio::time::Instant::now() + first_poll, INBOX_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut to_spawn: Vec<(Key, u32)> = Vec::new();
        loop {
            self.settle(&mut to_spawn).await;
            if let Err(e) = self.log.sync().await {
                self.store_error = Some(e.to_string());
            }
            if let Some(err) = self.store_error.take() {
                self.run_cancel.cancel();
                self.drain_running().await;
                return RunOutcome::Failed(ErrorInfo::new("store", err));
            }
            for (key, attempt) in to_spawn.drain(..) {
                self.spawn_attempt(key, attempt);
            }
            self.spawn_scorers();
            if let Some(outcome) = self.maybe_end().await {
                return outcome;
            }
            if self.mode == Mode::Apply && self.idle() {
                // Every gate that was waiting waits again: apply what the
                // inbox holds, and stop once nothing is left to apply.
                if self.drain_inbox().await > 0 {
                    continue;
                }
                self.parking
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.run_cancel.cancel();
                self.drain_running().await;
                self.mcp.close("the run stopped").await;
                return RunOutcome::Waiting;
            }
            if !self.ending.shutting_down() && self.is_waiting() {
                let status = self.gates.waiting_status();
                if let Some(kind) = self.gates.announce(status) {
                    self.emit(Scope::run(), kind);
                    if let Err(e) = self.log.sync().await {
                        return RunOutcome::Failed(ErrorInfo::new("store", e.to_string()));
                    }
                }
                if self.exit_on_wait {
                    // A decision sent while we were getting here is taken
                    // now rather than left for the next resume.
                    if self.drain_inbox().await > 0 {
                        continue;
                    }
                    self.parking
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    self.run_cancel.cancel();
                    self.drain_running().await;
                    self.mcp.close("the run stopped to wait for a person").await;
                    return RunOutcome::Waiting;
                }
            }
            tokio::select! {
                Some(m) = self.msg_rx.recv() => self.on_msg(m),
                Some(a) = self.ask_rx.recv() => self.on_ask(a),
                _ = wait_for(&mut self.inbox) => { self.drain_inbox().await; }
                _ = poll.tick() => { self.drain_inbox().await; }
                note = reload::next_note(&mut self.reloads) => self.on_note(note).await,
                _ = self.shutdown.token.cancelled(), if !self.ending.shutting_down() => {
                    self.begin_shutdown();
                }
            }
            // Batch whatever else is already queued into this round.
            while let Ok(m) = self.msg_rx.try_recv() {
                self.on_msg(m);
            }
            while let Ok(a) = self.ask_rx.try_recv() {
                self.on_ask(a);
            }
        }
    }

    /// Hands a task's report to the seam it is for.
    fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::Done {
                key,
                attempt,
                result,
                duration_ms,
                snapshot,
            } => self.attempt_done(key, attempt, result, duration_ms, snapshot),
            Msg::ScorerDone(end) => self.scorer_done(*end),
            Msg::Snapshotted(s) => self.snapshotted(*s),
            Msg::RetryDue(key) => self.retry_due(key),
        }
    }

    /// Decides everything that can be decided without waiting, in slices,
    /// looking at the inbox and the shutdown signal between slices.
    async fn settle(&mut self, to_spawn: &mut Vec<(Key, u32)>) {
        self.attempts.take_snapshot_ready(to_spawn);
        loop {
            let checked_all = self.process_checks();
            let before = to_spawn.len();
            let started_all = self.start_ready(to_spawn);
            // Starting a group mounts its nodes, and a value node or a skip
            // ends in the round: both queue checks that must be decided now,
            // not at the next wake-up (the inbox poll, a second away).
            let more_checks = !self.check_queue.is_empty();
            if checked_all && started_all && to_spawn.len() == before && !more_checks {
                break;
            }
            if !self.ease_backlog().await {
                break;
            }
            if self.shutdown.token.is_cancelled() && !self.ending.shutting_down() {
                self.begin_shutdown();
            }
            if futures::FutureExt::now_or_never(wait_for(&mut self.inbox)).is_some() {
                self.drain_inbox().await;
            }
        }
    }

    /// The engine is shutting down: running nodes get the engine's grace to
    /// reach a safe point, then they are killed. Waiting approvals are safe
    /// points already.
    fn begin_shutdown(&mut self) {
        let grace = self.shutdown.grace();
        self.ending.shut_down(grace);
        let token = self.run_cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            token.cancel();
        });
        for key in self.gates.approvals() {
            self.attempts.stop(key);
        }
    }

    /// Nothing runs but attempts waiting for a person, and nothing is ready.
    fn idle(&self) -> bool {
        self.attempts.count() == self.gates.waiting_count()
            && self.check_queue.is_empty()
            && !self.ending.stopping()
    }

    fn warn(&mut self, source: &str, message: String) {
        self.emit(
            Scope::run(),
            EventKind::Diagnostic {
                level: Level::Warn,
                source: source.into(),
                message,
            },
        );
    }

    /// Waits for attempts stopped without events (waiting approvals when the
    /// run exits to wait) so that nothing holds the run's log, and with it
    /// the run's lease, once the driver returns.
    async fn drain_running(&mut self) {
        // Scorers queued and not spawned are still open in the log: the
        // resume runs them.
        self.scoring.abandon_queue();
        while self.attempts.count() > 0 || self.scoring.running() > 0 {
            match self.msg_rx.recv().await {
                Some(Msg::Done { key, .. }) => {
                    self.attempts.end(&key);
                }
                Some(Msg::ScorerDone(_)) => {
                    self.scoring.lost();
                }
                Some(Msg::Snapshotted(s)) => {
                    // Not started: the resume starts it.
                    self.attempts.end(s.key());
                }
                Some(Msg::RetryDue(_)) => {}
                None => break,
            }
        }
    }

    fn backlog_full(&self) -> bool {
        self.log.last_seq() >= self.synced_at + MAX_BACKLOG
    }

    /// Waits for the log once a round has appended `MAX_BACKLOG` events, so
    /// that the store's queue stays bounded. False on a store error.
    async fn ease_backlog(&mut self) -> bool {
        if !self.backlog_full() {
            return true;
        }
        self.synced_at = self.log.last_seq();
        if let Err(e) = self.log.sync().await {
            self.store_error = Some(e.to_string());
            return false;
        }
        true
    }

    fn is_waiting(&self) -> bool {
        self.gates.any()
            && self.attempts.count() == self.gates.waiting_count()
            && self.ready.is_empty()
            && self.attempts.retries_pending() == 0
            && self.scoring.running() == 0
            && !self.ending.stopping()
    }

    /// Checks queued nodes, at most a slice of them; true when none is left.
    fn process_checks(&mut self) -> bool {
        for _ in 0..ROUND_SLICE {
            let Some(key) = self.check_queue.pop_front() else {
                return true;
            };
            self.check(&key);
        }
        self.check_queue.is_empty()
    }

    fn check(&mut self, key: &Key) {
        let Some(inst) = self.plan.insts.get(key).cloned() else {
            return;
        };
        if self.status_of(key) != Some(NodeStatus::Pending) || self.queued.contains(key) {
            return;
        }
        if self.unmet.get(key).is_some_and(|&n| n > 0) {
            return;
        }
        let mut blocked_by = None;
        for dep in &inst.needs {
            match self.status_of(dep) {
                Some(NodeStatus::Finished) => {}
                Some(s) if s.is_done() => {
                    blocked_by.get_or_insert((dep.0.clone(), s));
                }
                _ => return,
            }
        }
        if self.ending.stopping() {
            return;
        }
        if let Some((dep, s)) = blocked_by {
            self.skip(key, format!("dependency `{dep}` {}", s.as_str()));
            return;
        }
        if let Some(cond) = inst.spec.if_.clone() {
            // Each context is dropped before anything updates `nodes`, which
            // would otherwise copy the whole map.
            let holds = {
                let ctx = self.context_for(&inst, inst.key.1);
                self.templates.eval_bool_in(&cond, &ctx)
            };
            match holds {
                Ok(true) => {}
                Ok(false) => {
                    self.skip(key, format!("condition `{cond}` is false"));
                    return;
                }
                Err(e) => {
                    let scope = self.node_scope(key).with_attempt(1);
                    self.emit(scope, EventKind::NodeStarted { snapshot: None });
                    let err = NodeError::fatal("template", format!("if: {e}"));
                    self.fail_attempt(key, &inst, 1, err);
                    return;
                }
            }
        }
        self.queued.insert(key.clone());
        self.ready.push_back(key.clone());
    }

    fn skip(&mut self, key: &Key, reason: String) {
        let scope = self.node_scope(key);
        self.emit(scope, EventKind::NodeSkipped { reason });
        self.node_done(key);
    }

    fn leaf_slots(&self) -> usize {
        let running = self.attempts.count();
        let busy = running - self.gates.approval_count().min(running);
        self.concurrency.saturating_sub(busy)
    }

    /// Emits `NodeStarted` for what may start now, at most a slice of
    /// nodes and until the log's backlog is full; leaf attempts are spawned
    /// by the caller once those events are durable. Returns false when it
    /// stopped early with nodes still ready.
    fn start_ready(&mut self, to_spawn: &mut Vec<(Key, u32)>) -> bool {
        if self.ending.halted() {
            return true;
        }
        if self.mode == Mode::Apply {
            // Nothing new starts; gates that waited wait again.
            let resumed: Vec<Key> = self
                .ready
                .iter()
                .filter(|k| self.attempts.is_resumed(k))
                .cloned()
                .collect();
            self.ready.retain(|k| !self.attempts.is_resumed(k));
            for key in resumed {
                self.queued.remove(&key);
                let attempt = self.attempts.take_resumed(&key).unwrap_or(1);
                to_spawn.push((key, attempt));
            }
            return true;
        }
        let mut slice = ROUND_SLICE;
        let mut budget = self.leaf_slots().saturating_sub(to_spawn.len());
        // Leaves past the concurrency budget stay queued; so does a group
        // behind them, which waits for a slot like a leaf would.
        while budget > 0
            || self
                .ready
                .front()
                .is_some_and(|k| self.attempts.is_resumed(k))
        {
            if slice == 0 || (self.backlog_full() && !self.ready.is_empty()) {
                return false;
            }
            slice -= 1;
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            self.queued.remove(&key);
            let Some(inst) = self.plan.insts.get(&key).cloned() else {
                continue;
            };
            let is_group = inst.spec.kind.children().is_some();
            if let Some(attempt) = self.attempts.take_resumed(&key) {
                // A person-in-the-loop attempt continues where it stood.
                to_spawn.push((key, attempt));
                continue;
            }
            let attempt = self.state.node(&key.0, key.1).map_or(0, |n| n.attempt) + 1;
            let leaf = !is_group && !matches!(inst.spec.kind, NodeKind::Value(_));
            if leaf && self.changes_files(&inst) {
                // Starts once the root's snapshot is taken (`snapshotted`).
                budget -= 1;
                self.begin_snapshot(key, attempt);
                continue;
            }
            let scope = self.node_scope(&key).with_attempt(attempt);
            let opened = self.tallies.started(inst.layer, inst.spec.stage.as_deref());
            self.emit_run(opened);
            self.emit(scope, EventKind::NodeStarted { snapshot: None });
            if attempt == 1 {
                self.traverse_edges(&key, &inst);
            }
            if is_group {
                match self.enter_group(&key, false) {
                    Ok(()) => {
                        self.rerender_group(&key);
                        if self.group_remaining.get(&key).copied().unwrap_or(0) == 0 {
                            self.finish_group_pass(&key);
                        }
                    }
                    Err(e) => self.fail_attempt(&key, &inst, attempt, e),
                }
            } else if let NodeKind::Value(v) = &inst.spec.kind {
                // A value node touches nothing outside the log, so it ends in
                // the round it starts in and takes no slot: a chain of them
                // shares one commit instead of paying one per node. Its
                // NodeFinished still commits with (never before) anything
                // that follows from it.
                let t0 = Instant::now();
                let rendered = if self.is_templated(&inst) {
                    let ctx = self.context_for(&inst, inst.key.1);
                    self.templates.render_value_in(v, &ctx)
                } else {
                    Ok(v.clone())
                };
                match rendered {
                    Ok(output) => {
                        let scope = self.node_scope(&key).with_attempt(attempt);
                        self.emit(
                            scope,
                            EventKind::NodeFinished {
                                duration_ms: t0.elapsed().as_millis() as u64,
                                output: Some(output.into()),
                                cached: None,
                                snapshot: None,
                            },
                        );
                        self.node_done(&key);
                    }
                    Err(e) => {
                        let err = NodeError::fatal("template", e.to_string());
                        self.fail_attempt(&key, &inst, attempt, err);
                    }
                }
            } else {
                budget -= 1;
                to_spawn.push((key, attempt));
            }
        }
        true
    }

    /// The edges into a node that starts its first attempt.
    fn traverse_edges(&mut self, key: &Key, inst: &Inst) {
        for dep in &inst.needs {
            self.emit(
                Scope::run(),
                EventKind::EdgeTraversed {
                    from: dep.0.to_string(),
                    to: key.0.to_string(),
                    condition: inst.spec.if_.clone(),
                },
            );
            // A join of 100,000 needs appends as many edges at once.
            self.ease_backlog_now();
        }
    }

    /// Bookkeeping once a node instance can no longer change.
    fn node_done(&mut self, key: &Key) {
        if self.start_scorers(key) {
            // Held for a blocking scorer: this runs again when it ends.
            return;
        }
        let Some(inst) = self.plan.insts.get(key).cloned() else {
            return;
        };
        let status = self.status_of(key).unwrap_or(NodeStatus::Failed);
        if let Some(n) = self.state.node(&key.0, key.1) {
            let replaced = self.nodes_ctx.insert(&key.0, node_ctx_entry(n));
            // Templates read a node's latest pass, and a loop's output is
            // built from its current pass: the output of the pass this one
            // replaces has no reader left in this process (the log keeps
            // it). Loops nested in loops would otherwise hold every pass's
            // outputs, each level's holding the levels below.
            if let Some(old) = replaced.filter(|old| old.iteration != key.1) {
                self.state.drop_output(&key.0, old.iteration);
            }
        }
        self.count_done(&inst, status);
        // An ended node's dependents and a ready node's count are not
        // needed again: dropped, so a long run's maps hold only what waits.
        if let Some(deps) = self.dependents.remove(key) {
            for d in deps {
                if let Some(n) = self.unmet.get_mut(&d) {
                    *n = n.saturating_sub(1);
                    if *n > 0 {
                        continue;
                    }
                    self.unmet.remove(&d);
                }
                self.check_queue.push_back(d);
            }
        }
        if let Some(parent) = &inst.parent {
            if let Some(r) = self.group_remaining.get_mut(parent) {
                *r = r.saturating_sub(1);
                if *r == 0
                    && self.status_of(parent) == Some(NodeStatus::Running)
                    && !self.ending.stopping()
                {
                    let parent = parent.clone();
                    self.finish_group_pass(&parent);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! What the parts' tests share: events, run states and plans built by
    //! hand, no store.

    use std::sync::Arc;

    use cairn_events::{Event, EventKind, RunState, Scope, Seq};

    use crate::plan::{self, Key, Paths, Plan, Shape, SpecTree};

    /// An event of run `r` at `seq`, as the log would hand it out.
    pub(crate) fn event(seq: u64, scope: Scope, kind: EventKind) -> Event {
        Event {
            run_id: "r".into(),
            seq: Seq(seq),
            timestamp_ms: 0,
            scope,
            kind,
        }
    }

    /// Folds `kind` in `scope` into `state` as the log's next event.
    pub(crate) fn apply(state: &mut RunState, scope: Scope, kind: EventKind) {
        let ev = event(state.last_seq + 1, scope, kind);
        state.apply(&ev);
    }

    /// The plan a run of the workflow `yaml` mounts at its start.
    pub(crate) fn plan_of(yaml: &str) -> Plan {
        let wf = Arc::new(
            cairn_workflow::parse(yaml, std::path::Path::new("test.yaml"))
                .expect("a valid workflow"),
        );
        let tree = SpecTree::new(&wf);
        plan::render(&tree, &wf.name, &Shape::default(), &mut Paths::default())
    }

    /// The key of the top-level node `id`.
    pub(crate) fn key(id: &str) -> Key {
        (id.into(), 0)
    }

    /// Folds a first attempt of `key` that started and finished.
    pub(crate) fn finished(state: &mut RunState, key: &Key) {
        let scope = Scope::node(key.0.clone(), key.1);
        apply(
            state,
            scope.clone(),
            EventKind::NodePending { layer_index: None },
        );
        let attempt = scope.with_attempt(1);
        apply(
            state,
            attempt.clone(),
            EventKind::NodeStarted { snapshot: None },
        );
        apply(
            state,
            attempt,
            EventKind::NodeFinished {
                duration_ms: 1,
                output: None,
                cached: None,
                snapshot: None,
            },
        );
    }
}
