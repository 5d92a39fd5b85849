//! `cairn revert`: the paths the run changed since one attempt of a node
//! started put back as they were then, from the snapshot its `NodeStarted`
//! names (docs/snapshots.md); every other path is left alone, and a path
//! that something else changed since is a conflict ([`crate::touched`]).
//!
//! A revert writes to the run's log (`RevertStarted`, `RevertFinished`),
//! so it holds the run's lease like a driver: a run that a process drives
//! is refused (its nodes are using the files). The run may have ended: a
//! revert changes files, not the run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_events::{OpenRevert, RunId, RunState, Scope};
use cairn_snapshot::SnapshotStore;
use cairn_store::{RunLog, StoreError};
use cairn_workflow::Workflow;

use crate::driver::revert_files;
use crate::touched::{shell, AttemptKey, FilesPlan, History, Point};
use crate::{reload, Engine, EngineError, FilesTask, RevertRefusal, Wanted};

/// What [`Engine::prune_snapshots`] deleted.
#[derive(Debug, Clone, Default)]
pub struct SnapshotsPruned {
    /// From this machine's snapshot repository.
    pub local: cairn_snapshot::Pruned,
    /// From the store's shared objects, for a store that keeps them.
    pub shared: Option<cairn_snapshot::Pruned>,
}

/// Which attempt's snapshot to restore.
#[derive(Debug, Clone, Default)]
pub struct RevertRequest {
    /// The node's id (its path, for a node inside a group).
    pub node: String,
    /// The pass, for a node in a loop or `for_each`; the latest pass that
    /// has a snapshot when absent.
    pub iteration: Option<u32>,
    /// The attempt; the first one with a snapshot (the files before the
    /// node did anything) when absent.
    pub attempt: Option<u32>,
    /// Overwrite paths that something else changed since the run did.
    pub force: bool,
    /// Plan only: nothing is written, to the files or the log.
    pub dry_run: bool,
}

/// What a revert did.
#[derive(Debug, Clone)]
pub struct Reverted {
    /// The node, pass and attempt whose snapshot was restored.
    pub node: String,
    /// Its pass.
    pub iteration: u32,
    /// Its attempt.
    pub attempt: u32,
    /// The snapshot restored.
    pub snapshot: String,
    /// A snapshot of the files as they were before this revert: reverting
    /// to it undoes the revert (`git --git-dir <snapshots> ls-tree` reads it).
    pub before: String,
    /// Files and links written back.
    pub written: u64,
    /// Files, links and folders deleted.
    pub removed: u64,
    /// A revert a killed process left open, finished first (its node).
    pub finished_open: Option<String>,
    /// Why the files could not be restored (the log says so too); the
    /// files are as far as the restore got, and running it again finishes
    /// it.
    pub error: Option<cairn_events::ErrorInfo>,
    /// What the revert writes and removes, and its conflicts.
    pub plan: FilesPlan,
    /// Whether the files were touched: false for a dry run and for a plan
    /// with conflicts and no `force`.
    pub applied: bool,
}

/// A revert's request that does not fit the run.
fn refused(reason: RevertRefusal) -> EngineError {
    EngineError::RevertRefused { reason }
}

impl Engine {
    /// Restores the run's sandbox root to the snapshot taken before an
    /// attempt of one of its nodes. Fails with `LeaseHeld` while a process
    /// drives the run, `RunNotFound` for an unknown run, `RevertRefused`
    /// for a node, pass or attempt without a snapshot. A restore that fails is
    /// logged (`RevertFinished` with `success: false`) and returned in
    /// [`Reverted::error`].
    pub async fn revert(
        &self,
        run_id: &RunId,
        req: RevertRequest,
    ) -> Result<Reverted, EngineError> {
        self.require_run_off(run_id).await?;
        let log = match self.take_log(run_id).await {
            Ok(l) => Arc::new(l),
            Err(StoreError::LeaseHeld { .. }) => {
                return Err(self.lease_held(run_id, Wanted::Revert).await)
            }
            Err(e) => return Err(e.into()),
        };
        let id = run_id.clone();
        let (state, wf) = self
            .blocking(move |e| {
                let rec = e.require_run(&id)?;
                let state = e.fold(&id)?;
                let wf = reload::definition(e.backend().as_ref(), &rec, &state)?;
                Ok::<_, EngineError>((state, wf))
            })
            .await?;
        let store = self.snapshot_store()?;
        // The run's secrets: files that hold one are never read into the
        // snapshot of the root as it is now (a secret that cannot be read
        // stops the revert, as it stops a resume).
        let withhold = crate::secrets::resolve_for(&wf).await?.to_withhold();
        let finished_open = match &state.open_revert {
            Some(open) if req.dry_run => {
                return Err(refused(RevertRefusal::OpenRevert {
                    node: open.node_id.clone(),
                }))
            }
            Some(open) => {
                self.finish_revert(&log, &wf, open, &withhold).await;
                Some(open.node_id.to_string())
            }
            None => None,
        };
        let (iteration, attempt, snapshot) = pick(run_id, &state, &req)?;
        let (root, exclude) = self
            .inner
            .services
            .workspace(&wf)
            .map_err(|e| EngineError::Workspace(*e.info))?;
        let key = AttemptKey {
            node: req.node.clone(),
            iteration,
            attempt,
        };
        let planned = self
            .plan_revert(
                run_id,
                key,
                &snapshot,
                req.force,
                (&store, &root, &exclude),
                withhold.clone(),
            )
            .await?;
        let mut out = Reverted {
            node: req.node.clone(),
            iteration,
            attempt,
            snapshot: snapshot.clone(),
            before: planned.before.to_string(),
            written: 0,
            removed: 0,
            finished_open,
            error: None,
            plan: planned.plan,
            applied: false,
        };
        if req.dry_run || out.plan.refused() {
            return Ok(out);
        }
        let scope = Scope::node(req.node, iteration).with_attempt(attempt);
        let paths = out.plan.paths();
        let ws = (&store, root.as_path(), exclude.as_slice());
        match revert_files(&log, scope, ws, &snapshot, paths, &withhold).await {
            Ok(d) => {
                out.before = d.before.to_string();
                out.written = d.written;
                out.removed = d.removed;
            }
            // The log could not take the revert's events: the store's
            // failure, which the restore reports as text.
            Err(e) if e.kind == "store" => {
                return Err(StoreError::Commit(Arc::from(e.message)).into())
            }
            Err(e) => out.error = Some(e),
        }
        out.applied = true;
        Ok(out)
    }

    /// What restoring `snapshot` over the run's files would write and
    /// remove, from the run's history since attempt `key` started.
    async fn plan_revert(
        &self,
        run_id: &RunId,
        key: AttemptKey,
        snapshot: &str,
        force: bool,
        (store, root, exclude): (&Arc<SnapshotStore>, &Path, &[PathBuf]),
        withhold: Arc<Vec<Vec<u8>>>,
    ) -> Result<shell::Planned, EngineError> {
        // What the run changed since the attempt started, read after the
        // open revert (if any) was finished: it is part of the history.
        let id = run_id.clone();
        let events = self
            .blocking(move |e| shell::history_events(e.backend().as_ref(), &id, None))
            .await?;
        let target = snapshot.to_string();
        let (store, root, exclude) = (store.clone(), root.to_path_buf(), exclude.to_vec());
        tokio::task::spawn_blocking(move || {
            let history = History::of(&events, false);
            let point = Point::After(history.starts.get(&key).copied().unwrap_or(0));
            shell::plan_files(
                &store, &root, &exclude, &history, &point, &target, force, &withhold,
            )
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        .map_err(|source| EngineError::Files {
            task: FilesTask::RevertPlan,
            source,
        })
    }

    /// Runs a revert that a killed process left open to its end, so the
    /// files end as its snapshot has them (whatever it finds there, a
    /// restore writes only what differs). A failure is in its
    /// `RevertFinished`; the caller goes on.
    pub(crate) async fn finish_revert(
        &self,
        log: &RunLog,
        wf: &Workflow,
        open: &OpenRevert,
        withhold: &Arc<Vec<Vec<u8>>>,
    ) {
        let scope = Scope::node(open.node_id.clone(), open.iteration).with_attempt(open.attempt);
        let (store, workspace) = match (self.snapshot_store(), self.inner.services.workspace(wf)) {
            (Ok(s), Ok(w)) => (s, w),
            (Err(e), _) => {
                return self
                    .close_open_revert(log, scope, open, e.to_string())
                    .await
            }
            (_, Err(e)) => {
                return self
                    .close_open_revert(log, scope, open, e.info.message)
                    .await
            }
        };
        // The restore's outcome is in the log either way.
        let _ = revert_files_again(self, log, scope, &store, &workspace, open, withhold).await;
    }

    async fn close_open_revert(&self, log: &RunLog, scope: Scope, open: &OpenRevert, why: String) {
        let _ = log
            .append_durable(
                scope,
                cairn_events::EventKind::RevertFinished {
                    snapshot: open.snapshot.clone(),
                    success: false,
                    error: Some(cairn_events::ErrorInfo::new("revert", why)),
                },
            )
            .await;
    }

    /// Deletes the workspace snapshot objects no run of the store names
    /// (`NodeStarted`, `AgentStepStarted`, `NodeFinished`, `NodeFailed`,
    /// `RevertStarted`) and no root's stat cache needs, sparing what was
    /// written or used within `grace` (`cairn gc`). `None` when this engine
    /// keeps no snapshots.
    pub async fn prune_snapshots(
        &self,
        grace: std::time::Duration,
    ) -> Result<Option<SnapshotsPruned>, EngineError> {
        let Some(store) = self.inner.services.snapshot_store() else {
            return Ok(None);
        };
        let store = store.map_err(|detail| EngineError::SnapshotsUnavailable { detail })?;
        self.blocking(move |e| {
            let keep = e.named_snapshots()?;
            let failed = |source| EngineError::Files {
                task: FilesTask::Prune,
                source,
            };
            let local = store.prune(&keep, grace).map_err(failed)?;
            let shared = store.prune_mirror(&keep, grace).map_err(failed)?;
            Ok(Some(SnapshotsPruned { local, shared }))
        })
        .await
    }

    /// Every snapshot id the store's runs name.
    fn named_snapshots(&self) -> Result<Vec<cairn_snapshot::ObjectId>, EngineError> {
        const PAGE: usize = 500;
        let types = cairn_events::SnapshotAt::EVENT_TYPES.to_vec();
        let mut keep = std::collections::HashSet::new();
        let mut offset = 0;
        loop {
            let runs = self.backend().list_runs(&cairn_store::RunFilter {
                limit: Some(PAGE),
                offset: Some(offset),
                ..Default::default()
            })?;
            for r in &runs {
                let events = self.backend().read_events(
                    &r.run_id,
                    &cairn_store::EventQuery {
                        types: types.clone(),
                        ..Default::default()
                    },
                )?;
                for ev in events.iter().filter_map(|s| s.decode().ok()) {
                    let id = ev.kind.snapshot().map(|(s, _)| s);
                    if let Some(id) = id.and_then(|s| s.parse().ok()) {
                        keep.insert(id);
                    }
                }
            }
            if runs.len() < PAGE {
                break;
            }
            offset += PAGE;
        }
        Ok(keep.into_iter().collect())
    }

    /// The snapshot repository, which reverts and forks need.
    pub(crate) fn snapshot_store(&self) -> Result<Arc<SnapshotStore>, EngineError> {
        match self.inner.services.snapshot_store() {
            Some(Ok(s)) => Ok(s),
            Some(Err(detail)) => Err(EngineError::SnapshotsUnavailable { detail }),
            None => Err(EngineError::NoSnapshots),
        }
    }
}

/// Finishing an open revert: the restore and its `RevertFinished`, without
/// a second `RevertStarted` (the open one stands for it). Its paths are
/// those it covered when it started, computed again from the log before
/// it; what was decided then (conflicts forced, or none) stands.
async fn revert_files_again(
    engine: &Engine,
    log: &RunLog,
    scope: Scope,
    store: &Arc<SnapshotStore>,
    workspace: &(std::path::PathBuf, Vec<std::path::PathBuf>),
    open: &OpenRevert,
    withhold: &Arc<Vec<Vec<u8>>>,
) -> Result<(), ()> {
    let result = match open_revert_paths(engine, log.run_id(), store, workspace, withhold).await {
        Ok(Some(paths)) => {
            crate::driver::restore_paths(
                store,
                &workspace.0,
                &workspace.1,
                &open.snapshot,
                paths,
                withhold,
            )
            .await
        }
        Ok(None) => Err(cairn_events::ErrorInfo::new(
            "revert",
            "the log has no open revert",
        )),
        Err(e) => Err(cairn_events::ErrorInfo::new("revert", e.to_string())),
    };
    log.append_durable(
        scope,
        cairn_events::EventKind::RevertFinished {
            snapshot: open.snapshot.clone(),
            success: result.is_ok(),
            error: result.err(),
        },
    )
    .await
    .map(|_| ())
    .map_err(|_| ())
}

/// The paths the log's open revert covers, as when it started: a
/// `cairn revert`'s, the run's changes after its attempt started; an
/// `on_retry: revert`'s, the failed attempt's (closed by the root as it is
/// now when that attempt left no snapshot). `None` when the log has no open
/// revert.
async fn open_revert_paths(
    engine: &Engine,
    run_id: &RunId,
    store: &Arc<SnapshotStore>,
    workspace: &(std::path::PathBuf, Vec<std::path::PathBuf>),
    withhold: &Arc<Vec<Vec<u8>>>,
) -> Result<Option<Vec<crate::touched::RelPath>>, EngineError> {
    let id = run_id.clone();
    let events = engine
        .blocking(move |e| shell::history_events(e.backend().as_ref(), &id, None))
        .await?;
    let (store, root, exclude) = (store.clone(), workspace.0.clone(), workspace.1.clone());
    let withhold = withhold.clone();
    tokio::task::spawn_blocking(move || {
        let mut history = History::of(&events, false);
        let Some(open) = history
            .reverts
            .iter()
            .rfind(|r| r.finished.is_none())
            .cloned()
        else {
            return Ok(None);
        };
        if open.on_retry {
            history = History::of(&events, true);
        }
        let point = history.point_of(&open);
        shell::plan_files(
            &store,
            &root,
            &exclude,
            &history,
            &point,
            &open.target,
            true,
            &withhold,
        )
        .map(|p| Some(p.plan.paths()))
        .map_err(|source| EngineError::Files {
            task: FilesTask::RevertPlan,
            source,
        })
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The pass, attempt and snapshot a request names.
fn pick(
    run_id: &RunId,
    state: &RunState,
    req: &RevertRequest,
) -> Result<(u32, u32, String), EngineError> {
    let passes: Vec<_> = state
        .nodes
        .iter()
        .filter(|n| n.node_id.as_str() == req.node)
        .collect();
    let node = || cairn_events::NodePath::from(req.node.as_str());
    if passes.is_empty() {
        return Err(EngineError::for_run(run_id, |run| {
            refused(RevertRefusal::NodeNeverStarted { run, node: node() })
        }));
    }
    let with_snaps = |n: &&&cairn_events::NodeState| {
        n.notes
            .as_ref()
            .is_some_and(|notes| !notes.snapshots.is_empty())
    };
    let pass = match req.iteration {
        Some(iteration) => passes
            .iter()
            .find(|n| n.iteration == iteration)
            .ok_or_else(|| {
                refused(RevertRefusal::NoSuchPass {
                    node: node(),
                    iteration,
                })
            })?,
        None => passes
            .iter()
            .rev()
            .find(with_snaps)
            .ok_or_else(|| refused(RevertRefusal::NodeWithoutSnapshot { node: node() }))?,
    };
    let snaps = pass
        .notes
        .as_ref()
        .map(|n| n.snapshots.as_slice())
        .unwrap_or_default();
    let snap = match req.attempt {
        Some(attempt) => snaps.iter().find(|s| s.attempt == attempt).ok_or_else(|| {
            refused(RevertRefusal::NoSnapshotBeforeAttempt {
                node: node(),
                iteration: pass.iteration,
                attempt,
                have: snaps.iter().map(|s| s.attempt).collect(),
            })
        })?,
        None => snaps.first().ok_or_else(|| {
            refused(RevertRefusal::PassWithoutSnapshot {
                node: node(),
                iteration: pass.iteration,
            })
        })?,
    };
    Ok((pass.iteration, snap.attempt, snap.snapshot.clone()))
}
