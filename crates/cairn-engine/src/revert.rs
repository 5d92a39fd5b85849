//! `cairn revert`: the sandbox root put back as it was before one attempt
//! of a node, from the snapshot its `NodeStarted` names (docs/snapshots.md).
//!
//! A revert writes to the run's log (`RevertStarted`, `RevertFinished`),
//! so it holds the run's lease like a driver: a run that a process drives
//! is refused (its nodes are using the files). The run may have ended: a
//! revert changes files, not the run.

use std::sync::Arc;

use cairn_events::{OpenRevert, RunState, Scope};
use cairn_snapshot::SnapshotStore;
use cairn_store::{RunLog, StoreError};
use cairn_workflow::Workflow;

use crate::driver::revert_files;
use crate::{reload, Engine, EngineError};

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
}

/// Why a revert could not be done, beside the engine's own errors.
fn bad(msg: String) -> EngineError {
    EngineError::BadRequest(msg)
}

impl Engine {
    /// Restores the run's sandbox root to the snapshot taken before an
    /// attempt of one of its nodes. Fails with `Conflict` while a process
    /// drives the run, `NotFound` for an unknown run, `BadRequest` for a
    /// node, pass or attempt without a snapshot. A restore that fails is
    /// logged (`RevertFinished` with `success: false`) and returned in
    /// [`Reverted::error`].
    pub async fn revert(&self, run_id: &str, req: RevertRequest) -> Result<Reverted, EngineError> {
        self.require_run_off(run_id).await?;
        let log = match self.take_log(run_id).await {
            Ok(l) => Arc::new(l),
            Err(StoreError::Busy { .. }) => {
                return Err(EngineError::Conflict(format!(
                    "run `{run_id}` is being driven by another process, whose nodes use the files; \
                     cancel it or wait for it to stop, then revert"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        let id = run_id.to_string();
        let (state, wf) = self
            .blocking(move |e| {
                let rec = e.require_run(&id)?;
                let state = e.fold(&id)?;
                let wf = reload::definition(e.backend().as_ref(), &rec, &state)?;
                Ok::<_, EngineError>((state, wf))
            })
            .await?;
        let store = self.snapshot_store()?;
        let finished_open = match &state.open_revert {
            Some(open) => {
                self.finish_revert(&log, &wf, open).await;
                Some(open.node_id.to_string())
            }
            None => None,
        };
        let (iteration, attempt, snapshot) = pick(&state, &req)?;
        let (root, exclude) = self
            .inner
            .services
            .workspace(&wf)
            .map_err(|e| EngineError::Conflict(e.info.message))?;
        let scope = Scope::node(req.node.clone(), iteration).with_attempt(attempt);
        let done = revert_files(&log, scope, &store, &root, &exclude, &snapshot).await;
        let (before, written, removed, error) = match done {
            Ok(d) => (d.before.to_string(), d.written, d.removed, None),
            Err(e) if e.kind == "store" => return Err(EngineError::Conflict(e.message)),
            Err(e) => (String::new(), 0, 0, Some(e)),
        };
        Ok(Reverted {
            node: req.node,
            iteration,
            attempt,
            snapshot,
            before,
            written,
            removed,
            finished_open,
            error,
        })
    }

    /// Runs a revert that a killed process left open to its end, so the
    /// files end as its snapshot has them (whatever it finds there, a
    /// restore writes only what differs). A failure is in its
    /// `RevertFinished`; the caller goes on.
    pub(crate) async fn finish_revert(&self, log: &RunLog, wf: &Workflow, open: &OpenRevert) {
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
        let _ = revert_files_again(log, scope, &store, &workspace, open).await;
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
    ) -> Result<Option<cairn_snapshot::Pruned>, EngineError> {
        let Some(store) = self.inner.services.snapshot_store() else {
            return Ok(None);
        };
        let store = store.map_err(EngineError::Conflict)?;
        self.blocking(move |e| {
            let keep = e.named_snapshots()?;
            store
                .prune(&keep, grace)
                .map(Some)
                .map_err(|err| EngineError::Conflict(err.to_string()))
        })
        .await
    }

    /// Every snapshot id the store's runs name.
    fn named_snapshots(&self) -> Result<Vec<cairn_snapshot::ObjectId>, EngineError> {
        const PAGE: usize = 500;
        let types: Vec<String> = [
            "NodeStarted",
            "AgentStepStarted",
            "NodeFinished",
            "NodeFailed",
            "RevertStarted",
        ]
        .map(String::from)
        .to_vec();
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
                    let id = match ev.kind {
                        cairn_events::EventKind::NodeStarted { snapshot }
                        | cairn_events::EventKind::AgentStepStarted { snapshot, .. }
                        | cairn_events::EventKind::NodeFinished { snapshot, .. }
                        | cairn_events::EventKind::NodeFailed { snapshot, .. } => snapshot,
                        cairn_events::EventKind::RevertStarted { snapshot } => Some(snapshot),
                        _ => None,
                    };
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

    fn snapshot_store(&self) -> Result<Arc<SnapshotStore>, EngineError> {
        match self.inner.services.snapshot_store() {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(EngineError::Conflict(e)),
            None => Err(EngineError::Conflict(
                "this store keeps no workspace snapshots (give the engine a snapshot folder)"
                    .into(),
            )),
        }
    }
}

/// Finishing an open revert: the restore and its `RevertFinished`, without
/// a second `RevertStarted` (the open one stands for it).
async fn revert_files_again(
    log: &RunLog,
    scope: Scope,
    store: &Arc<SnapshotStore>,
    workspace: &(std::path::PathBuf, Vec<std::path::PathBuf>),
    open: &OpenRevert,
) -> Result<(), ()> {
    let result =
        crate::driver::restore_snapshot(store, &workspace.0, &workspace.1, &open.snapshot).await;
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

/// The pass, attempt and snapshot a request names.
fn pick(state: &RunState, req: &RevertRequest) -> Result<(u32, u32, String), EngineError> {
    let passes: Vec<_> = state
        .nodes
        .iter()
        .filter(|n| n.node_id.as_str() == req.node)
        .collect();
    if passes.is_empty() {
        return Err(bad(format!(
            "run `{}` has no node `{}` that started",
            state.run_id, req.node
        )));
    }
    let with_snaps = |n: &&&cairn_events::NodeState| {
        n.notes
            .as_ref()
            .is_some_and(|notes| !notes.snapshots.is_empty())
    };
    let pass = match req.iteration {
        Some(i) => passes
            .iter()
            .find(|n| n.iteration == i)
            .ok_or_else(|| bad(format!("node `{}` has no pass {i}", req.node)))?,
        None => passes.iter().rev().find(with_snaps).ok_or_else(|| {
            bad(format!(
                "node `{}` has no workspace snapshot: only attempts of nodes that can change \
                 files (agents with tools, commands, write/edit/bash tools) get one",
                req.node
            ))
        })?,
    };
    let snaps = pass
        .notes
        .as_ref()
        .map(|n| n.snapshots.as_slice())
        .unwrap_or_default();
    let snap =
        match req.attempt {
            Some(a) => {
                snaps.iter().find(|s| s.attempt == a).ok_or_else(|| {
                    let have: Vec<String> = snaps.iter().map(|s| s.attempt.to_string()).collect();
                    bad(format!(
                "node `{}` pass {} has no snapshot before attempt {a} (attempts with one: {})",
                req.node,
                pass.iteration,
                if have.is_empty() { "none".into() } else { have.join(", ") }
            ))
                })?
            }
            None => snaps.first().ok_or_else(|| {
                bad(format!(
                    "node `{}` pass {} has no workspace snapshot",
                    req.node, pass.iteration
                ))
            })?,
        };
    Ok((pass.iteration, snap.attempt, snap.snapshot.clone()))
}
