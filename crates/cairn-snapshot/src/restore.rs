//! Putting a root back as a snapshot has it: files written, changed or
//! deleted since are written back, files that were not there are deleted.
//!
//! Every file is written aside and renamed over its name, so no file is
//! ever half-written; a restore cut short is finished by running it again
//! (it compares before it writes). Nothing is written through a symbolic
//! link: a folder on the way that has become a link (or a file) is
//! replaced by a real folder first, so a link planted in the root cannot
//! make a restore write outside it.

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

/// Makes `root` (whose walk is `current`) hold `target`.
pub fn apply(
    objects: &Objects,
    root: &Path,
    current: &Flat,
    target: &Flat,
    max_file_bytes: u64,
) -> Result<Applied, SnapshotError> {
    let mut done = Applied::default();
    // Files and links that the snapshot does not have at that path.
    for p in current.leaves.keys() {
        if !target.leaves.contains_key(p) {
            let abs = abs_of(root, p);
            match fs::remove_file(&abs) {
                Ok(()) => done.removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(SnapshotError::io(&abs, e)),
            }
        }
    }
    // Folders the snapshot does not have, deepest first; one that holds
    // what snapshots leave out stays.
    for p in current.dirs.iter().rev() {
        if target.dirs.contains(p) {
            continue;
        }
        let abs = abs_of(root, p);
        match fs::remove_dir(&abs) {
            Ok(()) => done.removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) if target.leaves.contains_key(p) => {
                return Err(SnapshotError::Conflict(format!(
                    "`{}` is a folder with files that snapshots leave out (.git, files over the size limit), where the snapshot has a file",
                    String::from_utf8_lossy(p)
                )));
            }
            Err(_) => {}
        }
    }
    for (p, &(mode, id)) in &target.leaves {
        if current.leaves.get(p) == Some(&(mode, id)) {
            continue;
        }
        if current.kept.contains(p) {
            return Err(SnapshotError::Conflict(format!(
                "`{}` is in the snapshot, but now it is something snapshots leave out",
                String::from_utf8_lossy(p)
            )));
        }
        write_leaf(objects, root, p, mode, id, max_file_bytes)?;
        done.written += 1;
    }
    for p in &target.dirs {
        ensure_dir(root, p)?;
    }
    Ok(done)
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

fn write_leaf(
    objects: &Objects,
    root: &Path,
    rel: &[u8],
    mode: Mode,
    id: ObjectId,
    max_file_bytes: u64,
) -> Result<(), SnapshotError> {
    let (parent, _) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&b""[..], rel),
    };
    if !parent.is_empty() {
        ensure_dir(root, parent)?;
    }
    let dest = abs_of(root, rel);
    // A folder where the file goes (one the removals could not take away
    // is a conflict, found above).
    if fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(&dest).map_err(|e| SnapshotError::io(&dest, e))?;
    }
    let dir = dest.parent().unwrap_or(root);
    let bytes = objects.read(id, Kind::Blob, max_file_bytes.max(1 << 20))?;
    let tmp = if mode == Mode::Symlink {
        let tmp = temp_name(dir);
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&bytes), &tmp)
            .map_err(|e| SnapshotError::io(&tmp, e))?;
        tmp
    } else {
        let (tmp, mut f) = crate::object::tempfile_in(dir)?;
        let perms = if mode == Mode::Executable {
            0o755
        } else {
            0o644
        };
        f.write_all(&bytes)
            .and_then(|_| f.set_permissions(fs::Permissions::from_mode(perms)))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                SnapshotError::io(&tmp, e)
            })?;
        tmp
    };
    fs::rename(&tmp, &dest).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        SnapshotError::io(&dest, e)
    })
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
