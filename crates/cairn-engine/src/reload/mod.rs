//! Hot reload (`cairn run --watch`, `cairn serve --watch`): a watched run's
//! workflow file and the files it refers to are watched; when one changes,
//! the tree is read and checked again and handed to the run's driver, which
//! logs what became of it (`driver/reload.rs`): the run takes the new
//! definition as its next generation, or goes on with the one it has.
//!
//! The file system is watched by one [`hub::Hub`] per engine. A run's
//! watcher task keeps what it last saw of each file (a hash of its bytes),
//! so an editor that saves without changing anything, or touches a file,
//! reports nothing; and it starts by comparing the file on disk with the
//! definition the run has, so that a change made between the file's read
//! and the watch's start is not missed.

pub(crate) mod hub;
pub(crate) mod pin;
pub(crate) mod safety;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_events::{ErrorInfo, RunId, RunState};
use cairn_store::{Backend, RunRecord};
use cairn_workflow::{Problem, Workflow, WorkflowError};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::{EngineError, IntegrityProblem};

/// How long the files must stay quiet after a change before they are read:
/// an editor's save is several events (a temporary file written, renamed
/// over the old one, its mode set), and a person saving several files at
/// once should make one reload.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// What a run's watcher tells its driver.
pub(crate) enum Note {
    /// Watched files changed: the workflow as it reads now (boxed: a
    /// parsed workflow is large, a warning small).
    Reload(Box<Reload>),
    /// Something cannot be watched; the run goes on, watched as far as it
    /// can be.
    Warn(String),
}

/// A change to a watched run's files.
pub(crate) struct Reload {
    /// The files whose bytes changed, as the workflow names them (relative
    /// to the workflow's folder when inside it).
    pub changed_files: Vec<String>,
    /// The workflow read again with the files it refers to, or why it does
    /// not validate (each problem with its file and line).
    pub loaded: Result<Workflow, ErrorInfo>,
}

/// Reads the workflow at `main` again, as a run's start reads it: the file,
/// the child workflows it names and theirs, and the scripts of its scripted
/// models, so that a broken one is reported now rather than when a node
/// uses it. Problems name files relative to `base` (the run's workflow
/// folder).
pub(crate) fn load(main: &Path, base: &Path) -> Result<Workflow, ErrorInfo> {
    let wf = cairn_workflow::load_tree(main).map_err(|e| workflow_error(&e, base))?;
    let mut problems = Vec::new();
    each_in_tree(&wf, &mut |w| {
        for (name, def) in &w.models {
            let Some(script) = &def.script else {
                continue;
            };
            let path = w.base_dir.join(script);
            match cairn_workflow::load_data(&path) {
                Err(e) => problems.extend(e.problems),
                Ok(data) => {
                    if let Err(e) = cairn_agent::Script::from_value(data) {
                        problems.push(Problem {
                            file: path,
                            line: None,
                            column: None,
                            field: None,
                            message: format!("the script of model `{name}`: {e}"),
                            hint: None,
                        });
                    }
                }
            }
        }
    });
    if !problems.is_empty() {
        return Err(workflow_error(&WorkflowError { problems }, base));
    }
    // The files of the new generation, read once as its start reads them.
    let mut wf = wf;
    let files = pin::pin(&wf).map_err(|e| workflow_error(&e, base))?;
    pin::attach(&mut wf, &files);
    Ok(wf)
}

/// Calls `f` with `root` and every child workflow under it that reads, each
/// once.
fn each_in_tree(root: &Workflow, f: &mut dyn FnMut(&Workflow)) {
    let mut seen = HashSet::new();
    seen.insert(
        root.path
            .canonicalize()
            .unwrap_or_else(|_| root.path.clone()),
    );
    f(root);
    let mut stack: Vec<PathBuf> = children(root);
    while let Some(p) = stack.pop() {
        if !seen.insert(p.canonicalize().unwrap_or_else(|_| p.clone())) {
            continue;
        }
        if let Ok(child) = cairn_workflow::load(&p) {
            f(&child);
            stack.extend(children(&child));
        }
    }
}

fn children(wf: &Workflow) -> Vec<PathBuf> {
    wf.child_paths()
        .into_iter()
        .map(|(p, _)| wf.resolve(&p))
        .collect()
}

/// The files a run of `wf` reads: the workflow file, its child workflows
/// (those that do not read too: their creation is a change) and the
/// scripts of scripted models, in the whole tree.
pub(crate) fn files_of(wf: &Workflow) -> Vec<PathBuf> {
    let mut files = vec![wf.path.clone()];
    each_in_tree(wf, &mut |w| {
        if w.path != wf.path {
            files.push(w.path.clone());
        }
        files.extend(children(w));
        for def in w.models.values() {
            if let Some(script) = &def.script {
                files.push(w.base_dir.join(script));
            }
        }
    });
    let mut seen = HashSet::new();
    files.retain(|f| seen.insert(f.clone()));
    files
}

/// A file as people know it: relative to the workflow's folder when it is
/// inside it (events and messages never show a machine's paths that the
/// user did not write).
pub(crate) fn shown(path: &Path, base: &Path) -> String {
    match path.strip_prefix(base) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
        _ => path.display().to_string(),
    }
}

/// A workflow's problems as the error of `WorkflowReloadFailed`: the
/// parser's lines (`file:line:column: field: message (hint)`), files
/// relative to `base`, and each problem in `details`.
fn workflow_error(e: &WorkflowError, base: &Path) -> ErrorInfo {
    let base_text = base.display().to_string();
    let relative = |s: &str| {
        s.replace(&format!("{base_text}/"), "")
            .replace(&base_text, "the workflow's folder")
    };
    let problems: Vec<Problem> = e
        .problems
        .iter()
        .map(|p| Problem {
            file: PathBuf::from(shown(&p.file, base)),
            message: relative(&p.message),
            hint: p.hint.as_deref().map(relative),
            ..p.clone()
        })
        .collect();
    let message = problems
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let details: Vec<serde_json::Value> = problems.iter().map(|p| p.to_json()).collect();
    let mut info = ErrorInfo::new("workflow", message);
    info.details = Some(json!({ "problems": details }));
    info
}

/// SHA-256 hex of a file's bytes; `None` when it cannot be read (it is
/// gone, or not there yet).
fn file_hash(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| hex::encode(Sha256::digest(&b)))
}

/// Watches the files of a run of `wf` and tells `notes` about changes,
/// until the driver drops its end. `wf` is the run's current definition:
/// its workflow file is compared with it at once.
pub(crate) fn spawn_watcher(
    hub: Arc<hub::Hub>,
    wf: Arc<Workflow>,
    notes: mpsc::UnboundedSender<Note>,
) {
    tokio::spawn(async move {
        let (main, base) = (wf.path.clone(), wf.base_dir.clone());
        let (look_tx, mut look_rx) = mpsc::unbounded_channel();
        let mut sub = hub.subscribe(look_tx);
        let tree = wf.clone();
        let Ok(files) = tokio::task::spawn_blocking(move || files_of(&tree)).await else {
            return;
        };
        // Watched before the first look: a change from now on is seen by
        // one or the other.
        let mut files = files;
        warn_refused(&notes, sub.set_files(&files), &base);
        let mut seen: HashMap<PathBuf, Option<String>> = {
            let (files, main) = (files.clone(), main.clone());
            let hash = wf.hash.clone();
            tokio::task::spawn_blocking(move || {
                files
                    .iter()
                    .map(|f| {
                        let h = if *f == main {
                            Some(hash.clone())
                        } else {
                            file_hash(f)
                        };
                        (f.clone(), h)
                    })
                    .collect()
            })
            .await
            .unwrap_or_default()
        };
        drop(wf);
        let mut due = Some(tokio::time::Instant::now());
        loop {
            tokio::select! {
                _ = notes.closed() => return,
                got = look_rx.recv() => {
                    if got.is_none() {
                        return;
                    }
                    due = Some(tokio::time::Instant::now() + DEBOUNCE);
                }
                _ = async { tokio::time::sleep_until(due.unwrap()).await }, if due.is_some() => {
                    due = None;
                    let (f, m, b) = (files.clone(), main.clone(), base.clone());
                    let old = seen.clone();
                    let Ok(look) = tokio::task::spawn_blocking(move || look_again(&f, &m, &b, old)).await else {
                        return;
                    };
                    let Some(look) = look else { continue };
                    seen = look.seen;
                    if let Some(new_files) = look.files {
                        if new_files != files {
                            files = new_files;
                            warn_refused(&notes, sub.set_files(&files), &base);
                        }
                    }
                    if notes.send(Note::Reload(Box::new(look.reload))).is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// What a look at the files found that changed.
struct Look {
    reload: Reload,
    /// Every watched file's hash as of this look.
    seen: HashMap<PathBuf, Option<String>>,
    /// The files to watch from now on, when the workflow read.
    files: Option<Vec<PathBuf>>,
}

/// Reads the watched files; `None` when none changed since `seen`.
fn look_again(
    files: &[PathBuf],
    main: &Path,
    base: &Path,
    mut seen: HashMap<PathBuf, Option<String>>,
) -> Option<Look> {
    let mut changed = Vec::new();
    for f in files {
        let now = file_hash(f);
        if seen.get(f) != Some(&now) {
            changed.push(shown(f, base));
            seen.insert(f.clone(), now);
        }
    }
    if changed.is_empty() {
        return None;
    }
    let loaded = load(main, base);
    let files = loaded.as_ref().ok().map(|wf| {
        // The text that was parsed is the one seen: it may have changed
        // again since it was hashed above.
        seen.insert(main.to_path_buf(), Some(wf.hash.clone()));
        let files = files_of(wf);
        for f in &files {
            if !seen.contains_key(f) {
                seen.insert(f.clone(), file_hash(f));
            }
        }
        files
    });
    Some(Look {
        reload: Reload {
            changed_files: changed,
            loaded,
        },
        seen,
        files,
    })
}

fn warn_refused(notes: &mpsc::UnboundedSender<Note>, refused: Vec<(PathBuf, String)>, base: &Path) {
    for (file, why) in refused {
        let _ = notes.send(Note::Warn(format!(
            "not watching {}: {why}",
            shown(&file, base)
        )));
    }
}

/// The workflow of the run's current generation, as a resume runs it: the
/// run's record for generation 0, else the generation's stored text. What
/// the store holds must hash to what was recorded: the log's hash where it
/// has one (the latest `RunStarted`, unless a reload came after it), and
/// the hash stored with the generation. The files the generation pinned
/// come with it ([`pin`]), each checked against its hash.
pub(crate) fn definition(
    backend: &dyn Backend,
    rec: &RunRecord,
    state: &RunState,
) -> Result<Workflow, EngineError> {
    let mut wf = text_of_generation(backend, rec, state)?;
    let run_id = &rec.run_id;
    let n = state.generation;
    let Some(row) = backend
        .generation(run_id, n)?
        .filter(|row| !row.files.is_empty())
    else {
        // Nothing pinned: the workflow refers to no file, or the run began
        // before files were pinned and reads them from the disk, as it did.
        return Ok(wf);
    };
    if row.workflow_hash != wf.hash {
        return Err(tampered(
            run_id,
            IntegrityProblem::PinnedForAnother {
                generation: n,
                pinned_for: row.workflow_hash.clone(),
                workflow: wf.hash.clone(),
            },
        ));
    }
    if let Some(f) = pin::tampered(&row.files) {
        return Err(tampered(
            run_id,
            IntegrityProblem::PinnedTextChanged {
                path: f.path.clone(),
            },
        ));
    }
    pin::attach(&mut wf, &row.files);
    Ok(wf)
}

/// The workflow text of the run's current generation, checked, without
/// its pinned files.
fn text_of_generation(
    backend: &dyn Backend,
    rec: &RunRecord,
    state: &RunState,
) -> Result<Workflow, EngineError> {
    let run_id = &rec.run_id;
    let path = PathBuf::from(&rec.workflow_path);
    if state.generation == 0 {
        let wf = cairn_workflow::parse(&rec.workflow_source, &path)?;
        // The log's `RunStarted` names the workflow the run was started
        // with; a stored source that hashes otherwise was changed behind
        // the engine's back (say, `network: false` turned to `true`), and
        // resuming would run the changed file.
        if let Some(recorded) = state.workflow_hash.as_deref() {
            if recorded != wf.hash {
                return Err(tampered(
                    run_id,
                    IntegrityProblem::SourceChanged {
                        stored: wf.hash.clone(),
                        recorded: recorded.to_string(),
                    },
                ));
            }
        }
        return Ok(wf);
    }
    let n = state.generation;
    let stored = backend.generation(run_id, n)?.ok_or_else(|| {
        tampered(
            run_id,
            IntegrityProblem::GenerationMissing { generation: n },
        )
    })?;
    let wf = cairn_workflow::parse(&stored.workflow_source, &path)?;
    let recorded = state
        .generation_hash
        .as_deref()
        .unwrap_or(&stored.workflow_hash);
    if wf.hash != stored.workflow_hash || wf.hash != recorded {
        return Err(tampered(
            run_id,
            IntegrityProblem::GenerationChanged {
                generation: n,
                stored: wf.hash.clone(),
                recorded: recorded.to_string(),
            },
        ));
    }
    Ok(wf)
}

/// What the store holds of `run_id` does not match its log.
fn tampered(run_id: &RunId, problem: IntegrityProblem) -> EngineError {
    EngineError::for_run(run_id, |run| EngineError::Integrity { run, problem })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_files_as_the_workflow_does() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir(base.join("sub")).unwrap();
        std::fs::write(
            base.join("flow.yaml"),
            "name: flow\nnodes:\n  - id: a\n    workflow: sub/child.yaml\n",
        )
        .unwrap();
        std::fs::write(
            base.join("sub/child.yaml"),
            "name: child\nnodes:\n  - id: b\n    comand: [\"true\"]\n",
        )
        .unwrap();
        let err = load(&base.join("flow.yaml"), base).unwrap_err();
        assert_eq!(err.kind, "workflow");
        assert!(
            err.message
                .contains("sub/child.yaml:4:5: nodes[0].comand: unknown field `comand`"),
            "{}",
            err.message
        );
        assert!(
            !err.message.contains(&base.display().to_string()),
            "{}",
            err.message
        );
        let problems = err.details.as_ref().unwrap()["problems"]
            .as_array()
            .unwrap()
            .clone();
        assert!(problems
            .iter()
            .all(|p| p["file"] == "sub/child.yaml" && p["line"].is_u64()));

        // A missing child is the parent's problem, at the line naming it.
        std::fs::remove_file(base.join("sub/child.yaml")).unwrap();
        let err = load(&base.join("flow.yaml"), base).unwrap_err();
        assert!(
            err.message
                .starts_with("flow.yaml:3: child workflow `sub/child.yaml`"),
            "{}",
            err.message
        );
        assert!(
            !err.message.contains(&base.display().to_string()),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_tree_of_files_is_watched() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::write(
            base.join("flow.yaml"),
            "name: flow\nmodels:\n  m: { provider: scripted, script: m.yaml }\n\
             nodes:\n  - id: a\n    workflow: child.yaml\n  - id: b\n    workflow: gone.yaml\n",
        )
        .unwrap();
        std::fs::write(
            base.join("child.yaml"),
            "name: child\nnodes:\n  - id: c\n    workflow: grandchild.yaml\n",
        )
        .unwrap();
        std::fs::write(
            base.join("grandchild.yaml"),
            "name: grandchild\nnodes:\n  - id: d\n    value: 1\n",
        )
        .unwrap();
        let wf = cairn_workflow::load(&base.join("flow.yaml")).unwrap();
        let mut names: Vec<String> = files_of(&wf).iter().map(|f| shown(f, base)).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "child.yaml",
                "flow.yaml",
                "gone.yaml",
                "grandchild.yaml",
                "m.yaml"
            ]
        );
    }
}
