//! Cairn's engine: runs workflows durably on a [`Journal`].
//!
//! The engine knows the store and nothing above it. Each run is driven by one
//! task that owns the run's state and is the only writer of its lifecycle
//! events; node attempts run beside it. A run survives a crash of the process
//! that drove it: [`Engine::resume`] folds the log back into state, closes the
//! attempts that were interrupted, and carries on with the same log.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cairn_engine::{Engine, EngineOptions, StartOptions};
//! use cairn_store::{Journal, JournalOptions};
//! use std::sync::Arc;
//!
//! let journal = Journal::open_sqlite(".cairn/cairn.db".as_ref(), JournalOptions { log_dir: None })?;
//! let engine = Engine::new(journal, EngineOptions::default());
//! let wf = cairn_workflow::load("examples/hello.yaml".as_ref())?;
//! let opts = StartOptions {
//!     observer: Some(Arc::new(|ev: &cairn_events::Event| println!("{}", ev.to_json()))),
//!     ..StartOptions::default()
//! };
//! let outcome = engine.start(wf, serde_json::json!({}), opts).await?.wait().await;
//! println!("exit code {}", outcome.exit_code());
//! # Ok(()) }
//! ```

mod agent;
mod alloc;
mod child;
mod claim;
mod driver;
mod error;
mod fork;
mod kinds;
mod mcp;
mod node;
mod plan;
mod reload;
pub mod replay;
mod revert;
mod scorer;
pub mod secrets;
mod services;
mod touched;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_events::{
    ErrorInfo, Event, EventKind, EventType, InboxReply, NodePath, RunCommand, RunId, RunState,
    RunStatus, Scope,
};
use cairn_store::{
    Backend, EventQuery, Journal, RecordStatus, RunRecord, StoreError, ToolCallRecord, Topic,
};
use cairn_tools::ToolRegistry;
use cairn_workflow::{Templates, Workflow};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use alloc::{
    limit_malloc_arenas, release_free_memory, MallocConf, RunAllocator, MALLOC_ARENAS, MALLOC_CONF,
};
pub use node::{runner_for, Decision, NodeCtx, NodeError, NodeRunner};

use driver::{Driver, DriverInit, Mode};

pub use cairn_tools::RUN_ENV;
/// Default per-stream output cap of `command` nodes.
pub(crate) const COMMAND_OUTPUT_LIMIT: usize = 1_000_000;
/// How long a caller of [`Engine::send`] waits for the command's event
/// before saying that the command stays queued.
const COMMAND_WAIT: Duration = Duration::from_secs(30);
/// How often a caller waiting for its command's event checks that some
/// process still drives the run (it applies the command itself otherwise).
const LEASE_CHECK: Duration = Duration::from_millis(250);
/// What a shutdown adds to its grace for drivers to commit their last
/// events once the running nodes were killed.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);

/// The engine's stop signal, with the grace running nodes get.
#[derive(Clone)]
pub(crate) struct Shutdown {
    pub token: CancellationToken,
    grace: Arc<Mutex<Duration>>,
}

impl Shutdown {
    /// How long running nodes may take to reach a safe point.
    pub fn grace(&self) -> Duration {
        *self.grace.lock().unwrap()
    }
}

/// How a run (or one session of it) ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// `RunFinished`, with the workflow's output.
    Finished(Option<Value>),
    /// `RunFailed`.
    Failed(ErrorInfo),
    /// `RunCancelled`.
    Cancelled,
    /// Waiting for a person; `cairn resume` continues it.
    Waiting,
    /// The engine shut down mid-run; the next start resumes it.
    Interrupted,
}

impl RunOutcome {
    /// The documented exit codes: 0 finished, 1 failed, 2 cancelled,
    /// 3 waiting for a person (or interrupted).
    pub fn exit_code(&self) -> i32 {
        match self {
            RunOutcome::Finished(_) => 0,
            RunOutcome::Failed(_) => 1,
            RunOutcome::Cancelled => 2,
            RunOutcome::Waiting | RunOutcome::Interrupted => 3,
        }
    }
}

/// An in-process observer of every event of a run, in seq order.
pub type Observer = Arc<dyn Fn(&Event) + Send + Sync>;

/// Told each time a driver of an engine stops driving a run, with the run's
/// id and how the session ended (see [`EngineOptions::on_run_stopped`]).
pub type RunStopped = Arc<dyn Fn(&RunId, &RunOutcome) + Send + Sync>;

pub use claim::Submitted;
pub use error::{
    EngineError, FilesTask, ForkRefusal, HijackRefusal, IntegrityProblem, ResumeRefusal,
    RevertRefusal, Wanted,
};
pub use fork::{ForkPoint, ForkRequest, Forked, FORKING};
pub use revert::{RevertRequest, Reverted, SnapshotsPruned};
pub use touched::{Conflict, FilesPlan};

/// A run checked and ready to be written ([`Engine::prepare`]).
struct Prepared {
    run_id: RunId,
    /// The workflow, its text moved to `rec`.
    wf: Workflow,
    rec: RunRecord,
    pinned: Option<cairn_store::GenerationRecord>,
    secrets: Arc<secrets::Secrets>,
}

/// Options of one run (or one resume).
#[derive(Default, Clone)]
pub struct StartOptions {
    /// The run's id; generated when absent.
    pub run_id: Option<RunId>,
    /// Most leaf nodes running at once (overrides the workflow's `concurrency`).
    pub max_concurrency: Option<usize>,
    /// Return [`RunOutcome::Waiting`] instead of waiting for a person.
    pub exit_on_wait: bool,
    /// Receives every event of the run in seq order, synchronously.
    pub observer: Option<Observer>,
    /// Watch the workflow's files and reload the run when they change
    /// (`cairn run --watch`; see docs/reload.md). Runs started by another
    /// run are never watched: the parent's watcher watches their files.
    pub watch: bool,
    /// The schedule or webhook that starts the run (`RunStarted.trigger`).
    pub trigger: Option<cairn_events::Trigger>,
    /// Make the run a replay of another (`RunStarted.replayOf`, `cairn
    /// replay`): answered from the original where it asks the same, its
    /// tools working in a copy of the original's root.
    pub replay: Option<cairn_events::ReplayOf>,
}

/// Options of an engine.
#[derive(Clone)]
pub struct EngineOptions {
    /// The tools `tool` nodes (and later agents) may call.
    pub tools: ToolRegistry,
    /// When a command comes for a run that no process drives, go on
    /// driving the run afterwards (a server), instead of applying the
    /// command and stopping at the next wait (the CLI).
    pub adopt_idle_runs: bool,
    /// Most parents a child run may have (`workflow` nodes and delegates
    /// inside children); a child deeper than this fails its node.
    pub max_depth: u32,
    /// Called each time a driver of this engine stops driving a run: the
    /// run ended, waits for a person, or was interrupted by a shutdown; for
    /// child runs and for runs driven only to apply a command too. Called
    /// on the run's task once its events are committed, so it must return
    /// at once (queue the work elsewhere): the caller of
    /// [`RunHandle::wait`] waits for it.
    pub on_run_stopped: Option<RunStopped>,
    /// Watch the workflow files of every run this engine drives, started
    /// or resumed, as [`StartOptions::watch`] does for one run (`cairn
    /// serve --watch`).
    pub watch: bool,
    /// Give the memory freed by finished runs back to the system once no
    /// run has been driven for a moment ([`IDLE_RELEASE_AFTER`]): for a
    /// long-lived process whose load comes in waves (`cairn serve`).
    /// Without it, a server idle after a busy wave keeps the pages its
    /// allocators freed (they give them back only as they are used
    /// again), and what the blocking pool's threads cached until they
    /// exited.
    pub release_memory_when_idle: bool,
    /// Cairn's workspace snapshot repository (docs/snapshots.md). `None`:
    /// `snapshots` beside a store kept in files (SQLite), and no snapshots
    /// for a store that has none (PostgreSQL; the CLI gives `.cairn/snapshots`).
    pub snapshot_dir: Option<PathBuf>,
    /// Start runs as work for the store's instances to claim, when the
    /// store offers it ([`cairn_store::Claims`], a shared PostgreSQL
    /// store): [`Engine::submit`] queues a run instead of driving it, and
    /// a child run is queued for any instance to drive (`cairn serve`).
    /// Off, the process that starts a run drives it (the CLI).
    pub queue: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            tools: ToolRegistry::builtin(),
            adopt_idle_runs: false,
            max_depth: DEFAULT_MAX_DEPTH,
            on_run_stopped: None,
            watch: false,
            release_memory_when_idle: false,
            snapshot_dir: None,
            queue: false,
        }
    }
}

/// How long after its last run ended an engine with
/// [`EngineOptions::release_memory_when_idle`] gives freed memory back,
/// if no run was driven meanwhile: soon, for what the runs left freed, and
/// again once tokio's idle blocking threads (kept 10 s) have exited and
/// returned what they cached.
pub const IDLE_RELEASE_AFTER: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(12)];

/// The default of [`EngineOptions::max_depth`].
pub const DEFAULT_MAX_DEPTH: u32 = 8;

/// A run being driven by this engine.
pub struct RunHandle {
    /// The run's id.
    pub run_id: RunId,
    join: tokio::task::JoinHandle<RunOutcome>,
}

impl RunHandle {
    /// Waits until the run ends, waits for a person, or is interrupted.
    pub async fn wait(self) -> RunOutcome {
        match self.join.await {
            Ok(o) => o,
            Err(e) => RunOutcome::Failed(ErrorInfo::new("internal", format!("run task died: {e}"))),
        }
    }
}

struct Inner {
    services: Arc<services::Services>,
    templates: Arc<Templates>,
    /// Runs a driver of this engine holds, by id.
    active: Mutex<HashSet<RunId>>,
    adopt_idle_runs: bool,
    on_run_stopped: Option<RunStopped>,
    shutdown: Shutdown,
    closing: AtomicBool,
    done_tx: tokio::sync::watch::Sender<usize>,
    /// [`EngineOptions::watch`].
    watch_all: bool,
    /// The file watcher of watched runs, made when the first one starts.
    watch_hub: std::sync::OnceLock<Result<Arc<reload::hub::Hub>, String>>,
    /// [`EngineOptions::release_memory_when_idle`].
    release_when_idle: bool,
    /// [`EngineOptions::queue`], and the store offers claims.
    queue: bool,
    /// Counts the times the engine went idle (its last run ended), so that
    /// a release planned for one idle spell is skipped once runs came and
    /// went since.
    idle_spells: std::sync::atomic::AtomicU64,
}

/// The engine just went idle: after each of [`IDLE_RELEASE_AFTER`], if no
/// run was driven meanwhile, gives freed memory back to the system
/// ([`release_free_memory`]). Holds the engine only weakly, so that a
/// waiting release keeps nothing alive.
fn release_when_still_idle(inner: &Arc<Inner>) {
    let spell = inner.idle_spells.fetch_add(1, Ordering::SeqCst) + 1;
    let engine = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut waited = Duration::ZERO;
        for after in IDLE_RELEASE_AFTER {
            tokio::time::sleep(after.saturating_sub(waited)).await;
            waited = after;
            let still_idle = engine.upgrade().is_some_and(|inner| {
                inner.idle_spells.load(Ordering::SeqCst) == spell
                    && inner.active.lock().unwrap().is_empty()
            });
            if !still_idle {
                return;
            }
            // It walks the allocators' free lists: not on a runtime worker.
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
        }
    });
}

/// Runs workflows on a journal. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// An engine over a journal.
    pub fn new(journal: Journal, opts: EngineOptions) -> Engine {
        let journal_claims = journal.backend().claims().is_some();
        Engine {
            inner: Arc::new_cyclic(|me| Inner {
                services: Arc::new(services::Services::new(
                    journal,
                    opts.tools,
                    me.clone(),
                    opts.max_depth,
                    opts.snapshot_dir,
                )),
                templates: Arc::new(Templates::new()),
                active: Mutex::new(HashSet::new()),
                adopt_idle_runs: opts.adopt_idle_runs,
                on_run_stopped: opts.on_run_stopped,
                shutdown: Shutdown {
                    token: CancellationToken::new(),
                    grace: Arc::new(Mutex::new(Duration::from_secs(10))),
                },
                closing: AtomicBool::new(false),
                done_tx: tokio::sync::watch::channel(0).0,
                watch_all: opts.watch,
                watch_hub: std::sync::OnceLock::new(),
                release_when_idle: opts.release_memory_when_idle,
                queue: opts.queue && journal_claims,
                idle_spells: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The journal runs are written to.
    pub fn journal(&self) -> &Journal {
        &self.inner.services.journal
    }

    fn backend(&self) -> &Arc<dyn Backend> {
        self.journal().backend()
    }

    /// Runs store work with a clone of the engine on tokio's blocking pool.
    /// Store calls block (SQLite reads, writes and file locks): a slow disk
    /// should hold up a blocking thread, not one of the runtime's workers and
    /// every task queued behind it. A panic in `f` goes on in the caller.
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine) -> R + Send + 'static,
    ) -> R {
        let engine = self.clone();
        match tokio::task::spawn_blocking(move || f(&engine)).await {
            Ok(r) => r,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only a runtime shutting down cancels blocking work, and
                // then nothing waits for this future.
                Err(e) => panic!("store work was cancelled: {e}"),
            },
        }
    }

    /// Loads a workflow by path, or by name from a folder of workflows
    /// (`NAME.yaml`, `NAME.yml` or `NAME.json`), with the child workflows
    /// it names checked too ([`cairn_workflow::load_tree`]).
    pub fn load_workflow(
        &self,
        name_or_path: &str,
        workflows_dir: Option<&Path>,
    ) -> Result<Workflow, EngineError> {
        let direct = PathBuf::from(name_or_path);
        if direct.is_file() {
            return Ok(cairn_workflow::load_tree(&direct)?);
        }
        if let Some(dir) = workflows_dir {
            let safe = !name_or_path.is_empty()
                && name_or_path
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if safe {
                for ext in ["yaml", "yml", "json"] {
                    let p = dir.join(format!("{name_or_path}.{ext}"));
                    if p.is_file() {
                        return Ok(cairn_workflow::load_tree(&p)?);
                    }
                }
            }
        }
        Err(EngineError::WorkflowNotFound {
            name: name_or_path.to_string(),
            dir: workflows_dir.map(Path::to_path_buf),
        })
    }

    /// Starts a run. Returns once `RunStarted` is durable; the run goes on
    /// in a task of its own.
    pub async fn start(
        &self,
        wf: Workflow,
        input: Value,
        opts: StartOptions,
    ) -> Result<RunHandle, EngineError> {
        self.start_as(wf, input, opts, None).await
    }

    /// [`Engine::start`], as the child of `parent` when there is one.
    pub(crate) async fn start_as(
        &self,
        wf: Workflow,
        input: Value,
        opts: StartOptions,
        parent: Option<child::Lineage>,
    ) -> Result<RunHandle, EngineError> {
        let Prepared {
            run_id,
            mut wf,
            rec,
            pinned,
            secrets,
        } = self
            .prepare(wf, input, &opts, parent.as_ref(), RecordStatus::Pending)
            .await?;
        let replay = match opts.replay.clone() {
            Some(of) => Some(self.replayer(&run_id, of, &mut wf, true).await?),
            None => None,
        };
        // A child whose record a crash left without its `RunStarted` is
        // started in that record.
        let exists = parent.as_ref().is_some_and(|p| p.record_exists);
        let started = EventKind::RunStarted {
            workflow: wf.name.clone(),
            workflow_hash: wf.hash.clone(),
            input: Some(rec.input.clone()),
            resumed: false,
            parent_run_id: parent.as_ref().map(|p| p.run_id.clone()),
            parent_node_id: parent.as_ref().map(|p| p.node_id.clone()),
            depth: parent.as_ref().map_or(0, |p| p.depth),
            forked_from: None,
            trigger: opts.trigger.clone().map(Box::new),
            replay_of: opts.replay.clone().map(Box::new),
        };
        let start = cairn_store::RunStart {
            run_id: run_id.clone(),
            record: (!exists).then_some(rec),
            pinned,
            scope: Scope::run(),
            first: started,
            observer: opts
                .observer
                .clone()
                .map(|obs| Box::new(move |e: &Event| obs(e)) as Box<dyn Fn(&Event) + Send + Sync>),
        };
        let (log, ev) = self.blocking(move |e| e.journal().start_run(start)).await?;
        log.set_redactor(secrets.redactor());
        let log = Arc::new(log);
        let mut state = RunState::new(run_id.clone());
        state.apply(&ev);
        Ok(self.spawn_driver(
            run_id,
            Arc::new(wf),
            log,
            state,
            opts,
            Mode::Drive,
            false,
            None,
            secrets,
            replay,
        ))
    }

    /// What starting a run checks and reads before anything is written:
    /// the input against the workflow, the secrets (so that a run that
    /// cannot read them is refused now, not failed later), and the files
    /// the workflow refers to, pinned (`reload::pin`); and the run's row,
    /// with `status`.
    async fn prepare(
        &self,
        mut wf: Workflow,
        input: Value,
        opts: &StartOptions,
        parent: Option<&child::Lineage>,
        status: RecordStatus,
    ) -> Result<Prepared, EngineError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        wf.validate_input(&input)?;
        let secrets = secrets::resolve_for(&wf).await?;
        let run_id = opts.run_id.clone().unwrap_or_else(new_run_id);
        // The files the workflow refers to, read now and kept with the
        // run: what it will use, whatever a node writes to them later
        // (`reload::pin`). A child takes them from its parent's.
        // Read in place: a workflow that refers to no file reads nothing,
        // and one that does reads a few small files.
        let files = reload::pin::pin(&wf)?;
        reload::pin::attach(&mut wf, &files);
        let now = node::now_ms();
        let pinned = (!files.is_empty()).then(|| cairn_store::GenerationRecord {
            run_id: run_id.clone(),
            generation: 0,
            workflow_hash: wf.hash.clone(),
            workflow_source: wf.source.clone(),
            files,
            created_ms: now,
        });
        let rec = RunRecord {
            run_id: run_id.clone(),
            workflow: wf.name.clone(),
            workflow_path: wf.path.display().to_string(),
            workflow_hash: wf.hash.clone(),
            // The text goes to the store and is read from there (a resume,
            // the API); the driver needs only what was parsed from it, and a
            // 100,000-node file is megabytes.
            workflow_source: std::mem::take(&mut wf.source),
            input,
            status,
            created_ms: now,
            updated_ms: now,
            parent_run_id: parent.map(|p| p.run_id.clone()),
        };
        Ok(Prepared {
            run_id,
            wf,
            rec,
            pinned,
            secrets,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_driver(
        &self,
        run_id: RunId,
        wf: Arc<Workflow>,
        log: Arc<cairn_store::RunLog>,
        state: RunState,
        opts: StartOptions,
        mode: Mode,
        resumed: bool,
        cancel_requested: Option<String>,
        secrets: Arc<secrets::Secrets>,
        replay: Option<Arc<replay::Replayer>>,
    ) -> RunHandle {
        self.inner.active.lock().unwrap().insert(run_id.clone());
        let watched = (opts.watch || self.inner.watch_all)
            && mode == Mode::Drive
            && state.parent_run_id.is_none();
        let reloads = watched.then(|| self.watch(wf.clone()));
        let driver = Driver::new(DriverInit {
            run_id: run_id.clone(),
            wf,
            templates: self.inner.templates.clone(),
            log,
            services: self.inner.services.clone(),
            state,
            mode,
            shutdown: self.inner.shutdown.clone(),
            max_concurrency: opts.max_concurrency,
            exit_on_wait: opts.exit_on_wait,
            cancel_requested,
            reloads,
            secrets,
            replay,
        });
        let inner = self.inner.clone();
        let id = run_id.clone();
        let join = tokio::spawn(async move {
            let outcome = driver.run(resumed).await;
            // The driver dropped its log (and with it the run's lease) on return.
            let idle = {
                let mut active = inner.active.lock().unwrap();
                active.remove(&id);
                active.is_empty()
            };
            if idle && inner.release_when_idle {
                release_when_still_idle(&inner);
            }
            if let Some(stopped) = &inner.on_run_stopped {
                stopped(&id, &outcome);
            }
            inner.done_tx.send_modify(|n| *n += 1);
            // A run that ended while children of it ran (a cancel applied
            // by a driver that runs nothing, a failure) takes them along.
            if matches!(outcome, RunOutcome::Cancelled | RunOutcome::Failed(_)) {
                Engine { inner }.cancel_children(&id).await;
            }
            outcome
        });
        RunHandle { run_id, join }
    }

    /// Starts watching the files of a run of `wf`; the receiver is its
    /// driver's. When nothing can be watched, it carries why, once.
    fn watch(&self, wf: Arc<Workflow>) -> tokio::sync::mpsc::UnboundedReceiver<reload::Note> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        match self.inner.watch_hub.get_or_init(reload::hub::Hub::new) {
            Ok(hub) => reload::spawn_watcher(hub.clone(), wf, tx),
            Err(e) => {
                let _ = tx.send(reload::Note::Warn(e.clone()));
            }
        }
        rx
    }

    /// Resumes a run that a crash, a shutdown or `--exit-on-wait` left
    /// unfinished. Finished nodes are never run again.
    pub async fn resume(
        &self,
        run_id: &RunId,
        opts: StartOptions,
    ) -> Result<RunHandle, EngineError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        self.require_run_off(run_id).await?;
        let log = match self.take_log(run_id).await {
            Ok(l) => Arc::new(l),
            Err(StoreError::LeaseHeld { .. }) => {
                return Err(self.lease_held(run_id, Wanted::Resume).await)
            }
            Err(e) => return Err(e.into()),
        };
        self.drive_with(run_id, log, opts, Mode::Drive, true).await
    }

    /// Starts a driver on a run whose lease `log` holds: a resume
    /// (`Mode::Drive`, with its `RunStarted`) or an application of the
    /// inbox's commands (`Mode::Apply`, which writes only what they cause,
    /// and runs only the failure handlers a stop lets run). `reads_secrets`
    /// for a command that may stop the run (the handlers get theirs).
    async fn drive_with(
        &self,
        run_id: &RunId,
        log: Arc<cairn_store::RunLog>,
        opts: StartOptions,
        mode: Mode,
        reads_secrets: bool,
    ) -> Result<RunHandle, EngineError> {
        let id = run_id.clone();
        let (rec, mut state, wf) = self
            .blocking(move |e| {
                let (rec, state) = (e.require_run(&id)?, e.fold(&id)?);
                // The run's last generation: what a reload made it, or
                // what it started with.
                // An ended run has nothing to resume: its status instead.
                let wf = match state.status.filter(|s| s.is_terminal()) {
                    Some(ended) => Err(ended),
                    None => Ok(reload::definition(e.backend().as_ref(), &rec, &state)?),
                };
                Ok::<_, EngineError>((rec, state, wf))
            })
            .await?;
        let refused =
            |reason| EngineError::for_run(run_id, |run| EngineError::ResumeRefused { run, reason });
        let mut wf = wf.map_err(|ended| refused(ResumeRefusal::Ended(ended)))?;
        if state.last_seq == 0 && rec.status == fork::FORKING {
            return Err(refused(ResumeRefusal::ForkUnfinished));
        }
        // The driver needs only what was parsed; the text stays in the store.
        wf.source = String::new();
        if let Some(obs) = opts.observer.clone() {
            log.set_observer(Box::new(move |e| obs(e)));
        }
        // A cancel that was acknowledged, then a stop before the run ended:
        // the resume's `RunStarted` clears it from the fold, but the run
        // that goes on is still being cancelled.
        let cancel_requested = state.cancel_requested.clone();
        // A crash between the run's record and its first event left a log
        // with nothing in it, or the run was queued: it starts now, with
        // its stored input, and as a run (a command for it waits for that).
        let fresh = state.last_seq == 0;
        if fresh {
            let rec = rec.clone();
            let (parent, node, depth) = self.blocking(move |e| e.lineage_of(&rec)).await?;
            state.parent_run_id = parent;
            state.parent_node_id = node;
            state.depth = depth;
        }
        // Read again on every resume (a rotated token is picked up, a
        // removed one stops the resume before anything runs). A driver
        // that only applies commands runs no process but the failure
        // handlers of a stop: it reads them for a command that may stop
        // the run, and one it cannot read does not refuse the command (a
        // cancel must always go through): the handlers run without it,
        // which the log says.
        let mut unread = None;
        let secrets = match mode {
            Mode::Drive => secrets::resolve_for(&wf).await?,
            Mode::Apply if reads_secrets && wf.nodes.iter().any(has_handler) => {
                match secrets::resolve_for(&wf).await {
                    Ok(s) => s,
                    Err(e) => {
                        unread = Some(e.to_string());
                        Arc::default()
                    }
                }
            }
            Mode::Apply => Arc::default(),
        };
        log.set_redactor(secrets.redactor());
        if let Some(why) = unread {
            log.append(
                Scope::run(),
                EventKind::Diagnostic {
                    level: cairn_events::Level::Warn,
                    source: "secrets".into(),
                    message: format!(
                        "the failure handlers this command may start run without the run's secrets: {why}"
                    ),
                },
            );
        }
        // A run that never started starts now, even to apply a command:
        // a queued run cancelled before any instance claimed it ends with
        // `RunStarted` then its cancel, no node run.
        if mode == Mode::Drive || fresh {
            let ev = log
                .append_durable(
                    Scope::run(),
                    EventKind::RunStarted {
                        workflow: wf.name.clone(),
                        workflow_hash: wf.hash.clone(),
                        input: fresh.then(|| rec.input.clone()),
                        resumed: !fresh,
                        parent_run_id: state.parent_run_id.clone(),
                        parent_node_id: state.parent_node_id.clone(),
                        depth: state.depth,
                        forked_from: None,
                        trigger: None,
                        replay_of: None,
                    },
                )
                .await?;
            state.apply(&ev);
            // A revert a killed process left half-way is run to its end
            // before any node touches the files again.
            if let Some(open) = state.open_revert.take() {
                self.finish_revert(&log, &wf, &open, &secrets.to_withhold())
                    .await;
            }
        }
        let replay = match state.replay_of.clone() {
            Some(of) => Some(self.replayer(run_id, of, &mut wf, false).await?),
            None => None,
        };
        Ok(self.spawn_driver(
            run_id.clone(),
            Arc::new(wf),
            log,
            state,
            opts,
            mode,
            true,
            cancel_requested,
            secrets,
            replay,
        ))
    }

    /// Resumes every run the store shows as running or waiting for a person
    /// whose lease is free (runs a crashed or stopped server was driving),
    /// so that their nodes go on and decisions sent to them take effect.
    /// Returns their ids.
    pub async fn resume_interrupted(&self) -> Vec<RunId> {
        let runs = self
            .blocking(|e| {
                let mut runs = Vec::new();
                for status in [
                    RunStatus::Running,
                    RunStatus::WaitingApproval,
                    RunStatus::WaitingInput,
                ] {
                    runs.extend(
                        e.backend()
                            .list_runs(&cairn_store::RunFilter {
                                status: Some(status.into()),
                                ..Default::default()
                            })
                            .unwrap_or_default(),
                    );
                }
                runs
            })
            .await;
        let mut resumed = Vec::new();
        for r in runs {
            if self.is_active(&r.run_id) {
                continue;
            }
            if self
                .resume(&r.run_id, StartOptions::default())
                .await
                .is_ok()
            {
                resumed.push(r.run_id);
            }
        }
        resumed
    }

    /// Folds a run's log into its state (the one reducer).
    pub fn state(&self, run_id: &RunId) -> Result<RunState, EngineError> {
        if self.backend().get_run(run_id)?.is_none() {
            return Err(EngineError::run_not_found(run_id));
        }
        self.fold(run_id)
    }

    fn fold(&self, run_id: &RunId) -> Result<RunState, EngineError> {
        let events = self.backend().read_events(run_id, &EventQuery::default())?;
        let mut state = RunState::new(run_id.clone());
        // One event decoded at a time: a large run's log is never held
        // decoded whole.
        for stored in &events {
            state.apply(&decode_row(run_id, stored)?);
        }
        Ok(state)
    }

    /// Takes the run's sequencer. A lease this process just gave up is
    /// released by the store's writer once the run's queued events are
    /// committed, so a short wait tells "released a moment ago" from "held by
    /// another process".
    async fn take_log(&self, run_id: &RunId) -> Result<cairn_store::RunLog, StoreError> {
        let mut tries = 0;
        loop {
            let id = run_id.clone();
            match self.blocking(move |e| e.journal().run_log(&id)).await {
                Err(StoreError::LeaseHeld { .. }) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => return other,
            }
        }
    }

    /// Counts the times a driver of this engine stopped driving a run:
    /// changes whenever one does (room freed for another).
    pub fn runs_stopped(&self) -> tokio::sync::watch::Receiver<usize> {
        self.inner.done_tx.subscribe()
    }

    /// Runs driven by this engine right now.
    pub fn active_runs(&self) -> Vec<RunId> {
        self.inner.active.lock().unwrap().iter().cloned().collect()
    }

    fn require_run(&self, run_id: &RunId) -> Result<RunRecord, EngineError> {
        self.backend()
            .get_run(run_id)?
            .ok_or_else(|| EngineError::run_not_found(run_id))
    }

    /// [`Engine::require_run`] off the async workers.
    async fn require_run_off(&self, run_id: &RunId) -> Result<RunRecord, EngineError> {
        let id = run_id.clone();
        self.blocking(move |e| e.require_run(&id)).await
    }

    fn is_active(&self, run_id: &RunId) -> bool {
        self.inner.active.lock().unwrap().contains(run_id)
    }

    /// Sends a command to a run, the one way every front end does: the
    /// command is recorded in the run's inbox, the process driving the run
    /// is woken, and this returns the event the command caused once it is
    /// durable (observed through a subscription to the run's log). When no
    /// process drives the run, this engine takes its lease and applies the
    /// command with the run's own driver: it then stops at the next wait,
    /// or, with [`EngineOptions::adopt_idle_runs`], goes on driving the run.
    pub async fn send(&self, run_id: &RunId, command: RunCommand) -> Result<Event, EngineError> {
        let (mut events, id) = self.post_command(run_id, &command).await?;
        let mut applier: Option<RunHandle> = None;
        let deadline = tokio::time::Instant::now() + COMMAND_WAIT;
        let mut check = tokio::time::interval(LEASE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lease_tried = false;
        let result = loop {
            tokio::select! {
                // What is committed counts before whether anyone drives.
                biased;
                next = events.next() => {
                    if let Some(answer) = answer_in(run_id, &command, id, next)? {
                        break answer;
                    }
                }
                _ = check.tick(), if applier.is_none() && !lease_tried && !self.is_active(run_id) => {
                    // Nobody may be driving the run: then nobody else will
                    // apply the command.
                    let id = run_id.clone();
                    match self.blocking(move |e| e.journal().run_log(&id)).await {
                        Ok(log) => {
                            // A queued run being cancelled is not started
                            // to be cancelled: its first nodes would run.
                            let cancels_queued = may_stop(&command) && {
                                let id = run_id.clone();
                                self.blocking(move |e| e.backend().get_run(&id))
                                    .await
                                    .ok()
                                    .flatten()
                                    .is_some_and(|r| r.status == RecordStatus::Queued)
                            };
                            let mode = if self.inner.adopt_idle_runs
                                && !self.inner.closing.load(Ordering::SeqCst)
                                && !cancels_queued
                            {
                                Mode::Drive
                            } else {
                                Mode::Apply
                            };
                            let reads_secrets = mode == Mode::Drive || may_stop(&command);
                            match self.drive_with(run_id, Arc::new(log), StartOptions::default(), mode, reads_secrets).await {
                                Ok(h) => applier = Some(h),
                                // The run ended (drive_with's one conflict)
                                // after the subscription last read the log:
                                // the process that drove it may have applied
                                // the command first. The log tells: the
                                // subscription goes on to the command's
                                // event, or to the run's end.
                                Err(EngineError::ResumeRefused { .. }) => lease_tried = true,
                                Err(e) => break Err(e),
                            }
                        }
                        Err(StoreError::LeaseHeld { .. }) => {}
                        Err(e) => break Err(e.into()),
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    break Err(EngineError::for_run(run_id, |run| EngineError::CommandNotTaken {
                        run,
                        command: command.name(),
                        waited: COMMAND_WAIT,
                    }));
                }
            }
        };
        // A driver that only applied commands stops at the next wait; let
        // it release the run before the caller (often a CLI) exits.
        if let Some(h) = applier {
            if !self.inner.adopt_idle_runs {
                h.wait().await;
            }
        }
        result
    }

    /// Records `command` in the run's inbox, once the run has not ended
    /// and [`Engine::precheck`] lets it through, and wakes whoever drives
    /// the run; returns a subscription to the run's log from before the
    /// command, and the command's id.
    async fn post_command(
        &self,
        run_id: &RunId,
        command: &RunCommand,
    ) -> Result<(cairn_store::Subscription, u64), EngineError> {
        let rec = self.require_run_off(run_id).await?;
        if let Some(status) = RunStatus::parse(rec.status.as_str()).filter(|s| s.is_terminal()) {
            return Err(EngineError::for_run(run_id, |run| EngineError::RunEnded {
                run,
                status,
            }));
        }
        // A run driven here may have asked what is being answered in an
        // event its observer saw but the store does not hold yet: only
        // what can never apply is refused up front then.
        let waiting_known = !self.is_active(run_id);
        let (run, command) = (run_id.clone(), command.clone());
        self.blocking(move |e| {
            e.precheck(&run, &command, waiting_known)?;
            let backend = e.backend();
            let after = backend.last_seq(&run)?;
            let events = e.journal().subscribe(&run, after)?;
            let id = backend.put_command(&run, &command)?;
            backend.notify(Topic::Inbox(&run));
            Ok::<_, EngineError>((events, id))
        })
        .await
    }

    /// Refuses at once what the log shows can never apply, so that typos
    /// get a clear answer and leave nothing in the inbox or the log: a node
    /// the run never had, and, when `waiting_known` (the log is all there
    /// is to know), a gate or question that never asked.
    fn precheck(
        &self,
        run_id: &RunId,
        command: &RunCommand,
        waiting_known: bool,
    ) -> Result<(), EngineError> {
        match command {
            RunCommand::Approve { node_id, .. } | RunCommand::Deny { node_id, .. } => {
                self.precheck_gate(run_id, node_id, waiting_known)
            }
            RunCommand::Answer {
                request_id, answer, ..
            } => self.precheck_answer(run_id, request_id, answer, waiting_known),
            RunCommand::Cancel { .. } => Ok(()),
            RunCommand::Hijack { node_id, .. } => {
                // Whether it is a running agent is the driver's to say.
                let seen = self.backend().read_events(
                    run_id,
                    &EventQuery {
                        node: Some(node_id.clone()),
                        limit: Some(1),
                        ..Default::default()
                    },
                )?;
                if seen.is_empty() {
                    Err(EngineError::for_run(run_id, |run| {
                        EngineError::NodeNotFound {
                            run,
                            node: node_id.into(),
                        }
                    }))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// [`Engine::precheck`] of a decision at the gate of `node`.
    fn precheck_gate(
        &self,
        run_id: &RunId,
        node: &str,
        waiting_known: bool,
    ) -> Result<(), EngineError> {
        // A node's NodePending is committed before it can ever ask.
        let seen = |types: Vec<EventType>| {
            self.backend().read_events(
                run_id,
                &EventQuery {
                    types,
                    node: Some(node.to_string()),
                    limit: Some(1),
                    ..Default::default()
                },
            )
        };
        if seen(Vec::new())?.is_empty() {
            return Err(EngineError::for_run(run_id, |run| {
                EngineError::NodeNotFound {
                    run,
                    node: node.into(),
                }
            }));
        }
        if waiting_known && seen(vec![EventType::NodeWaitingApproval])?.is_empty() {
            return Err(EngineError::for_run(run_id, |run| {
                EngineError::NodeNotWaiting {
                    run,
                    node: node.into(),
                    status: None,
                }
            }));
        }
        Ok(())
    }

    /// [`Engine::precheck`] of an answer to the question `request_id`.
    fn precheck_answer(
        &self,
        run_id: &RunId,
        request_id: &str,
        answer: &Value,
        waiting_known: bool,
    ) -> Result<(), EngineError> {
        // An answer that breaks the question's schema is refused
        // here, as a bad request, before anything is recorded.
        let asked = self.backend().read_events(
            run_id,
            &EventQuery {
                types: vec![EventType::InputRequested],
                ..Default::default()
            },
        )?;
        let schema = asked.iter().find_map(|e| match e.decode().map(|e| e.kind) {
            Ok(EventKind::InputRequested {
                request_id: r,
                schema,
                ..
            }) if r == request_id => Some(schema),
            _ => None,
        });
        if let Some(Some(schema)) = &schema {
            if let Some(problem) = schema_problem(schema, answer) {
                return Err(EngineError::AnswerInvalid {
                    request: request_id.to_string(),
                    reason: problem,
                });
            }
        }
        if !waiting_known {
            return Ok(());
        }
        let asked = self.backend().read_events(
            run_id,
            &EventQuery {
                types: vec![EventType::InputRequested],
                ..Default::default()
            },
        )?;
        let found = asked.iter().any(|e| {
            matches!(e.decode().map(|e| e.kind),
                Ok(EventKind::InputRequested { request_id: r, .. }) if r == request_id)
        });
        if found {
            Ok(())
        } else {
            Err(EngineError::for_run(run_id, |run| {
                EngineError::QuestionNotFound {
                    run,
                    request: request_id.to_string(),
                }
            }))
        }
    }

    /// Grants or denies an approval ([`Engine::send`]); returns once the
    /// decision is durable.
    pub async fn decide(
        &self,
        run_id: &RunId,
        node_id: &str,
        approved: bool,
        note: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        let node_id = node_id.to_string();
        let command = if approved {
            RunCommand::Approve { node_id, note, by }
        } else {
            RunCommand::Deny { node_id, note, by }
        };
        self.send(run_id, command).await.map(|_| ())
    }

    /// Cancels a run ([`Engine::send`]): immediately (running commands'
    /// process groups are killed) or gracefully (running nodes may finish).
    /// Returns once `RunCancelRequested` is durable.
    pub async fn cancel(
        &self,
        run_id: &RunId,
        graceful: bool,
        reason: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        self.send(
            run_id,
            RunCommand::Cancel {
                graceful,
                reason,
                by,
            },
        )
        .await
        .map(|_| ())
    }

    /// Answers a question a node asked a person ([`Engine::send`]).
    pub async fn answer(
        &self,
        run_id: &RunId,
        request_id: &str,
        answer: Value,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        self.send(
            run_id,
            RunCommand::Answer {
                request_id: request_id.to_string(),
                answer,
                by,
            },
        )
        .await
        .map(|_| ())
    }

    /// Stops taking new runs, lets running nodes reach a safe point for up
    /// to `grace` (then kills them), and returns when every run task has
    /// stopped with its events committed. Runs stay `running` in the store;
    /// [`Engine::resume_interrupted`] picks them up at the next start.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.closing.store(true, Ordering::SeqCst);
        *self.inner.shutdown.grace.lock().unwrap() = grace;
        self.inner.shutdown.token.cancel();
        let mut rx = self.inner.done_tx.subscribe();
        let deadline = tokio::time::Instant::now() + grace + SHUTDOWN_MARGIN;
        while !self.inner.active.lock().unwrap().is_empty() {
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                break;
            }
        }
    }
}

/// A stored event of `run_id`, decoded. A row that does not decode is the
/// run's damage, not the database file's: `BadRow` names the run.
pub(crate) fn decode_row(
    run_id: &RunId,
    stored: &cairn_store::StoredEvent,
) -> Result<Event, EngineError> {
    stored.decode().map_err(|e| {
        EngineError::Store(StoreError::BadRow {
            run: run_id.to_string(),
            detail: format!("event {}: {e}", stored.seq),
        })
    })
}

/// Kills every process whose environment says it belongs to `run_id` of
/// this store ([`RUN_ENV`] and [`cairn_tools::STORE_ENV`]), except this
/// process. Called by a resume, when no process
/// of the run may legitimately be alive: whoever drove it before is dead.
/// Returns how many were killed.
pub(crate) fn kill_leftovers(run_id: &RunId, store_tag: &str) -> usize {
    let run = format!("{RUN_ENV}={run_id}");
    let store = format!("{}={store_tag}", cairn_tools::STORE_ENV);
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let mut vars = environ.split(|&b| b == 0);
        let (mut of_run, mut of_store) = (false, false);
        for kv in &mut vars {
            of_run |= kv == run.as_bytes();
            of_store |= kv == store.as_bytes();
        }
        // The same run id in another store (another checkout, tests side
        // by side) is another run: its processes are not ours to kill.
        if of_run && of_store {
            // SAFETY: kill(2) with a pid read from /proc; no memory is touched.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            killed += 1;
        }
    }
    killed
}

/// Whether the process `rec.pgid` on this machine is the group leader a
/// node attempt of this run recorded: its environment marks it as the
/// run's in this store, or (a program may empty its environment) it started
/// when the record says, to the clock's tick and a margin for the time
/// between the spawn and the record.
pub(crate) fn is_recorded_leader(
    rec: &cairn_store::ProcessRecord,
    run_id: &RunId,
    store_tag: &str,
) -> bool {
    let pid = rec.pgid;
    if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
        let run = format!("{RUN_ENV}={run_id}");
        let store = format!("{}={store_tag}", cairn_tools::STORE_ENV);
        let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
        if vars.contains(&run.as_bytes()) && vars.contains(&store.as_bytes()) {
            return true;
        }
    }
    match process_start_ms(pid) {
        Some(started) => (started - rec.started_ms).abs() <= 2_000,
        None => false,
    }
}

/// When a process started (Unix ms), from `/proc`: its start in clock ticks
/// after boot, and the boot time.
fn process_start_ms(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields are
    // counted after its closing one (state is field 3, starttime field 22).
    let rest = &stat[stat.rfind(')')? + 2..];
    let ticks: i64 = rest.split(' ').nth(19)?.parse().ok()?;
    let boot: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = i64::from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as i32).max(1);
    Some(boot * 1000 + ticks * 1000 / hz)
}

/// Why a decision for `node_id` finds no gate waiting for it: the run
/// never had the node, or the node stands elsewhere.
pub(crate) fn not_waiting(run_id: &RunId, node_id: &str, state: &RunState) -> EngineError {
    let node = node_id.into();
    EngineError::for_run(run_id, |run| match state.latest(node_id) {
        None => EngineError::NodeNotFound { run, node },
        Some(n) => EngineError::NodeNotWaiting {
            run,
            node,
            status: Some(n.status),
        },
    })
}

/// Side-effecting, non-idempotent tool calls that attempts before `attempt`
/// of a node already made: what a retry or resume should warn about.
pub fn earlier_side_effects(
    backend: &dyn Backend,
    run_id: &RunId,
    node_id: &NodePath,
    iteration: u32,
    attempt: u32,
) -> Result<Vec<ToolCallRecord>, StoreError> {
    Ok(backend
        .tool_calls(run_id, node_id, iteration)?
        .into_iter()
        .filter(|c| c.attempt < attempt && c.side_effect && !c.idempotent)
        .collect())
}

/// What the next event of a run's log (`next`, from a subscription) says
/// of the command `id` sent to it: its answer (the event it caused, the
/// driver's refusal, or an error when the log ends or cannot be read), or
/// nothing yet. An event that cannot be decoded is an error of its own.
fn answer_in(
    run_id: &RunId,
    command: &RunCommand,
    id: u64,
    next: Option<Result<Arc<cairn_store::StoredEvent>, cairn_store::SubscribeError>>,
) -> Result<Option<Result<Event, EngineError>>, EngineError> {
    let ended = || {
        EngineError::for_run(run_id, |run| EngineError::RunEndedFirst {
            run,
            command: command.name(),
        })
    };
    let stored = match next {
        Some(Ok(e)) => e,
        Some(Err(e)) => {
            return Ok(Some(Err(EngineError::Store(match e {
                cairn_store::SubscribeError::Store(e) => e,
                other => StoreError::Commit(Arc::from(other.to_string())),
            }))))
        }
        None => return Ok(Some(Err(ended()))),
    };
    let ev = stored.decode().map_err(|e| {
        EngineError::Store(StoreError::BadRow {
            run: run_id.to_string(),
            detail: e.to_string(),
        })
    })?;
    if command.is_result(&ev) {
        return Ok(Some(Ok(ev)));
    }
    if let Some(reply) = InboxReply::parse(&ev).filter(|r| r.id == id) {
        return Ok(Some(if reply.accepted {
            Ok(ev)
        } else {
            Err(EngineError::for_run(run_id, |run| {
                EngineError::CommandRefused {
                    run,
                    command: command.name(),
                    reason: reply.message,
                }
            }))
        }));
    }
    if stored.is_terminal() {
        return Ok(Some(Err(ended())));
    }
    Ok(None)
}

/// A new run id: time-ordered, so `cairn runs` lists newest first naturally.
pub fn new_run_id() -> RunId {
    let ms = node::now_ms() as u64;
    let r: u32 = rand::random();
    RunId::parse(&format!("run-{ms:x}-{:06x}", r & 0xff_ffff))
        .expect("`run-`, hex digits and `-` make a run id")
}

/// Why `value` breaks `schema` (the first few problems), if it does.
pub fn schema_problem(schema: &Value, value: &Value) -> Option<String> {
    match jsonschema::validator_for(schema) {
        Ok(v) => {
            let problems = schema_errors(&v, value, 5);
            (!problems.is_empty()).then(|| problems.join("; "))
        }
        Err(e) => Some(format!("the schema is not valid: {e}")),
    }
}

/// At most `max` of the ways `value` breaks a schema, each with where.
pub(crate) fn schema_errors(
    validator: &jsonschema::Validator,
    value: &Value,
    max: usize,
) -> Vec<String> {
    validator
        .iter_errors(value)
        .take(max)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("at {at}: {e}")
            }
        })
        .collect()
}

/// Whether applying `command` may stop the run (a cancel, a denial),
/// which lets its failure handlers run.
fn may_stop(command: &RunCommand) -> bool {
    matches!(command, RunCommand::Cancel { .. } | RunCommand::Deny { .. })
}

/// Whether `spec` or a node inside it is a failure handler.
fn has_handler(spec: &cairn_workflow::NodeSpec) -> bool {
    spec.handler
        || spec
            .kind
            .children()
            .is_some_and(|c| c.iter().any(has_handler))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pgid: u32, started_ms: i64) -> cairn_store::ProcessRecord {
        cairn_store::ProcessRecord {
            id: 1,
            run_id: RunId::parse("r").unwrap(),
            node_id: "n".into(),
            iteration: 0,
            attempt: 1,
            pgid,
            started_ms,
        }
    }

    #[test]
    fn a_recorded_group_is_killed_only_if_its_leader_is_the_recorded_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env_clear()
            .spawn()
            .unwrap();
        let now = crate::node::now_ms();
        let pid = child.id();
        // No marks in its environment: recognised by its start time.
        assert!(is_recorded_leader(
            &record(pid, now),
            &RunId::parse("r").unwrap(),
            "s"
        ));
        // The same pid recorded an hour ago (or on another machine) is
        // someone else.
        assert!(!is_recorded_leader(
            &record(pid, now - 3_600_000),
            &RunId::parse("r").unwrap(),
            "s"
        ));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_recorded_leader(
            &record(pid, now),
            &RunId::parse("r").unwrap(),
            "s"
        ));
        assert!(!is_recorded_leader(
            &record(u32::MAX - 1, now),
            &RunId::parse("r").unwrap(),
            "s"
        ));
    }
}
