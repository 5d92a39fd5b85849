//! One run's driver: the single task that owns the run's state, decides what
//! happens next, and appends the lifecycle events in one order.
//!
//! Node attempts run in their own tasks and report back through a channel;
//! only the driver turns their results into lifecycle events, so the log's
//! order is the order of the driver's decisions. Before anything acts on an
//! event (a node starts, a decision is acknowledged, the run reports its end)
//! the driver waits for the log to be durable (contract, guarantee 2); it does
//! so once per round, so that many events share one commit.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_events::{
    CancelMechanism, ErrorInfo, Event, EventKind, Level, NodeCounts, NodeStatus, NodeTiming,
    RunState, RunStatus, Scope,
};
use cairn_events::{InboxReply, RunCommand};
use cairn_store::{Listener, RunLog, Topic};
use cairn_workflow::{
    Context, NodeKind, NodeSpec, OnFailure, OnInterrupt, RetryPolicy, Templates, Workflow,
};
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::node::{runner_for, Ask, Decision, NodeCtx, NodeError};
use crate::plan::{self, Inst, Key, Plan, Shape, SpecTree};
use crate::services::Services;
use crate::{EngineError, RunOutcome, Shutdown};

const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often the driver reads its inbox when no wake-up came: wake-ups are
/// best effort, the inbox in the store is the truth.
const INBOX_POLL: Duration = Duration::from_secs(1);
const MAX_TIMINGS: usize = 20;
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
    },
    RetryDue(Key),
}

#[derive(Default)]
struct Tally {
    total: u64,
    done: u64,
    succeeded: u64,
    failed: u64,
    skipped: u64,
    cancelled: u64,
    open: bool,
    started: Option<Instant>,
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
    frame_no: u64,
    dependents: HashMap<Key, Vec<Key>>,
    /// How many of each mounted instance's needs have not ended, so that a
    /// join is looked at in full once, not once per finished need.
    unmet: HashMap<Key, usize>,
    group_remaining: HashMap<Key, usize>,
    nodes_ctx: NodesCtx,
    templated: HashMap<usize, bool>,
    check_queue: VecDeque<Key>,
    ready: VecDeque<Key>,
    /// Pending nodes already in `ready`, so a node checked once per finished
    /// dependency is queued once (a `VecDeque::contains` would be quadratic).
    queued: HashSet<Key>,
    /// Attempts to continue without a new `NodeStarted` (approvals after a resume).
    resumed_attempts: HashMap<Key, u32>,
    running: HashMap<Key, CancellationToken>,
    waiting: HashMap<Key, oneshot::Sender<Decision>>,
    retry_pending: usize,
    msg_tx: mpsc::UnboundedSender<Msg>,
    msg_rx: mpsc::UnboundedReceiver<Msg>,
    ask_tx: mpsc::UnboundedSender<Ask>,
    ask_rx: mpsc::UnboundedReceiver<Ask>,
    /// Wake-ups for commands in the run's inbox.
    inbox: Option<Box<dyn Listener>>,
    mode: Mode,
    run_cancel: CancellationToken,
    shutdown: Shutdown,
    shutdown_grace: Option<Duration>,
    concurrency: usize,
    failing: Option<ErrorInfo>,
    cancelling: Option<(CancelMechanism, Option<String>)>,
    exit_on_wait: bool,
    announced: RunStatus,
    layers: HashMap<u32, Tally>,
    chapters: HashMap<String, Tally>,
    store_error: Option<String>,
    /// The log's last seq when the driver last waited for a backlog.
    synced_at: u64,
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
}

impl Driver {
    pub(crate) fn new(init: DriverInit) -> Driver {
        let (msg_tx, msg_rx) = mpsc::unbounded_channel();
        let (ask_tx, ask_rx) = mpsc::unbounded_channel();
        let tree = SpecTree::new(&init.wf);
        let concurrency = init
            .max_concurrency
            .or(init.wf.concurrency)
            .unwrap_or(8)
            .max(1);
        let frame_no = init.state.frame_no;
        // A run that stopped while waiting for a person still waits.
        let announced = match init.state.status {
            Some(s @ (RunStatus::WaitingApproval | RunStatus::WaitingInput)) => s,
            _ => RunStatus::Running,
        };
        Driver {
            run_id: init.run_id,
            tree,
            templates: init.templates,
            log: init.log,
            services: init.services,
            state: init.state,
            shape: Shape::default(),
            plan: Plan {
                order: Vec::new(),
                insts: HashMap::new(),
                xml_hash: String::new(),
            },
            frame_no,
            dependents: HashMap::new(),
            unmet: HashMap::new(),
            group_remaining: HashMap::new(),
            nodes_ctx: NodesCtx::default(),
            templated: HashMap::new(),
            check_queue: VecDeque::new(),
            ready: VecDeque::new(),
            queued: HashSet::new(),
            resumed_attempts: HashMap::new(),
            running: HashMap::new(),
            waiting: HashMap::new(),
            retry_pending: 0,
            msg_tx,
            msg_rx,
            ask_tx,
            ask_rx,
            inbox: None,
            mode: init.mode,
            run_cancel: CancellationToken::new(),
            shutdown: init.shutdown,
            shutdown_grace: None,
            concurrency,
            failing: None,
            cancelling: None,
            exit_on_wait: init.exit_on_wait,
            announced,
            layers: HashMap::new(),
            chapters: HashMap::new(),
            store_error: None,
            synced_at: 0,
            wf: init.wf,
        }
    }

    fn emit(&mut self, scope: Scope, kind: EventKind) -> Event {
        let ev = self.log.append(scope, kind);
        self.state.apply(&ev);
        ev
    }

    fn node_scope(&self, key: &Key) -> Scope {
        let chapter = self.plan.insts.get(key).and_then(|i| i.spec.stage.clone());
        Scope::node(key.0.clone(), key.1).with_chapter(chapter)
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
                self.nodes_ctx.insert(n.node_id.clone(), node_ctx_entry(n));
            }
        }
        if resumed {
            self.reopen_tallies();
        }
        self.rerender();
        if resumed {
            self.recover();
        }
        let mut poll =
            tokio::time::interval_at(tokio::time::Instant::now() + INBOX_POLL, INBOX_POLL);
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
            if let Some(outcome) = self.maybe_end().await {
                return outcome;
            }
            if self.mode == Mode::Apply && self.idle() {
                // Every gate that was waiting waits again: apply what the
                // inbox holds, and stop once nothing is left to apply.
                if self.drain_inbox().await > 0 {
                    continue;
                }
                self.run_cancel.cancel();
                self.drain_running().await;
                return RunOutcome::Waiting;
            }
            if self.shutdown_grace.is_none() && self.is_waiting() {
                if self.announced != RunStatus::WaitingApproval {
                    self.announced = RunStatus::WaitingApproval;
                    self.emit(
                        Scope::run(),
                        EventKind::RunStatusChanged {
                            status: RunStatus::WaitingApproval,
                        },
                    );
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
                    self.run_cancel.cancel();
                    self.drain_running().await;
                    return RunOutcome::Waiting;
                }
            }
            tokio::select! {
                Some(m) = self.msg_rx.recv() => self.on_msg(m),
                Some(a) = self.ask_rx.recv() => self.on_ask(a),
                _ = wait_for(&mut self.inbox) => { self.drain_inbox().await; }
                _ = poll.tick() => { self.drain_inbox().await; }
                _ = self.shutdown.token.cancelled(), if self.shutdown_grace.is_none() => {
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

    /// Decides everything that can be decided without waiting, in slices,
    /// looking at the inbox and the shutdown signal between slices.
    async fn settle(&mut self, to_spawn: &mut Vec<(Key, u32)>) {
        loop {
            let checked_all = self.process_checks();
            let before = to_spawn.len();
            let started_all = self.start_ready(to_spawn);
            if checked_all && started_all && to_spawn.len() == before {
                break;
            }
            if !self.ease_backlog().await {
                break;
            }
            if self.shutdown.token.is_cancelled() && self.shutdown_grace.is_none() {
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
        self.shutdown_grace = Some(grace);
        let token = self.run_cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            token.cancel();
        });
        for key in self.waiting.keys() {
            if let Some(t) = self.running.get(key) {
                t.cancel();
            }
        }
    }

    /// Nothing runs but attempts waiting for a person, and nothing is ready.
    fn idle(&self) -> bool {
        self.running.len() == self.waiting.len()
            && self.check_queue.is_empty()
            && self.cancelling.is_none()
            && self.failing.is_none()
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
        while !self.running.is_empty() {
            match self.msg_rx.recv().await {
                Some(Msg::Done { key, .. }) => {
                    self.running.remove(&key);
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
        !self.waiting.is_empty()
            && self.running.len() == self.waiting.len()
            && self.ready.is_empty()
            && self.retry_pending == 0
            && self.cancelling.is_none()
            && self.failing.is_none()
    }

    // ---- plan ----

    fn rerender(&mut self) {
        let plan = plan::render(&self.tree, &self.wf.name, &self.shape);
        if plan.xml_hash == self.plan.xml_hash {
            return;
        }
        self.frame_no += 1;
        self.emit(
            Scope::run(),
            EventKind::FrameCommitted {
                frame_no: self.frame_no,
                xml_hash: plan.xml_hash.clone(),
                mounted: plan.order.len() as u64,
            },
        );
        let old = std::mem::replace(&mut self.plan, plan);
        let order = self.plan.order.clone();
        // Counted once every instance is in its layer's total, so that a
        // layer still open from before a resume is not closed half-counted.
        let mut done_already = Vec::new();
        for key in &order {
            if old.insts.contains_key(key) {
                continue;
            }
            let inst = self.plan.insts[key].clone();
            if self.state.node(&key.0, key.1).is_none() {
                let scope = self.node_scope(key);
                self.emit(
                    scope,
                    EventKind::NodePending {
                        layer_index: Some(inst.layer),
                    },
                );
            }
            let status = self.status_of(key).unwrap_or(NodeStatus::Pending);
            let done = status.is_done();
            self.layers.entry(inst.layer).or_default().total += 1;
            if let Some(stage) = &inst.spec.stage {
                self.chapters.entry(stage.clone()).or_default().total += 1;
            }
            let mut unmet = 0;
            for dep in &inst.needs {
                let deps = self.dependents.entry(dep.clone()).or_default();
                // Most nodes have one dependent: no room for four.
                deps.reserve_exact(1);
                deps.push(key.clone());
                if !self.status_of(dep).is_some_and(|s| s.is_done()) {
                    unmet += 1;
                }
            }
            if unmet > 0 {
                self.unmet.insert(key.clone(), unmet);
            }
            if let Some(parent) = &inst.parent {
                if !done {
                    *self.group_remaining.entry(parent.clone()).or_default() += 1;
                }
            }
            if done {
                done_already.push((inst, status));
            } else if status == NodeStatus::Pending {
                self.check_queue.push_back(key.clone());
            }
        }
        for (inst, status) in done_already {
            self.count_done(&inst, status);
        }
        for key in &old.order {
            if self.plan.insts.contains_key(key) {
                continue;
            }
            if self.status_of(key) == Some(NodeStatus::Pending) {
                let scope = Scope::node(key.0.clone(), key.1)
                    .with_chapter(old.insts[key].spec.stage.clone());
                self.emit(
                    scope,
                    EventKind::NodeCancelled {
                        reason: Some("unmounted".into()),
                    },
                );
            }
        }
    }

    /// After a resume: re-enter started groups, close interrupted attempts,
    /// and kill process groups a crashed engine left behind.
    fn recover(&mut self) {
        if self.mode == Mode::Drive {
            self.kill_leftovers();
        }
        // Groups first, repeatedly, since a started group mounts more groups.
        loop {
            let mut changed = false;
            for key in self.plan.order.clone() {
                let inst = self.plan.insts[&key].clone();
                let is_group = inst.spec.kind.children().is_some();
                if !is_group || self.shape.started_groups.contains(&key) {
                    continue;
                }
                if self.status_of(&key) != Some(NodeStatus::Running) {
                    continue;
                }
                if self.enter_group(&key, true).is_ok() {
                    changed = true;
                }
            }
            if !changed {
                break;
            }
            self.rerender();
        }
        for key in self.plan.order.clone() {
            let inst = self.plan.insts[&key].clone();
            if inst.spec.kind.children().is_some() {
                continue;
            }
            let Some(n) = self.state.node(&key.0, key.1).cloned() else {
                continue;
            };
            let scope = self.node_scope(&key);
            match n.status {
                NodeStatus::WaitingApproval => {
                    self.check_queue.retain(|k| k != &key);
                    self.resumed_attempts.insert(key.clone(), n.attempt);
                    self.ready.push_back(key);
                }
                NodeStatus::Running | NodeStatus::WaitingInput
                    if matches!(inst.spec.kind, NodeKind::Approval(_)) && n.decision.is_some() =>
                {
                    self.resumed_attempts.insert(key.clone(), n.attempt);
                    self.ready.push_back(key);
                }
                // Applying commands only: interrupted attempts and retries
                // are the next resume's to close and start.
                _ if self.mode == Mode::Apply => {}
                NodeStatus::Running | NodeStatus::WaitingInput => {
                    self.interrupted(&key, &inst, n.attempt);
                }
                NodeStatus::Retrying => {
                    if !n.retry_announced {
                        self.emit(
                            scope.with_attempt(n.attempt + 1),
                            EventKind::NodeRetrying { delay_ms: 0 },
                        );
                    }
                    self.ready.push_back(key);
                }
                _ => {}
            }
        }
    }

    /// Kills what the dead engine left running: the process groups it
    /// recorded (commands and `bash` calls), and, for a crash between a
    /// spawn and its record, every process whose environment names the run.
    fn kill_leftovers(&mut self) {
        let backend = self.services.journal.backend().clone();
        let mut killed = 0;
        if let Ok(groups) = backend.processes(&self.run_id) {
            for g in groups {
                // SAFETY: signal 0 only asks whether the group exists.
                let alive = unsafe { libc::kill(-(g.pgid as libc::pid_t), 0) } == 0;
                cairn_tools::process::kill_group(g.pgid);
                killed += usize::from(alive);
                let _ = backend.remove_process(g.id);
            }
        }
        killed += crate::kill_leftovers(&self.run_id);
        if killed > 0 {
            self.emit(
                Scope::run(),
                EventKind::Diagnostic {
                    level: Level::Info,
                    source: "resume".into(),
                    message: format!(
                        "killed {killed} leftover process(es) of the interrupted session"
                    ),
                },
            );
        }
    }

    // ---- deciding ----

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
        if self.cancelling.is_some() || self.failing.is_some() {
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
                    self.emit(scope, EventKind::NodeStarted {});
                    let err = NodeError::fatal("template", format!("if: {e}"));
                    self.fail_attempt(key, &inst, 1, err, Duration::ZERO);
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
        let busy = self.running.len() - self.waiting.len().min(self.running.len());
        self.concurrency.saturating_sub(busy)
    }

    /// Emits `NodeStarted` for what may start now, at most a slice of
    /// nodes and until the log's backlog is full; leaf attempts are spawned
    /// by the caller once those events are durable. Returns false when it
    /// stopped early with nodes still ready.
    fn start_ready(&mut self, to_spawn: &mut Vec<(Key, u32)>) -> bool {
        if self.cancelling.is_some() || self.failing.is_some() || self.shutdown_grace.is_some() {
            return true;
        }
        if self.mode == Mode::Apply {
            // Nothing new starts; gates that waited wait again.
            let resumed: Vec<Key> = self
                .ready
                .iter()
                .filter(|k| self.resumed_attempts.contains_key(*k))
                .cloned()
                .collect();
            self.ready
                .retain(|k| !self.resumed_attempts.contains_key(k));
            for key in resumed {
                self.queued.remove(&key);
                let attempt = self.resumed_attempts.remove(&key).unwrap_or(1);
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
                .is_some_and(|k| self.resumed_attempts.contains_key(k))
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
            if let Some(attempt) = self.resumed_attempts.remove(&key) {
                // A person-in-the-loop attempt continues where it stood.
                to_spawn.push((key, attempt));
                continue;
            }
            let attempt = self.state.node(&key.0, key.1).map_or(0, |n| n.attempt) + 1;
            let scope = self.node_scope(&key).with_attempt(attempt);
            self.open_tallies(&inst);
            self.emit(scope, EventKind::NodeStarted {});
            if attempt == 1 {
                for dep in &inst.needs {
                    self.emit(
                        Scope::run(),
                        EventKind::EdgeTraversed {
                            from: dep.0.clone(),
                            to: key.0.clone(),
                            condition: inst.spec.if_.clone(),
                        },
                    );
                }
            }
            if is_group {
                match self.enter_group(&key, false) {
                    Ok(()) => {
                        self.rerender();
                        if self.group_remaining.get(&key).copied().unwrap_or(0) == 0 {
                            self.finish_group_pass(&key);
                        }
                    }
                    Err(e) => self.fail_attempt(&key, &inst, attempt, e, Duration::ZERO),
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
                                output: Some(output),
                                cached: None,
                            },
                        );
                        self.node_done(&key);
                    }
                    Err(e) => {
                        let err = NodeError::fatal("template", e.to_string());
                        self.fail_attempt(&key, &inst, attempt, err, Duration::ZERO);
                    }
                }
            } else {
                budget -= 1;
                to_spawn.push((key, attempt));
            }
        }
        true
    }

    /// After a resume: layers and chapters the log shows started and not
    /// finished are open again, so they get their `LayerFinished` and
    /// `ChapterFinished` (at once when everything in them ended before the
    /// stop) and no second start.
    fn reopen_tallies(&mut self) {
        let now_ms = crate::node::now_ms();
        for (&layer, &started_ms) in &self.state.open_layers {
            let t = self.layers.entry(layer).or_default();
            t.open = true;
            let ago = Duration::from_millis((now_ms - started_ms).max(0) as u64);
            t.started = Instant::now().checked_sub(ago).or(Some(Instant::now()));
        }
        for chapter in &self.state.open_chapters {
            self.chapters.entry(chapter.clone()).or_default().open = true;
        }
    }

    fn open_tallies(&mut self, inst: &Inst) {
        let layer = inst.layer;
        let t = self.layers.entry(layer).or_default();
        if !t.open {
            t.open = true;
            t.started = Some(Instant::now());
            let node_count = t.total;
            self.emit(
                Scope::run(),
                EventKind::LayerStarted {
                    layer_index: layer,
                    node_count,
                },
            );
        }
        if let Some(stage) = &inst.spec.stage {
            let t = self.chapters.entry(stage.clone()).or_default();
            if !t.open {
                t.open = true;
                self.emit(
                    Scope::run(),
                    EventKind::ChapterStarted {
                        chapter: stage.clone(),
                    },
                );
            }
        }
    }

    /// Marks a group instance started and computes its shape (pass, list).
    fn enter_group(&mut self, key: &Key, resuming: bool) -> Result<(), NodeError> {
        let inst = self.plan.insts[key].clone();
        match &inst.spec.kind {
            NodeKind::Loop { .. } => {
                let pass = if resuming {
                    let prefix = inst.child_prefix();
                    self.state
                        .nodes
                        .iter()
                        .filter(|n| {
                            n.node_id
                                .strip_prefix(&prefix)
                                .is_some_and(|rest| !rest.contains(['.', '[']))
                        })
                        .map(|n| n.iteration)
                        .max()
                        .unwrap_or(0)
                } else {
                    0
                };
                self.shape.loop_pass.insert(key.clone(), pass);
            }
            NodeKind::ForEach { list, .. } => {
                let ctx = self.context_for(&inst, inst.key.1);
                let value = self
                    .templates
                    .eval_in(list, &ctx)
                    .map_err(|e| NodeError::fatal("template", format!("for_each: {e}")))?;
                let items = match value {
                    Value::Array(a) => a,
                    Value::Null => Vec::new(),
                    other => {
                        return Err(NodeError::fatal(
                            "for_each",
                            format!(
                                "for_each `{list}` must yield a list, got {}",
                                json_type(&other)
                            ),
                        ))
                    }
                };
                self.shape.lists.insert(key.clone(), Arc::new(items));
            }
            _ => return Err(NodeError::fatal("internal", "not a group")),
        }
        self.shape.started_groups.insert(key.clone());
        Ok(())
    }

    fn finish_group_pass(&mut self, key: &Key) {
        let inst = self.plan.insts[key].clone();
        let children = self.tree.children(&inst.spec);
        match &inst.spec.kind {
            NodeKind::Loop {
                until,
                max_iterations,
                ..
            } => {
                let pass = self.shape.loop_pass.get(key).copied().unwrap_or(0);
                let prefix = inst.child_prefix();
                let mut out = Map::new();
                for c in &children {
                    let path = format!("{prefix}{}", c.id);
                    let v = self
                        .state
                        .node(&path, pass)
                        .and_then(|n| n.output.clone())
                        .unwrap_or(Value::Null);
                    out.insert(c.id.clone(), v);
                }
                let holds = {
                    let ctx = self.context_for(&inst, pass);
                    self.templates.eval_bool_in(until, &ctx)
                };
                match holds {
                    Ok(done) if done || pass + 1 >= *max_iterations => {
                        if !done {
                            self.emit(
                                Scope::run(),
                                EventKind::Diagnostic {
                                    level: Level::Warn,
                                    source: "loop".into(),
                                    message: format!(
                                        "loop `{}` stopped after {max_iterations} passes without `{until}` holding",
                                        key.0
                                    ),
                                },
                            );
                        }
                        self.finish_group(key, Value::Object(out));
                    }
                    Ok(_) => {
                        self.shape.loop_pass.insert(key.clone(), pass + 1);
                        self.rerender();
                        if self.group_remaining.get(key).copied().unwrap_or(0) == 0 {
                            self.finish_group_pass(key);
                        }
                    }
                    Err(e) => {
                        let attempt = self.state.node(&key.0, key.1).map_or(1, |n| n.attempt);
                        let err = NodeError::fatal("template", format!("until: {e}"));
                        self.fail_attempt(key, &inst, attempt, err, Duration::ZERO);
                    }
                }
            }
            NodeKind::ForEach { .. } => {
                let len = self.shape.lists.get(key).map_or(0, |l| l.len());
                let mut list = Vec::with_capacity(len);
                for i in 0..len {
                    let mut entry = Map::new();
                    for c in &children {
                        let path = format!("{}[{i}].{}", key.0, c.id);
                        let v = self
                            .state
                            .node(&path, key.1)
                            .and_then(|n| n.output.clone())
                            .unwrap_or(Value::Null);
                        entry.insert(c.id.clone(), v);
                    }
                    list.push(Value::Object(entry));
                }
                self.finish_group(key, Value::Array(list));
            }
            _ => {}
        }
    }

    fn finish_group(&mut self, key: &Key, output: Value) {
        let n = self.state.node(&key.0, key.1).cloned();
        let attempt = n.as_ref().map_or(1, |n| n.attempt);
        let started = n
            .as_ref()
            .and_then(|n| n.attempts.last().map(|a| a.started_ms));
        let duration_ms = started.map_or(0, |s| (crate::node::now_ms() - s).max(0) as u64);
        let scope = self.node_scope(key).with_attempt(attempt);
        self.emit(
            scope,
            EventKind::NodeFinished {
                duration_ms,
                output: Some(output),
                cached: None,
            },
        );
        self.node_done(key);
    }

    /// Bookkeeping once a node instance can no longer change.
    fn node_done(&mut self, key: &Key) {
        let Some(inst) = self.plan.insts.get(key).cloned() else {
            return;
        };
        let status = self.status_of(key).unwrap_or(NodeStatus::Failed);
        if let Some(n) = self.state.node(&key.0, key.1) {
            self.nodes_ctx.insert(key.0.clone(), node_ctx_entry(n));
        }
        self.count_done(&inst, status);
        if let Some(deps) = self.dependents.get(key) {
            for d in deps {
                if let Some(n) = self.unmet.get_mut(d) {
                    *n = n.saturating_sub(1);
                    if *n > 0 {
                        continue;
                    }
                }
                self.check_queue.push_back(d.clone());
            }
        }
        if let Some(parent) = &inst.parent {
            if let Some(r) = self.group_remaining.get_mut(parent) {
                *r = r.saturating_sub(1);
                if *r == 0
                    && self.status_of(parent) == Some(NodeStatus::Running)
                    && self.failing.is_none()
                    && self.cancelling.is_none()
                {
                    let parent = parent.clone();
                    self.finish_group_pass(&parent);
                }
            }
        }
    }

    fn count_done(&mut self, inst: &Inst, status: NodeStatus) {
        let mut events = Vec::new();
        let t = self.layers.entry(inst.layer).or_default();
        t.done += 1;
        match status {
            NodeStatus::Finished => t.succeeded += 1,
            NodeStatus::Failed => t.failed += 1,
            NodeStatus::Cancelled => t.cancelled += 1,
            _ => t.skipped += 1,
        }
        if t.open && t.done >= t.total {
            t.open = false;
            events.push(EventKind::LayerFinished {
                layer_index: inst.layer,
                duration_ms: t.started.map_or(0, |s| s.elapsed().as_millis() as u64),
                succeeded: t.succeeded,
                failed: t.failed,
                skipped: t.skipped,
                cancelled: t.cancelled,
            });
        }
        if let Some(stage) = &inst.spec.stage {
            let t = self.chapters.entry(stage.clone()).or_default();
            t.done += 1;
            if status == NodeStatus::Failed {
                t.failed += 1;
            }
            if t.open && t.done >= t.total {
                t.open = false;
                events.push(EventKind::ChapterFinished {
                    chapter: stage.clone(),
                    status: if t.failed > 0 { "failed" } else { "finished" }.into(),
                });
            }
        }
        for e in events {
            self.emit(Scope::run(), e);
        }
    }

    // ---- attempts ----

    fn spawn_attempt(&mut self, key: Key, attempt: u32) {
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
        self.running.insert(key.clone(), cancel.clone());
        let tx = self.msg_tx.clone();
        let log = self.log.clone();
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
            let _ = tx.send(Msg::Done {
                key,
                attempt,
                result,
                duration_ms: t0.elapsed().as_millis() as u64,
            });
        });
    }

    fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::Done {
                key,
                attempt,
                result,
                duration_ms,
            } => {
                self.running.remove(&key);
                self.waiting.remove(&key);
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
                                output: Some(output),
                                cached: None,
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
                    Err(e) => self.fail_attempt(
                        &key,
                        &inst,
                        attempt,
                        e,
                        Duration::from_millis(duration_ms),
                    ),
                }
            }
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
    fn interrupted(&mut self, key: &Key, inst: &Inst, attempt: u32) {
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
                error: err.info,
                will_retry: true,
            },
        );
        self.emit(
            scope.with_attempt(attempt + 1),
            EventKind::NodeRetrying { delay_ms: 0 },
        );
        self.ready.push_back(key.clone());
    }

    fn retry_policy(&self, spec: &NodeSpec) -> Option<RetryPolicy> {
        spec.retry
            .clone()
            .or_else(|| self.wf.defaults.retry.clone())
    }

    fn fail_attempt(&mut self, key: &Key, inst: &Inst, attempt: u32, e: NodeError, _d: Duration) {
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
                error: e.info.clone(),
                will_retry,
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
        if inst.spec.on_failure == OnFailure::Fail
            && self.failing.is_none()
            && self.cancelling.is_none()
        {
            let mut info = ErrorInfo::new(
                "node-failed",
                format!("node `{}` failed: {}", key.0, e.info.message),
            );
            info.details = Some(json!({ "nodeId": key.0, "iteration": key.1, "error": e.info }));
            self.failing = Some(info);
            self.run_cancel.cancel();
        }
        self.node_done(key);
    }

    // ---- people ----

    fn on_ask(&mut self, a: Ask) {
        match a {
            Ask::Approval {
                key,
                message,
                reply,
            } => {
                // The attempt may have been cancelled, and its end handled,
                // before its question came through: a gate opened now would
                // follow the node's terminal event.
                if !self.running.contains_key(&key) {
                    return;
                }
                let node = self.state.node(&key.0, key.1).cloned();
                if let Some(d) = node.as_ref().and_then(|n| n.decision.clone()) {
                    let _ = reply.send(Decision {
                        approved: d.approved,
                        note: d.note,
                        by: d.by,
                    });
                    return;
                }
                if node.map(|n| n.status) != Some(NodeStatus::WaitingApproval) {
                    let scope = self.node_scope(&key);
                    self.emit(scope.clone(), EventKind::NodeWaitingApproval {});
                    self.emit(scope, EventKind::ApprovalRequested { message });
                }
                self.waiting.insert(key, reply);
            }
        }
    }

    /// Applies the commands waiting in the run's inbox, oldest first, and
    /// returns how many it took. Each is marked taken only once what it
    /// caused is durable, so a crash in between applies it again on resume
    /// (where a second decision is refused, harmlessly).
    async fn drain_inbox(&mut self) -> usize {
        let backend = self.services.journal.backend().clone();
        let run = self.run_id.clone();
        let pending = tokio::task::spawn_blocking(move || backend.pending_commands(&run)).await;
        let entries = match pending {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => {
                self.warn("inbox", format!("cannot read the run's inbox: {e}"));
                return 0;
            }
            Err(_) => return 0,
        };
        let n = entries.len();
        for entry in entries {
            let outcome = self.apply(entry.command).await;
            let text = match outcome {
                Ok(None) => "applied".to_string(),
                Ok(Some(note)) => {
                    let reply = InboxReply {
                        id: entry.id,
                        accepted: true,
                        message: note.clone(),
                    };
                    self.emit(Scope::run(), reply.to_event_kind());
                    format!("applied: {note}")
                }
                Err(e) => {
                    let reply = InboxReply {
                        id: entry.id,
                        accepted: false,
                        message: e.to_string(),
                    };
                    self.emit(Scope::run(), reply.to_event_kind());
                    format!("refused: {e}")
                }
            };
            if let Err(e) = self.log.sync().await {
                self.store_error = Some(e.to_string());
                return n;
            }
            let backend = self.services.journal.backend().clone();
            let id = entry.id;
            let _ = tokio::task::spawn_blocking(move || backend.take_command(id, &text)).await;
        }
        n
    }

    /// Carries out one command. `Ok(Some(note))` when it was taken without
    /// an event of its own.
    async fn apply(&mut self, command: RunCommand) -> Result<Option<String>, EngineError> {
        match command {
            RunCommand::Approve { node_id, note, by } => {
                self.decide(&node_id, true, note, by).await.map(|_| None)
            }
            RunCommand::Deny { node_id, note, by } => {
                self.decide(&node_id, false, note, by).await.map(|_| None)
            }
            RunCommand::Cancel {
                graceful,
                reason,
                by,
            } => {
                if self.cancelling.is_some() {
                    return Ok(Some("the run is already being cancelled".into()));
                }
                self.request_cancel(graceful, reason, by)
                    .await
                    .map(|_| None)
            }
            RunCommand::Answer { request_id, .. } => Err(EngineError::NotFound(format!(
                "no node of run `{}` waits for an answer to `{request_id}`",
                self.run_id
            ))),
        }
    }

    async fn decide(
        &mut self,
        node_id: &str,
        approved: bool,
        note: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        // A gate the log shows waiting may not have asked again yet after a
        // resume: its attempt finds the decision in the state when it does.
        let key = self
            .waiting
            .keys()
            .filter(|k| k.0 == node_id)
            .max_by_key(|k| k.1)
            .cloned()
            .or_else(|| {
                self.state
                    .nodes
                    .iter()
                    .filter(|n| {
                        n.node_id == node_id
                            && n.status == NodeStatus::WaitingApproval
                            && n.decision.is_none()
                            && self
                                .plan
                                .insts
                                .contains_key(&(n.node_id.clone(), n.iteration))
                    })
                    .map(|n| (n.node_id.clone(), n.iteration))
                    .max_by_key(|k| k.1)
            })
            .ok_or_else(|| crate::not_waiting(&self.run_id, node_id, &self.state))?;
        let scope = self.node_scope(&key);
        let kind = if approved {
            EventKind::ApprovalGranted {
                decided_by: by.clone(),
                note: note.clone(),
            }
        } else {
            EventKind::ApprovalDenied {
                decided_by: by.clone(),
                note: note.clone(),
            }
        };
        self.emit(scope, kind);
        if self.announced != RunStatus::Running {
            self.announced = RunStatus::Running;
            self.emit(
                Scope::run(),
                EventKind::RunStatusChanged {
                    status: RunStatus::Running,
                },
            );
        }
        self.log.sync().await?;
        if let Some(reply) = self.waiting.remove(&key) {
            let _ = reply.send(Decision { approved, note, by });
        }
        Ok(())
    }

    async fn request_cancel(
        &mut self,
        graceful: bool,
        reason: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        if self.cancelling.is_some() {
            return Ok(());
        }
        let mechanism = if graceful {
            CancelMechanism::Graceful
        } else {
            CancelMechanism::Immediate
        };
        self.emit(
            Scope::run(),
            EventKind::RunCancelRequested {
                reason: reason.clone(),
                requested_by: by,
                mechanism,
            },
        );
        self.log.sync().await?;
        self.cancelling = Some((mechanism, reason));
        if graceful {
            for key in self.waiting.keys() {
                if let Some(t) = self.running.get(key) {
                    t.cancel();
                }
            }
        } else {
            self.run_cancel.cancel();
        }
        Ok(())
    }

    // ---- ending ----

    async fn maybe_end(&mut self) -> Option<RunOutcome> {
        if !self.running.is_empty() || !self.check_queue.is_empty() {
            return None;
        }
        if self.shutdown_grace.is_some() {
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
            for key in self.plan.order.clone() {
                let Some(n) = self.state.node(&key.0, key.1).cloned() else {
                    continue;
                };
                if n.status.is_done() {
                    continue;
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
            .filter(|k| !self.status_of(k).is_some_and(|s| s.is_done()))
            .cloned()
            .collect();
        if !not_done.is_empty() && !stopping {
            if !self.waiting.is_empty() {
                return None;
            }
            let names: Vec<&str> = not_done.iter().take(5).map(|k| k.0.as_str()).collect();
            self.failing = Some(ErrorInfo::new(
                "stuck",
                format!("nodes can never start: {}", names.join(", ")),
            ));
        }
        Some(self.finish().await)
    }

    async fn finish(&mut self) -> RunOutcome {
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

    fn duration_ms(&self) -> u64 {
        self.state
            .started_ms
            .map_or(0, |s| (crate::node::now_ms() - s).max(0) as u64)
    }

    fn summary(&self) -> EventKind {
        let mut nodes = NodeCounts::default();
        // The slowest nodes by index first: naming every node would copy
        // every path.
        let mut slowest: Vec<(u64, usize)> = Vec::new();
        for (i, n) in self.state.nodes.iter().enumerate() {
            match n.status {
                NodeStatus::Finished => nodes.finished += 1,
                NodeStatus::Failed => nodes.failed += 1,
                NodeStatus::Skipped => nodes.skipped += 1,
                NodeStatus::Cancelled => nodes.cancelled += 1,
                _ => {}
            }
            if let Some(d) = n.duration_ms {
                slowest.push((d, i));
                if slowest.len() >= 2 * MAX_TIMINGS {
                    slowest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                    slowest.truncate(MAX_TIMINGS);
                }
            }
        }
        slowest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        slowest.truncate(MAX_TIMINGS);
        let timings = slowest
            .into_iter()
            .map(|(d, i)| NodeTiming {
                node_id: self.state.nodes[i].node_id.clone(),
                iteration: self.state.nodes[i].iteration,
                duration_ms: d,
            })
            .collect();
        EventKind::RunSummary {
            duration_ms: self.duration_ms(),
            nodes,
            tokens: self.state.tokens.clone(),
            cost_usd: self.state.cost_usd,
            timings,
        }
    }

    // ---- template context ----

    /// The template context of the workflow's `output`.
    fn run_context(&self) -> Context {
        Context::scoped(
            self.small_vars(0, &[]),
            "nodes",
            self.nodes_ctx.shared(),
            "",
        )
    }

    /// The variables of a render other than `nodes`: all small, so they are
    /// built for every render. A group's names (`item`, the `as` name,
    /// `index`) come after `input` and before `run` and `workflow`, as they
    /// always have, so the same one wins where they clash.
    fn small_vars(&self, iteration: u32, group: &[(String, Value)]) -> Map<String, Value> {
        let mut vars = Map::new();
        vars.insert(
            "input".into(),
            self.state.input.clone().unwrap_or(Value::Null),
        );
        for (k, v) in group {
            vars.insert(k.clone(), v.clone());
        }
        // Inside a loop the group's `iteration` is the instance's pass
        // already; a loop's own `until` reads the pass that just ended.
        vars.insert("iteration".into(), Value::from(iteration));
        vars.insert("run".into(), json!({ "id": self.run_id }));
        vars.insert("workflow".into(), json!({ "name": self.wf.name }));
        vars
    }

    /// The template context of one instance for a render in the driver: it
    /// shares `nodes` instead of copying it, so a render costs what the
    /// template reads. `iteration` is the instance's pass, or for a loop's
    /// `until` the pass that just ended.
    fn context_for(&self, inst: &Inst, iteration: u32) -> Context {
        let vars = self.small_vars(iteration, &inst.vars);
        Context::scoped(vars, "nodes", self.nodes_ctx.shared(), &inst.prefix)
    }

    /// Whether an instance's spec has templates (looked at once per spec).
    fn is_templated(&mut self, inst: &Inst) -> bool {
        *self
            .templated
            .entry(inst.spec.id())
            .or_insert_with(|| uses_templates(&inst.spec))
    }

    /// The template context of an attempt that runs in its own task, as a
    /// value of its own. Nodes without templates get a small context:
    /// copying every node's output for each of thousands of plain nodes
    /// would make a run quadratic.
    fn vars_for(&mut self, inst: &Inst, force: bool) -> Value {
        let templated = force || self.is_templated(inst);
        let mut vars = Map::new();
        vars.insert(
            "input".into(),
            self.state.input.clone().unwrap_or(Value::Null),
        );
        if templated {
            let all = self.nodes_ctx.map();
            let mut nodes = all.clone();
            if !inst.prefix.is_empty() {
                // Siblings inside a group are known by their plain id too.
                for (k, v) in all {
                    if let Some(rest) = k.strip_prefix(&inst.prefix) {
                        if !rest.contains(['.', '[']) {
                            nodes.insert(rest.to_string(), v.clone());
                        }
                    }
                }
            }
            vars.insert("nodes".into(), Value::Object(nodes));
        } else {
            vars.insert("nodes".into(), Value::Object(Map::new()));
        }
        vars.insert("iteration".into(), Value::from(inst.key.1));
        for (k, v) in inst.vars.iter() {
            vars.insert(k.clone(), v.clone());
        }
        vars.insert("run".into(), json!({ "id": self.run_id }));
        vars.insert("workflow".into(), json!({ "name": self.wf.name }));
        Value::Object(vars)
    }
}

/// The `nodes` of templates (`output`, `status`, `attempt` of every ended
/// node instance, by path), shared with the renders that read it.
///
/// Renders in the driver hold the map only while they run, so an update
/// finds it unshared and changes it in place.
#[derive(Debug)]
struct NodesCtx(Arc<Value>);

impl Default for NodesCtx {
    fn default() -> Self {
        NodesCtx(Arc::new(Value::Object(Map::new())))
    }
}

impl NodesCtx {
    fn insert(&mut self, path: String, entry: Value) {
        if let Value::Object(m) = Arc::make_mut(&mut self.0) {
            m.insert(path, entry);
        }
    }

    fn shared(&self) -> Arc<Value> {
        self.0.clone()
    }

    fn map(&self) -> &Map<String, Value> {
        self.0.as_object().expect("the nodes context is an object")
    }
}

fn node_ctx_entry(n: &cairn_events::NodeState) -> Value {
    json!({
        "output": n.output.clone().unwrap_or(Value::Null),
        "status": n.status.as_str(),
        "attempt": n.attempt,
    })
}

fn uses_templates(spec: &NodeSpec) -> bool {
    fn has(s: &str) -> bool {
        s.contains("{{") || s.contains("{%") || s.contains("{#")
    }
    fn value_has(v: &Value) -> bool {
        match v {
            Value::String(s) => has(s),
            Value::Array(a) => a.iter().any(value_has),
            Value::Object(o) => o.values().any(value_has),
            _ => false,
        }
    }
    spec.if_.is_some()
        || spec.env.values().any(|v| has(v))
        || spec.cwd.as_deref().is_some_and(has)
        || match &spec.kind {
            NodeKind::Command(argv) => argv.iter().any(|a| has(a)),
            NodeKind::Value(v) => value_has(v),
            NodeKind::Approval(m) => has(m),
            NodeKind::Tool { args, .. } => value_has(args),
            NodeKind::Loop { .. } | NodeKind::ForEach { .. } => true,
        }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        format!("{ms}ms")
    } else if ms % 60_000 != 0 || ms == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

/// Resolves at the listener's next wake-up; never without a listener.
async fn wait_for(listener: &mut Option<Box<dyn Listener>>) {
    match listener {
        Some(l) => l.wait().await,
        None => std::future::pending().await,
    }
}
