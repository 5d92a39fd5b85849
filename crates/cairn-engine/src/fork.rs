//! `cairn fork`: a new run whose log starts as a copy of another's up to a
//! point, whose files are put back as they were at that point, and which
//! goes on from there, possibly with another workflow or input
//! (docs/fork.md).
//!
//! The copy keeps every event's seq, so a copied event is the same event
//! in both logs: the fork's `RunStarted` (seq 1) names its origin
//! (`forkedFrom`), and everything after the copy is the fork's own. The
//! fork is then driven like a resume: finished nodes stay finished, an
//! attempt that was running at the point is taken up as an interrupted
//! one (an agent's conversation goes on from its last step, its calls'
//! rows copied with the log), and nodes that had not started start.
//!
//! Only the paths the original run changed after the point are put back
//! ([`crate::touched`]): what other processes made or changed in the root
//! is left alone, and a path both changed is a conflict that refuses the
//! fork unless forced.

use std::collections::{BTreeSet, HashMap};

use cairn_events::{
    Event, EventKind, ForkedFrom, NodePath, RunId, RunState, Scope, Seq, SnapshotAt,
};
use cairn_snapshot::ObjectId;
use cairn_store::{
    EventQuery, GenerationRecord, RecordStatus, RunRecord, StoredEvent, ToolCallRecord,
    ToolCallStatus,
};
use cairn_workflow::Workflow;
use serde_json::Value;

use crate::touched::{shell, FilesPlan, History, Point};
use crate::{node, reload, Engine, EngineError, FilesTask, ForkRefusal, Wanted};

/// The status of a fork's record until its copied log is written: a run
/// in this state with no events was cut short while being made, and is not
/// started as a run of its own (`Engine::resume` refuses it).
pub const FORKING: RecordStatus = RecordStatus::Forking;

/// Where a fork starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkPoint {
    /// After this seq of the run's log.
    Seq(u64),
    /// Just before the node's first attempt started (its latest pass, for a
    /// node in a loop): the node and everything after it run again.
    Node(String),
}

impl ForkPoint {
    /// A seq when `s` is a number, else a node.
    pub fn parse(s: &str) -> ForkPoint {
        match s.parse::<u64>() {
            Ok(n) => ForkPoint::Seq(n),
            Err(_) => ForkPoint::Node(s.to_string()),
        }
    }
}

/// What to fork.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// The point.
    pub at: ForkPoint,
    /// The fork's input, instead of the run's.
    pub input: Option<Value>,
    /// The fork's workflow, instead of the run's (the fork adopts it as a
    /// reload at the point: `WorkflowReloaded`).
    pub workflow: Option<Workflow>,
    /// The fork's id; generated when absent.
    pub run_id: Option<RunId>,
    /// Overwrite paths that something else changed since the run did.
    pub force: bool,
    /// Plan only: no files touched, no run made.
    pub dry_run: bool,
}

/// A fork made, ready to be driven ([`Engine::resume`]).
#[derive(Debug, Clone)]
pub struct Forked {
    /// The new run.
    pub run_id: RunId,
    /// The last seq of the original its log copies (the point, moved back
    /// to the last step boundary when it fell among an agent step's calls).
    pub seq: u64,
    /// The snapshot the files were put back to, when the log has one at
    /// or before the point.
    pub snapshot: Option<String>,
    /// Files written and removed by that restore.
    pub written: u64,
    /// Files removed.
    pub removed: u64,
    /// What putting the files back writes, removes and conflicts with
    /// (empty when the point has no snapshot).
    pub plan: FilesPlan,
    /// Whether the fork was made: false for a dry run, and for a plan with
    /// conflicts and no `force` (nothing was touched then).
    pub made: bool,
}

/// A fork's request that does not fit the run.
fn refused(reason: ForkRefusal) -> EngineError {
    EngineError::ForkRefused { reason }
}

/// What putting the files back did (or would do).
struct FilesBack {
    /// The snapshot the files were put back to.
    snapshot: Option<String>,
    written: u64,
    removed: u64,
    plan: FilesPlan,
    /// Only planned: a dry run, or a plan refused for its conflicts.
    planned_only: bool,
}

/// What a fork writes: its record, the generations it carries, its log.
struct Copy {
    rec: RunRecord,
    generations: Vec<GenerationRecord>,
    events: Vec<Event>,
}

impl Engine {
    /// Makes a fork of `from` (see the module's documentation): restores
    /// the files, then writes the fork's record, its copied log and calls.
    /// The fork is not driven: [`Engine::resume`] it.
    pub async fn fork(&self, from: &RunId, req: ForkRequest) -> Result<Forked, EngineError> {
        let run_id = req.run_id.clone().unwrap_or_else(crate::new_run_id);
        let id = from.clone();
        let (rec, events) = self
            .blocking(move |e| {
                let rec = e.require_run(&id)?;
                let events = read_all(e, &id)?;
                Ok::<_, EngineError>((rec, events))
            })
            .await?;
        let seq = cut(&events, &req.at)?;
        let prefix = &events[..seq as usize];
        let state = RunState::from_events(from, prefix);
        // The definition in force at the point, and what the fork runs.
        let (at_point, generations) = self.definition_at(&rec, &state).await?;
        let runs = req.workflow.as_ref().unwrap_or(&at_point);
        let input = match &req.input {
            Some(i) => i.clone(),
            None => state.input.clone().unwrap_or(rec.input.clone()),
        };
        runs.validate_input(&input)?;

        // The original's lease while the files are put back: a process
        // driving it has nodes using those files.
        let _original = match self.take_log(from).await {
            Ok(log) => log,
            Err(cairn_store::StoreError::LeaseHeld { .. }) => {
                return Err(self.lease_held(from, Wanted::Fork).await)
            }
            Err(e) => return Err(e.into()),
        };
        // The files first: a fork cut short here leaves no run behind, and
        // is made again the same way.
        let files = self
            .put_files_back(runs, &at_point, &events, seq, &req)
            .await?;
        let made = !files.planned_only;
        if made {
            let copy = copy_of(
                &run_id,
                from,
                &rec,
                prefix,
                seq,
                input,
                &req,
                generations,
                &state,
            )?;
            self.write_fork(from, copy, calls_in(prefix)).await?;
        }
        Ok(Forked {
            run_id,
            seq,
            snapshot: files.snapshot,
            written: files.written,
            removed: files.removed,
            plan: files.plan,
            made,
        })
    }

    /// The definition in force in a run (`rec`) at the point `state` folds
    /// its log to, and the generations the run stored up to there.
    async fn definition_at(
        &self,
        rec: &RunRecord,
        state: &RunState,
    ) -> Result<(Workflow, Vec<GenerationRecord>), EngineError> {
        let (rec, state) = (rec.clone(), state.clone());
        self.blocking(move |e| {
            let wf = reload::definition(e.backend().as_ref(), &rec, &state)?;
            let mut gens = Vec::new();
            for g in 1..=state.generation {
                if let Some(r) = e.backend().generation(&rec.run_id, g)? {
                    gens.push(r);
                }
            }
            Ok::<_, EngineError>((wf, gens))
        })
        .await
    }

    /// Puts back the paths the original changed after the point as the
    /// snapshot there has them (only plans it for a dry run, or when a
    /// path conflicts and nothing forces it). Nothing to do when the log
    /// names no snapshot at or before the point.
    async fn put_files_back(
        &self,
        runs: &Workflow,
        original: &Workflow,
        events: &[Event],
        seq: u64,
        req: &ForkRequest,
    ) -> Result<FilesBack, EngineError> {
        let at = files_at(&events[..seq as usize], events.get(seq as usize));
        let mut back = FilesBack {
            snapshot: at.as_ref().map(|(_, s)| s.clone()),
            written: 0,
            removed: 0,
            plan: FilesPlan::default(),
            planned_only: req.dry_run,
        };
        let Some((point_seq, snap)) = at else {
            return Ok(back);
        };
        let store = self.snapshot_store()?;
        let (root, exclude) = self
            .inner
            .services
            .workspace(runs)
            .map_err(|e| EngineError::Workspace(*e.info))?;
        let _: ObjectId = snap.parse().map_err(|source| EngineError::Files {
            task: FilesTask::ForkRestore,
            source,
        })?;
        // The original's whole log: its changes after the point, up to
        // now, are what is put back.
        let (force, dry_run) = (req.force, req.dry_run);
        // The secrets of the workflow the fork runs and of the one that
        // wrote the files: a file that holds one is never read into the
        // snapshots of the root now.
        let mut withhold = crate::secrets::resolve_for(runs).await?.to_withhold();
        if req.workflow.is_some() {
            let more = crate::secrets::resolve_for(original).await?.to_withhold();
            let mut all = (*withhold).clone();
            all.extend(more.iter().cloned());
            withhold = std::sync::Arc::new(all);
        }
        let history = History::of(events, false);
        let done = tokio::task::spawn_blocking(move || {
            let point = Point::After(point_seq);
            let planned = shell::plan_files(
                &store, &root, &exclude, &history, &point, &snap, force, &withhold,
            )?;
            if dry_run || planned.plan.refused() {
                return Ok((planned.plan, None));
            }
            let paths = planned.plan.paths();
            let done = shell::restore(&store, &root, &exclude, &snap, &paths, &withhold)?;
            Ok::<_, cairn_snapshot::SnapshotError>((planned.plan, Some(done)))
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .map_err(|source| EngineError::Files {
            task: FilesTask::ForkRestore,
            source,
        })?;
        back.plan = done.0;
        match done.1 {
            Some(d) => (back.written, back.removed) = (d.written, d.removed),
            None => back.planned_only = true,
        }
        Ok(back)
    }

    /// Writes a fork: its record first, marked as a fork being made, then
    /// its generations and its calls' rows, then its log in one batch,
    /// whose first append makes it a run. A fork cut short in between is
    /// made again by the same command.
    async fn write_fork(&self, from: &RunId, copy: Copy, calls: Calls) -> Result<(), EngineError> {
        let from_id = from.clone();
        self.blocking(move |e| {
            let b = e.backend();
            let fork_id = copy.rec.run_id.clone();
            let rows = copied_calls(b.as_ref(), &from_id, &fork_id, &calls)?;
            match b.get_run(&fork_id)? {
                Some(r) if r.status == FORKING && b.last_seq(&fork_id)? == 0 => {}
                Some(_) => {
                    return Err(EngineError::for_run(&fork_id, |run| {
                        refused(ForkRefusal::RunIdTaken { run })
                    }))
                }
                None => b.create_run(&copy.rec)?,
            }
            for g in &copy.generations {
                b.put_generation(g)?;
            }
            for r in &rows {
                b.put_tool_call(r)?;
            }
            let stored: Vec<StoredEvent> =
                copy.events.iter().map(StoredEvent::from_event).collect();
            // The NDJSON mirror catches up from the store on the fork's
            // first write (as after any gap).
            b.append(&stored)?;
            Ok::<_, EngineError>(())
        })
        .await
    }
}

/// The fork `run_id` of `from` (record `rec`) at `seq`: its record, the
/// original's generations up to the point (`generations`, `state`'s) as
/// its own, and its log, the original's `prefix` under a `RunStarted` that
/// names the origin, then, for a fork with a workflow of its own, that
/// workflow adopted as a reload.
#[allow(clippy::too_many_arguments)]
fn copy_of(
    run_id: &RunId,
    from: &RunId,
    rec: &RunRecord,
    prefix: &[Event],
    seq: u64,
    input: Value,
    req: &ForkRequest,
    generations: Vec<GenerationRecord>,
    state: &RunState,
) -> Result<Copy, EngineError> {
    let now = node::now_ms();
    let first_hash = match &prefix[0].kind {
        EventKind::RunStarted { workflow_hash, .. } => workflow_hash.clone(),
        _ => rec.workflow_hash.clone(),
    };
    let fork_rec = RunRecord {
        run_id: run_id.clone(),
        parent_run_id: None,
        input: input.clone(),
        status: FORKING,
        created_ms: now,
        updated_ms: now,
        ..rec.clone()
    };
    let mut copy: Vec<Event> = Vec::with_capacity(prefix.len() + 2);
    copy.push(Event {
        run_id: run_id.clone(),
        seq: Seq(1),
        // The copied events keep their times: the log's times stay in
        // order from its first event.
        timestamp_ms: prefix[0].timestamp_ms,
        scope: Scope::run(),
        kind: EventKind::RunStarted {
            workflow: rec.workflow.clone(),
            workflow_hash: first_hash,
            input: Some(input),
            resumed: false,
            parent_run_id: None,
            parent_node_id: None,
            depth: 0,
            forked_from: Some(ForkedFrom {
                run_id: from.clone(),
                seq,
            }),
            trigger: None,
            replay_of: None,
        },
    });
    for ev in &prefix[1..] {
        copy.push(Event {
            run_id: run_id.clone(),
            ..ev.clone()
        });
    }
    let mut gens: Vec<GenerationRecord> = generations
        .into_iter()
        .map(|g| GenerationRecord {
            run_id: run_id.clone(),
            ..g
        })
        .collect();
    if let Some(wf) = &req.workflow {
        gens.push(adopt(run_id, wf, state.generation + 1, now, &mut copy)?);
    }
    Ok(Copy {
        rec: fork_rec,
        generations: gens,
        events: copy,
    })
}

/// A fork's own workflow, adopted at the point as a reload is: its
/// generation (`generation`, stored with the files it refers to), and
/// its `WorkflowReloadDetected` and `WorkflowReloaded` after the copy.
fn adopt(
    run_id: &RunId,
    wf: &Workflow,
    generation: u64,
    now: i64,
    copy: &mut Vec<Event>,
) -> Result<GenerationRecord, EngineError> {
    let record = GenerationRecord {
        run_id: run_id.clone(),
        generation,
        workflow_hash: wf.hash.clone(),
        workflow_source: wf.source.clone(),
        files: match wf.pinned {
            Some(_) => crate::reload::pin::pinned_files(wf),
            None => crate::reload::pin::pin(wf)?,
        },
        created_ms: now,
    };
    let file = wf.path.display().to_string();
    for kind in [
        EventKind::WorkflowReloadDetected {
            changed_files: vec![file.clone()],
        },
        EventKind::WorkflowReloaded {
            generation,
            changed_files: vec![file.clone()],
        },
    ] {
        copy.push(Event {
            run_id: run_id.clone(),
            seq: Seq(copy.len() as u64 + 1),
            timestamp_ms: now,
            scope: Scope::run(),
            kind,
        });
    }
    Ok(record)
}

fn read_all(e: &Engine, run_id: &RunId) -> Result<Vec<Event>, EngineError> {
    let stored = e.backend().read_events(run_id, &EventQuery::default())?;
    stored
        .iter()
        .map(|s| crate::decode_row(run_id, s))
        .collect()
}

/// The last seq the fork copies.
fn cut(events: &[Event], at: &ForkPoint) -> Result<u64, EngineError> {
    let last = events.len() as u64;
    let mut seq = match at {
        ForkPoint::Seq(0) => return Err(refused(ForkRefusal::SeqZero)),
        ForkPoint::Seq(n) if *n > last => {
            return Err(refused(ForkRefusal::PastEnd {
                at: Seq(*n),
                last: Seq(last),
            }))
        }
        ForkPoint::Seq(n) => *n,
        ForkPoint::Node(node) => {
            let mut passes = events.iter().filter(|e| {
                e.scope.node_id.as_deref() == Some(node.as_str())
                    && matches!(e.kind, EventKind::NodeStarted { .. })
            });
            let first = passes.next().ok_or_else(|| {
                refused(ForkRefusal::NodeNeverStarted {
                    node: node.as_str().into(),
                })
            })?;
            // The latest pass's first attempt, for a node in a loop.
            let latest = passes
                .rfind(|e| e.scope.attempt == Some(1))
                .unwrap_or(first);
            latest.seq.get() - 1
        }
    };
    // What the copy must not hold: the run's end, a cancel, a revert under way.
    for ev in &events[..seq as usize] {
        let at = ev.seq.get();
        if ev.kind.is_terminal() {
            return Err(refused(ForkRefusal::AfterEnd {
                at: Seq(seq),
                ended: Seq(at),
            }));
        }
        if let EventKind::RunCancelRequested { .. } = ev.kind {
            return Err(refused(ForkRefusal::AfterCancel {
                at: Seq(seq),
                cancel: Seq(at),
            }));
        }
    }
    let state = RunState::from_events(&events[0].run_id, &events[..seq as usize]);
    if state.open_revert.is_some() {
        return Err(refused(ForkRefusal::InRevert { at: Seq(seq) }));
    }
    // A point among the calls of an agent's step moves back to the step's
    // end: the files are known there (the step's snapshot), and the fork
    // makes the step's calls again.
    seq = step_boundary(&events[..seq as usize]).unwrap_or(seq);
    Ok(seq)
}

/// The end of the step whose calls a prefix stops among, for each agent
/// attempt open at its end: the earliest such.
fn step_boundary(prefix: &[Event]) -> Option<u64> {
    // (node, pass, attempt) → seq of its latest AgentStepFinished, and
    // whether a call started after it.
    let mut open: HashMap<(String, u32, u32), (Option<u64>, bool)> = HashMap::new();
    for ev in prefix {
        let (Some(node), Some(it), Some(a)) =
            (&ev.scope.node_id, ev.scope.iteration, ev.scope.attempt)
        else {
            continue;
        };
        let key = (node.to_string(), it, a);
        use EventKind as K;
        match &ev.kind {
            K::NodeStarted { .. } => {
                open.insert(key, (None, false));
            }
            K::NodeFinished { .. } | K::NodeFailed { .. } | K::NodeCancelled { .. } => {
                open.remove(&key);
            }
            K::AgentStepFinished { .. } => {
                if let Some(o) = open.get_mut(&key) {
                    *o = (Some(ev.seq.get()), false);
                }
            }
            K::ToolCallStarted { .. } => {
                if let Some(o) = open.get_mut(&key) {
                    o.1 = true;
                }
            }
            // Neither opens nor ends an attempt, a step or a call.
            K::RunStarted { .. }
            | K::RunStatusChanged { .. }
            | K::RunCancelRequested { .. }
            | K::RunSummary { .. }
            | K::RunFinished { .. }
            | K::RunFailed { .. }
            | K::RunCancelled { .. }
            | K::FrameCommitted { .. }
            | K::LayerStarted { .. }
            | K::LayerFinished { .. }
            | K::EdgeTraversed { .. }
            | K::BranchResolved { .. }
            | K::ChapterStarted { .. }
            | K::ChapterFinished { .. }
            | K::NodePending { .. }
            | K::NodeHeartbeat { .. }
            | K::NodeOutput { .. }
            | K::NodeRetrying { .. }
            | K::NodeSkipped { .. }
            | K::NodeWaitingApproval {}
            | K::NodeWaitingInput { .. }
            | K::ApprovalRequested { .. }
            | K::ApprovalGranted { .. }
            | K::ApprovalDenied { .. }
            | K::InputRequested { .. }
            | K::InputReceived { .. }
            | K::AgentStepStarted { .. }
            | K::AgentGenerationRetried { .. }
            | K::AgentContextCompacted { .. }
            | K::AgentWaiting { .. }
            | K::AgentEvent { .. }
            | K::TokenUsageReported { .. }
            | K::ToolCallFinished { .. }
            | K::DelegationStarted { .. }
            | K::DelegationFinished { .. }
            | K::McpServerStarting { .. }
            | K::McpServerConnected { .. }
            | K::McpServerStderr { .. }
            | K::McpServerDisconnected { .. }
            | K::NetworkAccess { .. }
            | K::Diagnostic { .. }
            | K::RevertStarted { .. }
            | K::RevertFinished { .. }
            | K::WorkflowReloadDetected { .. }
            | K::WorkflowReloaded { .. }
            | K::WorkflowReloadFailed { .. }
            | K::WorkflowReloadUnsafe { .. }
            | K::ScorerStarted { .. }
            | K::ScorerFinished { .. }
            | K::ScorerFailed { .. }
            | K::RunHijackRequested { .. }
            | K::RunHijacked { .. } => {}
        }
    }
    open.values()
        .filter(|(_, called)| *called)
        .filter_map(|(end, _)| *end)
        .min()
}

/// The snapshot of the files at the end of `prefix`, with the seq of the
/// event that names it: the one taken just before the event after it (a
/// start, a step), else the latest in it.
fn files_at(prefix: &[Event], next: Option<&Event>) -> Option<(u64, String)> {
    let named = |e: &Event, before_only: bool| match e.kind.snapshot()? {
        (s, SnapshotAt::Before) => Some((e.seq.get(), s.to_string())),
        (s, SnapshotAt::After) if !before_only => Some((e.seq.get(), s.to_string())),
        (_, SnapshotAt::After | SnapshotAt::Restored) => None,
    };
    if let Some(s) = next.and_then(|e| named(e, true)) {
        return Some(s);
    }
    prefix.iter().rev().find_map(|e| named(e, false))
}

/// The tool calls a prefix started, by (node, pass), with the calls it saw
/// finish.
struct Calls {
    started: BTreeSet<(String, u32, u32, u32)>,
    finished: BTreeSet<(String, u32, u32, u32)>,
}

fn calls_in(prefix: &[Event]) -> Calls {
    let mut calls = Calls {
        started: BTreeSet::new(),
        finished: BTreeSet::new(),
    };
    for ev in prefix {
        let (Some(node), Some(it), Some(a)) =
            (&ev.scope.node_id, ev.scope.iteration, ev.scope.attempt)
        else {
            continue;
        };
        match &ev.kind {
            EventKind::ToolCallStarted { tool_seq, .. } => {
                calls.started.insert((node.to_string(), it, a, *tool_seq));
            }
            EventKind::ToolCallFinished { tool_seq, .. } => {
                calls.finished.insert((node.to_string(), it, a, *tool_seq));
            }
            _ => {}
        }
    }
    calls
}

/// The original's rows of the calls the copy holds, as the fork's: a call
/// whose end comes after the point is copied as never finished, so the
/// fork makes it again.
fn copied_calls(
    b: &dyn cairn_store::Backend,
    from: &RunId,
    fork: &RunId,
    calls: &Calls,
) -> Result<Vec<ToolCallRecord>, EngineError> {
    let passes: BTreeSet<(String, u32)> = calls
        .started
        .iter()
        .map(|(n, i, _, _)| (n.clone(), *i))
        .collect();
    let mut out = Vec::new();
    for (node, it) in passes {
        for mut r in b.tool_calls(from, &NodePath::from(node), it)? {
            let k = (r.node_id.clone(), r.iteration, r.attempt, r.tool_seq);
            if !calls.started.contains(&k) {
                continue;
            }
            if !calls.finished.contains(&k) {
                r.status = ToolCallStatus::Running;
                r.output = None;
                r.error = None;
                r.finished_ms = None;
            }
            r.run_id = fork.clone();
            out.push(r);
        }
    }
    Ok(out)
}
