//! The I/O around a files plan: the snapshots a history names, read as
//! flat maps; the root as it is now (a fresh snapshot); the restore of the
//! plan's paths alone. Blocking: callers run it off the async workers.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_events::EventType;
use cairn_snapshot::{ObjectId, Restored, SnapshotError, SnapshotStore};

use super::{plan, Change, Current, FilesPlan, Flat, History, Left, Point, RelPath};

/// A plan, and the snapshot of the root it was made against.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// What to write, remove, and what conflicts.
    pub plan: FilesPlan,
    /// The root as it was when planned (reverting to it undoes the plan).
    pub before: ObjectId,
}

/// Plans putting back, as snapshot `target` has them, the paths the run
/// changed since `point` (see [`super::plan`]), against the root as it is
/// now. `withhold` is the run's secrets: a file that holds one is not read
/// into the snapshot of the root now, and the plan leaves it alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_files(
    store: &SnapshotStore,
    root: &Path,
    exclude: &[PathBuf],
    history: &History,
    point: &Point,
    target: &str,
    force: bool,
    withhold: &[Vec<u8>],
) -> Result<Planned, SnapshotError> {
    let (before, now) = current(store, root, exclude, withhold)?;
    let mut ctx = Reader::new(store, history, &now.flat);
    let changes = ctx.changes(point, u64::MAX)?;
    let target_flat = ctx.flat(target)?;
    let mut p = plan(&changes, &target_flat, &now, force);
    p.snapshot = target.to_string();
    if matches!(point, Point::After(_)) {
        p.unknown = history
            .unclosed
            .iter()
            .map(|(k, s)| {
                format!(
                    "node {} pass {} attempt {} ended without a snapshot of what it left and \
                     none was taken after it: what it changed after snapshot {s} is not known \
                     and is left as it is",
                    k.node, k.iteration, k.attempt
                )
            })
            .collect();
    }
    Ok(Planned { plan: p, before })
}

/// Makes the plan's paths (root-relative) what snapshot `target` has,
/// every other path left alone.
pub(crate) fn restore(
    store: &SnapshotStore,
    root: &Path,
    exclude: &[PathBuf],
    target: &str,
    paths: &[RelPath],
    withhold: &[Vec<u8>],
) -> Result<Restored, SnapshotError> {
    let id: ObjectId = target.parse()?;
    store.restore_paths_withholding(root, id, paths, exclude, withhold)
}

/// The root as it is now: a snapshot of it, as a flat map, with what the
/// snapshot left out.
fn current(
    store: &SnapshotStore,
    root: &Path,
    exclude: &[PathBuf],
    withhold: &[Vec<u8>],
) -> Result<(ObjectId, Current), SnapshotError> {
    let snap = store.snapshot_withholding(root, exclude, withhold)?;
    let flat = store.flat(snap.id)?;
    let unknown = snap
        .skipped
        .iter()
        .map(|s| s.path.as_bytes().to_vec())
        .collect();
    Ok((snap.id, Current { flat, unknown }))
}

/// Reads what a history's steps changed, each once.
struct Reader<'a> {
    store: &'a SnapshotStore,
    history: &'a History,
    now: &'a Flat,
    /// The few snapshots read last: consecutive segments share one.
    flats: Vec<(String, Arc<Flat>)>,
    segments: HashMap<usize, Arc<Left>>,
    reverts: HashMap<usize, Arc<BTreeSet<RelPath>>>,
}

impl<'a> Reader<'a> {
    fn new(store: &'a SnapshotStore, history: &'a History, now: &'a Flat) -> Reader<'a> {
        Reader {
            store,
            history,
            now,
            flats: Vec::new(),
            segments: HashMap::new(),
            reverts: HashMap::new(),
        }
    }

    fn flat(&mut self, id: &str) -> Result<Arc<Flat>, SnapshotError> {
        if let Some((_, f)) = self.flats.iter().find(|(k, _)| k == id) {
            return Ok(f.clone());
        }
        let f = Arc::new(self.store.flat(id.parse()?)?);
        if self.flats.len() >= 4 {
            self.flats.remove(0);
        }
        self.flats.push((id.to_string(), f.clone()));
        Ok(f)
    }

    /// The paths segment `i` changed, with what it left.
    fn segment(&mut self, i: usize) -> Result<Arc<Left>, SnapshotError> {
        if let Some(l) = self.segments.get(&i) {
            return Ok(l.clone());
        }
        let seg = &self.history.segments[i];
        let before = self.flat(&seg.before)?;
        let left = match &seg.after {
            super::After::Snapshot(s) => {
                let after = self.flat(s)?;
                super::diff(&before, &after)
            }
            super::After::Now => super::diff(&before, self.now),
        };
        let left = Arc::new(left);
        self.segments.insert(i, left.clone());
        Ok(left)
    }

    /// The paths revert `i` of the log restored: what it covered, computed
    /// as it was then (from the steps logged before it).
    fn revert_paths(&mut self, i: usize) -> Result<Arc<BTreeSet<RelPath>>, SnapshotError> {
        if let Some(p) = self.reverts.get(&i) {
            return Ok(p.clone());
        }
        let r = &self.history.reverts[i];
        let (segs, revs) = self.history.covered(&self.history.point_of(r), r.seq);
        let mut paths = BTreeSet::new();
        for s in segs {
            paths.extend(self.segment(s)?.keys().cloned());
        }
        for j in revs {
            // Reverts before this one only (`covered` stops at its seq).
            paths.extend(self.revert_paths(j)?.iter().cloned());
        }
        let paths = Arc::new(paths);
        self.reverts.insert(i, paths.clone());
        Ok(paths)
    }

    /// The changes a plan for `point` covers, logged before `upto`.
    fn changes(&mut self, point: &Point, upto: u64) -> Result<Vec<Change>, SnapshotError> {
        let (segs, revs) = self.history.covered(point, upto);
        let mut out = Vec::with_capacity(segs.len() + revs.len());
        for s in segs {
            out.push(Change {
                seq: self.history.segments[s].end_seq,
                left: (*self.segment(s)?).clone(),
            });
        }
        for r in revs {
            let paths = self.revert_paths(r)?;
            let mark = &self.history.reverts[r];
            let target = self.flat(&mark.target.clone())?;
            out.push(Change {
                seq: History::revert_seq(mark),
                left: paths
                    .iter()
                    .map(|p| (p.clone(), target.get(p).copied()))
                    .collect(),
            });
        }
        Ok(out)
    }
}

/// The event types a [`History`] reads.
const HISTORY_TYPES: [EventType; 8] = [
    EventType::NodeStarted,
    EventType::AgentStepStarted,
    EventType::NodeFinished,
    EventType::NodeFailed,
    EventType::NodeCancelled,
    EventType::NodeRetrying,
    EventType::RevertStarted,
    EventType::RevertFinished,
];

/// The events of a run's log a [`History`] reads (of one node, when
/// `node` is given), in seq order.
pub(crate) fn history_events(
    backend: &dyn cairn_store::Backend,
    run_id: &cairn_events::RunId,
    node: Option<&str>,
) -> Result<Vec<cairn_events::Event>, crate::EngineError> {
    let rows = backend.read_events(
        run_id,
        &cairn_store::EventQuery {
            types: HISTORY_TYPES.to_vec(),
            node: node.map(String::from),
            ..Default::default()
        },
    )?;
    rows.iter().map(|s| crate::decode_row(run_id, s)).collect()
}
