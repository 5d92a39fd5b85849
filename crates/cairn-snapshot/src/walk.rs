//! A walk of a root into tree objects: every directory becomes a tree,
//! every file and symbolic link a blob, read only when the stat cache does
//! not know it.
//!
//! The walk is read-only and never follows a link: it goes down through
//! folder descriptors ([`cairn_rootfs::Dir`]), lists a folder through its
//! own descriptor, takes each entry's `lstat` in its folder, opens a file
//! by its one name with `O_NOFOLLOW` (and reads it only when `fstat` of
//! what was opened is the regular file the `lstat` saw) and reads a link
//! with `readlinkat`. An entry that changes between those steps is looked
//! at again; one that vanishes is as if it had never been there.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read;

use cairn_rootfs::{Dir, Kind as FileKind};

use crate::cache::{Stat, StatCache};
use crate::object::{encode_tree, Kind, Mode, ObjectId, Objects, TreeEntry};
use crate::{Options, SkipReason, Skipped, SnapshotError};

/// Deepest folder nesting a walk goes down (a restore follows trees no
/// deeper either).
const MAX_DEPTH: usize = 512;
/// How many times an entry that changes while it is read is looked at
/// again before the walk gives up.
const RETRIES: usize = 4;

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

/// What a walk leaves out besides what the options do: root-relative
/// paths, and the stage of a restore that a kill cut short.
pub struct Skip<'a> {
    /// The caller's exclusions and the repository, relative to the root.
    pub exclude: &'a HashSet<Vec<u8>>,
    /// The recorded stage folder's name (at the root), while it exists.
    pub stage: Option<&'a [u8]>,
    /// Values no kept file or link may hold (a run's secrets): a file that
    /// holds one is left out, as [`SkipReason::HoldsSecret`].
    pub withhold: &'a [Vec<u8>],
}

impl Skip<'_> {
    /// Whether `bytes` hold one of the withheld values.
    fn withholds(&self, bytes: &[u8]) -> bool {
        self.withhold
            .iter()
            .any(|v| !v.is_empty() && memchr::memmem::find(bytes, v).is_some())
    }
}

impl Skip<'_> {
    /// Whether the entry `name` at `rel` is not the snapshot's, whatever
    /// it is.
    fn skips(&self, rel: &[u8], name: &[u8], at_root: bool) -> bool {
        name == b".git" || self.exclude.contains(rel) || (at_root && self.stage == Some(name))
    }
}

/// One walk's settings and tallies.
pub struct Walk<'a> {
    pub objects: &'a Objects,
    pub cache: &'a mut StatCache,
    pub opts: &'a Options,
    pub skip: Skip<'a>,
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

/// What one entry of a folder came to.
enum Step {
    /// Its mode, id and size; `None` when it is not in the snapshot.
    Done(Option<(Mode, ObjectId, u64)>),
    /// It changed while it was read: look again.
    Again,
}

fn io_err(rel: &[u8], e: std::io::Error) -> SnapshotError {
    SnapshotError::io(std::path::Path::new(&*String::from_utf8_lossy(rel)), e)
}

fn gone(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

impl Walk<'_> {
    /// The tree of the folder `dir` (whose path under the root is `rel`);
    /// `None` for a folder with nothing to keep (git has no empty trees).
    pub fn dir(
        &mut self,
        dir: &Dir,
        rel: &[u8],
        depth: usize,
    ) -> Result<Option<ObjectId>, SnapshotError> {
        if depth > MAX_DEPTH {
            return Err(SnapshotError::TooLarge(format!(
                "folders nested more than {MAX_DEPTH} deep"
            )));
        }
        let listing = match dir.entries() {
            Ok(l) => l,
            Err(e) if gone(&e) && !rel.is_empty() => return Ok(None),
            Err(e) => return Err(io_err(rel, e)),
        };
        if let Some(f) = &mut self.flat {
            if !rel.is_empty() {
                f.dirs.insert(rel.to_vec());
            }
        }
        let mut entries = Vec::new();
        for ent in listing {
            let name = ent.name;
            let child_rel = join(rel, &name);
            if self.skip.skips(&child_rel, &name, rel.is_empty()) {
                self.keep(&child_rel);
                continue;
            }
            let mut tries = 0;
            let found = loop {
                match self.entry(dir, &name, &child_rel, depth)? {
                    Step::Done(found) => break found,
                    Step::Again if tries < RETRIES => tries += 1,
                    Step::Again => {
                        return Err(io_err(
                            &child_rel,
                            cairn_rootfs::changed("it kept changing while it was read"),
                        ))
                    }
                }
            };
            let Some((mode, id, len)) = found else {
                continue;
            };
            if mode != Mode::Tree {
                self.files += 1;
                self.total_bytes += len;
                check_limits(self.files, self.total_bytes, self.opts)?;
                self.seen.insert(child_rel.clone());
                if let Some(f) = &mut self.flat {
                    f.leaves.insert(child_rel, (mode, id));
                }
            }
            entries.push(TreeEntry { name, mode, id });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let bytes = encode_tree(&mut entries);
        let (id, added) = self.objects.write(Kind::Tree, &bytes)?;
        self.count(added);
        Ok(Some(id))
    }

    /// The entry `name` of `dir`, by what its `lstat` says it is.
    fn entry(
        &mut self,
        dir: &Dir,
        name: &[u8],
        rel: &[u8],
        depth: usize,
    ) -> Result<Step, SnapshotError> {
        let st = match dir.lstat(name) {
            Ok(st) => st,
            Err(e) if gone(&e) => return Ok(Step::Done(None)),
            Err(e) => return Err(io_err(rel, e)),
        };
        match st.kind() {
            FileKind::Dir if name == b".cairn" => {
                // A store of Cairn's (this run's or a nested project's):
                // never the snapshot's.
                self.keep(rel);
                Ok(Step::Done(None))
            }
            FileKind::Dir => {
                let sub = match dir.open_dir_seen(name, &st) {
                    Ok(d) => d,
                    Err(e) if gone(&e) => return Ok(Step::Done(None)),
                    Err(e) if cairn_rootfs::is_changed(&e) => return Ok(Step::Again),
                    Err(e) => return Err(io_err(rel, e)),
                };
                Ok(Step::Done(
                    self.dir(&sub, rel, depth + 1)?
                        .map(|id| (Mode::Tree, id, 0)),
                ))
            }
            FileKind::Symlink => {
                let stat = Stat::of(&st);
                let id = match self.cache.get(rel, &stat) {
                    Some(id) => id,
                    None => match dir.read_link(name) {
                        Ok(target) if self.skip.withholds(&target) => {
                            self.cache.forget(rel);
                            self.skip(rel.to_vec(), SkipReason::HoldsSecret);
                            return Ok(Step::Done(None));
                        }
                        Ok(target) => self.store_blob(rel, stat, &target)?,
                        Err(e) if gone(&e) => return Ok(Step::Done(None)),
                        // EINVAL: not a link any more.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Step::Again),
                        Err(e) => return Err(io_err(rel, e)),
                    },
                };
                Ok(Step::Done(Some((Mode::Symlink, id, st.size))))
            }
            FileKind::File => self.file(dir, name, rel, &st),
            FileKind::Other => {
                self.skip(rel.to_vec(), SkipReason::NotAFile);
                Ok(Step::Done(None))
            }
        }
    }

    /// A regular file: its blob from the cache when its stat is unchanged,
    /// else read through a descriptor that is checked to be that file.
    fn file(
        &mut self,
        dir: &Dir,
        name: &[u8],
        rel: &[u8],
        st: &cairn_rootfs::Stat,
    ) -> Result<Step, SnapshotError> {
        if st.size > self.opts.max_file_bytes {
            self.skip(rel.to_vec(), SkipReason::TooLarge { bytes: st.size });
            return Ok(Step::Done(None));
        }
        let mode = if st.mode & 0o111 != 0 {
            Mode::Executable
        } else {
            Mode::File
        };
        if let Some(id) = self.cache.get(rel, &Stat::of(st)) {
            return Ok(Step::Done(Some((mode, id, st.size))));
        }
        let (f, opened) = match dir.open_file(name) {
            Ok(x) => x,
            Err(e) if gone(&e) => return Ok(Step::Done(None)),
            // A link or something else now stands there.
            Err(e)
                if e.kind() == std::io::ErrorKind::InvalidInput
                    || e.raw_os_error() == Some(libc::ELOOP) =>
            {
                return Ok(Step::Again)
            }
            Err(e) => return Err(io_err(rel, e)),
        };
        if !opened.same_inode(st) {
            return Ok(Step::Again);
        }
        let mut bytes = Vec::new();
        f.take(self.opts.max_file_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_err(rel, e))?;
        if bytes.len() as u64 > self.opts.max_file_bytes {
            // Grew past the limit while we read it.
            self.skip(rel.to_vec(), SkipReason::TooLarge { bytes: st.size });
            return Ok(Step::Done(None));
        }
        if self.skip.withholds(&bytes) {
            // Never stored, never remembered: the next walk reads it again.
            self.cache.forget(rel);
            self.skip(rel.to_vec(), SkipReason::HoldsSecret);
            return Ok(Step::Done(None));
        }
        let mode = if opened.mode & 0o111 != 0 {
            Mode::Executable
        } else {
            Mode::File
        };
        let id = self.store_blob(rel, Stat::of(&opened), &bytes)?;
        Ok(Step::Done(Some((mode, id, bytes.len() as u64))))
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
/// fails as soon as that passes the limits. Read-only and link-free like
/// the walk; what cannot be read is not counted.
pub fn survey(root: &Dir, skip: &Skip<'_>, opts: &Options) -> Result<(), SnapshotError> {
    let mut tally = (0u64, 0u64);
    survey_dir(root, b"", 0, skip, opts, &mut tally)
}

/// One folder of a survey; recursion holds one descriptor per level.
fn survey_dir(
    dir: &Dir,
    rel: &[u8],
    depth: usize,
    skip: &Skip<'_>,
    opts: &Options,
    tally: &mut (u64, u64),
) -> Result<(), SnapshotError> {
    let Ok(listing) = dir.entries() else {
        return Ok(());
    };
    for ent in listing {
        let child_rel = join(rel, &ent.name);
        if skip.skips(&child_rel, &ent.name, rel.is_empty()) {
            continue;
        }
        let Ok(st) = dir.lstat(&ent.name) else {
            continue;
        };
        match st.kind() {
            FileKind::Dir if ent.name == b".cairn" || depth >= MAX_DEPTH => {}
            FileKind::Dir => {
                if let Ok(sub) = dir.open_dir_seen(&ent.name, &st) {
                    survey_dir(&sub, &child_rel, depth + 1, skip, opts, tally)?;
                }
            }
            FileKind::File | FileKind::Symlink if st.size <= opts.max_file_bytes => {
                tally.0 += 1;
                tally.1 += st.size;
                check_limits(tally.0, tally.1, opts)?;
            }
            _ => {}
        }
    }
    Ok(())
}
