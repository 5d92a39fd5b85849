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
//! The driver is made of parts, each owning its state, each told what
//! happened and answering with the events to append (or a small
//! decision), none touching the log or the store:
//!
//! - [`scheduler::Scheduler`]: the mounted plan, its frames, and what may
//!   start (needs not ended, checks, the ready queue, groups' passes);
//! - [`attempt::Attempts`]: the attempts running, continued after a
//!   resume, left open, waiting for a retry, and their hijack flags;
//! - [`gates::Gates`]: approvals, questions and child runs waiting for a
//!   person, and the run's status as last announced;
//! - [`scoring::Scoring`]: the scorers of finished nodes;
//! - [`tallies::Tallies`]: layers and chapters (and the run's summary);
//! - [`ending::Ending`]: why the run stops (a cancel, a failure, the
//!   engine's shutdown) and how it ends.
//!
//! This file keeps what is the driver's own: the log it appends to, the
//! services, the channels, and the select loop (`run`), which only waits
//! and dispatches. Each part's file also holds the driver's side of it
//! (spawning tasks, rendering templates, waiting for the log); around
//! them, `mount` (committing frames), `groups` (entering a loop or a
//! `for_each`, ending a pass), `context` (templates' context), `inbox`
//! (commands), `hijack`, `recovery` (what a resume does first), `reload`
//! (a watched run taking a new definition) and `workspace` (snapshots
//! around attempts).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_events::{
    CancelMechanism, ErrorInfo, Event, EventKind, Level, NodeStatus, RunState, RunStatus, Scope,
};
use cairn_events::{InboxReply, RunCommand, RunId};
use cairn_store::{Listener, RunLog, Topic};
use cairn_workflow::{
    Context, NodeKind, NodeSpec, OnFailure, OnInterrupt, RetryPolicy, Templates, Workflow,
};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::node::{runner_for, Ask, Decision, NodeCtx, NodeError};
use crate::plan::{GroupVars, Inst, Key, KeyMap, KeySet, SpecTree};
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
mod scheduler;
mod scoring;
mod tallies;
mod workspace;

pub(crate) use workspace::{restore_paths, revert_files, Snapshotter};

use context::NodesCtx;
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
/// Polls skipped between two reads of the inbox while its wake-ups are
/// heard (a lost one then waits up to ten seconds): a read is a blocking
/// thread and a query, and a server driving a thousand runs made a thousand
/// of them a second for commands that nearly always came with a wake-up.
const POLLS_WHILE_LISTENING: u32 = 10;
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

/// What the tasks the driver spawned report.
enum Msg {
    /// An attempt ended.
    Done {
        key: Key,
        attempt: u32,
        result: Result<Value, NodeError>,
        duration_ms: u64,
        /// The workspace snapshot taken once the attempt ended, for a node
        /// that can change files.
        snapshot: Option<String>,
    },
    /// A retry's delay is over.
    RetryDue(Key),
    /// A scorer ended (boxed: its spec and result are large).
    ScorerDone(Box<scoring::ScorerEnd>),
    /// The workspace snapshot before an attempt is taken.
    Snapshotted(Box<workspace::Snapshotted>),
}

/// What the driver does after a round, when it does not end the run.
enum Pause {
    /// Wait for the next thing to happen.
    Wait,
    /// Commands were applied: decide another round at once.
    Again,
    /// The driver stops (the run waits for a person, with nobody driving).
    Stop(RunOutcome),
}

pub(crate) struct Driver {
    run_id: RunId,
    wf: Arc<Workflow>,
    templates: Arc<Templates>,
    log: Arc<RunLog>,
    services: Arc<Services>,
    /// The run's state: the fold of its log, with every event the driver
    /// appends applied as it appends it.
    state: RunState,
    mode: Mode,
    exit_on_wait: bool,
    /// Leaf attempts that may run at once.
    concurrency: usize,

    // The parts.
    /// The mounted plan and what may start.
    sched: scheduler::Scheduler,
    /// The attempts running, continued, left open or waiting for a retry.
    attempts: attempt::Attempts,
    /// Approvals, questions and child runs waiting for a person, and the
    /// run's status as last announced.
    gates: gates::Gates,
    /// The scorers of finished nodes.
    scoring: scoring::Scoring,
    /// Layers and chapters.
    tallies: tallies::Tallies,
    /// Why the run stops, when it does.
    ending: ending::Ending,

    // What templates read.
    nodes_ctx: NodesCtx,
    /// Whether a spec has templates, by its address.
    templated: HashMap<usize, bool>,

    // What the attempts share.
    /// What the run has spent on models, shared with its agents' attempts.
    spend: Arc<crate::agent::Spend>,
    /// How many child runs the run's agents may have going at once: the
    /// run's concurrency.
    child_slots: Arc<tokio::sync::Semaphore>,
    /// Set when the driver stops its attempts to stop and wait for a
    /// person: their child runs wait too, rather than being cancelled.
    parking: Arc<std::sync::atomic::AtomicBool>,
    /// The run's MCP servers, started when a node first needs one.
    mcp: Arc<crate::mcp::McpPool>,
    /// Stops every attempt and scorer of the run.
    run_cancel: CancellationToken,
    /// The token an immediate stop cancelled, once the failure handlers
    /// run under a new one: an attempt that was queued before the stop and
    /// starts after it (a gate a driver that applies commands continues)
    /// gets this one, and so ends at once, cancelled.
    stopped: Option<CancellationToken>,
    /// The run's secrets: given to the processes of the nodes that name
    /// them (the log masks them already).
    secrets: Arc<crate::secrets::Secrets>,
    /// For a replay: the original's answers.
    replay: Option<Arc<crate::replay::Replayer>>,
    /// Decisions and answers a replay recorded this round, handed over
    /// once the log holds them.
    replayed: Vec<inbox::Replayed>,

    // The channels.
    msg_tx: mpsc::UnboundedSender<Msg>,
    msg_rx: mpsc::UnboundedReceiver<Msg>,
    ask_tx: mpsc::UnboundedSender<Ask>,
    ask_rx: mpsc::UnboundedReceiver<Ask>,
    /// Wake-ups for commands in the run's inbox.
    inbox: Option<Box<dyn Listener>>,
    /// Whether the driver subscribed to those wake-ups (or tried to).
    listening: bool,
    /// Inbox polls since the last read of the inbox.
    polls: u32,
    /// What the watcher of the run's files says (`--watch`); `None` for a
    /// run not watched.
    reloads: Option<mpsc::UnboundedReceiver<crate::reload::Note>>,
    shutdown: Shutdown,

    // The log's progress.
    /// A store error that fails the run at the end of the round.
    store_error: Option<String>,
    /// The log's last seq when the driver last waited for a backlog.
    synced_at: u64,
}

pub(crate) struct DriverInit {
    pub run_id: RunId,
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
    /// The run's secrets, read as it started or resumed.
    pub secrets: Arc<crate::secrets::Secrets>,
    /// For a replay: the original's answers.
    pub replay: Option<Arc<crate::replay::Replayer>>,
}

impl Driver {
    pub(crate) fn new(init: DriverInit) -> Driver {
        let (msg_tx, msg_rx) = mpsc::unbounded_channel();
        let (ask_tx, ask_rx) = mpsc::unbounded_channel();
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
        let sched = scheduler::Scheduler::new(SpecTree::new(&init.wf), init.state.frame_no);
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
            templates: init.templates,
            log: init.log,
            services: init.services,
            state: init.state,
            mode: init.mode,
            exit_on_wait: init.exit_on_wait,
            concurrency,
            sched,
            attempts: Default::default(),
            gates: gates::Gates::new(announced),
            scoring: Default::default(),
            tallies: Default::default(),
            ending,
            nodes_ctx: NodesCtx::default(),
            templated: HashMap::new(),
            spend,
            child_slots: Arc::new(tokio::sync::Semaphore::new(concurrency)),
            parking: Default::default(),
            mcp,
            run_cancel,
            stopped: None,
            msg_tx,
            msg_rx,
            ask_tx,
            ask_rx,
            inbox: None,
            listening: false,
            polls: 0,
            reloads: init.reloads,
            shutdown: init.shutdown,
            store_error: None,
            synced_at: 0,
            wf: init.wf,
            secrets: init.secrets,
            replay: init.replay,
            replayed: Vec::new(),
        }
    }

    fn emit(&mut self, scope: Scope, kind: EventKind) -> Event {
        let ev = self.log.append(scope, kind);
        self.state.apply(&ev);
        ev
    }

    /// Appends events a part asked for, in its order.
    fn emit_all(&mut self, events: Vec<(Scope, EventKind)>) {
        for (scope, kind) in events {
            self.emit(scope, kind);
        }
    }

    /// Appends run-scoped events a part asked for, in its order.
    fn emit_run(&mut self, kinds: Vec<EventKind>) {
        for kind in kinds {
            self.emit(Scope::run(), kind);
        }
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
        let chapter = self.sched.inst(key).and_then(|i| i.spec.stage.clone());
        Scope::node(key.0.clone(), key.1).with_chapter(chapter)
    }

    /// The mounted instances' keys in mount order, as a list of their own
    /// (the walks that use it change the plan as they go).
    fn plan_keys(&self) -> Vec<Key> {
        self.sched.keys()
    }

    fn status_of(&self, key: &Key) -> Option<NodeStatus> {
        self.state.node(&key.0, key.1).map(|n| n.status)
    }

    /// Drives the run until it ends, waits for a person (with
    /// `exit_on_wait`), or the engine shuts down; in [`Mode::Apply`], until
    /// the commands in the inbox are applied.
    pub(crate) async fn run(mut self, resumed: bool) -> RunOutcome {
        self.take_up(resumed);
        // A resumed run may have commands that came while nobody listened
        // for their wake-up: the first look at the inbox is at once.
        let first_poll = if resumed { Duration::ZERO } else { INBOX_POLL };
        let mut poll =
            tokio::time::interval_at(tokio::time::Instant::now() + first_poll, INBOX_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut to_spawn: Vec<(Key, u32)> = Vec::new();
        loop {
            if let Some(outcome) = self.round(&mut to_spawn).await {
                return outcome;
            }
            match self.pause().await {
                // Commands the subscription's first read applied call for
                // a round before any wait.
                Pause::Wait => {
                    if self.listen_to_inbox().await == 0 {
                        self.next_news(&mut poll).await
                    }
                }
                Pause::Again => {}
                Pause::Stop(outcome) => return outcome,
            }
        }
    }

    /// Subscribes to the wake-ups of the run's inbox (polled without them),
    /// once: when the driver first waits for news, or when its first round
    /// goes on for more than one slice. A run that ends in its first slice
    /// (a few value nodes) never registers, which on SQLite spares it a
    /// folder and a marker file made and removed. A command sent before the
    /// subscription woke nobody, so the inbox is read once right after it;
    /// returns how many commands that read applied.
    async fn listen_to_inbox(&mut self) -> usize {
        if self.listening {
            return 0;
        }
        self.listening = true;
        let listened = self
            .services
            .journal
            .backend()
            .listen(Topic::Inbox(&self.run_id));
        match listened {
            Ok(l) => self.inbox = Some(l),
            Err(e) => self.warn(
                "inbox",
                format!(
                    "no wake-ups for commands ({e}); reading the inbox every {}s",
                    INBOX_POLL.as_secs()
                ),
            ),
        }
        self.drain_inbox().await
    }

    /// Takes up the run from its state: the templates' context from what
    /// ended, the plan mounted, and after a resume what was open.
    fn take_up(&mut self, resumed: bool) {
        self.nodes_ctx.follow(&self.wf, &self.state);
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
    }

    /// One round: decides what can be decided, waits once for the log,
    /// then spawns what started. The run's outcome when it ended.
    async fn round(&mut self, to_spawn: &mut Vec<(Key, u32)>) -> Option<RunOutcome> {
        self.settle(to_spawn).await;
        // With nothing to start, the run may end in this round: its end is
        // then committed with the round's events, one commit and one wait
        // instead of two (a run of value nodes is its start and this). The
        // order holds: what the end follows is durable before the end is
        // reported, in the same transaction. Not when the engine shuts down,
        // where the end is an interruption that does not wait for the log.
        if to_spawn.is_empty() && self.store_error.is_none() && !self.ending.shutting_down() {
            if let Some(outcome) = self.maybe_end().await {
                return Some(outcome);
            }
        }
        if let Err(e) = self.log.sync().await {
            self.store_error = Some(e.to_string());
        }
        if let Some(err) = self.store_error.take() {
            self.run_cancel.cancel();
            self.drain_running().await;
            return Some(RunOutcome::Failed(ErrorInfo::new("store", err)));
        }
        self.hand_over_replayed();
        for (key, attempt) in to_spawn.drain(..) {
            self.spawn_attempt(key, attempt);
        }
        if self.ending.shutting_down() {
            // The shutdown began while this round was being decided: what it
            // queued for a person stops like what waited already (else it
            // would wait out the grace).
            self.stop_waits_for_people();
        }
        self.spawn_scorers();
        self.maybe_end().await
    }

    /// After a round: whether the driver waits for news, goes on at once,
    /// or stops because the run waits for a person with nobody to drive it.
    async fn pause(&mut self) -> Pause {
        if self.mode == Mode::Apply && self.idle() {
            // Every gate that was waiting waits again: apply what the
            // inbox holds, and stop once nothing is left to apply.
            if self.drain_inbox().await > 0 {
                return Pause::Again;
            }
            return Pause::Stop(self.park("the run stopped").await);
        }
        if self.ending.shutting_down() || !self.is_waiting() {
            return Pause::Wait;
        }
        let status = self.gates.waiting_status();
        if let Some(kind) = self.gates.announce(status) {
            self.emit(Scope::run(), kind);
            if let Err(e) = self.log.sync().await {
                return Pause::Stop(RunOutcome::Failed(ErrorInfo::new("store", e.to_string())));
            }
        }
        if !self.exit_on_wait {
            return Pause::Wait;
        }
        // A decision sent while we were getting here is taken now rather
        // than left for the next resume.
        if self.drain_inbox().await > 0 {
            return Pause::Again;
        }
        Pause::Stop(self.park("the run stopped to wait for a person").await)
    }

    /// Stops the attempts waiting for a person, leaving them (and their
    /// child runs) to the next resume.
    async fn park(&mut self, why: &str) -> RunOutcome {
        self.parking
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.run_cancel.cancel();
        self.drain_running().await;
        self.mcp.close(why).await;
        RunOutcome::Waiting
    }

    /// Waits for the next thing to happen and hands it to the seam it is
    /// for, with whatever else is already queued.
    async fn next_news(&mut self, poll: &mut tokio::time::Interval) {
        tokio::select! {
            Some(m) = self.msg_rx.recv() => self.on_msg(m),
            Some(a) = self.ask_rx.recv() => self.on_ask(a),
            _ = wait_for(&mut self.inbox) => { self.drain_inbox().await; }
            _ = poll.tick() => {
                self.polls += 1;
                if self.inbox.is_none() || self.polls >= POLLS_WHILE_LISTENING {
                    self.drain_inbox().await;
                }
            }
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
            let more_checks = self.sched.has_checks();
            if checked_all && started_all && to_spawn.len() == before && !more_checks {
                break;
            }
            if !self.ease_backlog().await {
                break;
            }
            if self.shutdown.token.is_cancelled() && !self.ending.shutting_down() {
                self.begin_shutdown();
            }
            self.listen_to_inbox().await;
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
        self.stop_waits_for_people();
    }

    /// Stops the attempts that wait for a person. Waiting for a person is a
    /// safe point already: those attempts stop now, not after the grace (a
    /// question, like an approval, is in the log, and the resume asks
    /// again). An `ask` or `approval` attempt is one whichever step it is
    /// at: a resumed one may not have said again what it waits for yet.
    fn stop_waits_for_people(&mut self) {
        let mut at_people = self.gates.at_people();
        at_people.extend(
            self.attempts
                .running_keys()
                .filter(|k| {
                    self.sched.inst(k).is_some_and(|i| {
                        matches!(i.spec.kind, NodeKind::Ask { .. } | NodeKind::Approval(_))
                    })
                })
                .cloned(),
        );
        for key in at_people {
            self.attempts.stop(&key);
        }
    }

    /// Nothing runs but attempts waiting for a person, and nothing is ready.
    fn idle(&self) -> bool {
        self.attempts.count() == self.gates.waiting_count()
            && !self.sched.has_checks()
            && !self.ending.stopping()
    }

    /// Something waits for a person, and nothing else can happen until one
    /// answers.
    fn is_waiting(&self) -> bool {
        self.gates.any()
            && self.attempts.count() == self.gates.waiting_count()
            && !self.sched.has_ready()
            && self.attempts.retries_pending() == 0
            && self.scoring.running() == 0
            && !self.ending.stopping()
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
            run_id: cairn_events::RunId::parse("r").unwrap(),
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

    /// The spec nodes of the workflow `yaml` (they keep it alive).
    pub(crate) fn tree_of(yaml: &str) -> SpecTree {
        let wf = Arc::new(
            cairn_workflow::parse(yaml, std::path::Path::new("test.yaml"))
                .expect("a valid workflow"),
        );
        SpecTree::new(&wf)
    }

    /// The plan a run of the workflow `yaml` mounts at its start.
    pub(crate) fn plan_of(yaml: &str) -> Plan {
        plan::render(
            &tree_of(yaml),
            "test",
            &Shape::default(),
            &mut Paths::default(),
        )
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
