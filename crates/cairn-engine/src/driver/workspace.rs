//! Workspace snapshots around attempts (docs/snapshots.md): before an
//! attempt of a node that can change files in the sandbox root, a snapshot
//! of the root, whose id its `NodeStarted` carries; before a retry of a
//! node with `on_retry: revert`, the paths the attempt that failed changed
//! restored as its snapshot has them (`RevertStarted`, `RevertFinished`),
//! or, when something else changed one of them since, nothing restored and
//! the retry failed (docs/snapshots.md).
//!
//! Both touch the disk for as long as the root takes to walk, so they run
//! off the driver's task: the attempt holds its slot meanwhile (it is in
//! `running`), and its `NodeStarted` is appended when the snapshot is
//! taken (`Msg::Snapshotted`).

use std::path::{Path, PathBuf};

use cairn_snapshot::{ObjectId, Restored, SnapshotStore};

use crate::touched::{shell, AttemptKey, History, Point, RelPath};
use cairn_workflow::OnRetry;

use super::*;

/// A snapshot taken (or not) for an attempt about to start.
pub(super) struct Snapshotted {
    key: Key,
    attempt: u32,
    snapshot: Option<String>,
    /// Why there is no snapshot: the attempt starts anyway, with a warning.
    warning: Option<String>,
    /// The restore `on_retry: revert` asked for failed: the attempt fails
    /// rather than start from files nobody asked for.
    revert_failed: Option<ErrorInfo>,
}

/// What takes a snapshot of a run's root from an attempt's task: after the
/// attempt (`NodeFinished.snapshot`), and before each agent step after the
/// first (`AgentStepStarted.snapshot`).
#[derive(Clone)]
pub(crate) struct Snapshotter {
    store: Arc<SnapshotStore>,
    root: PathBuf,
    exclude: Vec<PathBuf>,
    /// The run's secrets: a file that holds one is never kept.
    withhold: Arc<Vec<Vec<u8>>>,
}

impl Snapshotter {
    /// A snapshot of the root now, or `None` when it cannot be taken (the
    /// attempt's own `NodeStarted` already told why, when it could not).
    pub(crate) async fn take(&self) -> Option<String> {
        take_snapshot(
            self.store.clone(),
            self.root.clone(),
            self.exclude.clone(),
            self.withhold.clone(),
        )
        .await
        .ok()
        .map(|id| id.to_string())
    }
}

impl Snapshotted {
    /// The attempt's node instance.
    pub(super) fn key(&self) -> &Key {
        &self.key
    }
}

impl Driver {
    /// Whether an attempt of `inst` may change files in the sandbox root
    /// (and so gets a snapshot before it starts).
    pub(super) fn changes_files(&self, inst: &Inst) -> bool {
        if self.services.snapshot_store().is_none() || !inst.spec.kind.may_change_files() {
            return false;
        }
        match inst.spec.cwd.as_deref() {
            // A fixed folder outside the root: nothing of the root's is
            // where the command works.
            Some(cwd) if Path::new(cwd).is_absolute() && !cwd.contains("{{") => self
                .services
                .workspace(&self.wf)
                .map(|(root, _)| Path::new(cwd).starts_with(root))
                .unwrap_or(true),
            _ => true,
        }
    }

    /// What takes the snapshots of an attempt of `inst` from its task, for
    /// a node that can change files.
    pub(super) fn end_snapshot_of(&self, inst: &Inst) -> Option<Snapshotter> {
        if !self.changes_files(inst) {
            return None;
        }
        let store = self.services.snapshot_store()?.ok()?;
        let (root, exclude) = self.services.workspace(&self.wf).ok()?;
        Some(Snapshotter {
            store,
            root,
            exclude,
            withhold: self.secrets.to_withhold(),
        })
    }

    /// Takes the snapshot (after the revert a retry asks for) off the
    /// driver's task; [`Driver::snapshotted`] starts the attempt.
    pub(super) fn begin_snapshot(&mut self, key: Key, attempt: u32) {
        let Some(inst) = self.sched.plan().insts.get(&key).cloned() else {
            return;
        };
        let store = match self.services.snapshot_store() {
            Some(Ok(s)) => s,
            Some(Err(e)) => return self.send_snapshotted(key, attempt, None, Some(e)),
            None => return self.send_snapshotted(key, attempt, None, None),
        };
        let (root, exclude) = match self.services.workspace(&self.wf) {
            Ok(w) => w,
            Err(e) => return self.send_snapshotted(key, attempt, None, Some(e.info.message)),
        };
        // The snapshot taken before the attempt that failed, from the log.
        let revert = (attempt > 1 && inst.spec.on_retry == OnRetry::Revert).then(|| {
            self.state
                .node(&key.0, key.1)
                .and_then(|n| n.notes.as_ref())
                .and_then(|notes| notes.snapshots.iter().rfind(|s| s.attempt < attempt))
                .map(|s| (s.attempt, s.snapshot.clone()))
        });
        self.attempts.begin(key.clone(), CancellationToken::new());
        let tx = self.msg_tx.clone();
        let log = self.log.clone();
        let scope = self.node_scope(&key);
        let backend = self.services.journal.backend().clone();
        let withhold = self.secrets.to_withhold();
        tokio::spawn(async move {
            let mut revert_failed = None;
            match revert {
                Some(Some((prev, snapshot))) => {
                    let failed = AttemptKey {
                        node: key.0.to_string(),
                        iteration: key.1,
                        attempt: prev,
                    };
                    let ws = (store.clone(), root.clone(), exclude.clone());
                    let scope = scope.with_attempt(prev);
                    let r = retry_revert(
                        &log,
                        backend,
                        scope,
                        failed,
                        &ws,
                        &snapshot,
                        withhold.clone(),
                    )
                    .await;
                    revert_failed = r.err();
                }
                Some(None) => {
                    revert_failed = Some(ErrorInfo::new(
                        "revert",
                        "on_retry: revert, but the failed attempt has no snapshot to restore",
                    ));
                }
                None => {}
            }
            let (snapshot, warning) = match take_snapshot(store, root, exclude, withhold).await {
                Ok(id) => (Some(id.to_string()), None),
                Err(e) => (None, Some(e)),
            };
            let _ = tx.send(Msg::Snapshotted(Box::new(Snapshotted {
                key,
                attempt,
                snapshot,
                warning,
                revert_failed,
            })));
        });
    }

    fn send_snapshotted(
        &mut self,
        key: Key,
        attempt: u32,
        snapshot: Option<String>,
        warning: Option<String>,
    ) {
        self.attempts.begin(key.clone(), CancellationToken::new());
        let _ = self.msg_tx.send(Msg::Snapshotted(Box::new(Snapshotted {
            key,
            attempt,
            snapshot,
            warning,
            revert_failed: None,
        })));
    }

    /// The snapshot is taken: the attempt starts (its `NodeStarted` now,
    /// its task once that is durable), unless the run stopped meanwhile.
    pub(super) fn snapshotted(&mut self, s: Snapshotted) {
        let Snapshotted {
            key,
            attempt,
            snapshot,
            warning,
            revert_failed,
        } = s;
        self.attempts.end(&key);
        let Some(inst) = self.sched.plan().insts.get(&key).cloned() else {
            return;
        };
        // While the run stops only a failure handler starts; while the
        // engine shuts down, nothing.
        let starts = if self.ending.shutting_down() {
            false
        } else if self.ending.stopping() {
            self.sched.is_handler(&inst)
        } else {
            true
        };
        if !starts {
            // It never started: the run's end (or the resume) deals with it.
            return;
        }
        if let Some(w) = warning {
            self.warn(
                "snapshot",
                format!(
                    "node `{}` attempt {attempt} starts without a workspace snapshot: {w}",
                    key.0
                ),
            );
        }
        let opened = self.tallies.started(inst.layer, inst.spec.stage.as_deref());
        self.emit_run(opened);
        let scope = self.node_scope(&key).with_attempt(attempt);
        self.emit(scope, EventKind::NodeStarted { snapshot });
        if attempt == 1 {
            self.traverse_edges(&key, &inst);
        }
        match revert_failed {
            Some(err) => {
                let err = NodeError {
                    info: Box::new(err),
                    retryable: false,
                    cancelled: false,
                };
                self.fail_attempt(&key, &inst, attempt, err);
            }
            None => self.attempts.snapshot_taken(key, attempt),
        }
    }
}

async fn take_snapshot(
    store: Arc<SnapshotStore>,
    root: PathBuf,
    exclude: Vec<PathBuf>,
    withhold: Arc<Vec<Vec<u8>>>,
) -> Result<ObjectId, String> {
    match tokio::task::spawn_blocking(move || {
        store.snapshot_withholding(&root, &exclude, &withhold)
    })
    .await
    {
        Ok(Ok(s)) => Ok(s.id),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("the snapshot's task died: {e}")),
    }
}

/// Most conflicting paths a retry's error and diagnostic name one by one.
const CONFLICTS_NAMED: usize = 20;

/// `on_retry: revert`: the paths the failed attempt changed put back as
/// its snapshot has them. When something else changed one of them since,
/// nothing is restored and the retry fails (error kind `revert`), with a
/// `Diagnostic` naming each path: overwriting would destroy work that is
/// not the run's, and starting the retry on files half put back is what
/// the node asked not to do; a person decides (`cairn revert --force`).
async fn retry_revert(
    log: &RunLog,
    backend: Arc<dyn cairn_store::Backend>,
    scope: Scope,
    failed: AttemptKey,
    ws: &(Arc<SnapshotStore>, PathBuf, Vec<PathBuf>),
    snapshot: &str,
    withhold: Arc<Vec<Vec<u8>>>,
) -> Result<Restored, ErrorInfo> {
    let revert_err = |m: String| ErrorInfo::new("revert", m);
    // The failed attempt's end is in the log before its history is read.
    log.sync()
        .await
        .map_err(|e| ErrorInfo::new("store", e.to_string()))?;
    let (store, root, exclude) = ws.clone();
    let (run, target) = (log.run_id().clone(), snapshot.to_string());
    let secrets = withhold.clone();
    let planned = tokio::task::spawn_blocking(move || {
        let events = shell::history_events(backend.as_ref(), &run, Some(&failed.node))
            .map_err(|e| e.to_string())?;
        let history = History::of(&events, true);
        let point = Point::Attempt(failed);
        shell::plan_files(
            &store, &root, &exclude, &history, &point, &target, false, &secrets,
        )
        .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| revert_err(format!("the revert's task died: {e}")))?
    .map_err(|e| revert_err(format!("on_retry: revert cannot tell what to restore: {e}")))?;
    let plan = planned.plan;
    if plan.refused() {
        let named: Vec<String> = plan
            .conflicts
            .iter()
            .take(CONFLICTS_NAMED)
            .map(|c| format!("{} ({})", String::from_utf8_lossy(&c.path), c.why))
            .collect();
        let more = plan.conflicts.len().saturating_sub(CONFLICTS_NAMED);
        let message = format!(
            "on_retry: revert restored nothing: {} path(s) the failed attempt changed were \
             changed since by something else: {}{}; the retry does not start on files half \
             put back (`cairn revert --force` overwrites them)",
            plan.conflicts.len(),
            named.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        );
        // The node pass's scope: the failed attempt has ended, the next
        // one has not started.
        let pass = Scope {
            attempt: None,
            ..scope.clone()
        };
        let _ = log
            .append_durable(
                pass,
                EventKind::Diagnostic {
                    level: cairn_events::Level::Warn,
                    source: "revert".into(),
                    message: message.clone(),
                },
            )
            .await;
        return Err(revert_err(message));
    }
    let (store, root, exclude) = ws;
    revert_files(
        log,
        scope,
        (store, root, exclude),
        snapshot,
        plan.paths(),
        &withhold,
    )
    .await
}

/// Restores `paths` of `root` as `snapshot` has them, as the log says:
/// `RevertStarted` durable before a file is touched, `RevertFinished` with
/// how it went. A process killed in between leaves the revert open in the
/// log, and whoever takes the run up next runs it again to its end
/// ([`crate::Engine::revert`], a resume), its paths computed again from the
/// log, so the files end as the snapshot has them.
pub(crate) async fn revert_files(
    log: &RunLog,
    scope: Scope,
    (store, root, exclude): (&Arc<SnapshotStore>, &Path, &[PathBuf]),
    snapshot: &str,
    paths: Vec<RelPath>,
    withhold: &Arc<Vec<Vec<u8>>>,
) -> Result<Restored, ErrorInfo> {
    let store_err = |e: cairn_store::StoreError| ErrorInfo::new("store", e.to_string());
    log.append_durable(
        scope.clone(),
        EventKind::RevertStarted {
            snapshot: snapshot.to_string(),
        },
    )
    .await
    .map_err(store_err)?;
    let result = restore_paths(store, root, exclude, snapshot, paths, withhold).await;
    log.append_durable(
        scope,
        EventKind::RevertFinished {
            snapshot: snapshot.to_string(),
            success: result.is_ok(),
            error: result.as_ref().err().cloned(),
        },
    )
    .await
    .map_err(store_err)?;
    result
}

/// Restores `paths` of `root` as `snapshot` has them (every other path
/// left alone), off the async workers.
pub(crate) async fn restore_paths(
    store: &Arc<SnapshotStore>,
    root: &Path,
    exclude: &[PathBuf],
    snapshot: &str,
    paths: Vec<RelPath>,
    withhold: &Arc<Vec<Vec<u8>>>,
) -> Result<Restored, ErrorInfo> {
    let (store, root, exclude, snapshot, withhold) = (
        store.clone(),
        root.to_path_buf(),
        exclude.to_vec(),
        snapshot.to_string(),
        withhold.clone(),
    );
    let restore = move || shell::restore(&store, &root, &exclude, &snapshot, &paths, &withhold);
    match tokio::task::spawn_blocking(restore).await {
        Ok(r) => r.map_err(|e| ErrorInfo::new("revert", e.to_string())),
        Err(e) => Err(ErrorInfo::new(
            "revert",
            format!("the restore's task died: {e}"),
        )),
    }
}
