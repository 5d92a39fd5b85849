//! Child runs: what the `workflow` node kind (`kinds::workflow`) and
//! agents' delegates start.
//!
//! A child is a run of its own (its own log, lease and driver) whose
//! `RunStarted` names its parent. Its id is derived from the place of the
//! call in the parent (run, node, pass, the attempt that began the
//! conversation, step, call), so an attempt that takes up an interrupted one
//! finds the child that exists and waits for it, resuming it if nobody
//! drives it, instead of starting a second one. The parent logs
//! `DelegationStarted` (durable before the child is created) and
//! `DelegationFinished` once the child has ended.
//!
//! A parent that is cancelled, or whose node times out, cancels the child;
//! an engine that shuts down stops both, and the parent's resume resumes the
//! child. A child waiting for a person makes its parent wait too (the
//! driver counts the node as waiting), so `--exit-on-wait` and the run's
//! status tell the truth about a tree of runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_events::{ErrorInfo, Event, EventKind, RunId, RunStatus};
use cairn_store::{EventQuery, RecordStatus};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::node::{Ask, NodeCtx, NodeError};
use crate::{Engine, EngineError, RunHandle, RunOutcome, StartOptions};

/// How long a parent waits before it looks again at a child that another
/// process drives (a `cairn answer` applying a command to it, say).
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// How often a parent looks at a child that may be driven by another
/// instance of a shared store (its row: one small read).
const ELSEWHERE_POLL: Duration = Duration::from_millis(200);

/// Who a child run's parent is, as its `RunStarted` says.
pub(crate) struct Lineage {
    pub run_id: RunId,
    pub node_id: String,
    /// The child's depth: its parent's plus one.
    pub depth: u32,
    /// The child's record exists already: a crash came between it and the
    /// child's `RunStarted`.
    pub record_exists: bool,
}

/// A child run to start, or to wait for if it exists.
pub(crate) struct ChildSpec {
    /// Derived from the call's place ([`child_run_id`]).
    pub run_id: RunId,
    /// The workflow file as the parent names it.
    pub path: String,
    /// The delegate's name, or `workflow` for a `workflow` node.
    pub agent: String,
    /// The child's input.
    pub input: Value,
}

/// The id of the child run a call starts: the id of the tree's first run,
/// a dot and a hash of the parent and `place` (what tells the call apart
/// within the parent). A tree's runs sort together, and an id stays short
/// however deep the tree. `parent_depth` says whether the parent's id is
/// itself one of these (a user's run id may hold dots of its own).
pub(crate) fn child_run_id(parent: &str, parent_depth: u32, place: &str) -> RunId {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((parent.len() as u64).to_le_bytes());
    h.update(parent.as_bytes());
    h.update(place.as_bytes());
    let hash = hex::encode(h.finalize());
    let root = match parent_depth {
        0 => parent,
        _ => parent.rsplit_once('.').map_or(parent, |(r, _)| r),
    };
    let id = format!("{root}.{}", &hash[..12]);
    // A run id's prefix, a dot and hex digits are a run id again when short
    // enough; the fallback is one whatever the parent.
    let id = if id.len() <= cairn_events::MAX_RUN_ID_LEN {
        id
    } else {
        format!("run-child-{}", &hash[..32])
    };
    RunId::parse(&id).expect("a run id's root, `.` and hex digits make a run id")
}

/// The error a child's failure ends in: `RunFailed` wraps the failed
/// node's error, which for a node that ran a child wraps that child's, and
/// so on; the innermost is what went wrong.
fn root_cause(e: &ErrorInfo) -> ErrorInfo {
    let mut at = e.clone();
    for _ in 0..64 {
        let inner = at
            .details
            .as_ref()
            .and_then(|d| d.get("error"))
            .and_then(|v| serde_json::from_value::<ErrorInfo>(v.clone()).ok());
        match inner {
            Some(i) => at = i,
            None => break,
        }
    }
    at
}

/// The attempt that began the current try of a node pass: this one, unless
/// the attempts before it were interrupted by a crash (then the first of
/// them). `failed` maps attempts to the kind of their `NodeFailed`.
pub(crate) fn origin_of(failed: &std::collections::HashMap<u32, String>, attempt: u32) -> u32 {
    let mut origin = attempt.max(1);
    while origin > 1 && failed.get(&(origin - 1)).map(String::as_str) == Some("interrupted") {
        origin -= 1;
    }
    origin
}

/// [`origin_of`] for `ctx`'s attempt, read from the log.
pub(crate) async fn origin(ctx: &NodeCtx) -> Result<u32, NodeError> {
    if ctx.attempt <= 1 {
        return Ok(1);
    }
    let backend = ctx.services.journal.backend().clone();
    let (run_id, node) = (ctx.run_id.clone(), ctx.node_id.to_string());
    let events = tokio::task::spawn_blocking(move || {
        backend.read_events(
            &run_id,
            &EventQuery {
                node: Some(node),
                types: vec![cairn_events::EventType::NodeFailed],
                ..EventQuery::default()
            },
        )
    })
    .await
    .map_err(|e| NodeError::new("internal", e.to_string()))??;
    let mut failed = std::collections::HashMap::new();
    for stored in &events {
        let Ok(ev) = stored.decode() else { continue };
        if ev.scope.iteration != Some(ctx.iteration) {
            continue;
        }
        if let EventKind::NodeFailed { error, .. } = ev.kind {
            failed.insert(ev.scope.attempt.unwrap_or(0), error.kind);
        }
    }
    Ok(origin_of(&failed, ctx.attempt))
}

/// How a child ended, as its parent sees it.
enum ChildEnd {
    Finished(Option<Value>),
    Failed(ErrorInfo),
    Cancelled,
}

impl NodeCtx {
    /// Runs `spec` as a child of this attempt's run, or takes up the child
    /// that exists, and returns its output. Its failure is this call's
    /// error (retryable: a retry begins a new child); an error that
    /// `cancelled` marks means the attempt itself was stopped.
    pub(crate) async fn run_child(&self, spec: ChildSpec) -> Result<Value, NodeError> {
        let engine = self
            .services
            .engine()
            .ok_or_else(|| NodeError::cancelled("the engine stopped"))?;
        let existing = {
            let id = spec.run_id.clone();
            engine
                .blocking(move |e| {
                    let rec = e.backend().get_run(&id)?;
                    let started = match &rec {
                        Some(_) => e.backend().last_seq(&id)? > 0,
                        None => false,
                    };
                    Ok::<_, cairn_store::StoreError>(rec.map(|r| (r, started)))
                })
                .await?
        };
        if let Some((rec, _)) = &existing {
            if rec.parent_run_id.as_deref() != Some(self.run_id.as_str()) {
                return Err(NodeError::fatal(
                    "child",
                    format!(
                        "run `{}` exists and is not a child of run `{}`",
                        spec.run_id, self.run_id
                    ),
                ));
            }
        }
        let handle = match existing {
            Some((_, true)) => {
                self.delegation_started(&spec).await?;
                None
            }
            // Queued by an earlier attempt: an instance claims it.
            Some((rec, false)) if rec.status == RecordStatus::Queued => {
                self.delegation_started(&spec).await?;
                None
            }
            None if engine.queues() => {
                let wf = self.child_workflow(&engine, &spec).await?;
                self.delegation_started(&spec).await?;
                let lineage = Lineage {
                    run_id: self.run_id.clone(),
                    node_id: self.node_id.to_string(),
                    depth: self.depth + 1,
                    record_exists: false,
                };
                let opts = StartOptions {
                    run_id: Some(spec.run_id.clone()),
                    ..StartOptions::default()
                };
                match engine
                    .enqueue(wf, spec.input.clone(), &opts, Some(&lineage))
                    .await
                {
                    // Queued by a moment-earlier attempt: wait for it.
                    Ok(_) | Err(EngineError::Store(cairn_store::StoreError::RunExists(_))) => None,
                    Err(EngineError::ShuttingDown) => {
                        return Err(NodeError::cancelled("the engine stops"))
                    }
                    Err(e) => return Err(NodeError::new("child", e.to_string())),
                }
            }
            unstarted => {
                let wf = self.child_workflow(&engine, &spec).await?;
                self.delegation_started(&spec).await?;
                let mut opts = self.child_options(&spec.run_id);
                if let Some(r) = &self.replay {
                    opts.0.replay = r.child(self, &(self.node_id.to_string(), self.iteration))?;
                }
                let lineage = Lineage {
                    run_id: self.run_id.clone(),
                    node_id: self.node_id.to_string(),
                    depth: self.depth + 1,
                    record_exists: unstarted.is_some(),
                };
                match engine
                    .start_as(wf, spec.input.clone(), opts.0, Some(lineage))
                    .await
                {
                    Ok(h) => Some((h, opts.1)),
                    Err(EngineError::ShuttingDown) => {
                        return Err(NodeError::cancelled("the engine stops"))
                    }
                    Err(e) => return Err(NodeError::new("child", e.to_string())),
                }
            }
        };
        let end = self.await_child(&engine, &spec.run_id, handle).await?;
        let (status, result) = match end {
            ChildEnd::Finished(out) => ("finished", Ok(out.unwrap_or(Value::Null))),
            ChildEnd::Failed(e) => (
                "failed",
                Err(NodeError::new("child", {
                    let cause = root_cause(&e);
                    format!(
                        "child run `{}` ({}) failed: {}: {}",
                        spec.run_id, spec.path, cause.kind, cause.message
                    )
                })
                .with_details(json!({ "childRunId": spec.run_id, "error": e }))),
            ),
            ChildEnd::Cancelled => (
                "cancelled",
                Err(NodeError::fatal(
                    "child",
                    format!("child run `{}` ({}) was cancelled", spec.run_id, spec.path),
                )
                .with_details(json!({ "childRunId": spec.run_id }))),
            ),
        };
        self.emit(EventKind::DelegationFinished {
            child_run_id: spec.run_id.clone(),
            status: status.into(),
        });
        // The child ended because this attempt was stopped: the attempt
        // was cancelled, it did not fail.
        if self.cancel.is_cancelled() && result.is_err() {
            return Err(NodeError::cancelled(format!(
                "child run `{}` was stopped with its parent",
                spec.run_id
            )));
        }
        result
    }

    async fn delegation_started(&self, spec: &ChildSpec) -> Result<(), NodeError> {
        self.emit_durable(EventKind::DelegationStarted {
            child_run_id: spec.run_id.clone(),
            agent: spec.agent.clone(),
            workflow: spec.path.clone(),
        })
        .await
    }

    /// Loads the child's workflow and checks, before anything is created,
    /// what would make the child wrong: its file, its input, the depth
    /// limit, and a cycle (an ancestor that ran the same workflow with the
    /// same input would repeat for ever).
    async fn child_workflow(
        &self,
        engine: &Engine,
        spec: &ChildSpec,
    ) -> Result<cairn_workflow::Workflow, NodeError> {
        let max = self.services.max_depth;
        if self.depth + 1 > max {
            return Err(NodeError::fatal(
                "depth",
                format!(
                    "starting `{}` would make a run {} levels deep; the limit is {max}",
                    spec.path,
                    self.depth + 1
                ),
            ));
        }
        let path: PathBuf = self.workflow.resolve(&spec.path);
        // The text pinned when this run began, not the file as it reads
        // now: a node may have rewritten it (docs/reload.md#pinned-files).
        let wf = self.workflow.child(&path).map_err(|e| {
            NodeError::fatal("workflow", format!("child workflow `{}`: {e}", spec.path))
        })?;
        wf.validate_input(&spec.input).map_err(|e| {
            NodeError::fatal("input", format!("child workflow `{}`: {e}", spec.path))
        })?;
        let (hash, input, parent) = (wf.hash.clone(), spec.input.clone(), self.run_id.clone());
        let cycle = engine
            .blocking(move |e| {
                let mut at = Some(parent);
                let mut hops = 0;
                while let Some(id) = at.take() {
                    let Some(rec) = e.backend().get_run(&id)? else {
                        break;
                    };
                    if rec.workflow_hash == hash && rec.input == input {
                        return Ok::<_, cairn_store::StoreError>(Some(id));
                    }
                    hops += 1;
                    if hops > max {
                        break;
                    }
                    at = rec.parent_run_id;
                }
                Ok(None)
            })
            .await?;
        if let Some(ancestor) = cycle {
            return Err(NodeError::fatal(
                "cycle",
                format!(
                    "child workflow `{}` with this input is what run `{ancestor}` already runs, \
                     one of this run's ancestors: it would start itself for ever",
                    spec.path
                ),
            ));
        }
        Ok(wf)
    }

    /// A child's options: this run's `--exit-on-wait`, and an observer that
    /// passes the child's status on, so the parent knows when its child
    /// waits for a person.
    fn child_options(
        &self,
        child: &RunId,
    ) -> (StartOptions, mpsc::UnboundedReceiver<Option<RunStatus>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let observer: crate::Observer = Arc::new(move |ev: &Event| match &ev.kind {
            EventKind::RunStatusChanged { status } => {
                let waits = matches!(status, RunStatus::WaitingApproval | RunStatus::WaitingInput);
                let _ = tx.send(waits.then_some(*status));
            }
            EventKind::RunStarted { .. } => {
                let _ = tx.send(None);
            }
            _ => {}
        });
        (
            StartOptions {
                run_id: Some(child.clone()),
                max_concurrency: None,
                exit_on_wait: self.exit_on_wait,
                observer: Some(observer),
                // A child runs the file as its parent's node found it; the
                // parent's watcher watches the child's file.
                watch: false,
                trigger: None,
                replay: None,
            },
            rx,
        )
    }

    /// Waits for the child to end, driving it when nobody does.
    async fn await_child(
        &self,
        engine: &Engine,
        child: &RunId,
        mut handle: Option<(RunHandle, mpsc::UnboundedReceiver<Option<RunStatus>>)>,
    ) -> Result<ChildEnd, NodeError> {
        let mut cancel_sent = false;
        // What the parent was last told of a child driven elsewhere.
        let mut told: Option<Option<RunStatus>> = None;
        loop {
            let Some((h, statuses)) = handle.as_mut() else {
                let status = engine.record_status(child).await?;
                if status.is_terminal() {
                    if let Some(end) = engine.ended(child).await? {
                        return Ok(end);
                    }
                }
                // A child another instance drives tells its waits through
                // its row: so does the parent.
                let waits = match status {
                    RecordStatus::Run(
                        s @ (RunStatus::WaitingApproval | RunStatus::WaitingInput),
                    ) => Some(s),
                    _ => None,
                };
                if told != Some(waits) {
                    let key = (self.node_id.clone(), self.iteration);
                    let _ = self.asks.send(Ask::Child { key, status: waits });
                    told = Some(waits);
                }
                if engine.is_active(child) {
                    // Driven here already (another attempt's leftover, or a
                    // command applied to it): wait for that driver.
                    let mut done = engine.inner.done_tx.subscribe();
                    tokio::select! {
                        _ = done.changed() => {}
                        _ = self.cancel.cancelled(), if !cancel_sent => {
                            cancel_sent = self.cancel_child(engine, child).await;
                        }
                    }
                    continue;
                }
                // Queued: it is for the instance whose share it is, this
                // one included, to claim.
                if status == RecordStatus::Queued && engine.queues() {
                    tokio::select! {
                        _ = tokio::time::sleep(ELSEWHERE_POLL) => {}
                        _ = self.cancel.cancelled(), if !cancel_sent => {
                            cancel_sent = self.cancel_child(engine, child).await;
                        }
                    }
                    continue;
                }
                let (opts, rx) = self.child_options(child);
                match engine.resume(child, opts).await {
                    Ok(h) => handle = Some((h, rx)),
                    Err(EngineError::LeaseHeld { .. } | EngineError::ResumeRefused { .. }) => {
                        // Another process holds its lease (for a moment, or
                        // it drives the child), or it ended in between: look
                        // again.
                        let wait = if engine.queues() {
                            ELSEWHERE_POLL
                        } else {
                            BUSY_RETRY
                        };
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = self.cancel.cancelled() => {
                                if !cancel_sent {
                                    cancel_sent = self.cancel_child(engine, child).await;
                                }
                                if engine.closing() {
                                    return Err(NodeError::cancelled("the engine stops"));
                                }
                            }
                        }
                    }
                    Err(EngineError::ShuttingDown) => {
                        return Err(NodeError::cancelled("the engine stops"))
                    }
                    Err(e) => return Err(NodeError::new("child", e.to_string())),
                }
                continue;
            };
            tokio::select! {
                outcome = &mut h.join => {
                    let outcome = outcome.unwrap_or_else(|e| {
                        RunOutcome::Failed(ErrorInfo::new("internal", format!("child run task died: {e}")))
                    });
                    match outcome {
                        RunOutcome::Finished(out) => return Ok(ChildEnd::Finished(out)),
                        RunOutcome::Failed(e) => return Ok(ChildEnd::Failed(e)),
                        RunOutcome::Cancelled => return Ok(ChildEnd::Cancelled),
                        RunOutcome::Waiting => {
                            // The child stopped to wait for a person
                            // (`--exit-on-wait`): so does this attempt, until
                            // the parent's driver stops it; the resume takes
                            // the child up again. The driver learns that the
                            // child waits from the statuses the child sent
                            // before it ended, which `select!` may not have
                            // taken yet (it picks among ready branches at
                            // random): passed on now, or the parent would
                            // never stop to wait (1 run in 300 hung so).
                            while let Ok(status) = statuses.try_recv() {
                                let key = (self.node_id.clone(), self.iteration);
                                let _ = self.asks.send(Ask::Child { key, status });
                            }
                            self.cancel.cancelled().await;
                            return Err(NodeError::cancelled("the run stops to wait for a person"));
                        }
                        RunOutcome::Interrupted => {
                            return Err(NodeError::cancelled("the engine stops"));
                        }
                    }
                }
                Some(status) = statuses.recv() => {
                    let key = (self.node_id.clone(), self.iteration);
                    let _ = self.asks.send(Ask::Child { key, status });
                }
                _ = self.cancel.cancelled(), if !cancel_sent => {
                    cancel_sent = self.cancel_child(engine, child).await;
                }
            }
        }
    }

    /// Cancels the child because this attempt was stopped (the parent's
    /// cancel, a timeout, a failing run), unless the engine is shutting
    /// down or the run stops to wait for a person: then the child stops
    /// with it and the resume takes it up.
    /// True once nothing more is to be sent.
    async fn cancel_child(&self, engine: &Engine, child: &RunId) -> bool {
        if engine.closing() || self.parking.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        if let Err(e) = engine
            .cancel(
                child,
                false,
                Some(format!(
                    "its parent run `{}` stopped node `{}`",
                    self.run_id, self.node_id
                )),
                None,
            )
            .await
        {
            tracing::debug!(child = %child, error = %e, "cannot cancel a child run");
        }
        true
    }
}

impl Engine {
    /// Where a run's row says it stands.
    async fn record_status(&self, run_id: &RunId) -> Result<RecordStatus, NodeError> {
        self.require_run_off(run_id)
            .await
            .map(|r| r.status)
            .map_err(|e| NodeError::new("child", format!("cannot read child run `{run_id}`: {e}")))
    }

    /// How a run ended, from its log; `None` while it has not.
    async fn ended(&self, run_id: &RunId) -> Result<Option<ChildEnd>, NodeError> {
        let id = run_id.clone();
        let state = self.blocking(move |e| e.fold(&id)).await.map_err(|e| {
            NodeError::new("child", format!("cannot read child run `{run_id}`: {e}"))
        })?;
        Ok(match state.status {
            Some(RunStatus::Finished) => Some(ChildEnd::Finished(state.output)),
            Some(RunStatus::Failed) => {
                Some(ChildEnd::Failed(state.error.unwrap_or_else(|| {
                    ErrorInfo::new("unknown", "the run failed")
                })))
            }
            Some(RunStatus::Cancelled) => Some(ChildEnd::Cancelled),
            _ => None,
        })
    }

    /// Whether the engine takes no new runs.
    pub(crate) fn closing(&self) -> bool {
        self.inner.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Cancels the children of `run_id` that have not ended: its run ended
    /// without them (cancelled, or failed while they ran).
    pub(crate) async fn cancel_children(&self, run_id: &RunId) {
        let id = run_id.clone();
        let children = self
            .blocking(move |e| {
                e.backend().list_runs(&cairn_store::RunFilter {
                    parent: Some(id),
                    ..Default::default()
                })
            })
            .await
            .unwrap_or_default();
        for c in children {
            if matches!(c.status.as_str(), "finished" | "failed" | "cancelled") {
                continue;
            }
            let reason = format!("its parent run `{run_id}` ended");
            if let Err(e) = self.cancel(&c.run_id, false, Some(reason), None).await {
                tracing::debug!(child = %c.run_id, error = %e, "cannot cancel a child run");
            }
        }
    }
}
