//! File operations inside a sandbox root, for code that runs outside the
//! sandbox (the engine, the tools).
//!
//! A node's root is the attacker's ground: while the engine walks it,
//! restores it or serves a tool call, other nodes of the run keep working
//! in it and can swap a folder for a symbolic link to anywhere at any
//! moment. A path resolved by name (`open("root/a/b")`) is checked at one
//! moment and used at another; this crate never resolves such a path.
//! Everything goes through directory descriptors:
//!
//! - a path of several parts is resolved by the kernel in one call,
//!   `openat2` with `RESOLVE_BENEATH` (never above the descriptor) and
//!   `RESOLVE_NO_MAGICLINKS`, and, for the engine's own work
//!   ([`Follow::Never`]), `RESOLVE_NO_SYMLINKS`: a link anywhere on the way
//!   is an error, never followed;
//! - an operation on one name (`stat`, `unlink`, `rename`, `mkdir`,
//!   `readlink`, opening a folder or a file) is an `*at` call on the
//!   descriptor of the folder that holds it, with `O_NOFOLLOW` or
//!   `AT_SYMLINK_NOFOLLOW`, and what was opened is checked with `fstat`;
//! - a folder is listed through its own descriptor (`fdopendir`), not by
//!   name;
//! - a file is opened with `O_NONBLOCK` and read only when `fstat` says it
//!   is a regular file, so a FIFO or a device never blocks the caller;
//! - a root that changes under a caller (what was a folder is now a link,
//!   an inode is not the one seen) is an error ([`is_changed`]), never a
//!   reason to touch something else.
//!
//! One module owns this so that the rules are kept in one place, and its
//! race tests (`tests/race.rs`) cover every caller.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// How a path of several parts may resolve beneath a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Symbolic links are followed as long as every step stays beneath the
    /// directory (an absolute link, `..` above it or a magic link is
    /// refused): what a tool's path argument may do, since a link inside
    /// the root is the user's to make.
    Beneath,
    /// No symbolic link anywhere on the path: the engine's own walks and
    /// restores, which must see the root as it is.
    Never,
}

/// What a descriptor opened beneath a directory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Reading its content. Opened without blocking (a FIFO does not hang
    /// the call) and blocking again afterwards; the caller checks with
    /// `fstat` that it is a regular file before reading.
    ReadFile,
    /// A directory descriptor (`O_PATH`) usable with `*at` calls.
    Dir,
    /// Anything, as an `O_PATH` descriptor (existence and containment only).
    Any,
}

/// `openat2(dirfd, rel, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, with
/// `RESOLVE_NO_SYMLINKS` too for [`Follow::Never`]; retried on `EAGAIN`
/// (the kernel's answer when a concurrent rename could have let a `..`
/// step escape).
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    open: Open,
    follow: Follow,
) -> io::Result<OwnedFd> {
    let c = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in path"))?;
    // SAFETY: open_how is plain data; zero is a valid starting value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = match open {
        Open::ReadFile => libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        Open::Dir => libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        Open::Any => libc::O_PATH | libc::O_CLOEXEC,
    } as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    if follow == Follow::Never {
        how.resolve |= libc::RESOLVE_NO_SYMLINKS;
        if open != Open::Dir {
            // The last part too: a link there is opened as the link itself
            // by O_PATH, refused otherwise.
            how.flags |= libc::O_NOFOLLOW as u64;
        }
    }
    for _ in 0..64 {
        // SAFETY: valid dirfd, C string and open_how of the right size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
            if open == Open::ReadFile {
                blocking(&fd);
            }
            return Ok(fd);
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Reads on `fd` block normally from here on (it was opened with
/// `O_NONBLOCK` so that opening a FIFO could not hang).
fn blocking(fd: &OwnedFd) {
    // SAFETY: a valid descriptor; F_GETFL/F_SETFL take and return flags.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// The error that says the root changed under the caller: what it found
/// is not what it saw a moment before.
#[derive(Debug)]
pub struct Changed(pub String);

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "changed while Cairn worked on it: {}", self.0)
    }
}

impl std::error::Error for Changed {}

/// An error saying that `what` changed under the caller.
pub fn changed(what: impl Into<String>) -> io::Error {
    io::Error::other(Changed(what.into()))
}

/// Whether `e` says the root changed under the caller ([`changed`]), or is
/// the kernel's refusal of a link or a non-folder where a folder was
/// expected (`ELOOP`, `ENOTDIR`, `EXDEV` from a resolution).
pub fn is_changed(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Changed>())
        || matches!(
            e.raw_os_error(),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV)
        )
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A FIFO, a socket or a device: never opened.
    Other,
}

/// What `fstat`/`fstatat` said of an entry (never following a link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The device it lives on.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    /// Its size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// Change time, ns since the epoch.
    pub ctime_ns: i64,
}

impl Stat {
    fn of(st: &libc::stat) -> Stat {
        Stat {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            size: st.st_size as u64,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        }
    }

    /// What it is.
    pub fn kind(&self) -> Kind {
        match self.mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }

    /// Whether `other` is the same inode.
    pub fn same_inode(&self, other: &Stat) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

fn fstat_fd(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Stat::of(&st))
}

/// `fstat` of an open file or folder.
pub fn fstat(fd: &impl AsFd) -> io::Result<Stat> {
    fstat_fd(fd.as_fd())
}

/// One name in a folder: not empty, no `/`, not `.` or `..`, no NUL.
fn name_c(name: &[u8]) -> io::Result<CString> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` is not one name", String::from_utf8_lossy(name)),
        ));
    }
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in name"))
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn cvt_fd(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: a fresh descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// An entry of a folder, as its listing gave it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its name (bytes, as Linux keeps them).
    pub name: Vec<u8>,
    /// What the listing says it is, when it says (`None`: ask `stat`).
    /// Only a hint: it may have changed since.
    pub kind: Option<Kind>,
}

/// An open folder: every operation is on a name in it, or on a path
/// resolved beneath it by the kernel.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<Dir> for OwnedFd {
    fn from(d: Dir) -> OwnedFd {
        d.fd
    }
}

impl Dir {
    /// Opens the folder at `path`, a path a person chose (a root, the
    /// snapshot repository), not one inside a root.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in path"))?;
        // SAFETY: a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        Ok(Dir { fd: cvt_fd(fd)? })
    }

    /// A folder already opened (an `O_PATH` descriptor will do).
    pub fn from_fd(fd: OwnedFd) -> Dir {
        Dir { fd }
    }

    /// A second descriptor of the same folder.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
        })
    }

    /// `fstat` of the folder itself.
    pub fn stat(&self) -> io::Result<Stat> {
        fstat_fd(self.fd.as_fd())
    }

    /// `fstatat(name, AT_SYMLINK_NOFOLLOW)`: a link is described, not
    /// followed.
    pub fn lstat(&self, name: &[u8]) -> io::Result<Stat> {
        let c = name_c(name)?;
        // SAFETY: a zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid dirfd, C string and out pointer.
        cvt(unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(Stat::of(&st))
    }

    /// The folder's entries (without `.` and `..`), read through its own
    /// descriptor.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        // A descriptor of its own for the listing (an `O_PATH` one cannot
        // be read, and a duplicate would share the read offset); "." on
        // the folder's descriptor is the folder itself, not a path a node
        // could swap.
        // SAFETY: a valid dirfd and C string.
        let fd = cvt_fd(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
        // SAFETY: `raw` is ours; fdopendir takes it over.
        let dirp = unsafe { libc::fdopendir(raw) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `raw` is still ours to close.
            unsafe { libc::close(raw) };
            return Err(e);
        }
        let mut out = Vec::new();
        let result = loop {
            // SAFETY: errno is thread-local; readdir64 reports errors there.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: a valid DIR pointer.
            let ent = unsafe { libc::readdir64(dirp) };
            if ent.is_null() {
                let errno = unsafe { *libc::__errno_location() };
                break if errno == 0 {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(errno))
                };
            }
            // SAFETY: readdir64 returned a valid entry with a NUL-terminated name.
            let (name, d_type) = unsafe {
                (
                    CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes(),
                    (*ent).d_type,
                )
            };
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match d_type {
                libc::DT_REG => Some(Kind::File),
                libc::DT_DIR => Some(Kind::Dir),
                libc::DT_LNK => Some(Kind::Symlink),
                libc::DT_UNKNOWN => None,
                _ => Some(Kind::Other),
            };
            out.push(Entry {
                name: name.to_vec(),
                kind,
            });
        };
        // SAFETY: a valid DIR pointer, closed once (it closes `raw`).
        unsafe { libc::closedir(dirp) };
        result.map(|()| out)
    }

    /// Opens the folder `name` in this one, never through a link
    /// (`O_NOFOLLOW`: a link or a file there is `ENOTDIR`).
    pub fn open_dir(&self, name: &[u8]) -> io::Result<Dir> {
        let c = name_c(name)?;
        // SAFETY: a valid dirfd and C string.
        let fd = cvt_fd(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir { fd })
    }

    /// Opens the folder `name`, which must be the one `seen` describes
    /// (same inode): a folder swapped for another between a `stat` and
    /// the open is [`changed`].
    pub fn open_dir_seen(&self, name: &[u8], seen: &Stat) -> io::Result<Dir> {
        let d = self.open_dir(name)?;
        if !d.stat()?.same_inode(seen) {
            return Err(changed(format!(
                "folder `{}` was replaced",
                String::from_utf8_lossy(name)
            )));
        }
        Ok(d)
    }

    /// Opens the folder at `rel` ('/'-separated parts) beneath this one,
    /// with no link anywhere on the way.
    pub fn open_dir_path(&self, rel: &[u8]) -> io::Result<Dir> {
        if rel.is_empty() {
            return self.try_clone();
        }
        let fd = open_beneath(
            self.fd.as_fd(),
            Path::new(OsStr::from_bytes(rel)),
            Open::Dir,
            Follow::Never,
        )?;
        Ok(Dir { fd })
    }

    /// Opens the folder at `rel` beneath this one, making the folders that
    /// are missing, each in the descriptor of its parent. A link or a file
    /// where a folder should be is an error (`ELOOP`/`ENOTDIR`), never
    /// followed nor removed.
    pub fn create_dir_path(&self, rel: &[u8]) -> io::Result<Dir> {
        match self.open_dir_path(rel) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            other => return other,
        }
        let mut dir = self.try_clone()?;
        for part in rel.split(|&b| b == b'/') {
            dir = match dir.open_dir(part) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match dir.mkdir(part, 0o777) {
                        Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                        _ => {}
                    }
                    dir.open_dir(part)?
                }
                Err(e) => return Err(e),
            };
        }
        Ok(dir)
    }

    /// Opens the regular file `name` for reading: never through a link
    /// (`O_NOFOLLOW`), without blocking on a FIFO or a device
    /// (`O_NONBLOCK`), and only when `fstat` of what was opened says it is
    /// a regular file (else `InvalidInput`). Returns the file and its stat.
    pub fn open_file(&self, name: &[u8]) -> io::Result<(File, Stat)> {
        let c = name_c(name)?;
        // SAFETY: a valid dirfd and C string.
        let fd = cvt_fd(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY
                    | libc::O_NOFOLLOW
                    | libc::O_NONBLOCK
                    | libc::O_NOCTTY
                    | libc::O_CLOEXEC,
            )
        })?;
        let st = fstat_fd(fd.as_fd())?;
        if st.kind() != Kind::File {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{}` is not a regular file", String::from_utf8_lossy(name)),
            ));
        }
        blocking(&fd);
        Ok((File::from(fd), st))
    }

    /// The target of the link `name` (`readlinkat`: the link itself, in
    /// this folder).
    pub fn read_link(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        let c = name_c(name)?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: a valid dirfd, C string and buffer of that length.
            let n = unsafe {
                libc::readlinkat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            if n < buf.len() {
                buf.truncate(n);
                return Ok(buf);
            }
            if buf.len() >= 1 << 16 {
                return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
            }
            buf.resize(buf.len() * 4, 0);
        }
    }

    /// `mkdirat(name, mode)`.
    pub fn mkdir(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let c = name_c(name)?;
        // SAFETY: a valid dirfd and C string.
        cvt(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) })
    }

    /// `unlinkat(name)`: a file or a link (the link itself); a folder is
    /// `EISDIR`.
    pub fn unlink(&self, name: &[u8]) -> io::Result<()> {
        let c = name_c(name)?;
        // SAFETY: a valid dirfd and C string.
        cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })
    }

    /// `unlinkat(name, AT_REMOVEDIR)`: an empty folder.
    pub fn rmdir(&self, name: &[u8]) -> io::Result<()> {
        let c = name_c(name)?;
        // SAFETY: a valid dirfd and C string.
        cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
    }

    /// `renameat(name, to, to_name)`: the entry itself moves (a link is
    /// moved, not followed; a link at `to_name` is replaced).
    pub fn rename(&self, name: &[u8], to: &Dir, to_name: &[u8]) -> io::Result<()> {
        let (a, b) = (name_c(name)?, name_c(to_name)?);
        // SAFETY: valid dirfds and C strings.
        cvt(unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                a.as_ptr(),
                to.fd.as_raw_fd(),
                b.as_ptr(),
            )
        })
    }

    /// `symlinkat(target, name)`.
    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        let c = name_c(name)?;
        let t = CString::new(target)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in link"))?;
        // SAFETY: a valid dirfd and C strings.
        cvt(unsafe { libc::symlinkat(t.as_ptr(), self.fd.as_raw_fd(), c.as_ptr()) })
    }

    /// Creates the file `name`, which must not exist (`O_EXCL`, which
    /// never follows a link), for writing, with `mode` (set with `fchmod`,
    /// so the umask does not reduce it).
    pub fn create(&self, name: &[u8], mode: u32) -> io::Result<File> {
        let c = name_c(name)?;
        // SAFETY: a valid dirfd and C string.
        let fd = cvt_fd(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: a valid descriptor.
        if unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
            let e = io::Error::last_os_error();
            let _ = self.unlink(name);
            return Err(e);
        }
        Ok(File::from(fd))
    }

    /// Replaces (or creates) `name` with `bytes` and `mode`: written to a
    /// new temporary file in this folder (synced when `sync`), then
    /// renamed over `name`, so a reader never sees half a file and a
    /// failure leaves `name` as it was. A link at `name` is replaced, not
    /// written through.
    pub fn write_replace(
        &self,
        name: &[u8],
        bytes: &[u8],
        mode: u32,
        sync: bool,
    ) -> io::Result<()> {
        name_c(name)?;
        let (tmp, mut file) = self.create_temp(mode)?;
        let written = file
            .write_all(bytes)
            .and_then(|()| if sync { file.sync_all() } else { Ok(()) });
        drop(file);
        let result = written.and_then(|()| self.rename(&tmp, self, name));
        if result.is_err() {
            let _ = self.unlink(&tmp);
        }
        result
    }

    /// A new file with a name of its own in this folder, for a write that
    /// is renamed into place.
    fn create_temp(&self, mode: u32) -> io::Result<(Vec<u8>, File)> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for _ in 0..100 {
            let name = format!(
                ".cairn-tmp-{}-{nanos}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            )
            .into_bytes();
            match self.create(&name, mode) {
                Ok(f) => return Ok((name, f)),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "cannot create a temporary file",
        ))
    }

    /// Removes the folder `name` and everything in it, each entry through
    /// the descriptor of the folder that holds it; a link inside is
    /// removed, never followed. `name` must be the folder `seen` describes
    /// when given (else [`changed`], nothing removed).
    pub fn remove_tree(&self, name: &[u8], seen: Option<&Stat>) -> io::Result<()> {
        let sub = match seen {
            Some(s) => self.open_dir_seen(name, s)?,
            None => self.open_dir(name)?,
        };
        sub.empty_out(0)?;
        self.rmdir(name)
    }

    fn empty_out(&self, depth: usize) -> io::Result<()> {
        if depth > 512 {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        for e in self.entries()? {
            let st = match self.lstat(&e.name) {
                Ok(st) => st,
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(err) => return Err(err),
            };
            if st.kind() == Kind::Dir {
                self.open_dir_seen(&e.name, &st)?.empty_out(depth + 1)?;
                self.rmdir(&e.name)?;
            } else {
                match self.unlink(&e.name) {
                    Err(err) if err.raw_os_error() != Some(libc::ENOENT) => return Err(err),
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    #[test]
    fn names_of_more_than_one_part_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let d = Dir::open(tmp.path()).unwrap();
        for bad in [&b""[..], b".", b"..", b"a/b", b"/etc", b"a\0b"] {
            let e = d.lstat(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn links_are_never_followed_by_the_engines_calls() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::write(outside.join("canary"), "secret").unwrap();
        symlink(&outside, root.join("out")).unwrap();
        symlink("real", root.join("inner")).unwrap();
        symlink("../outside/canary", root.join("file")).unwrap();
        let d = Dir::open(&root).unwrap();
        // O_PATH | O_NOFOLLOW takes the link itself, which O_DIRECTORY refuses.
        assert!(is_changed(&d.open_dir(b"out").unwrap_err()));
        assert!(is_changed(&d.open_dir(b"inner").unwrap_err()));
        assert!(d.open_dir_path(b"out").is_err());
        assert!(d.open_dir_path(b"inner").is_err());
        assert!(d.open_dir_path(b"real/../out").is_err());
        assert_eq!(
            d.open_file(b"file").unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        assert_eq!(d.read_link(b"file").unwrap(), b"../outside/canary");
        assert_eq!(d.lstat(b"out").unwrap().kind(), Kind::Symlink);
        // The tools' policy: a link that stays beneath is followed, one
        // that leaves is not.
        let t = open_beneath(d.as_fd(), Path::new("inner"), Open::Dir, Follow::Beneath);
        assert!(t.is_ok());
        let t = open_beneath(
            d.as_fd(),
            Path::new("file"),
            Open::ReadFile,
            Follow::Beneath,
        );
        assert_eq!(t.unwrap_err().raw_os_error(), Some(libc::EXDEV));
        // Removing a tree that holds a link to outside removes the link.
        std::fs::create_dir(root.join("real/sub")).unwrap();
        symlink(&outside, root.join("real/sub/out")).unwrap();
        d.remove_tree(b"real", None).unwrap();
        assert_eq!(std::fs::read(outside.join("canary")).unwrap(), b"secret");
        assert!(!root.join("real").exists());
    }

    #[test]
    fn a_fifo_or_a_socket_is_neither_blocked_on_nor_read() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = CString::new(tmp.path().join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let _sock = std::os::unix::net::UnixListener::bind(tmp.path().join("sock")).unwrap();
        let d = Dir::open(tmp.path()).unwrap();
        let e = d.open_file(b"fifo").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(d.open_file(b"sock").is_err());
        let kinds: Vec<_> = d.entries().unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [Some(Kind::Other), Some(Kind::Other)]);
    }

    #[test]
    fn a_replace_writes_a_whole_file_and_replaces_a_link_rather_than_follow_it() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("target"), "keep").unwrap();
        symlink(tmp.path().join("target"), tmp.path().join("f")).unwrap();
        let d = Dir::open(tmp.path()).unwrap();
        d.write_replace(b"f", b"new", 0o640, true).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("target")).unwrap(), b"keep");
        let (mut f, st) = d.open_file(b"f").unwrap();
        assert_eq!(st.mode & 0o777, 0o640);
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "new");
        let names: Vec<_> = d.entries().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
    }

    #[test]
    fn missing_folders_are_made_but_a_link_on_the_way_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let d = Dir::open(tmp.path()).unwrap();
        d.create_dir_path(b"a/b/c").unwrap();
        assert!(tmp.path().join("a/b/c").is_dir());
        symlink(tmp.path(), tmp.path().join("a/l")).unwrap();
        let e = d.create_dir_path(b"a/l/x").unwrap_err();
        assert!(is_changed(&e), "{e}");
        assert!(!tmp.path().join("x").exists());
    }
}
