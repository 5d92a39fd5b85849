//! A second home for a repository's objects: the database of a store that
//! many machines share, so that a snapshot taken on one machine restores
//! on another.
//!
//! The repository's folder stays the working copy (the stat caches, the
//! walks and the restores use it as on one machine). A snapshot then
//! copies to the mirror every object of it the mirror lacks before its id
//! is returned, so an id that reaches a log is restorable from anywhere;
//! a restore first copies from the mirror every object of its snapshot
//! the folder lacks, checking that each one's bytes hash to its name (the
//! mirror is not trusted more than a file).

use std::collections::HashSet;
use std::sync::Mutex;

use crate::object::{decode_tree, Kind, Mode, ObjectId, Objects};
use crate::SnapshotError;

/// Where objects are kept besides the repository's folder.
pub trait ObjectMirror: Send + Sync {
    /// Which of `ids` it holds.
    fn holds(&self, ids: &[ObjectId]) -> Result<HashSet<ObjectId>, String>;
    /// Stores objects; one it holds already is left as it is (an id names
    /// its bytes).
    fn put(&self, objects: &[MirroredObject]) -> Result<(), String>;
    /// The objects of `ids` it holds (any it lacks are left out).
    fn get(&self, ids: &[ObjectId]) -> Result<Vec<MirroredObject>, String>;
    /// Deletes every object not in `live` and stored longer ago than
    /// `grace`; returns the objects and bytes deleted and the objects kept.
    fn retain(
        &self,
        live: &HashSet<ObjectId>,
        grace: std::time::Duration,
    ) -> Result<(u64, u64, u64), String>;
}

/// A mirror in memory: what a bundle carries, or is read into.
#[derive(Debug, Default)]
pub struct MemoryMirror {
    objects: Mutex<std::collections::BTreeMap<ObjectId, MirroredObject>>,
}

impl MemoryMirror {
    /// An empty one.
    pub fn new() -> MemoryMirror {
        MemoryMirror::default()
    }

    /// Its objects, by id.
    pub fn objects(&self) -> Vec<MirroredObject> {
        self.objects.lock().unwrap().values().cloned().collect()
    }
}

impl ObjectMirror for MemoryMirror {
    fn holds(&self, ids: &[ObjectId]) -> Result<HashSet<ObjectId>, String> {
        let objects = self.objects.lock().unwrap();
        Ok(ids
            .iter()
            .filter(|i| objects.contains_key(i))
            .copied()
            .collect())
    }

    fn put(&self, objects: &[MirroredObject]) -> Result<(), String> {
        let mut held = self.objects.lock().unwrap();
        for o in objects {
            held.entry(o.id).or_insert_with(|| o.clone());
        }
        Ok(())
    }

    fn get(&self, ids: &[ObjectId]) -> Result<Vec<MirroredObject>, String> {
        let objects = self.objects.lock().unwrap();
        Ok(ids.iter().filter_map(|i| objects.get(i).cloned()).collect())
    }

    fn retain(
        &self,
        live: &HashSet<ObjectId>,
        _grace: std::time::Duration,
    ) -> Result<(u64, u64, u64), String> {
        let mut objects = self.objects.lock().unwrap();
        let before = objects.len() as u64;
        let mut bytes = 0u64;
        objects.retain(|id, o| {
            let keep = live.contains(id);
            if !keep {
                bytes += o.body.len() as u64;
            }
            keep
        });
        Ok((before - objects.len() as u64, bytes, objects.len() as u64))
    }
}

/// An object as a mirror keeps it: uncompressed, with its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirroredObject {
    /// Its id: the hash of its kind, length and bytes.
    pub id: ObjectId,
    /// A blob or a tree.
    pub kind: Kind,
    /// Its bytes.
    pub body: Vec<u8>,
}

/// Ids asked of a mirror at once.
const IDS_PER_CALL: usize = 1000;

/// Bytes sent to or asked of a mirror at once (an object larger than this
/// goes alone).
const BYTES_PER_CALL: usize = 8 << 20;

/// Largest tree read (as `restore` allows).
const MAX_TREE_BYTES: u64 = 64 << 20;

/// Deepest folder nesting walked.
const MAX_DEPTH: usize = 512;

/// The mirror, and the ids this process knows it holds (so that a root
/// snapshotted again asks about its new objects only).
pub(crate) struct Mirrored {
    pub mirror: std::sync::Arc<dyn ObjectMirror>,
    known: Mutex<HashSet<ObjectId>>,
}

impl Mirrored {
    pub fn new(mirror: std::sync::Arc<dyn ObjectMirror>) -> Mirrored {
        Mirrored {
            mirror,
            known: Mutex::new(HashSet::new()),
        }
    }

    /// Forgets what it knew the mirror holds (a prune deleted some).
    pub fn forget_all(&self) {
        self.known.lock().unwrap().clear();
    }

    fn err(e: String) -> SnapshotError {
        SnapshotError::Mirror(e)
    }

    /// Copies to the mirror every object of the snapshot `root` it lacks.
    /// Returns how many it copied.
    pub fn push(&self, objects: &Objects, root: ObjectId) -> Result<usize, SnapshotError> {
        let mut all = Vec::new();
        let mut seen = HashSet::new();
        local_walk(objects, root, 0, &mut seen, &mut all)?;
        let unknown: Vec<(ObjectId, Kind)> = {
            let known = self.known.lock().unwrap();
            all.into_iter()
                .filter(|(id, _)| !known.contains(id) && *id != ObjectId::EMPTY_TREE)
                .collect()
        };
        let mut copied = 0;
        for chunk in unknown.chunks(IDS_PER_CALL) {
            let ids: Vec<ObjectId> = chunk.iter().map(|(id, _)| *id).collect();
            let held = self.mirror.holds(&ids).map_err(Self::err)?;
            let mut batch: Vec<MirroredObject> = Vec::new();
            let mut bytes = 0;
            for (id, kind) in chunk.iter().filter(|(id, _)| !held.contains(id)) {
                let body = objects.read(*id, *kind, u64::MAX >> 1)?;
                bytes += body.len();
                batch.push(MirroredObject {
                    id: *id,
                    kind: *kind,
                    body,
                });
                if bytes >= BYTES_PER_CALL {
                    self.mirror.put(&batch).map_err(Self::err)?;
                    copied += batch.len();
                    batch.clear();
                    bytes = 0;
                }
            }
            if !batch.is_empty() {
                self.mirror.put(&batch).map_err(Self::err)?;
                copied += batch.len();
            }
            self.known.lock().unwrap().extend(ids);
        }
        Ok(copied)
    }

    /// Copies from the mirror every object of the snapshot `root` that the
    /// folder lacks. Returns how many it copied. An object neither has is
    /// [`SnapshotError::Missing`]; one whose bytes do not hash to its name
    /// is [`SnapshotError::Corrupt`].
    pub fn pull(&self, objects: &Objects, root: ObjectId) -> Result<usize, SnapshotError> {
        if root == ObjectId::EMPTY_TREE {
            return Ok(0);
        }
        let mut copied = 0;
        let mut seen: HashSet<ObjectId> = HashSet::new();
        // Trees level by level (a tree's entries are known once it is
        // here), the blobs they name gathered on the way.
        let mut level = vec![root];
        let mut blobs: Vec<ObjectId> = Vec::new();
        for _ in 0..MAX_DEPTH {
            if level.is_empty() {
                break;
            }
            let missing: Vec<ObjectId> = level
                .iter()
                .copied()
                .filter(|id| !objects.contains(*id))
                .collect();
            copied += self.fetch(objects, &missing, Kind::Tree)?;
            let mut next = Vec::new();
            for id in level {
                let bytes = objects.read(id, Kind::Tree, MAX_TREE_BYTES)?;
                for e in decode_tree(id, &bytes)? {
                    if !seen.insert(e.id) {
                        continue;
                    }
                    if e.mode == Mode::Tree {
                        next.push(e.id);
                    } else if !objects.contains(e.id) {
                        blobs.push(e.id);
                    }
                }
            }
            level = next;
        }
        copied += self.fetch(objects, &blobs, Kind::Blob)?;
        Ok(copied)
    }

    /// Fetches `ids` (all of `kind`) from the mirror into the folder.
    fn fetch(
        &self,
        objects: &Objects,
        ids: &[ObjectId],
        kind: Kind,
    ) -> Result<usize, SnapshotError> {
        let mut copied = 0;
        for chunk in ids.chunks(IDS_PER_CALL) {
            // One call returns what it holds of the chunk; asked one by
            // one beyond a few, so a chunk of large blobs is not one answer
            // of gigabytes.
            let per_call = if kind == Kind::Tree { chunk.len() } else { 16 };
            for part in chunk.chunks(per_call.max(1)) {
                let got = self.mirror.get(part).map_err(Self::err)?;
                for id in part {
                    let Some(o) = got.iter().find(|o| o.id == *id) else {
                        return Err(SnapshotError::Missing(id.to_string()));
                    };
                    if o.kind != kind || ObjectId::of(o.kind, &o.body) != o.id {
                        return Err(SnapshotError::Corrupt {
                            id: id.to_string(),
                            why: "the shared store's copy does not hash to its name".into(),
                        });
                    }
                    objects.write(o.kind, &o.body)?;
                    copied += 1;
                }
            }
        }
        self.known.lock().unwrap().extend(ids.iter().copied());
        Ok(copied)
    }
}

/// Every object of the snapshot `id` in the folder, with its kind.
fn local_walk(
    objects: &Objects,
    id: ObjectId,
    depth: usize,
    seen: &mut HashSet<ObjectId>,
    out: &mut Vec<(ObjectId, Kind)>,
) -> Result<(), SnapshotError> {
    if depth > MAX_DEPTH || !seen.insert(id) {
        return Ok(());
    }
    out.push((id, Kind::Tree));
    if id == ObjectId::EMPTY_TREE {
        return Ok(());
    }
    let bytes = objects.read(id, Kind::Tree, MAX_TREE_BYTES)?;
    for e in decode_tree(id, &bytes)? {
        if e.mode == Mode::Tree {
            local_walk(objects, e.id, depth + 1, seen, out)?;
        } else if seen.insert(e.id) {
            out.push((e.id, Kind::Blob));
        }
    }
    Ok(())
}

/// Every object id reachable from `roots` in the mirror alone (its trees
/// read from it): what a prune of the mirror keeps. A root or tree the
/// mirror lacks keeps what is left of it.
pub fn reachable_in(
    mirror: &dyn ObjectMirror,
    roots: &[ObjectId],
) -> Result<HashSet<ObjectId>, SnapshotError> {
    let mut live: HashSet<ObjectId> = HashSet::new();
    let mut level: Vec<ObjectId> = roots.iter().copied().filter(|r| live.insert(*r)).collect();
    for _ in 0..MAX_DEPTH {
        if level.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for chunk in level.chunks(64) {
            for o in mirror.get(chunk).map_err(SnapshotError::Mirror)? {
                if o.kind != Kind::Tree || ObjectId::of(o.kind, &o.body) != o.id {
                    continue;
                }
                let Ok(entries) = decode_tree(o.id, &o.body) else {
                    continue;
                };
                for e in entries {
                    if live.insert(e.id) && e.mode == Mode::Tree {
                        next.push(e.id);
                    }
                }
            }
        }
        level = next;
    }
    Ok(live)
}
