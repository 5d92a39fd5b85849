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

mod driver;
mod kinds;
mod node;
mod plan;
mod services;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_events::{ErrorInfo, Event, EventKind, NodeStatus, RunState, RunStatus, Scope};
use cairn_store::{
    Backend, ControlRequest, EventQuery, Journal, RunRecord, StoreError, ToolCallRecord,
};
use cairn_tools::ToolRegistry;
use cairn_workflow::{InputError, Templates, Workflow, WorkflowError};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use node::{runner_for, Decision, NodeCtx, NodeError, NodeRunner};

use driver::{Control, Driver, DriverInit};

/// The control-table kind under which a running command's process group is
/// remembered, so a resume can kill what a crashed engine left behind.
pub(crate) const PROCESS_CONTROL: &str = "process";
/// The environment variable every command and `bash` call of a run gets,
/// holding the run's id: a resume finds and kills leftovers by it.
pub const RUN_ENV: &str = "CAIRN_RUN_ID";
/// Default per-stream output cap of `command` nodes.
pub(crate) const COMMAND_OUTPUT_LIMIT: usize = 1_000_000;
/// How long a shutdown lets running nodes reach a safe point.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the engine refused or could not do something.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The workflow file is invalid.
    #[error("{0}")]
    Workflow(#[from] WorkflowError),
    /// The run's input breaks the workflow's input schema.
    #[error("{0}")]
    Input(#[from] InputError),
    /// No such run or workflow.
    #[error("{0}")]
    NotFound(String),
    /// The request does not fit the run's state (not waiting, already ended, ...).
    #[error("{0}")]
    Conflict(String),
    /// A request that is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The engine is shutting down and takes no new runs.
    #[error("the engine is shutting down and takes no new runs")]
    ShuttingDown,
}

impl EngineError {
    /// The HTTP status that fits this error.
    pub fn http_status(&self) -> u16 {
        match self {
            EngineError::Workflow(_) | EngineError::BadRequest(_) => 400,
            EngineError::Input(_) => 422,
            EngineError::NotFound(_) => 404,
            EngineError::Conflict(_) => 409,
            EngineError::Store(StoreError::Busy { .. })
            | EngineError::Store(StoreError::RunExists(_)) => 409,
            EngineError::Store(_) => 500,
            EngineError::ShuttingDown => 503,
        }
    }

    /// The CLI's exit code for this error: 4 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            EngineError::Workflow(_)
            | EngineError::Input(_)
            | EngineError::NotFound(_)
            | EngineError::BadRequest(_)
            | EngineError::Conflict(_) => 4,
            EngineError::Store(StoreError::Corrupt { .. })
            | EngineError::Store(StoreError::Locked { .. }) => 4,
            _ => 1,
        }
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

/// Options of one run (or one resume).
#[derive(Default, Clone)]
pub struct StartOptions {
    /// The run's id; generated when absent.
    pub run_id: Option<String>,
    /// Most leaf nodes running at once (overrides the workflow's `concurrency`).
    pub max_concurrency: Option<usize>,
    /// Return [`RunOutcome::Waiting`] instead of waiting for a person.
    pub exit_on_wait: bool,
    /// Receives every event of the run in seq order, synchronously.
    pub observer: Option<Observer>,
}

/// Options of an engine.
#[derive(Clone)]
pub struct EngineOptions {
    /// The tools `tool` nodes (and later agents) may call.
    pub tools: ToolRegistry,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            tools: ToolRegistry::builtin(),
        }
    }
}

/// A run being driven by this engine.
pub struct RunHandle {
    /// The run's id.
    pub run_id: String,
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

struct Active {
    control: mpsc::UnboundedSender<Control>,
}

struct Inner {
    services: Arc<services::Services>,
    templates: Arc<Templates>,
    active: Mutex<HashMap<String, Active>>,
    shutdown: CancellationToken,
    closing: AtomicBool,
    done_tx: tokio::sync::watch::Sender<usize>,
}

/// Runs workflows on a journal. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// An engine over a journal.
    pub fn new(journal: Journal, opts: EngineOptions) -> Engine {
        Engine {
            inner: Arc::new(Inner {
                services: Arc::new(services::Services::new(journal, opts.tools)),
                templates: Arc::new(Templates::new()),
                active: Mutex::new(HashMap::new()),
                shutdown: CancellationToken::new(),
                closing: AtomicBool::new(false),
                done_tx: tokio::sync::watch::channel(0).0,
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

    /// Loads a workflow by path, or by name from a folder of workflows
    /// (`NAME.yaml`, `NAME.yml` or `NAME.json`).
    pub fn load_workflow(
        &self,
        name_or_path: &str,
        workflows_dir: Option<&Path>,
    ) -> Result<Workflow, EngineError> {
        let direct = PathBuf::from(name_or_path);
        if direct.is_file() {
            return Ok(cairn_workflow::load(&direct)?);
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
                        return Ok(cairn_workflow::load(&p)?);
                    }
                }
            }
        }
        Err(EngineError::NotFound(format!(
            "no workflow `{name_or_path}`: not a file{}",
            workflows_dir
                .map(|d| format!(", nor a workflow name in {}", d.display()))
                .unwrap_or_default()
        )))
    }

    /// Starts a run. Returns once `RunStarted` is durable; the run goes on
    /// in a task of its own.
    pub async fn start(
        &self,
        wf: Workflow,
        input: Value,
        opts: StartOptions,
    ) -> Result<RunHandle, EngineError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        wf.validate_input(&input)?;
        let run_id = match &opts.run_id {
            Some(id) => {
                validate_run_id(id)?;
                id.clone()
            }
            None => new_run_id(),
        };
        let now = node::now_ms();
        self.backend().create_run(&RunRecord {
            run_id: run_id.clone(),
            workflow: wf.name.clone(),
            workflow_path: wf.path.display().to_string(),
            workflow_hash: wf.hash.clone(),
            workflow_source: wf.source.clone(),
            input: input.clone(),
            status: "pending".into(),
            created_ms: now,
            updated_ms: now,
            parent_run_id: None,
        })?;
        let log = Arc::new(self.journal().run_log(&run_id)?);
        if let Some(obs) = opts.observer.clone() {
            log.set_observer(Box::new(move |e| obs(e)));
        }
        let ev = log
            .append_durable(
                Scope::run(),
                EventKind::RunStarted {
                    workflow: wf.name.clone(),
                    workflow_hash: wf.hash.clone(),
                    input: Some(input),
                    resumed: false,
                    parent_run_id: None,
                    parent_node_id: None,
                    depth: 0,
                },
            )
            .await?;
        let mut state = RunState::new(&run_id);
        state.apply(&ev);
        Ok(self.spawn_driver(run_id, Arc::new(wf), log, state, opts, false))
    }

    fn spawn_driver(
        &self,
        run_id: String,
        wf: Arc<Workflow>,
        log: Arc<cairn_store::RunLog>,
        state: RunState,
        opts: StartOptions,
        resumed: bool,
    ) -> RunHandle {
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
        self.inner
            .active
            .lock()
            .unwrap()
            .insert(run_id.clone(), Active { control: ctl_tx });
        let driver = Driver::new(DriverInit {
            run_id: run_id.clone(),
            wf,
            templates: self.inner.templates.clone(),
            log,
            services: self.inner.services.clone(),
            state,
            control_rx: ctl_rx,
            shutdown: self.inner.shutdown.clone(),
            max_concurrency: opts.max_concurrency,
            exit_on_wait: opts.exit_on_wait,
        });
        let inner = self.inner.clone();
        let id = run_id.clone();
        let join = tokio::spawn(async move {
            let outcome = driver.run(resumed).await;
            // The driver dropped its log (and with it the run's lease) on return.
            inner.active.lock().unwrap().remove(&id);
            inner.done_tx.send_modify(|n| *n += 1);
            outcome
        });
        RunHandle { run_id, join }
    }

    /// Resumes a run that a crash, a shutdown or `--exit-on-wait` left
    /// unfinished. Finished nodes are never run again.
    pub async fn resume(&self, run_id: &str, opts: StartOptions) -> Result<RunHandle, EngineError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        let rec = self.require_run(run_id)?;
        let log = match self.take_log(run_id).await {
            Ok(l) => Arc::new(l),
            Err(StoreError::Busy { .. }) => {
                return Err(EngineError::Conflict(format!(
                    "run `{run_id}` is being driven by another process; cancel it or wait"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        let state = self.fold(run_id)?;
        if let Some(s) = state.status.filter(|s| s.is_terminal()) {
            return Err(EngineError::Conflict(format!(
                "run `{run_id}` has already {}; there is nothing to resume",
                match s {
                    RunStatus::Finished => "finished",
                    RunStatus::Failed => "failed",
                    _ => "been cancelled",
                }
            )));
        }
        let path = PathBuf::from(&rec.workflow_path);
        let wf = cairn_workflow::parse(&rec.workflow_source, &path)?;
        if let Some(obs) = opts.observer.clone() {
            log.set_observer(Box::new(move |e| obs(e)));
        }
        let ev = log
            .append_durable(
                Scope::run(),
                EventKind::RunStarted {
                    workflow: wf.name.clone(),
                    workflow_hash: wf.hash.clone(),
                    input: None,
                    resumed: true,
                    parent_run_id: rec.parent_run_id.clone(),
                    parent_node_id: None,
                    depth: 0,
                },
            )
            .await?;
        let mut state = state;
        state.apply(&ev);
        Ok(self.spawn_driver(run_id.to_string(), Arc::new(wf), log, state, opts, true))
    }

    /// Resumes every run the store shows as running whose lease is free
    /// (runs a crashed or stopped server was driving). Returns their ids.
    pub async fn resume_interrupted(&self) -> Vec<String> {
        let runs = self
            .backend()
            .list_runs(&cairn_store::RunFilter {
                status: Some("running".into()),
                ..Default::default()
            })
            .unwrap_or_default();
        let mut resumed = Vec::new();
        for r in runs {
            if self.inner.active.lock().unwrap().contains_key(&r.run_id) {
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
    pub fn state(&self, run_id: &str) -> Result<RunState, EngineError> {
        if self.backend().get_run(run_id)?.is_none() {
            return Err(EngineError::NotFound(format!(
                "no run `{run_id}` in this store"
            )));
        }
        self.fold(run_id)
    }

    fn fold(&self, run_id: &str) -> Result<RunState, EngineError> {
        let events = self.backend().read_events(run_id, &EventQuery::default())?;
        let mut state = RunState::new(run_id);
        for e in &events {
            let ev = e.decode().map_err(|e| {
                EngineError::Store(StoreError::Corrupt {
                    path: PathBuf::from(run_id),
                    detail: e.to_string(),
                })
            })?;
            state.apply(&ev);
        }
        Ok(state)
    }

    /// Takes the run's sequencer. A lease this process just gave up is
    /// released by the store's writer once the run's queued events are
    /// committed, so a short wait tells "released a moment ago" from "held by
    /// another process".
    async fn take_log(&self, run_id: &str) -> Result<cairn_store::RunLog, StoreError> {
        let mut tries = 0;
        loop {
            match self.journal().run_log(run_id) {
                Err(StoreError::Busy { .. }) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => return other,
            }
        }
    }

    /// Runs driven by this engine right now.
    pub fn active_runs(&self) -> Vec<String> {
        self.inner.active.lock().unwrap().keys().cloned().collect()
    }

    fn control_of(&self, run_id: &str) -> Option<mpsc::UnboundedSender<Control>> {
        self.inner
            .active
            .lock()
            .unwrap()
            .get(run_id)
            .map(|a| a.control.clone())
    }

    /// Grants or denies an approval. Returns once the decision is durable,
    /// whether the run is driven here, by another process, or by nobody
    /// (a run that exited to wait; `resume` then continues it).
    pub async fn decide(
        &self,
        run_id: &str,
        node_id: &str,
        approved: bool,
        note: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        if let Some(ctl) = self.control_of(run_id) {
            return Self::ask_driver(&ctl, run_id, |ack| Control::Decide {
                node_id: node_id.into(),
                approved,
                note,
                by,
                ack,
            })
            .await;
        }
        self.require_run(run_id)?;
        match self.take_log(run_id).await {
            Ok(log) => {
                // Nobody drives the run: record the decision ourselves.
                let state = self.fold(run_id)?;
                let node = state
                    .nodes
                    .iter()
                    .filter(|n| n.node_id == node_id && n.status == NodeStatus::WaitingApproval)
                    .max_by_key(|n| n.iteration)
                    .ok_or_else(|| not_waiting(run_id, node_id, &state))?;
                let scope = Scope::node(node_id, node.iteration).with_chapter(node.chapter.clone());
                let kind = if approved {
                    EventKind::ApprovalGranted {
                        decided_by: by,
                        note,
                    }
                } else {
                    EventKind::ApprovalDenied {
                        decided_by: by,
                        note,
                    }
                };
                log.append_durable(scope, kind).await?;
                Ok(())
            }
            Err(StoreError::Busy { .. }) => {
                let kind = if approved { "approve" } else { "deny" };
                let after = self.backend().last_seq(run_id)?;
                self.backend().put_control(&ControlRequest {
                    id: 0,
                    run_id: run_id.into(),
                    kind: kind.into(),
                    node_id: Some(node_id.into()),
                    payload: json!({ "note": note, "by": by }),
                    created_ms: node::now_ms(),
                })?;
                let types = vec!["ApprovalGranted".to_string(), "ApprovalDenied".to_string()];
                self.wait_for_event(run_id, after, types, Some(node_id))
                    .await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Cancels a run: immediately (running commands' process groups are
    /// killed) or gracefully (running nodes may finish). Returns once
    /// `RunCancelRequested` is durable.
    pub async fn cancel(
        &self,
        run_id: &str,
        graceful: bool,
        reason: Option<String>,
        by: Option<String>,
    ) -> Result<(), EngineError> {
        if let Some(ctl) = self.control_of(run_id) {
            return Self::ask_driver(&ctl, run_id, |ack| Control::Cancel {
                graceful,
                reason,
                by,
                ack,
            })
            .await;
        }
        self.require_run(run_id)?;
        match self.take_log(run_id).await {
            Ok(log) => {
                let state = self.fold(run_id)?;
                if state.status.is_some_and(|s| s.is_terminal()) {
                    return Err(EngineError::Conflict(format!(
                        "run `{run_id}` has already ended ({})",
                        state.status.map(|s| s.as_str()).unwrap_or("?")
                    )));
                }
                // Nobody drives the run: end it here, in the log's one order.
                let mechanism = if graceful {
                    cairn_events::CancelMechanism::Graceful
                } else {
                    cairn_events::CancelMechanism::Immediate
                };
                log.append(
                    Scope::run(),
                    EventKind::RunCancelRequested {
                        reason: reason.clone(),
                        requested_by: by,
                        mechanism,
                    },
                );
                for n in state.nodes.iter().filter(|n| !n.status.is_done()) {
                    let mut scope =
                        Scope::node(n.node_id.clone(), n.iteration).with_chapter(n.chapter.clone());
                    if n.open_attempt().is_some() {
                        scope = scope.with_attempt(n.attempt);
                    }
                    log.append(
                        scope,
                        EventKind::NodeCancelled {
                            reason: Some("run cancelled".into()),
                        },
                    );
                }
                close_open_tallies(&log, &state);
                log.append(
                    Scope::run(),
                    EventKind::RunStatusChanged {
                        status: RunStatus::Cancelled,
                    },
                );
                log.append_durable(Scope::run(), EventKind::RunCancelled { reason })
                    .await?;
                Ok(())
            }
            Err(StoreError::Busy { .. }) => {
                let after = self.backend().last_seq(run_id)?;
                self.backend().put_control(&ControlRequest {
                    id: 0,
                    run_id: run_id.into(),
                    kind: "cancel".into(),
                    node_id: None,
                    payload: json!({ "graceful": graceful, "reason": reason, "by": by }),
                    created_ms: node::now_ms(),
                })?;
                self.wait_for_event(run_id, after, vec!["RunCancelRequested".into()], None)
                    .await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Hands a request to the driver of a run live in this engine and waits
    /// for its answer (given once the request's event is durable).
    async fn ask_driver(
        ctl: &mpsc::UnboundedSender<Control>,
        run_id: &str,
        make: impl FnOnce(Option<oneshot::Sender<Result<(), EngineError>>>) -> Control,
    ) -> Result<(), EngineError> {
        let stopped = || EngineError::Conflict(format!("run `{run_id}` has just stopped"));
        let (tx, rx) = oneshot::channel();
        ctl.send(make(Some(tx))).map_err(|_| stopped())?;
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    fn require_run(&self, run_id: &str) -> Result<RunRecord, EngineError> {
        self.backend()
            .get_run(run_id)?
            .ok_or_else(|| EngineError::NotFound(format!("no run `{run_id}` in this store")))
    }

    async fn wait_for_event(
        &self,
        run_id: &str,
        after: u64,
        types: Vec<String>,
        node: Option<&str>,
    ) -> Result<(), EngineError> {
        let q = EventQuery {
            after,
            types,
            node: node.map(str::to_string),
            limit: Some(1),
        };
        for _ in 0..150 {
            if !self.backend().read_events(run_id, &q)?.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(EngineError::Conflict(format!(
            "the process driving run `{run_id}` did not take the request within 7.5 s; \
             it stays queued and is applied when the run next checks"
        )))
    }

    /// Answers a question a node asked a person. No built-in node kind asks
    /// questions yet (agents will), so every request id is unknown for now.
    pub async fn answer(
        &self,
        run_id: &str,
        request_id: &str,
        _value: Value,
        _by: Option<String>,
    ) -> Result<(), EngineError> {
        let state = self.state(run_id)?;
        let waiting = state.nodes.iter().any(|n| {
            n.input_request_id.as_deref() == Some(request_id)
                && n.status == NodeStatus::WaitingInput
        });
        if !waiting {
            return Err(EngineError::NotFound(format!(
                "run `{run_id}` has no open question `{request_id}`"
            )));
        }
        Err(EngineError::Conflict(
            "answers to questions are taken by the node kinds that ask them; none is running"
                .into(),
        ))
    }

    /// Stops taking new runs, lets running nodes reach a safe point for up
    /// to `grace` (then kills them), and returns when every run task has
    /// stopped with its events committed. Runs stay `running` in the store;
    /// [`Engine::resume_interrupted`] picks them up at the next start.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.inner.shutdown.cancel();
        let mut rx = self.inner.done_tx.subscribe();
        let deadline = tokio::time::Instant::now() + grace + SHUTDOWN_GRACE;
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

/// Kills every process whose environment says it belongs to `run_id`
/// ([`RUN_ENV`]), except this process. Called by a resume, when no process
/// of the run may legitimately be alive: whoever drove it before is dead.
/// Returns how many were killed.
pub(crate) fn kill_leftovers(run_id: &str) -> usize {
    let needle = format!("{RUN_ENV}={run_id}");
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
        if environ.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()) {
            // SAFETY: kill(2) with a pid read from /proc; no memory is touched.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            killed += 1;
        }
    }
    killed
}

fn not_waiting(run_id: &str, node_id: &str, state: &RunState) -> EngineError {
    match state.latest(node_id) {
        None => EngineError::NotFound(format!("run `{run_id}` has no node `{node_id}`")),
        Some(n) => EngineError::Conflict(format!(
            "node `{node_id}` of run `{run_id}` is not waiting for approval (it is {})",
            n.status.as_str()
        )),
    }
}

/// Side-effecting, non-idempotent tool calls that attempts before `attempt`
/// of a node already made: what a retry or resume should warn about.
pub fn earlier_side_effects(
    backend: &dyn Backend,
    run_id: &str,
    node_id: &str,
    iteration: u32,
    attempt: u32,
) -> Result<Vec<ToolCallRecord>, StoreError> {
    Ok(backend
        .tool_calls(run_id, node_id, iteration)?
        .into_iter()
        .filter(|c| c.attempt < attempt && c.side_effect && !c.idempotent)
        .collect())
}

fn validate_run_id(id: &str) -> Result<(), EngineError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(EngineError::BadRequest(format!(
            "run id `{id}` is not allowed: use 1 to 128 letters, digits, `-`, `_` or `.` (not first)"
        )))
    }
}

/// A new run id: time-ordered, so `cairn runs` lists newest first naturally.
pub fn new_run_id() -> String {
    let ms = node::now_ms() as u64;
    let r: u32 = rand::random();
    format!("run-{ms:x}-{:06x}", r & 0xff_ffff)
}

/// Ends the layers and chapters a stopped run left open, for a cancel that
/// no driver handles: every node not done was just cancelled, which counts
/// as skipped, as the driver counts it.
fn close_open_tallies(log: &cairn_store::RunLog, state: &RunState) {
    let now = node::now_ms();
    for (&layer, &started_ms) in &state.open_layers {
        let (mut succeeded, mut failed, mut skipped) = (0, 0, 0);
        for n in state.nodes.iter().filter(|n| n.layer_index == Some(layer)) {
            match n.status {
                NodeStatus::Finished => succeeded += 1,
                NodeStatus::Failed => failed += 1,
                _ => skipped += 1,
            }
        }
        log.append(
            Scope::run(),
            EventKind::LayerFinished {
                layer_index: layer,
                duration_ms: (now - started_ms).max(0) as u64,
                succeeded,
                failed,
                skipped,
            },
        );
    }
    for chapter in &state.open_chapters {
        let failed = state
            .nodes
            .iter()
            .any(|n| n.chapter.as_ref() == Some(chapter) && n.status == NodeStatus::Failed);
        log.append(
            Scope::run(),
            EventKind::ChapterFinished {
                chapter: chapter.clone(),
                status: if failed { "failed" } else { "finished" }.into(),
            },
        );
    }
}
