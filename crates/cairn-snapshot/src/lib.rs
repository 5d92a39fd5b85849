//! Workspace snapshots: a sandbox root kept as git tree objects in a
//! repository of Cairn's own, so that what an agent did to the files can be
//! undone, and a forked run can start from the files as they were.
//!
//! The repository is a bare git repository beside Cairn's store (its
//! `objects`, `HEAD` and `config`); the user's own repository, its index
//! and its `.git` folder are never read or written. A snapshot is the id of
//! a tree: `git --git-dir <dir> ls-tree -r <id>` lists it.
//!
//! - **Incremental.** Objects are named by their bytes, so a file that did
//!   not change is never stored twice; a stat cache per root (see `cache`)
//!   means an unchanged file is not even read again. Taking a snapshot of
//!   an unchanged root costs one walk of its folders.
//! - **What is in it.** Every file, executable bit and symbolic link under
//!   the root, tracked by git or not, ignored or not, except `.git` folders,
//!   the paths the caller excludes (the store itself), files larger than
//!   [`Options::max_file_bytes`], and what is not a file, a folder or a link
//!   (sockets, FIFOs, devices). Empty folders are not kept (git has no
//!   empty trees). Permissions other than the execute bit, owners and
//!   times are not kept.
//! - **Restore** writes back what differs and deletes what the snapshot
//!   does not have, leaving alone what snapshots leave out (see `restore`).
//!   A restore cut short is finished by running it again.
//!
//! Snapshots and restores of one root are serialized, across processes
//! too, by a lock file in the repository.

mod cache;
mod mirror;
mod object;
mod restore;
mod walk;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sha1::{Digest, Sha1};

pub use mirror::{reachable_in, MemoryMirror, MirroredObject, ObjectMirror};
pub use object::{Kind, Mode, ObjectId};

use cache::StatCache;
use object::Objects;

/// Temporary files in the repository (an object or a cache being written)
/// start with this. Never a rule in a root: a walk deletes nothing, and a
/// restore's leftovers are found from its record.
pub const TEMP_PREFIX: &str = ".cairn-tmp-";

/// How close to a walk a file's times may be for the stat cache to trust
/// them; see the `cache` module.
const RACY: Duration = Duration::from_secs(2);

/// What went wrong with a snapshot or a restore.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The repository has no object of that id (a snapshot taken with
    /// another store, or one deleted).
    #[error("snapshot object {0} is not in Cairn's snapshot repository")]
    Missing(String),
    /// An object does not read back as what its name says.
    #[error("snapshot object {id} is damaged: {why}")]
    Corrupt {
        /// The object.
        id: String,
        /// What is wrong with it.
        why: String,
    },
    /// Not a snapshot id.
    #[error("`{0}` is not a snapshot id (40 lowercase hex digits)")]
    BadId(String),
    /// The root cannot be made to hold the snapshot.
    #[error("{0}")]
    Conflict(String),
    /// A path given to a selective restore is not a plain path under the
    /// root (empty, absolute, or with an empty, `.` or `..` part).
    #[error("`{0}` is not a path under the root")]
    BadPath(String),
    /// The root is larger than a snapshot may be ([`Options`]).
    #[error("the sandbox root is too large to snapshot: {0}")]
    TooLarge(String),
    /// The shared store that mirrors the repository's objects failed
    /// ([`SnapshotStore::with_mirror`]).
    #[error("the store's snapshot objects: {0}")]
    Mirror(String),
}

impl SnapshotError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A snapshot repository's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Files larger than this are left out of snapshots (and left alone by
    /// restores). 32 MiB by default.
    pub max_file_bytes: u64,
    /// A root with more files than this is not snapshotted at all (100,000
    /// by default): a root that holds a build folder or a home directory
    /// would cost minutes and gigabytes per attempt.
    pub max_files: u64,
    /// Nor is a root whose files (those not left out) hold more bytes than
    /// this, 2 GiB by default.
    pub max_total_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_file_bytes: 32 << 20,
            max_files: 100_000,
            max_total_bytes: 2 << 30,
        }
    }
}

/// Why a path is not in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Larger than [`Options::max_file_bytes`].
    TooLarge {
        /// Its size.
        bytes: u64,
    },
    /// A socket, a FIFO or a device.
    NotAFile,
    /// It holds one of the values the snapshot was told to withhold (a
    /// run's secrets, which Cairn never keeps): left out. A restore does
    /// not know those values: to it the path is one the snapshot does not
    /// have (a full [`SnapshotStore::restore`] removes it; a run's reverts
    /// put back only the paths its attempts changed, with
    /// [`SnapshotStore::restore_paths`]).
    HoldsSecret,
}

/// A path a snapshot left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Relative to the root.
    pub path: String,
    /// Why.
    pub why: SkipReason,
}

/// A snapshot taken.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The tree's id.
    pub id: ObjectId,
    /// Files and links in it.
    pub files: u64,
    /// New objects this snapshot stored (0 for an unchanged root).
    pub objects_added: u64,
    /// Bytes those objects take in the repository.
    pub bytes_added: u64,
    /// What it left out.
    pub skipped: Vec<Skipped>,
}

/// A restore done.
#[derive(Debug, Clone)]
pub struct Restored {
    /// A snapshot of the root as it was before the restore (restoring it
    /// undoes the restore).
    pub before: ObjectId,
    /// Files and links written back.
    pub written: u64,
    /// Files, links and folders deleted.
    pub removed: u64,
}

/// What a prune deleted.
#[derive(Debug, Clone, Default)]
pub struct Pruned {
    /// Objects deleted.
    pub objects: u64,
    /// The bytes they took.
    pub bytes: u64,
    /// Objects kept.
    pub kept: u64,
}

/// Cairn's snapshot repository.
pub struct SnapshotStore {
    dir: PathBuf,
    objects: Objects,
    opts: Options,
    /// Each root's stat cache, loaded once per process.
    caches: Mutex<HashMap<PathBuf, Arc<Mutex<StatCache>>>>,
    /// Where the objects are kept for other machines too, if anywhere.
    mirror: Option<mirror::Mirrored>,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("dir", &self.dir)
            .finish()
    }
}

impl SnapshotStore {
    /// Opens the repository at `dir`, making it (a bare git repository)
    /// when it is not there.
    pub fn open(dir: impl Into<PathBuf>, opts: Options) -> Result<SnapshotStore, SnapshotError> {
        let dir = dir.into();
        for sub in ["objects", "refs/heads", "refs/tags", "cairn"] {
            let p = dir.join(sub);
            fs::create_dir_all(&p).map_err(|e| SnapshotError::io(&p, e))?;
        }
        for (name, text) in [
            ("HEAD", "ref: refs/heads/main\n"),
            (
                "config",
                "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n",
            ),
            (
                "description",
                "Cairn's workspace snapshots: tree objects only, no commits.\n",
            ),
        ] {
            let p = dir.join(name);
            if !p.exists() {
                fs::write(&p, text).map_err(|e| SnapshotError::io(&p, e))?;
            }
        }
        Ok(SnapshotStore {
            objects: Objects::new(dir.join("objects")),
            dir,
            opts,
            caches: Mutex::new(HashMap::new()),
            mirror: None,
        })
    }

    /// Keeps the objects in `mirror` too (the database of a store that
    /// many machines share): a snapshot copies there what it lacks before
    /// its id is returned, and a restore, a listing or a reading of a
    /// snapshot first copies from there what this folder lacks.
    pub fn with_mirror(mut self, mirror: Arc<dyn ObjectMirror>) -> SnapshotStore {
        self.mirror = Some(mirror::Mirrored::new(mirror));
        self
    }

    /// Copies into `to` the objects of snapshot `id` it lacks (a bundle's
    /// objects, `cairn export --bundle`). Returns how many.
    pub fn export_snapshot(
        &self,
        id: ObjectId,
        to: Arc<dyn ObjectMirror>,
    ) -> Result<usize, SnapshotError> {
        self.pull(id)?;
        mirror::Mirrored::new(to).push(&self.objects, id)
    }

    /// Copies from `from` the objects of snapshot `id` this repository
    /// lacks, each checked against its id (a bundle's objects, read in).
    /// Returns how many.
    pub fn import_snapshot(
        &self,
        id: ObjectId,
        from: Arc<dyn ObjectMirror>,
    ) -> Result<usize, SnapshotError> {
        mirror::Mirrored::new(from).pull(&self.objects, id)
    }

    /// Brings the objects of snapshot `id` from the mirror when this
    /// folder lacks some of them.
    fn pull(&self, id: ObjectId) -> Result<(), SnapshotError> {
        if let Some(m) = &self.mirror {
            m.pull(&self.objects, id)?;
        }
        Ok(())
    }

    /// Deletes from the mirror the objects that no snapshot in `keep`
    /// reaches (its trees read from the mirror), sparing those stored
    /// within `grace`: a snapshot under way copies its objects before its
    /// id is in any log. `None` without a mirror.
    pub fn prune_mirror(
        &self,
        keep: &[ObjectId],
        grace: Duration,
    ) -> Result<Option<Pruned>, SnapshotError> {
        let Some(m) = &self.mirror else {
            return Ok(None);
        };
        let live = reachable_in(m.mirror.as_ref(), keep)?;
        let (objects, bytes, kept) = m
            .mirror
            .retain(&live, grace)
            .map_err(SnapshotError::Mirror)?;
        m.forget_all();
        Ok(Some(Pruned {
            objects,
            bytes,
            kept,
        }))
    }

    /// The repository's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the repository holds the snapshot `id`.
    pub fn contains(&self, id: ObjectId) -> bool {
        id == ObjectId::EMPTY_TREE || self.objects.contains(id)
    }

    /// Takes a snapshot of `root`, leaving out the paths in `exclude` (and
    /// what is under them).
    pub fn snapshot(&self, root: &Path, exclude: &[PathBuf]) -> Result<Snapshot, SnapshotError> {
        self.snapshot_withholding(root, exclude, &[])
    }

    /// [`SnapshotStore::snapshot`], leaving out as well every file and
    /// link that holds one of the values in `withhold` (a run's secrets):
    /// they are listed as [`SkipReason::HoldsSecret`], and no byte of them
    /// reaches the repository.
    pub fn snapshot_withholding(
        &self,
        root: &Path,
        exclude: &[PathBuf],
        withhold: &[Vec<u8>],
    ) -> Result<Snapshot, SnapshotError> {
        let root = canonical(root)?;
        let _lock = self.lock(&root)?;
        let dir = open_root(&root)?;
        let exclude = self.excluding(&root, exclude);
        let stage = restore::recorded_stage(&self.record_path(&root));
        let skip = walk::Skip {
            exclude: &exclude,
            stage: stage.as_deref(),
            withhold,
        };
        let cache = self.cache_of(&root);
        let mut cache = cache.lock().unwrap();
        if cache.is_empty() {
            // Nothing known of this root yet: its size is measured with
            // `lstat` alone before a byte of it is read or stored.
            walk::survey(&dir, &skip, &self.opts)?;
        }
        let (snap, _) = self.walk(&dir, &skip, &mut cache, false)?;
        cache.save(&self.cache_path(&root))?;
        if let Some(m) = &self.mirror {
            m.push(&self.objects, snap.id)?;
        }
        Ok(snap)
    }

    /// Makes `root` hold the snapshot `id`: see the crate's documentation.
    pub fn restore(
        &self,
        root: &Path,
        id: ObjectId,
        exclude: &[PathBuf],
    ) -> Result<Restored, SnapshotError> {
        self.restore_with(root, id, exclude, None, &[])
    }

    /// Makes each path in `paths` (root-relative, '/'-separated bytes) what
    /// snapshot `id` has: written when the snapshot has it, removed when it
    /// does not; every other path is left alone. A folder is removed only
    /// when one of `paths` was in it and it is empty afterwards (and the
    /// snapshot has no folder there). A path that snapshots leave out
    /// (excluded, `.git`, too large) is left alone when the snapshot does
    /// not have it, and a conflict when it does; so is a file or link that
    /// stands where a folder on the way of one of `paths` should be, unless
    /// it is itself one of `paths` to remove.
    pub fn restore_paths(
        &self,
        root: &Path,
        id: ObjectId,
        paths: &[Vec<u8>],
        exclude: &[PathBuf],
    ) -> Result<Restored, SnapshotError> {
        self.restore_paths_withholding(root, id, paths, exclude, &[])
    }

    /// [`SnapshotStore::restore_paths`], where a file or link that holds
    /// one of the values in `withhold` (a run's secrets) is never read into
    /// the snapshots the restore takes of the root before and after it: to
    /// the restore it is a path left out, left alone unless it is one of
    /// `paths`, and then a conflict when the snapshot has it.
    pub fn restore_paths_withholding(
        &self,
        root: &Path,
        id: ObjectId,
        paths: &[Vec<u8>],
        exclude: &[PathBuf],
        withhold: &[Vec<u8>],
    ) -> Result<Restored, SnapshotError> {
        let mut set = std::collections::BTreeSet::new();
        for p in paths {
            check_rel(p)?;
            set.insert(p.clone());
        }
        self.restore_with(root, id, exclude, Some(&set), withhold)
    }

    /// Snapshot `id` as a flat list: each file's and link's path (relative
    /// to the root, '/'-separated bytes) with its mode and blob, so that two
    /// snapshots can be compared path by path.
    pub fn flat(
        &self,
        id: ObjectId,
    ) -> Result<std::collections::BTreeMap<Vec<u8>, (Mode, ObjectId)>, SnapshotError> {
        self.pull(id)?;
        Ok(restore::flatten(&self.objects, id)?.leaves)
    }

    fn restore_with(
        &self,
        root: &Path,
        id: ObjectId,
        exclude: &[PathBuf],
        only: Option<&std::collections::BTreeSet<Vec<u8>>>,
        withhold: &[Vec<u8>],
    ) -> Result<Restored, SnapshotError> {
        let root = canonical(root)?;
        self.pull(id)?;
        let target = restore::flatten(&self.objects, id)?;
        let _lock = self.lock(&root)?;
        let dir = open_root(&root)?;
        let exclude = self.excluding(&root, exclude);
        let record = self.record_path(&root);
        // A restore a kill cut short left its stage: exactly the folder
        // its record names goes, before anything else.
        restore::clear_leftover(&dir, &record)?;
        let skip = walk::Skip {
            exclude: &exclude,
            stage: None,
            withhold,
        };
        let cache = self.cache_of(&root);
        let mut cache = cache.lock().unwrap();
        let (before, current) = self.walk(&dir, &skip, &mut cache, true)?;
        let current = current.expect("asked for the flat list");
        let plan = match only {
            None => restore::Plan::whole(&current, &target)?,
            Some(paths) => restore::Plan::selective(&current, &target, paths)?,
        };
        let applied = restore::apply(
            &self.objects,
            &dir,
            &plan,
            self.opts.max_file_bytes,
            &record,
        )?;
        // A stage that could not be removed is still recorded: skipped.
        let stage = restore::recorded_stage(&record);
        let skip = walk::Skip {
            exclude: &exclude,
            stage: stage.as_deref(),
            withhold,
        };
        // What was written is checked, not assumed: a walk of the root now
        // must give the snapshot's own id (or, for some paths, what the
        // snapshot has at each of them).
        let (after, after_flat) = self.walk(&dir, &skip, &mut cache, only.is_some())?;
        cache.save(&self.cache_path(&root))?;
        let differs = match (only, after_flat) {
            (Some(paths), Some(now)) => paths.iter().find(|p| {
                // A path left out that the snapshot does not have either
                // was left alone on purpose.
                let left_alone = now.kept.contains(*p) && !target.leaves.contains_key(*p);
                now.leaves.get(*p) != target.leaves.get(*p) && !left_alone
            }),
            _ => None,
        };
        if let Some(p) = differs {
            return Err(SnapshotError::Conflict(format!(
                "`{}` does not match snapshot {id} after the restore: something changed it while it was restored",
                String::from_utf8_lossy(p)
            )));
        }
        if only.is_none() && after.id != id {
            return Err(SnapshotError::Conflict(format!(
                "the root does not match snapshot {id} after the restore (it is {}): something changed it while it was restored",
                after.id
            )));
        }
        Ok(Restored {
            before: before.id,
            written: applied.written,
            removed: applied.removed,
        })
    }

    /// Deletes the objects that neither a snapshot in `keep` nor a root's
    /// stat cache needs, unless written or used within `grace` (a snapshot
    /// another process is taking now uses objects before its id is in any
    /// log; every object it uses is freshened). A snapshot in `keep` whose
    /// objects are missing keeps what is left of it.
    pub fn prune(&self, keep: &[ObjectId], grace: Duration) -> Result<Pruned, SnapshotError> {
        let mut live: HashSet<ObjectId> = HashSet::new();
        live.insert(ObjectId::EMPTY_TREE);
        for id in keep {
            self.mark(*id, 0, &mut live);
        }
        // What the roots' caches name is in use: the next snapshot of a
        // root takes an unchanged file's blob from its cache.
        if let Ok(files) = fs::read_dir(self.dir.join("cairn")) {
            for f in files.flatten() {
                if f.path().extension().is_some_and(|e| e == "stat") {
                    live.extend(StatCache::load(&f.path()).blobs());
                }
            }
        }
        for cache in self.caches.lock().unwrap().values() {
            live.extend(cache.lock().unwrap().blobs());
        }
        let cutoff = SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut pruned = Pruned::default();
        for (id, path, len, when) in self.objects.all() {
            if live.contains(&id) || when > cutoff {
                pruned.kept += 1;
                continue;
            }
            if fs::remove_file(&path).is_ok() {
                pruned.objects += 1;
                pruned.bytes += len;
            }
        }
        Ok(pruned)
    }

    fn mark(&self, id: ObjectId, depth: usize, live: &mut HashSet<ObjectId>) {
        if depth > 512 || !live.insert(id) {
            return;
        }
        let Ok(bytes) = self.objects.read(id, object::Kind::Tree, 64 << 20) else {
            return;
        };
        let Ok(entries) = object::decode_tree(id, &bytes) else {
            return;
        };
        for e in entries {
            if e.mode == Mode::Tree {
                self.mark(e.id, depth + 1, live);
            } else {
                live.insert(e.id);
            }
        }
    }

    /// The paths of a snapshot's files and links, sorted, with their modes.
    pub fn list(&self, id: ObjectId) -> Result<Vec<(String, Mode)>, SnapshotError> {
        self.pull(id)?;
        Ok(restore::flatten(&self.objects, id)?
            .leaves
            .into_iter()
            .map(|(p, (m, _))| (String::from_utf8_lossy(&p).into_owned(), m))
            .collect())
    }

    fn walk(
        &self,
        root: &cairn_rootfs::Dir,
        skip: &walk::Skip<'_>,
        cache: &mut StatCache,
        flat: bool,
    ) -> Result<(Snapshot, Option<walk::Flat>), SnapshotError> {
        let now_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i64;
        let mut w = walk::Walk {
            objects: &self.objects,
            cache,
            opts: &self.opts,
            skip: walk::Skip {
                exclude: skip.exclude,
                stage: skip.stage,
                withhold: skip.withhold,
            },
            total_bytes: 0,
            trust_before_ns: now_ns - RACY.as_nanos() as i64,
            seen: HashSet::new(),
            files: 0,
            bytes_added: 0,
            objects_added: 0,
            skipped: Vec::new(),
            flat: flat.then(walk::Flat::default),
        };
        let id = w.dir(root, b"", 0)?.unwrap_or(ObjectId::EMPTY_TREE);
        if id == ObjectId::EMPTY_TREE {
            self.objects.write(object::Kind::Tree, b"")?;
        }
        let seen = std::mem::take(&mut w.seen);
        let snap = Snapshot {
            id,
            files: w.files,
            objects_added: w.objects_added,
            bytes_added: w.bytes_added,
            skipped: std::mem::take(&mut w.skipped),
        };
        let flat = w.flat.take();
        cache.retain_seen(&seen);
        Ok((snap, flat))
    }

    /// The caller's exclusions and the repository itself (a repository
    /// inside the root would otherwise snapshot itself), as paths relative
    /// to `root`; those outside it do not matter to a walk.
    fn excluding(&self, root: &Path, exclude: &[PathBuf]) -> HashSet<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        let mut all = canonical_all(exclude);
        all.extend(canonical_all(std::slice::from_ref(&self.dir)));
        all.iter()
            .filter_map(|p| p.strip_prefix(root).ok())
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(|rel| rel.as_os_str().as_bytes().to_vec())
            .collect()
    }

    /// Where a restore of `root` records its stage folder.
    fn record_path(&self, root: &Path) -> PathBuf {
        self.dir
            .join("cairn")
            .join(format!("{}.stage", Self::root_key(root)))
    }

    fn cache_of(&self, root: &Path) -> Arc<Mutex<StatCache>> {
        let mut caches = self.caches.lock().unwrap();
        caches
            .entry(root.to_path_buf())
            .or_insert_with(|| Arc::new(Mutex::new(StatCache::load(&self.cache_path(root)))))
            .clone()
    }

    fn root_key(root: &Path) -> String {
        use std::os::unix::ffi::OsStrExt;
        let digest = Sha1::digest(root.as_os_str().as_bytes());
        hex::encode(&digest[..10])
    }

    fn cache_path(&self, root: &Path) -> PathBuf {
        self.dir
            .join("cairn")
            .join(format!("{}.stat", Self::root_key(root)))
    }

    /// Holds the root's lock file until dropped (`flock`: released by the
    /// kernel when a process dies, so a kill never leaves it taken).
    fn lock(&self, root: &Path) -> Result<fs::File, SnapshotError> {
        let p = self
            .dir
            .join("cairn")
            .join(format!("{}.lock", Self::root_key(root)));
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| SnapshotError::io(&p, e))?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(SnapshotError::io(&p, std::io::Error::last_os_error()));
        }
        Ok(f)
    }
}

fn canonical(root: &Path) -> Result<PathBuf, SnapshotError> {
    let p = root
        .canonicalize()
        .map_err(|e| SnapshotError::io(root, e))?;
    if !p.is_dir() {
        return Err(SnapshotError::io(
            &p,
            std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a folder"),
        ));
    }
    Ok(p)
}

/// Refuses a path that could name anything but a file under the root.
fn check_rel(p: &[u8]) -> Result<(), SnapshotError> {
    let bad = p.is_empty()
        || p.contains(&0)
        || p.split(|&b| b == b'/')
            .any(|part| part.is_empty() || part == b"." || part == b"..");
    if bad {
        return Err(SnapshotError::BadPath(
            String::from_utf8_lossy(p).chars().take(200).collect(),
        ));
    }
    Ok(())
}

/// Opens the root's folder, and checks that the folder opened is the one
/// `root` named (a root inside another node's root could be swapped for a
/// link between the two steps).
fn open_root(root: &Path) -> Result<cairn_rootfs::Dir, SnapshotError> {
    use std::os::fd::AsFd;
    let dir = cairn_rootfs::Dir::open(root).map_err(|e| SnapshotError::io(root, e))?;
    let real = fs::read_link(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd()));
    if real.is_ok_and(|r| r != root) {
        return Err(SnapshotError::io(
            root,
            cairn_rootfs::changed("the root's folder was replaced"),
        ));
    }
    Ok(dir)
}

fn canonical_all(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .collect()
}
