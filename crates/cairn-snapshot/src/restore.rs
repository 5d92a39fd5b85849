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
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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
/// the root as it was), then the root is changed with deletions and
/// renames alone.
pub fn apply(
    objects: &Objects,
    root: &Path,
    plan: &Plan,
    max_file_bytes: u64,
) -> Result<Applied, SnapshotError> {
    let mut done = Applied::default();
    let stage = Stage::new(root)?;
    let mut staged = Vec::with_capacity(plan.write.len());
    for (i, (p, mode, id)) in plan.write.iter().enumerate() {
        staged.push((p, stage.put(objects, i, *mode, *id, max_file_bytes)?));
    }

    // From here on, the root changes.
    for p in &plan.remove {
        let abs = abs_of(root, p);
        match fs::remove_file(&abs) {
            Ok(()) => done.removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SnapshotError::io(&abs, e)),
        }
    }
    // A folder that holds what snapshots leave out (or, for a selective
    // restore, files it leaves alone) stays.
    for (p, conflict) in &plan.rmdirs {
        let abs = abs_of(root, p);
        match fs::remove_dir(&abs) {
            Ok(()) => done.removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) if *conflict => {
                return Err(SnapshotError::Conflict(format!(
                    "`{}` is a folder with files a restore leaves alone (.git, files over the size limit, files it was not asked to restore), where the snapshot has a file",
                    String::from_utf8_lossy(p)
                )));
            }
            Err(_) => {}
        }
    }
    for (p, from) in staged {
        place(root, p, &from)?;
        done.written += 1;
    }
    for p in &plan.dirs {
        ensure_dir(root, p)?;
    }
    stage.remove();
    Ok(done)
}

/// The folder a restore stages its files in, in the root (so that moving
/// them into place is a rename on the same file system).
struct Stage {
    dir: PathBuf,
}

impl Stage {
    fn new(root: &Path) -> Result<Stage, SnapshotError> {
        let dir = temp_name(root);
        fs::create_dir(&dir).map_err(|e| SnapshotError::io(&dir, e))?;
        Ok(Stage { dir })
    }

    /// Writes blob `id` as staged file `i`, with its mode.
    fn put(
        &self,
        objects: &Objects,
        i: usize,
        mode: Mode,
        id: ObjectId,
        max_file_bytes: u64,
    ) -> Result<PathBuf, SnapshotError> {
        let bytes = objects.read(id, Kind::Blob, max_file_bytes.max(1 << 20))?;
        let path = self.dir.join(i.to_string());
        if mode == Mode::Symlink {
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&bytes), &path)
                .map_err(|e| SnapshotError::io(&path, e))?;
        } else {
            let perms = if mode == Mode::Executable {
                0o755
            } else {
                0o644
            };
            let mut f = fs::File::create(&path).map_err(|e| SnapshotError::io(&path, e))?;
            f.write_all(&bytes)
                .and_then(|_| f.set_permissions(fs::Permissions::from_mode(perms)))
                .map_err(|e| SnapshotError::io(&path, e))?;
        }
        Ok(path)
    }

    fn remove(self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Moves a staged file to its place, making the folders on its way (and
/// taking away a folder where the file goes).
fn place(root: &Path, rel: &[u8], from: &Path) -> Result<(), SnapshotError> {
    if let Some(i) = rel.iter().rposition(|&b| b == b'/') {
        ensure_dir(root, &rel[..i])?;
    }
    let dest = abs_of(root, rel);
    if fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(&dest).map_err(|e| SnapshotError::io(&dest, e))?;
    }
    match fs::rename(from, &dest) {
        Ok(()) => Ok(()),
        // A mount inside the root: the file is copied across instead.
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let dir = dest.parent().unwrap_or(root);
            let tmp = temp_name(dir);
            copy_leaf(from, &tmp).map_err(|e| SnapshotError::io(&tmp, e))?;
            fs::rename(&tmp, &dest).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                SnapshotError::io(&dest, e)
            })
        }
        Err(e) => Err(SnapshotError::io(&dest, e)),
    }
}

fn copy_leaf(from: &Path, to: &Path) -> std::io::Result<()> {
    let m = fs::symlink_metadata(from)?;
    if m.is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)
    } else {
        fs::copy(from, to).map(|_| ())
    }
}

fn abs_of(root: &Path, rel: &[u8]) -> PathBuf {
    root.join(std::ffi::OsStr::from_bytes(rel))
}

/// Makes every folder on `rel` a real folder, replacing a link or a file
/// that stands where one should be.
fn ensure_dir(root: &Path, rel: &[u8]) -> Result<(), SnapshotError> {
    let mut abs = root.to_path_buf();
    for part in rel.split(|&b| b == b'/') {
        abs.push(std::ffi::OsStr::from_bytes(part));
        match fs::symlink_metadata(&abs) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => fs::remove_file(&abs).map_err(|e| SnapshotError::io(&abs, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SnapshotError::io(&abs, e)),
        }
        match fs::create_dir(&abs) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SnapshotError::io(&abs, e)),
        }
    }
    Ok(())
}

fn temp_name(dir: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    dir.join(format!(
        "{}{}-l{}",
        crate::TEMP_PREFIX,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}
