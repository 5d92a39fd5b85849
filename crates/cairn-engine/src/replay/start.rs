//! Setting a replay up: the original's recording read, and the replay's
//! own copy of the root made from the original's first snapshot.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_events::{Event, ReplayOf, RunId};
use cairn_workflow::Workflow;

use super::{ReplayRoot, Replayer};
use crate::services::Services;
use crate::{Engine, EngineError};

fn refused(reason: impl Into<String>) -> EngineError {
    EngineError::ReplayRefused {
        reason: reason.into(),
    }
}

impl Engine {
    /// The workflow run `run_id` runs (its latest generation, with the
    /// files it pinned): what a replay of it runs unless given another.
    pub async fn definition_of(&self, run_id: &RunId) -> Result<Workflow, EngineError> {
        let id = run_id.clone();
        self.blocking(move |e| {
            let rec = e.require_run(&id)?;
            let state = e.fold(&id)?;
            crate::reload::definition(e.backend().as_ref(), &rec, &state)
        })
        .await
    }

    /// The replayer of run `run_id`, a replay of `of`, and its workflow
    /// pointed at the replay's copy of the root. A `fresh` replay makes the
    /// copy (from the original's first snapshot); one taken up again reads
    /// what its own log answered already, and works in the copy it made.
    pub(crate) async fn replayer(
        &self,
        run_id: &RunId,
        of: ReplayOf,
        wf: &mut Workflow,
        fresh: bool,
    ) -> Result<Arc<Replayer>, EngineError> {
        let dir = self.inner.services.replay_dir().ok_or_else(|| {
            refused("a replay needs a folder for its copy of the root: give the engine a snapshot folder")
        })?;
        let original = Services::root_of(wf);
        let id = run_id.clone();
        let (top, replayer) = self
            .blocking(move |e| {
                let backend = e.backend();
                // A child of a replay is a replay too, and works in the copy
                // of the replay that started it all, as the original's
                // children worked in the original's root.
                let mut top = id.clone();
                for _ in 0..=crate::DEFAULT_MAX_DEPTH * 4 {
                    match backend.get_run(&top)?.and_then(|r| r.parent_run_id) {
                        Some(p) => top = p,
                        None => break,
                    }
                }
                let root = ReplayRoot {
                    original,
                    copy: dir.join(top.as_str()),
                };
                if backend.get_run(&of.run_id)?.is_none() {
                    return Err(EngineError::for_run(&of.run_id, |run| {
                        EngineError::RunNotFound { run }
                    }));
                }
                let own: Option<Vec<Event>> = if fresh {
                    None
                } else {
                    let stored = backend.read_events(&id, &cairn_store::EventQuery::default())?;
                    Some(
                        stored
                            .iter()
                            .map(|s| crate::decode_row(&id, s))
                            .collect::<Result<_, _>>()?,
                    )
                };
                let r = Replayer::load(backend.as_ref(), of, own.as_deref(), Some(root))?;
                Ok::<_, EngineError>((top, r))
            })
            .await?;
        let dir = self.inner.services.replay_dir().unwrap_or_default();
        let copy = dir.join(top.as_str());
        if fresh && &top == run_id {
            let snapshot = replayer.first_snapshot().map(str::to_string);
            let store = self.inner.services.snapshot_store();
            let (dir2, copy2) = (dir.clone(), copy.clone());
            tokio::task::spawn_blocking(move || {
                make_copy(&dir2, &copy2, snapshot.as_deref(), store)
            })
            .await
            .map_err(|e| refused(format!("making the replay's copy of the root: {e}")))??;
        } else if !copy.is_dir() {
            return Err(refused(format!(
                "the replay's copy of the root, {}, is gone",
                copy.display()
            )));
        }
        wf.sandbox.root = Some(copy.display().to_string());
        Ok(Arc::new(replayer))
    }
}

/// Makes `copy` (a new folder in `dir`) hold the snapshot `snapshot`. The
/// folders are made, never followed: `dir` must be a folder and not a
/// link, and `copy` must not exist, so that nothing planted there decides
/// where the files go.
fn make_copy(
    dir: &Path,
    copy: &PathBuf,
    snapshot: Option<&str>,
    store: Option<Result<Arc<cairn_snapshot::SnapshotStore>, String>>,
) -> Result<(), EngineError> {
    let io = |what: &str, e: std::io::Error| refused(format!("{what} {}: {e}", copy.display()));
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io("making the folder of", e))?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("making the replays' folder for", e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| io("reading the folder of", e))?;
    if !meta.is_dir() {
        return Err(refused(format!(
            "{} is not a folder (a link?): no replay is copied there",
            dir.display()
        )));
    }
    std::fs::create_dir(copy).map_err(|e| io("making", e))?;
    let Some(snapshot) = snapshot else {
        return Ok(());
    };
    let id: cairn_snapshot::ObjectId = snapshot.parse().map_err(|_| {
        refused(format!(
            "the original's snapshot `{snapshot}` is no snapshot id"
        ))
    })?;
    let store = match store {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(refused(format!("the snapshot repository: {e}"))),
        None => return Err(EngineError::NoSnapshots),
    };
    store
        .restore(copy, id, &[])
        .map_err(|source| EngineError::Files {
            task: crate::FilesTask::ReplayCopy,
            source,
        })?;
    Ok(())
}
