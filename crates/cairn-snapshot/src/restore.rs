//! Putting a root back as a snapshot has it: files written, changed or
//! deleted since are written back, files that were not there are deleted.
//!
//! Every file to write back is first staged in a folder of its own in the
//! root; only then is the root changed, by deletions and renames alone, so
//! no file is ever half-written, a kill while staging leaves the root as it
//! was, and the part of a restore that can be cut half-way is as short as
//! it can be. A restore cut short is finished by running it again (it
//! compares before it writes). Nothing is written through a symbolic
//! link: a folder on the way that has become a link (or a file) is
//! replaced by a real folder first, so a link planted in the root cannot
//! make a restore write outside it.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::Path;

use cairn_rootfs::{Dir, Stat};

use crate::object::{decode_tree, Kind, Mode, ObjectId, Objects};
use crate::walk::{join, Flat};
use crate::SnapshotError;

/// Most bytes of one tree object a restore reads.
const MAX_TREE_BYTES: u64 = 64 << 20;
/// Deepest folder nesting a restore follows in a tree.
const MAX_DEPTH: usize = 512;

/// The snapshot `id` as a flat list.
pub fn flatten(objects: &Objects, id: ObjectId) -> Result<Flat, SnapshotError> {
    let mut flat = Flat::default();
    if id != ObjectId::EMPTY_TREE {
        walk_tree(objects, id, &[], 0, &mut flat)?;
    }
    Ok(flat)
}

fn walk_tree(
    objects: &Objects,
    id: ObjectId,
    rel: &[u8],
    depth: usize,
    flat: &mut Flat,
) -> Result<(), SnapshotError> {
    if depth > MAX_DEPTH {
        return Err(SnapshotError::Corrupt {
            id: id.to_string(),
            why: format!("folders nested more than {MAX_DEPTH} deep"),
        });
    }
    let bytes = objects.read(id, Kind::Tree, MAX_TREE_BYTES)?;
    for e in decode_tree(id, &bytes)? {
        let p = join(rel, &e.name);
        if e.mode == Mode::Tree {
            flat.dirs.insert(p.clone());
            walk_tree(objects, e.id, &p, depth + 1, flat)?;
        } else {
            flat.leaves.insert(p, (e.mode, e.id));
        }
    }
    Ok(())
}

/// What applying a restore did.
#[derive(Debug, Default)]
pub struct Applied {
    pub written: u64,
    pub removed: u64,
}

/// What a restore changes in a root, worked out before anything is touched.
#[derive(Debug, Default)]
pub struct Plan {
    /// Files and links to delete.
    pub remove: Vec<Vec<u8>>,
    /// Folders to delete when empty, deepest first; `true` when a folder
    /// that stays is a conflict (the snapshot has a file there).
    pub rmdirs: Vec<(Vec<u8>, bool)>,
    /// Files and links to write back.
    pub write: Vec<(Vec<u8>, Mode, ObjectId)>,
    /// Folders that must exist afterwards.
    pub dirs: Vec<Vec<u8>>,
}

impl Plan {
    /// Everything that differs between `current` (a walk of the root) and
    /// `target` (a snapshot).
    pub fn whole(current: &Flat, target: &Flat) -> Result<Plan, SnapshotError> {
        let mut plan = Plan::default();
        for (p, &(mode, id)) in &target.leaves {
            if current.leaves.get(p) == Some(&(mode, id)) {
                continue;
            }
            if current.kept.contains(p) {
                return Err(kept_conflict(p));
            }
            plan.write.push((p.clone(), mode, id));
        }
        plan.remove = current
            .leaves
            .keys()
            .filter(|p| !target.leaves.contains_key(*p))
            .cloned()
            .collect();
        plan.rmdirs = current
            .dirs
            .iter()
            .rev()
            .filter(|p| !target.dirs.contains(*p))
            .map(|p| (p.clone(), target.leaves.contains_key(p)))
            .collect();
        plan.dirs = target.dirs.iter().cloned().collect();
        Ok(plan)
    }

    /// Only `paths`: each becomes what `target` has there (written, or
    /// removed when `target` has nothing there); every other path is left
    /// alone. A folder is removed only when it is on the way of one of
    /// `paths` and empty once they are dealt with.
    pub fn selective(
        current: &Flat,
        target: &Flat,
        paths: &BTreeSet<Vec<u8>>,
    ) -> Result<Plan, SnapshotError> {
        let mut plan = Plan::default();
        let mut rmdirs: BTreeSet<Vec<u8>> = BTreeSet::new();
        for p in paths {
            let want = target.leaves.get(p);
            let have = current.leaves.get(p);
            if want.is_some() && want == have {
                continue;
            }
            if current.kept.contains(p) {
                if want.is_some() {
                    return Err(kept_conflict(p));
                }
                continue;
            }
            match want {
                Some(&(mode, id)) => {
                    for a in ancestors(p) {
                        let goes = paths.contains(a) && !target.leaves.contains_key(a);
                        if (current.leaves.contains_key(a) && !goes) || current.kept.contains(a) {
                            return Err(SnapshotError::Conflict(format!(
                                "`{}` is in the way of `{}`, and it is not a path to restore",
                                String::from_utf8_lossy(a),
                                String::from_utf8_lossy(p)
                            )));
                        }
                    }
                    if current.dirs.contains(p) {
                        rmdirs.insert(p.clone());
                        let mut under = p.clone();
                        under.push(b'/');
                        rmdirs.extend(
                            current
                                .dirs
                                .range(under.clone()..)
                                .take_while(|d| d.starts_with(&under))
                                .cloned(),
                        );
                    }
                    plan.write.push((p.clone(), mode, id));
                }
                None if have.is_some() => {
                    plan.remove.push(p.clone());
                    rmdirs.extend(
                        ancestors(p)
                            .filter(|a| current.dirs.contains(*a) && !target.dirs.contains(*a))
                            .map(<[u8]>::to_vec),
                    );
                }
                None => {}
            }
        }
        plan.rmdirs = rmdirs
            .into_iter()
            .rev()
            .map(|d| {
                let conflict = target.leaves.contains_key(&d);
                (d, conflict)
            })
            .collect();
        Ok(plan)
    }
}

/// The folders that hold `p`, outermost first (`a`, `a/b` for `a/b/c`).
fn ancestors(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    p.iter()
        .enumerate()
        .filter(|(_, &b)| b == b'/')
        .map(move |(i, _)| &p[..i])
}

fn kept_conflict(p: &[u8]) -> SnapshotError {
    SnapshotError::Conflict(format!(
        "`{}` is in the snapshot, but now it is something snapshots leave out",
        String::from_utf8_lossy(p)
    ))
}

/// Carries out `plan` in `root`, in two phases so that a kill leaves the
/// root changed for as short a time as it can: first every file to write
/// back is staged in a folder of its own in the root (a kill here leaves
/// the root as it was; the folder's name is in `record` before it is
/// made, and the next restore removes it), then the root is changed with
/// deletions and renames alone, each in a folder opened beneath the root
/// with no link on the way.
pub fn apply(
    objects: &Objects,
    root: &Dir,
    plan: &Plan,
    max_file_bytes: u64,
    record: &Path,
) -> Result<Applied, SnapshotError> {
    let stage = Stage::new(root, record)?;
    // The stage goes whether the restore went through or stopped; one that
    // cannot be removed stays recorded for the next restore.
    let result = apply_staged(objects, root, plan, max_file_bytes, &stage);
    stage.finish(root, record);
    result
}

fn apply_staged(
    objects: &Objects,
    root: &Dir,
    plan: &Plan,
    max_file_bytes: u64,
    stage: &Stage,
) -> Result<Applied, SnapshotError> {
    let mut done = Applied::default();
    let mut staged = Vec::with_capacity(plan.write.len());
    for (i, (p, mode, id)) in plan.write.iter().enumerate() {
        staged.push((p, *mode, stage.put(objects, i, *mode, *id, max_file_bytes)?));
    }

    // From here on, the root changes.
    let mut parents = Parents::new(root);
    for p in &plan.remove {
        let (parent, name) = split(p);
        let dir = match parents.open(parent, false) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(root_err(p, e)),
        };
        match dir.unlink(name) {
            Ok(()) => done.removed += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {
                return Err(root_err(
                    p,
                    cairn_rootfs::changed("a folder now stands there"),
                ))
            }
            Err(e) => return Err(root_err(p, e)),
        }
    }
    // A folder that holds what snapshots leave out (or, for a selective
    // restore, files it leaves alone) stays.
    for (p, conflict) in &plan.rmdirs {
        let (parent, name) = split(p);
        let Ok(dir) = parents.open(parent, false) else {
            continue;
        };
        match dir.rmdir(name) {
            Ok(()) => done.removed += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) if *conflict => {
                return Err(SnapshotError::Conflict(format!(
                    "`{}` is a folder with files a restore leaves alone (.git, files over the size limit, files it was not asked to restore), where the snapshot has a file",
                    String::from_utf8_lossy(p)
                )));
            }
            Err(_) => {}
        }
    }
    for (p, mode, i) in staged {
        let (parent, name) = split(p);
        let dir = parents.open(parent, true).map_err(|e| root_err(p, e))?;
        stage.place(&i, mode, dir, name).map_err(|e| match e.raw_os_error() {
            Some(libc::EISDIR) | Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => {
                SnapshotError::Conflict(format!(
                    "`{}` is a folder now, where the snapshot has a file: something changed the root while it was restored",
                    String::from_utf8_lossy(p)
                ))
            }
            _ => root_err(p, e),
        })?;
        done.written += 1;
    }
    for p in &plan.dirs {
        root.create_dir_path(p).map_err(|e| root_err(p, e))?;
    }
    Ok(done)
}

/// An error on `rel` in the root, in words: a link or a file where a
/// folder was is a root changed under the restore, which stops rather
/// than follow it.
fn root_err(rel: &[u8], e: std::io::Error) -> SnapshotError {
    if cairn_rootfs::is_changed(&e) {
        return SnapshotError::Conflict(format!(
            "`{}` changed while it was restored (a link or a file now stands where a folder was, or the reverse): the restore stopped there and touched nothing through it",
            String::from_utf8_lossy(rel)
        ));
    }
    SnapshotError::io(Path::new(&*String::from_utf8_lossy(rel)), e)
}

/// `(folder, name)` of a root-relative path (`b""` for the root itself).
fn split(p: &[u8]) -> (&[u8], &[u8]) {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (b"", p),
    }
}

/// The folder opened last, kept for the next path in it (paths come
/// sorted, so most paths share the previous one's folder).
struct Parents<'a> {
    root: &'a Dir,
    last: Option<(Vec<u8>, Dir)>,
}

impl<'a> Parents<'a> {
    fn new(root: &'a Dir) -> Self {
        Parents { root, last: None }
    }

    /// The folder `rel`, opened beneath the root with no link on the way,
    /// made (with the folders it needs) when `create` is set.
    fn open(&mut self, rel: &[u8], create: bool) -> std::io::Result<&Dir> {
        if rel.is_empty() {
            return Ok(self.root);
        }
        let fresh = match &self.last {
            // A folder kept from before may have been made since (by the
            // restore); one to create is always opened again.
            Some((r, _)) if r == rel && !create => false,
            _ => true,
        };
        if fresh {
            let d = if create {
                self.root.create_dir_path(rel)?
            } else {
                self.root.open_dir_path(rel)?
            };
            self.last = Some((rel.to_vec(), d));
        }
        Ok(&self.last.as_ref().expect("just set").1)
    }
}

/// The record of a restore's stage folder, in the repository (outside the
/// root): written and synced before the folder is made, so that a kill at
/// any moment leaves the folder's exact name behind.
const RECORD_MAGIC: &str = "cairn-stage 1\n";

/// The stage folder's name a record names, when there is a valid record.
pub fn recorded_stage(record: &Path) -> Option<Vec<u8>> {
    let text = fs::read(record).ok()?;
    let name = text
        .strip_prefix(RECORD_MAGIC.as_bytes())?
        .strip_suffix(b"\n")?;
    let ok = name.starts_with(b".cairn-stage-") && !name.contains(&b'/') && !name.contains(&0);
    ok.then(|| name.to_vec())
}

fn write_record(record: &Path, name: &[u8]) -> Result<(), SnapshotError> {
    let dir = record.parent().unwrap_or(Path::new("."));
    let (tmp, mut f) = crate::object::tempfile_in(dir)?;
    let mut text = RECORD_MAGIC.as_bytes().to_vec();
    text.extend_from_slice(name);
    text.push(b'\n');
    f.write_all(&text)
        .and_then(|()| f.sync_all())
        .map_err(|e| SnapshotError::io(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, record).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        SnapshotError::io(record, e)
    })?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SnapshotError::io(dir, e))
}

/// Removes what a restore cut short left: exactly the stage folder its
/// record names (at the root, not followed if a link stands there now),
/// then the record. Something other than a folder under that name is not
/// the stage, and is left alone.
pub fn clear_leftover(root: &Dir, record: &Path) -> Result<(), SnapshotError> {
    let Some(name) = recorded_stage(record) else {
        return match fs::remove_file(record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SnapshotError::io(record, e)),
            _ => Ok(()),
        };
    };
    match root.lstat(&name) {
        Ok(st) if st.kind() == cairn_rootfs::Kind::Dir => root
            .remove_tree(&name, Some(&st))
            .map_err(|e| root_err(&name, e))?,
        _ => {}
    }
    fs::remove_file(record).map_err(|e| SnapshotError::io(record, e))
}

/// The folder a restore stages its files in, in the root (so that moving
/// them into place is a rename on the same file system).
struct Stage {
    name: Vec<u8>,
    dir: Dir,
    seen: Stat,
}

impl Stage {
    fn new(root: &Dir, record: &Path) -> Result<Stage, SnapshotError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            ".cairn-stage-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
        .into_bytes();
        write_record(record, &name)?;
        root.mkdir(&name, 0o700).map_err(|e| root_err(&name, e))?;
        let dir = root.open_dir(&name).map_err(|e| root_err(&name, e))?;
        let seen = dir.stat().map_err(|e| root_err(&name, e))?;
        Ok(Stage { name, dir, seen })
    }

    /// Writes blob `id` as staged file `i`, with its mode; returns its name.
    fn put(
        &self,
        objects: &Objects,
        i: usize,
        mode: Mode,
        id: ObjectId,
        max_file_bytes: u64,
    ) -> Result<Vec<u8>, SnapshotError> {
        let bytes = objects.read(id, Kind::Blob, max_file_bytes.max(1 << 20))?;
        let name = i.to_string().into_bytes();
        let err = |e| root_err(&join(&self.name, &name), e);
        if mode == Mode::Symlink {
            self.dir.symlink(&bytes, &name).map_err(err)?;
        } else {
            let mut f = self.dir.create(&name, perms(mode)).map_err(err)?;
            f.write_all(&bytes).map_err(err)?;
        }
        Ok(name)
    }

    /// Moves staged file `i` to `name` in `dir`; across a mount inside the
    /// root (`EXDEV`) it is copied there beside its name, then renamed.
    fn place(&self, i: &[u8], mode: Mode, dir: &Dir, name: &[u8]) -> std::io::Result<()> {
        match self.dir.rename(i, dir, name) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
            other => return other,
        }
        if mode == Mode::Symlink {
            let target = self.dir.read_link(i)?;
            let mut tmp = self.name.clone();
            tmp.extend_from_slice(b"-link");
            dir.symlink(&target, &tmp)?;
            dir.rename(&tmp, dir, name).inspect_err(|_| {
                let _ = dir.unlink(&tmp);
            })
        } else {
            let (mut f, _) = self.dir.open_file(i)?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut bytes)?;
            dir.write_replace(name, &bytes, perms(mode), false)
        }
    }

    /// Removes the stage (what is left of it) and then its record; a stage
    /// that cannot be removed keeps its record for the next restore.
    fn finish(self, root: &Dir, record: &Path) {
        if root.remove_tree(&self.name, Some(&self.seen)).is_ok() {
            let _ = fs::remove_file(record);
        }
    }
}

fn perms(mode: Mode) -> u32 {
    if mode == Mode::Executable {
        0o755
    } else {
        0o644
    }
}
