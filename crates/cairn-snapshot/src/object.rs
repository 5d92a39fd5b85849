//! Git's object format: loose objects (`objects/ab/cdef…`, a zlib stream of
//! `<type> <length>\0<bytes>`, named by the SHA-1 of those bytes) and tree
//! entries. Only what snapshots need: blobs and trees, written once and read
//! back with their name checked.

use std::fmt;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;
use sha1::{Digest, Sha1};

use crate::SnapshotError;

/// The name of a git object: the SHA-1 of its header and bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 20]);

impl ObjectId {
    /// The id of the tree with no entries (the same in every git repository).
    pub const EMPTY_TREE: ObjectId = ObjectId([
        0x4b, 0x82, 0x5d, 0xc6, 0x42, 0xcb, 0x6e, 0xb9, 0xa0, 0x60, 0xe5, 0x4b, 0xf8, 0xd6, 0x92,
        0x88, 0xfb, 0xee, 0x49, 0x04,
    ]);

    /// The id of `bytes` stored as an object of `kind`.
    pub fn of(kind: Kind, bytes: &[u8]) -> ObjectId {
        let mut h = Sha1::new();
        h.update(header(kind, bytes.len()));
        h.update(bytes);
        ObjectId(h.finalize().into())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({self})")
    }
}

impl FromStr for ObjectId {
    type Err = SnapshotError;

    /// Forty lowercase hex digits, as git writes them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || SnapshotError::BadId(s.chars().take(80).collect());
        if s.len() != 40 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad());
        }
        let mut id = [0u8; 20];
        hex::decode_to_slice(s, &mut id).map_err(|_| bad())?;
        Ok(ObjectId(id))
    }
}

/// The object types snapshots use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A file's bytes, or a symbolic link's target.
    Blob,
    /// A directory: names, modes and ids.
    Tree,
}

impl Kind {
    /// Its name in git's object headers: `blob` or `tree`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Blob => "blob",
            Kind::Tree => "tree",
        }
    }

    /// The kind [`Kind::name`] names.
    pub fn parse(name: &str) -> Option<Kind> {
        match name {
            "blob" => Some(Kind::Blob),
            "tree" => Some(Kind::Tree),
            _ => None,
        }
    }
}

fn header(kind: Kind, len: usize) -> Vec<u8> {
    format!("{} {len}\0", kind.name()).into_bytes()
}

/// What a tree entry is, by git's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `100644`.
    File,
    /// `100755`: a file with an execute bit.
    Executable,
    /// `120000`: the blob is the link's target.
    Symlink,
    /// `40000`: a subtree.
    Tree,
}

impl Mode {
    fn as_bytes(self) -> &'static [u8] {
        match self {
            Mode::File => b"100644",
            Mode::Executable => b"100755",
            Mode::Symlink => b"120000",
            Mode::Tree => b"40000",
        }
    }

    fn parse(b: &[u8]) -> Option<Mode> {
        Some(match b {
            b"100644" | b"100664" => Mode::File,
            b"100755" => Mode::Executable,
            b"120000" => Mode::Symlink,
            b"40000" | b"040000" => Mode::Tree,
            _ => return None,
        })
    }
}

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// The file name: bytes, as Linux keeps them.
    pub name: Vec<u8>,
    /// What it is.
    pub mode: Mode,
    /// Its blob or subtree.
    pub id: ObjectId,
}

/// A tree's bytes, its entries sorted the way git sorts them (a subtree's
/// name compares as if it ended in `/`), so that equal directories give
/// equal ids and git reads the tree without complaint.
pub fn encode_tree(entries: &mut [TreeEntry]) -> Vec<u8> {
    entries.sort_by(|a, b| git_key(a).cmp(git_key(b)));
    let mut out = Vec::with_capacity(entries.len() * 48);
    for e in entries.iter() {
        out.extend_from_slice(e.mode.as_bytes());
        out.push(b' ');
        out.extend_from_slice(&e.name);
        out.push(0);
        out.extend_from_slice(&e.id.0);
    }
    out
}

fn git_key(e: &TreeEntry) -> std::iter::Chain<std::slice::Iter<'_, u8>, std::slice::Iter<'_, u8>> {
    let slash: &'static [u8] = if e.mode == Mode::Tree { b"/" } else { b"" };
    e.name.iter().chain(slash.iter())
}

/// Reads a tree's entries, refusing names that could reach outside the
/// folder they are written in (the objects are Cairn's own, but a restore
/// writes where they say, so they are checked as if they were not).
pub fn decode_tree(id: ObjectId, bytes: &[u8]) -> Result<Vec<TreeEntry>, SnapshotError> {
    let corrupt = |why: &str| SnapshotError::Corrupt {
        id: id.to_string(),
        why: why.into(),
    };
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| corrupt("an entry without a mode"))?;
        let mode = Mode::parse(&rest[..sp]).ok_or_else(|| corrupt("an unknown mode"))?;
        rest = &rest[sp + 1..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| corrupt("an entry without a name"))?;
        let name = &rest[..nul];
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(corrupt("an entry name that is not a plain file name"));
        }
        rest = &rest[nul + 1..];
        if rest.len() < 20 {
            return Err(corrupt("a truncated entry"));
        }
        let mut oid = [0u8; 20];
        oid.copy_from_slice(&rest[..20]);
        rest = &rest[20..];
        out.push(TreeEntry {
            name: name.to_vec(),
            mode,
            id: ObjectId(oid),
        });
    }
    Ok(out)
}

/// A repository's object folder.
#[derive(Debug, Clone)]
pub struct Objects {
    dir: PathBuf,
}

impl Objects {
    /// The objects under `dir` (the repository's `objects`).
    pub fn new(dir: PathBuf) -> Objects {
        Objects { dir }
    }

    fn path_of(&self, id: ObjectId) -> PathBuf {
        let hex = id.to_string();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    /// Whether the object is stored.
    pub fn contains(&self, id: ObjectId) -> bool {
        self.path_of(id).is_file()
    }

    /// Stores `bytes` unless an object of that id is there already (which
    /// is what makes snapshots incremental). Returns the id and the bytes
    /// it added to the folder (0 when it was there).
    pub fn write(&self, kind: Kind, bytes: &[u8]) -> Result<(ObjectId, u64), SnapshotError> {
        let id = ObjectId::of(kind, bytes);
        let path = self.path_of(id);
        if path.is_file() {
            // Freshened, as git does: a prune spares what was used lately,
            // so an old object a snapshot under way reuses is not deleted
            // before the snapshot's id is in a log.
            let _ = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            return Ok((id, 0));
        }
        let parent = path.parent().expect("an object path has a folder");
        fs::create_dir_all(parent).map_err(|e| SnapshotError::io(parent, e))?;
        // Written aside and renamed into place: a reader (or a process
        // killed half-way) never sees half an object under its name.
        let mut tmp = tempfile_in(parent)?;
        {
            let mut z = ZlibEncoder::new(&mut tmp.1, Compression::fast());
            z.write_all(&header(kind, bytes.len()))
                .and_then(|_| z.write_all(bytes))
                .and_then(|_| z.finish().map(|_| ()))
                .map_err(|e| SnapshotError::io(&tmp.0, e))?;
        }
        let added = tmp.1.metadata().map(|m| m.len()).unwrap_or(0);
        drop(tmp.1);
        fs::rename(&tmp.0, &path).map_err(|e| {
            let _ = fs::remove_file(&tmp.0);
            SnapshotError::io(&path, e)
        })?;
        Ok((id, added))
    }

    /// Every stored object's id, path and size and when it was last
    /// written or used.
    pub fn all(&self) -> Vec<(ObjectId, PathBuf, u64, std::time::SystemTime)> {
        let mut out = Vec::new();
        let Ok(dirs) = fs::read_dir(&self.dir) else {
            return out;
        };
        for d in dirs.flatten() {
            let prefix = d.file_name().to_string_lossy().into_owned();
            if prefix.len() != 2 {
                continue;
            }
            let Ok(files) = fs::read_dir(d.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                let Ok(id) = format!("{prefix}{name}").parse::<ObjectId>() else {
                    continue;
                };
                if let Ok(m) = f.metadata() {
                    let when = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    out.push((id, f.path(), m.len(), when));
                }
            }
        }
        out
    }

    /// Reads an object of `kind`, at most `max` bytes of it, and checks that
    /// its bytes hash to its name.
    pub fn read(&self, id: ObjectId, kind: Kind, max: u64) -> Result<Vec<u8>, SnapshotError> {
        let path = self.path_of(id);
        let file = File::open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                SnapshotError::Missing(id.to_string())
            } else {
                SnapshotError::io(&path, e)
            }
        })?;
        let corrupt = |why: String| SnapshotError::Corrupt {
            id: id.to_string(),
            why,
        };
        let mut raw = Vec::new();
        ZlibDecoder::new(file)
            .take(max + 64)
            .read_to_end(&mut raw)
            .map_err(|e| corrupt(format!("not a zlib stream ({e})")))?;
        let nul = raw
            .iter()
            .take(64)
            .position(|&b| b == 0)
            .ok_or_else(|| corrupt("no header".into()))?;
        let want = header(kind, 0);
        let prefix = &want[..want.len() - 2]; // "blob " / "tree "
        let head = &raw[..nul];
        if !head.starts_with(prefix) {
            return Err(corrupt(format!("not a {}", kind.name())));
        }
        let len: u64 = std::str::from_utf8(&head[prefix.len()..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt("a bad length".into()))?;
        if len > max {
            return Err(corrupt(format!("{len} bytes, more than the {max} allowed")));
        }
        let body = raw.split_off(nul + 1);
        if body.len() as u64 != len {
            return Err(corrupt("shorter or longer than its header says".into()));
        }
        if ObjectId::of(kind, &body) != id {
            return Err(corrupt("its bytes do not hash to its name".into()));
        }
        Ok(body)
    }
}

/// A new file in `dir` with a name no other writer uses.
pub(crate) fn tempfile_in(dir: &Path) -> Result<(PathBuf, File), SnapshotError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = dir.join(format!("{}{pid}-{n}-{nanos}", crate::TEMP_PREFIX));
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(SnapshotError::io(&path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_tree_has_gits_id() {
        assert_eq!(ObjectId::of(Kind::Tree, b""), ObjectId::EMPTY_TREE);
        assert_eq!(
            ObjectId::of(Kind::Blob, b"hello\n").to_string(),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[test]
    fn a_subtree_sorts_as_if_it_ended_in_a_slash() {
        let id = ObjectId([1; 20]);
        let mut entries = vec![
            TreeEntry {
                name: b"a.txt".to_vec(),
                mode: Mode::File,
                id,
            },
            TreeEntry {
                name: b"a".to_vec(),
                mode: Mode::Tree,
                id,
            },
            TreeEntry {
                name: b"a-b".to_vec(),
                mode: Mode::File,
                id,
            },
        ];
        encode_tree(&mut entries);
        let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
        assert_eq!(names, [&b"a-b"[..], b"a.txt", b"a"]);
    }

    #[test]
    fn names_that_climb_out_are_refused() {
        for name in [&b".."[..], b".", b"a/b", b""] {
            let mut bytes = b"100644 ".to_vec();
            bytes.extend_from_slice(name);
            bytes.push(0);
            bytes.extend_from_slice(&[0; 20]);
            assert!(decode_tree(ObjectId([0; 20]), &bytes).is_err(), "{name:?}");
        }
    }

    #[test]
    fn ids_are_forty_lowercase_hex_digits() {
        assert!("4b825dc642cb6eb9a060e54bf8d69288fbee4904"
            .parse::<ObjectId>()
            .is_ok());
        for bad in [
            "",
            "4B825DC642CB6EB9A060E54BF8D69288FBEE4904",
            "../../etc/passwd",
            "4b825dc6",
        ] {
            assert!(bad.parse::<ObjectId>().is_err(), "{bad}");
        }
    }
}
