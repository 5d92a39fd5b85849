//! What makes a snapshot of an unchanged root cost a walk and no reads:
//! each file's blob id, keyed by its path and remembered with what `lstat`
//! said of it (size, inode, modification and change times, mode). A file
//! whose stat is unchanged is taken to be unchanged, as git's index does.
//!
//! The change time (`ctime`) is set by the kernel on every write, rename and
//! chmod and cannot be set by a program, so a tool that puts a file's
//! `mtime` back does not fool the cache. A file whose times are close to
//! the walk that read it is not remembered ("racily clean" in git's words:
//! a write in the same clock tick would leave its stat unchanged) and is
//! read again next time.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::object::ObjectId;
use crate::SnapshotError;

const MAGIC: &[u8; 8] = b"CAIRNSC1";

/// What `lstat` said of a file when its blob was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub size: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub mode: u32,
}

impl Stat {
    /// What the cache keeps of `st`.
    pub fn of(st: &cairn_rootfs::Stat) -> Stat {
        Stat {
            size: st.size,
            ino: st.ino,
            mtime_ns: st.mtime_ns,
            ctime_ns: st.ctime_ns,
            mode: st.mode,
        }
    }

    /// The later of its two times, in ns since the epoch.
    pub fn newest_ns(&self) -> i64 {
        self.mtime_ns.max(self.ctime_ns)
    }
}

/// The blob ids of one root's files, by path relative to the root.
#[derive(Debug, Default)]
pub struct StatCache {
    entries: HashMap<Vec<u8>, (Stat, ObjectId)>,
    dirty: bool,
}

impl StatCache {
    /// The blob id of `path` when its stat has not changed.
    pub fn get(&self, path: &[u8], stat: &Stat) -> Option<ObjectId> {
        self.entries
            .get(path)
            .filter(|(s, _)| s == stat)
            .map(|(_, id)| *id)
    }

    /// The blobs it names.
    pub fn blobs(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.entries.values().map(|(_, id)| *id)
    }

    /// Whether it knows no file (a root not seen before).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Remembers `path`'s blob.
    pub fn put(&mut self, path: Vec<u8>, stat: Stat, id: ObjectId) {
        self.entries.insert(path, (stat, id));
        self.dirty = true;
    }

    /// Forgets `path` (read again next time).
    pub fn forget(&mut self, path: &[u8]) {
        if self.entries.remove(path).is_some() {
            self.dirty = true;
        }
    }

    /// Keeps only the paths a walk saw, so that files deleted from the root
    /// do not stay in the cache for ever.
    pub fn retain_seen(&mut self, seen: &std::collections::HashSet<Vec<u8>>) {
        let before = self.entries.len();
        self.entries.retain(|k, _| seen.contains(k));
        self.dirty |= self.entries.len() != before;
    }

    /// Reads the cache from `path`; a missing or damaged file is an empty
    /// cache (it is only ever a shortcut).
    pub fn load(path: &Path) -> StatCache {
        let Ok(bytes) = fs::read(path) else {
            return StatCache::default();
        };
        Self::decode(&bytes).unwrap_or_default()
    }

    fn decode(mut b: &[u8]) -> Option<StatCache> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            if b.len() < n {
                return None;
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Some(h)
        }
        fn u64_of(b: &mut &[u8]) -> Option<u64> {
            Some(u64::from_le_bytes(take(b, 8)?.try_into().ok()?))
        }
        if take(&mut b, 8)? != MAGIC {
            return None;
        }
        let n = u64_of(&mut b)? as usize;
        let mut entries = HashMap::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let len = u64_of(&mut b)? as usize;
            let path = take(&mut b, len)?.to_vec();
            let stat = Stat {
                size: u64_of(&mut b)?,
                ino: u64_of(&mut b)?,
                mtime_ns: u64_of(&mut b)? as i64,
                ctime_ns: u64_of(&mut b)? as i64,
                mode: u64_of(&mut b)? as u32,
            };
            let id = ObjectId(take(&mut b, 20)?.try_into().ok()?);
            entries.insert(path, (stat, id));
        }
        b.is_empty().then_some(StatCache {
            entries,
            dirty: false,
        })
    }

    /// Writes the cache to `path` (aside, then renamed) when it changed.
    pub fn save(&mut self, path: &Path) -> Result<(), SnapshotError> {
        if !self.dirty {
            return Ok(());
        }
        let mut out = Vec::with_capacity(16 + self.entries.len() * 80);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for (p, (s, id)) in &self.entries {
            out.extend_from_slice(&(p.len() as u64).to_le_bytes());
            out.extend_from_slice(p);
            for v in [
                s.size,
                s.ino,
                s.mtime_ns as u64,
                s.ctime_ns as u64,
                u64::from(s.mode),
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&id.0);
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let (tmp, mut f): (PathBuf, fs::File) = crate::object::tempfile_in(dir)?;
        f.write_all(&out).map_err(|e| SnapshotError::io(&tmp, e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            SnapshotError::io(path, e)
        })?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_cache_reads_back_and_a_damaged_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c");
        let mut c = StatCache::default();
        let s = Stat {
            size: 3,
            ino: 9,
            mtime_ns: 1,
            ctime_ns: 2,
            mode: 0o100644,
        };
        c.put(b"a/b".to_vec(), s, ObjectId([7; 20]));
        c.save(&p).unwrap();
        let back = StatCache::load(&p);
        assert_eq!(back.get(b"a/b", &s), Some(ObjectId([7; 20])));
        assert_eq!(back.get(b"a/b", &Stat { ctime_ns: 3, ..s }), None);
        let mut bytes = fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 1);
        fs::write(&p, bytes).unwrap();
        assert!(StatCache::load(&p).entries.is_empty());
    }
}
