//! Pinning: the files a run's workflow refers to (child workflows, the
//! scripts of scripted models, in the whole tree) are read once when a
//! generation of the run begins (its start, a reload a person's edit made)
//! and kept with that generation in the store
//! ([`cairn_store::GenerationRecord::files`]). The run then reads them from
//! there, never from the disk: a node that rewrites a child workflow in its
//! root (say to `isolation: none`) changes nothing the run will do. A
//! resume takes them back from the store, checked by hash.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use cairn_store::PinnedFile;
use cairn_workflow::{Workflow, WorkflowError};
use sha2::{Digest, Sha256};

/// Reads the files `wf` refers to in its whole tree, each once: from the
/// pinned files it already carries (a child run takes its parent's), else
/// from the disk. A child workflow is parsed from the very text pinned, so
/// its own references are the ones that text names.
pub(crate) fn pin(wf: &Workflow) -> Result<Vec<PinnedFile>, WorkflowError> {
    let mut files: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    seen.insert(wf.path.clone());
    let mut stack: Vec<Workflow> = Vec::new();
    let mut visit = |w: &Workflow,
                     files: &mut BTreeMap<PathBuf, String>,
                     stack: &mut Vec<Workflow>|
     -> Result<(), WorkflowError> {
        for def in w.models.values() {
            if let Some(script) = &def.script {
                let path = w.base_dir.join(script);
                if seen.insert(path.clone()) {
                    files.insert(path.clone(), w.referenced_text(&path)?);
                }
            }
        }
        for (p, _) in w.child_paths() {
            let path = w.resolve(&p);
            if path == wf.path {
                // The tree names its own top (a workflow that starts
                // itself): its text is the one being pinned from.
                files.entry(path).or_insert_with(|| wf.source.clone());
                continue;
            }
            if seen.insert(path.clone()) {
                let child = w.child(&path)?;
                files.insert(path, child.source.clone());
                stack.push(child);
            }
        }
        Ok(())
    };
    visit(wf, &mut files, &mut stack)?;
    while let Some(w) = stack.pop() {
        visit(&w, &mut files, &mut stack)?;
    }
    Ok(files
        .into_iter()
        .map(|(path, text)| PinnedFile {
            path: path.display().to_string(),
            hash: hash(&text),
            text,
        })
        .collect())
}

/// `wf` reading `files` from now on ([`Workflow::pinned`]).
pub(crate) fn attach(wf: &mut Workflow, files: &[PinnedFile]) {
    let map: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|f| (PathBuf::from(&f.path), f.text.clone()))
        .collect();
    wf.pinned = Some(Arc::new(map));
}

/// The files `wf` carries, as stored with a generation.
pub(crate) fn pinned_files(wf: &Workflow) -> Vec<PinnedFile> {
    wf.pinned
        .iter()
        .flat_map(|m| m.iter())
        .map(|(path, text)| PinnedFile {
            path: path.display().to_string(),
            hash: hash(text),
            text: text.clone(),
        })
        .collect()
}

/// The first stored file whose text does not hash to what was recorded:
/// the store was changed outside Cairn.
pub(crate) fn tampered(files: &[PinnedFile]) -> Option<&PinnedFile> {
    files.iter().find(|f| hash(&f.text) != f.hash)
}

fn hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_read_once_and_then_never_from_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::write(
            base.join("flow.yaml"),
            "name: flow\nnodes:\n  - id: c\n    workflow: child.yaml\n",
        )
        .unwrap();
        std::fs::write(
            base.join("child.yaml"),
            "name: child\nnodes:\n  - id: g\n    workflow: grand.yaml\n",
        )
        .unwrap();
        std::fs::write(
            base.join("grand.yaml"),
            "name: grand\nnodes:\n  - id: v\n    value: 1\n",
        )
        .unwrap();
        let mut wf = cairn_workflow::load(&base.join("flow.yaml")).unwrap();
        let files = pin(&wf).unwrap();
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(tampered(&files).is_none());
        attach(&mut wf, &files);
        // A node rewrites both files: the run still has what it pinned.
        std::fs::write(base.join("child.yaml"), "name: evil\nnodes: []\n").unwrap();
        std::fs::remove_file(base.join("grand.yaml")).unwrap();
        let child = wf.child(&base.join("child.yaml")).unwrap();
        assert_eq!(child.name, "child");
        let grand = child.child(&base.join("grand.yaml")).unwrap();
        assert_eq!(grand.name, "grand");
        // A child pins from its parent's files, not the disk.
        assert_eq!(pin(&child).unwrap().len(), 1);
        // A file the run did not pin is refused, not read.
        std::fs::write(base.join("other.yaml"), "name: other\nnodes: []\n").unwrap();
        assert!(wf.child(&base.join("other.yaml")).is_err());
        let mut bad = files.clone();
        bad[0].text.push('x');
        assert!(tampered(&bad).is_some());
    }
}
