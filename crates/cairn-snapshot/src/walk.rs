//! A walk of a root into tree objects: every directory becomes a tree,
//! every file and symbolic link a blob, read only when the stat cache does
//! not know it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cache::{Stat, StatCache};
use crate::object::{encode_tree, Kind, Mode, ObjectId, Objects, TreeEntry};
use crate::{Options, SkipReason, Skipped, SnapshotError, TEMP_PREFIX};

/// A root as a flat list: what a restore compares.
#[derive(Debug, Default)]
pub struct Flat {
    /// Files and links by path, with their mode and blob.
    pub leaves: BTreeMap<Vec<u8>, (Mode, ObjectId)>,
    /// Every directory (for a walk, also the empty ones).
    pub dirs: BTreeSet<Vec<u8>>,
    /// What the walk left out (excluded, too large, not a file): a
    /// restore leaves these alone, and the folders that hold them.
    pub kept: BTreeSet<Vec<u8>>,
}

/// One walk's settings and tallies.
pub struct Walk<'a> {
    pub objects: &'a Objects,
    pub cache: &'a mut StatCache,
    pub opts: &'a Options,
    pub exclude: &'a [PathBuf],
    /// Bytes of the files kept so far.
    pub total_bytes: u64,
    /// Files whose times are later than this are not remembered.
    pub trust_before_ns: i64,
    pub seen: HashSet<Vec<u8>>,
    pub files: u64,
    pub bytes_added: u64,
    pub objects_added: u64,
    pub skipped: Vec<Skipped>,
    /// Filled when the caller wants the flat list too.
    pub flat: Option<Flat>,
}

impl Walk<'_> {
    /// The tree of `abs` (whose path under the root is `rel`); `None` for a
    /// folder with nothing to keep (git has no empty trees).
    pub fn dir(&mut self, abs: &Path, rel: &[u8]) -> Result<Option<ObjectId>, SnapshotError> {
        let read = match fs::read_dir(abs) {
            Ok(r) => r,
            // Removed while we walked: as if it had never been there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !rel.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(SnapshotError::io(abs, e)),
        };
        if let Some(f) = &mut self.flat {
            if !rel.is_empty() {
                f.dirs.insert(rel.to_vec());
            }
        }
        let mut entries = Vec::new();
        for ent in read {
            let ent = ent.map_err(|e| SnapshotError::io(abs, e))?;
            let name = ent.file_name();
            let name = name.as_bytes();
            let path = ent.path();
            let child_rel = join(rel, name);
            if name == b".git" || self.exclude.contains(&path) {
                self.keep(&child_rel);
                continue;
            }
            if name.starts_with(TEMP_PREFIX.as_bytes()) {
                // A restore's file or stage that a kill left behind: not
                // the user's.
                if fs::remove_file(&path).is_err() {
                    let _ = fs::remove_dir_all(&path);
                }
                continue;
            }
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(SnapshotError::io(&path, e)),
            };
            let ft = meta.file_type();
            let entry = if ft.is_dir() {
                match self.dir(&path, &child_rel)? {
                    Some(id) => (Mode::Tree, id),
                    None => continue,
                }
            } else if ft.is_symlink() {
                let stat = Stat::of(&meta);
                let id = match self.cache.get(&child_rel, &stat) {
                    Some(id) => id,
                    None => {
                        let target = match fs::read_link(&path) {
                            Ok(t) => t,
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(SnapshotError::io(&path, e)),
                        };
                        self.store_blob(&child_rel, stat, target.as_os_str().as_bytes())?
                    }
                };
                (Mode::Symlink, id)
            } else if ft.is_file() {
                if meta.len() > self.opts.max_file_bytes {
                    self.skip(child_rel, SkipReason::TooLarge { bytes: meta.len() });
                    continue;
                }
                let stat = Stat::of(&meta);
                let mode = if meta.permissions().mode() & 0o111 != 0 {
                    Mode::Executable
                } else {
                    Mode::File
                };
                let id = match self.cache.get(&child_rel, &stat) {
                    Some(id) => id,
                    None => match self.read_file(&path)? {
                        Some(bytes) => self.store_blob(&child_rel, stat, &bytes)?,
                        None => {
                            // Grew past the limit while we read it.
                            self.skip(child_rel, SkipReason::TooLarge { bytes: meta.len() });
                            continue;
                        }
                    },
                };
                (mode, id)
            } else {
                self.skip(child_rel, SkipReason::NotAFile);
                continue;
            };
            if entry.0 != Mode::Tree {
                self.files += 1;
                self.total_bytes += meta.len();
                check_limits(self.files, self.total_bytes, self.opts)?;
                self.seen.insert(child_rel.clone());
                if let Some(f) = &mut self.flat {
                    f.leaves.insert(child_rel, entry);
                }
            }
            entries.push(TreeEntry {
                name: name.to_vec(),
                mode: entry.0,
                id: entry.1,
            });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let bytes = encode_tree(&mut entries);
        let (id, added) = self.objects.write(Kind::Tree, &bytes)?;
        self.count(added);
        Ok(Some(id))
    }

    /// The file's bytes, or `None` once it is larger than the limit.
    fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SnapshotError> {
        let f = match fs::File::open(path) {
            Ok(f) => f,
            Err(e) => return Err(SnapshotError::io(path, e)),
        };
        let mut bytes = Vec::new();
        f.take(self.opts.max_file_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| SnapshotError::io(path, e))?;
        Ok((bytes.len() as u64 <= self.opts.max_file_bytes).then_some(bytes))
    }

    fn store_blob(
        &mut self,
        rel: &[u8],
        stat: Stat,
        bytes: &[u8],
    ) -> Result<ObjectId, SnapshotError> {
        let (id, added) = self.objects.write(Kind::Blob, bytes)?;
        self.count(added);
        if stat.newest_ns() < self.trust_before_ns {
            self.cache.put(rel.to_vec(), stat, id);
        } else {
            self.cache.forget(rel);
        }
        Ok(id)
    }

    fn count(&mut self, added: u64) {
        if added > 0 {
            self.bytes_added += added;
            self.objects_added += 1;
        }
    }

    fn keep(&mut self, rel: &[u8]) {
        if let Some(f) = &mut self.flat {
            f.kept.insert(rel.to_vec());
        }
    }

    fn skip(&mut self, rel: Vec<u8>, why: SkipReason) {
        self.keep(&rel);
        self.skipped.push(Skipped {
            path: String::from_utf8_lossy(&rel).into_owned(),
            why,
        });
    }
}

/// `rel/name`, or `name` at the root.
pub fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    if !rel.is_empty() {
        p.extend_from_slice(rel);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn check_limits(files: u64, bytes: u64, opts: &Options) -> Result<(), SnapshotError> {
    if files > opts.max_files {
        return Err(SnapshotError::TooLarge(format!(
            "more than {} files",
            opts.max_files
        )));
    }
    if bytes > opts.max_total_bytes {
        return Err(SnapshotError::TooLarge(format!(
            "more than {} MiB in its files",
            opts.max_total_bytes >> 20
        )));
    }
    Ok(())
}

/// Counts what a snapshot of `root` would hold with `lstat` alone, and
/// fails as soon as that passes the limits.
pub fn survey(root: &Path, exclude: &[PathBuf], opts: &Options) -> Result<(), SnapshotError> {
    let mut files = 0u64;
    let mut bytes = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = fs::read_dir(&dir) else {
            continue;
        };
        for ent in read.flatten() {
            let path = ent.path();
            if ent.file_name().as_bytes() == b".git" || exclude.contains(&path) {
                continue;
            }
            let Ok(ft) = ent.file_type() else { continue };
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() || ft.is_symlink() {
                let len = ent.metadata().map(|m| m.len()).unwrap_or(0);
                if len <= opts.max_file_bytes {
                    files += 1;
                    bytes += len;
                    check_limits(files, bytes, opts)?;
                }
            }
        }
    }
    Ok(())
}
