//! The sandbox root and path resolution beneath it.
//!
//! Every path a tool receives is resolved and opened in one step with
//! `openat2(root_fd, path, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`
//! (`cairn_rootfs::open_beneath`, which owns every file operation in a
//! root): the
//! kernel walks the path from the root's directory descriptor and refuses any
//! step (`..`, an absolute symlink, a relative symlink climbing out, a
//! `/proc/.../fd` magic link) that would leave the root. Because the check and
//! the open are the same system call, a symlink swapped in between "checking"
//! and "using" has nothing to race against.
//!
//! Writes go through a descriptor of the (resolved) parent directory: the new
//! content is written to a temporary file there and renamed over the target,
//! so a reader never sees half a file and a failed edit leaves it untouched.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::error::ToolError;
use cairn_sandbox::{Confinement, Network, ResourceLimits};

use crate::process::NetworkPolicy;
use crate::proxy::HostRules;
use std::sync::Arc;

/// Output and time limits of tool calls.
///
/// The sandbox's limits are a ceiling: a per-call value (for example `bash`'s
/// `timeout`) may lower them but never raise them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of file content or output per stream a call handles.
    pub max_output_bytes: usize,
    /// Longest a call may run.
    pub timeout: Duration,
}

impl Limits {
    /// The highest output limit a sandbox accepts, whatever the workflow says:
    /// tool results travel through the event log and the store.
    pub const MAX_OUTPUT_BYTES: usize = 64 * 1024 * 1024;
    /// The longest timeout a sandbox accepts.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

    /// These limits, lowered to the crate's ceilings.
    pub fn capped(self) -> Limits {
        Limits {
            max_output_bytes: self.max_output_bytes.min(Self::MAX_OUTPUT_BYTES),
            timeout: self.timeout.min(Self::MAX_TIMEOUT),
        }
    }

    /// The timeout for one call: the requested one if lower, else the limit.
    pub fn timeout_for(&self, requested: Option<Duration>) -> Duration {
        requested.map_or(self.timeout, |r| r.min(self.timeout))
    }
}

impl Default for Limits {
    /// 200,000 bytes and 60 seconds, the defaults of the workflow format.
    fn default() -> Self {
        Limits {
            max_output_bytes: 200_000,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Why a sandbox could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The root does not exist, is not a directory, or cannot be opened.
    #[error("sandbox root `{root}`: {source}")]
    Root {
        /// The root as given.
        root: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The folder tools may touch, and the policies of their calls.
#[derive(Debug)]
pub struct Sandbox {
    root: PathBuf,
    root_fd: OwnedFd,
    network: NetworkPolicy,
    limits: Limits,
    env: Vec<(String, String)>,
    isolation: Isolation,
    hidden: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    resources: ResourceLimits,
    hosts: Option<Arc<HostRules>>,
}

/// Whether processes started in a sandbox are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Their own user, mount, PID and network namespaces (see
    /// `cairn-sandbox`); refused where the kernel cannot provide them.
    #[default]
    Namespaces,
    /// No confinement beyond the process group, the minimal environment
    /// and the seccomp network filter: an explicit, logged opt-out.
    None,
}

/// What a resolved path is opened for (`cairn-rootfs` owns resolution).
pub(crate) use cairn_rootfs::Open;

/// Opens `rel` beneath `dir` as the tools resolve paths: links are followed
/// while they stay beneath the root (a link inside the root is the user's
/// to make), `..` above it, absolute links and magic links are refused.
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    mode: Open,
) -> std::io::Result<OwnedFd> {
    cairn_rootfs::open_beneath(dir, rel, mode, cairn_rootfs::Follow::Beneath)
}

impl Sandbox {
    /// A sandbox rooted at `root` (which must be an existing directory), with
    /// the network shut, default limits and no extra environment.
    pub fn new(root: impl AsRef<Path>) -> Result<Sandbox, SandboxError> {
        let given = root.as_ref();
        let err = |source| SandboxError::Root {
            root: given.to_path_buf(),
            source,
        };
        let root = std::fs::canonicalize(given).map_err(err)?;
        let c = CString::new(root.as_os_str().as_bytes()).map_err(|_| {
            err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "contains a NUL byte",
            ))
        })?;
        // SAFETY: c is a valid C string; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(Sandbox {
            root,
            // SAFETY: fd was just opened and is owned by nobody else.
            root_fd: unsafe { OwnedFd::from_raw_fd(fd) },
            network: NetworkPolicy::Deny,
            limits: Limits::default(),
            env: Vec::new(),
            isolation: Isolation::Namespaces,
            hidden: Vec::new(),
            read_only: Vec::new(),
            resources: ResourceLimits::default(),
            hosts: None,
        })
    }

    /// Sets whether `bash` may reach the network.
    pub fn with_network(mut self, network: NetworkPolicy) -> Self {
        self.network = network;
        self
    }

    /// Sets the limits (lowered to [`Limits::MAX_OUTPUT_BYTES`] and
    /// [`Limits::MAX_TIMEOUT`]).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits.capped();
        self
    }

    /// Sets variables every `bash` call gets on top of the minimal environment.
    pub fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    /// Lets processes reach `hosts` only, through the filtering proxy
    /// ([`NetworkPolicy::Proxy`]).
    pub fn with_network_hosts(mut self, hosts: HostRules) -> Self {
        self.network = NetworkPolicy::Proxy;
        self.hosts = Some(Arc::new(hosts));
        self
    }

    /// The hosts of [`NetworkPolicy::Proxy`].
    pub fn network_hosts(&self) -> Option<Arc<HostRules>> {
        self.hosts.clone()
    }

    /// Sets whether processes are confined (namespaces by default).
    pub fn with_isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// Sets paths confined processes must not see even inside the root
    /// (the store, its locks, the logs).
    ///
    /// The file tools refuse them too: a path that resolves into one, by
    /// name or through a symlink inside the root, is refused.
    pub fn with_hidden(mut self, hidden: Vec<PathBuf>) -> Self {
        // Compared with the real paths of opened descriptors, so kept
        // canonical where they exist.
        self.hidden = hidden
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        self
    }

    /// Sets extra host folders confined processes see read-only.
    pub fn with_read_only(mut self, paths: Vec<PathBuf>) -> Self {
        self.read_only = paths;
        self
    }

    /// Sets memory, process and CPU ceilings for each process.
    pub fn with_resources(mut self, resources: ResourceLimits) -> Self {
        self.resources = resources;
        self
    }

    /// Whether processes are confined.
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// The paths hidden from confined processes.
    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    /// The extra read-only folders.
    pub fn read_only(&self) -> &[PathBuf] {
        &self.read_only
    }

    /// The per-process resource ceilings.
    pub fn resources(&self) -> ResourceLimits {
        self.resources
    }

    /// The confinement for a process started here, or `None` when the
    /// sandbox opts out of isolation.
    pub fn confinement(&self) -> Option<Confinement> {
        match self.isolation {
            Isolation::None => None,
            Isolation::Namespaces => Some(Confinement {
                root: self.root.clone(),
                hidden: self.hidden.clone(),
                read_only: self.read_only.clone(),
                network: match self.network {
                    NetworkPolicy::Allow => Network::Host,
                    NetworkPolicy::Deny => Network::None,
                    NetworkPolicy::Proxy => Network::Proxy,
                },
                limits: self.resources,
            }),
        }
    }

    /// A copy with other limits (same root, policies and environment).
    pub fn derive(&self, limits: Limits) -> Result<Sandbox, SandboxError> {
        let mut s = Sandbox::new(&self.root)?;
        s.hosts = self.hosts.clone();
        Ok(s.with_network(self.network)
            .with_limits(limits)
            .with_env(self.env.clone())
            .with_isolation(self.isolation)
            .with_hidden(self.hidden.clone())
            .with_read_only(self.read_only.clone())
            .with_resources(self.resources))
    }

    /// A second descriptor of the root, for work that outlives a borrow of
    /// the sandbox (searches on blocking threads).
    pub(crate) fn root_fd(&self) -> std::io::Result<OwnedFd> {
        self.root_fd.try_clone()
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The network policy for `bash`.
    pub fn network(&self) -> NetworkPolicy {
        self.network
    }

    /// The limits every call is held to.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The extra environment for `bash`.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Turns a tool's path argument into a path relative to the root, without
    /// touching the file system. Absolute paths must start with the root;
    /// whether the rest stays inside is the kernel's decision at open time.
    pub fn relative(&self, path: &str) -> Result<PathBuf, ToolError> {
        if path.contains('\0') {
            return Err(path_err(path, "contains a NUL byte"));
        }
        if path.is_empty() {
            return Err(path_err(path, "is empty"));
        }
        let p = Path::new(path);
        let rel = if p.is_absolute() {
            match p.strip_prefix(&self.root) {
                Ok(rest) => rest.to_path_buf(),
                Err(_) => {
                    return Err(path_err(
                        path,
                        &format!(
                            "is an absolute path outside the sandbox root `{}`",
                            self.root.display()
                        ),
                    ))
                }
            }
        } else {
            p.to_path_buf()
        };
        if rel.as_os_str().is_empty() {
            Ok(PathBuf::from("."))
        } else {
            Ok(rel)
        }
    }

    /// Resolves `path` beneath the root and opens it in the same step. Returns
    /// the descriptor and the path relative to the root. This is the function
    /// the adversarial tests and the fuzz target exercise.
    pub fn resolve(&self, path: &str) -> Result<(OwnedFd, PathBuf), ToolError> {
        let rel = self.relative(path)?;
        let fd = self.open_rel(&rel, Open::Any, path)?;
        Ok((fd, rel))
    }

    /// Opens a path relative to the root with `openat2(RESOLVE_BENEATH)`.
    pub(crate) fn open_rel(
        &self,
        rel: &Path,
        mode: Open,
        shown: &str,
    ) -> Result<OwnedFd, ToolError> {
        let fd =
            open_beneath(self.root_fd.as_fd(), rel, mode).map_err(|e| io_path_err(shown, e))?;
        self.refuse_hidden(&fd, None, shown)?;
        Ok(fd)
    }

    /// Refuses an opened file or folder (or the entry `name` in an opened
    /// folder) that is, or lies inside, a hidden path: the store, its locks
    /// and logs stay out of the tools' reach even inside the root. The
    /// descriptor's real path is the kernel's, so a symlink to the store
    /// inside the root is refused as the store itself is.
    fn refuse_hidden(
        &self,
        fd: &OwnedFd,
        name: Option<&std::ffi::OsStr>,
        shown: &str,
    ) -> Result<(), ToolError> {
        if self.hidden.is_empty() {
            return Ok(());
        }
        let Ok(mut real) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
            return Err(path_err(
                shown,
                "cannot be checked against the store's folder",
            ));
        };
        if let Some(n) = name {
            real.push(n);
        }
        // A hidden folder around the whole root would hide everything;
        // only what lies inside the root is the tools' to refuse.
        if self
            .hidden
            .iter()
            .any(|h| real.starts_with(h) && !self.root.starts_with(h))
        {
            return Err(path_err(
                shown,
                "is inside the run store's folder, which tools cannot reach",
            ));
        }
        Ok(())
    }

    /// Opens a regular file for reading.
    pub(crate) fn open_file(&self, path: &str) -> Result<(File, PathBuf), ToolError> {
        let rel = self.relative(path)?;
        let fd = self.open_rel(&rel, Open::ReadFile, path)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| io_path_err(path, e))?;
        if !meta.is_file() {
            let what = if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Err(path_err(path, &format!("is {what}")));
        }
        Ok((file, rel))
    }

    /// Opens the parent directory of `rel` (creating missing folders when
    /// `create` is set) and returns it with the file name.
    pub(crate) fn open_parent(
        &self,
        path: &str,
        rel: &Path,
        create: bool,
    ) -> Result<(cairn_rootfs::Dir, CString), ToolError> {
        let name = match rel.components().next_back() {
            Some(Component::Normal(n)) => n,
            _ => return Err(path_err(path, "does not name a file")),
        };
        let name =
            CString::new(name.as_bytes()).map_err(|_| path_err(path, "contains a NUL byte"))?;
        let parent = rel
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let entry = std::ffi::OsStr::from_bytes(name.as_bytes());
        match open_beneath(self.root_fd.as_fd(), parent, Open::Dir) {
            Ok(fd) => {
                self.refuse_hidden(&fd, Some(entry), path)?;
                self.refuse_read_only(&fd, entry, path)?;
                return Ok((cairn_rootfs::Dir::from_fd(fd), name));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {}
            Err(e) => return Err(io_path_err(path, e)),
        }
        // Create the missing folders one by one, each through the descriptor
        // of its (already resolved) parent, re-resolving every prefix from the
        // root so a symlink planted meanwhile is judged by the kernel too.
        let mut prefix = PathBuf::new();
        let mut dir = self.open_rel(Path::new("."), Open::Dir, path)?;
        for comp in parent.components() {
            prefix.push(comp);
            match open_beneath(self.root_fd.as_fd(), &prefix, Open::Dir) {
                Ok(fd) => dir = fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let Component::Normal(n) = comp else {
                        return Err(io_path_err(path, e));
                    };
                    let made = cairn_rootfs::Dir::from_fd(dir).mkdir(n.as_bytes(), 0o777);
                    match made {
                        Err(e) if e.raw_os_error() != Some(libc::EEXIST) => {
                            return Err(io_path_err(path, e))
                        }
                        _ => {}
                    }
                    dir = open_beneath(self.root_fd.as_fd(), &prefix, Open::Dir)
                        .map_err(|e| io_path_err(path, e))?;
                }
                Err(e) => return Err(io_path_err(path, e)),
            }
        }
        self.refuse_hidden(&dir, Some(entry), path)?;
        self.refuse_read_only(&dir, entry, path)?;
        Ok((cairn_rootfs::Dir::from_fd(dir), name))
    }

    /// Refuses to write the entry `name` of an opened folder when it is,
    /// or lies inside, a read-only path: confined processes see those
    /// read-only (the workflow files in the root among them, so that no
    /// node changes what will run), and the tools, which write from the
    /// engine, must not do for a node what its processes cannot.
    fn refuse_read_only(
        &self,
        dir: &OwnedFd,
        name: &std::ffi::OsStr,
        shown: &str,
    ) -> Result<(), ToolError> {
        if self.read_only.is_empty() {
            return Ok(());
        }
        let Ok(mut real) = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
            return Err(path_err(
                shown,
                "cannot be checked against the read-only paths",
            ));
        };
        real.push(name);
        let read_only = self
            .read_only
            .iter()
            .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
            .any(|p| real.starts_with(p));
        if read_only {
            return Err(path_err(
                shown,
                "is read-only in this sandbox (a workflow file of the run, or a `read_only` path)",
            ));
        }
        Ok(())
    }

    /// Replaces (or creates) `name` in `dir` with `content`: a temporary file
    /// in the same folder, synced, then renamed over the target. The target's
    /// permissions are kept when it existed.
    pub(crate) fn replace_file(
        &self,
        path: &str,
        dir: &cairn_rootfs::Dir,
        name: &CString,
        content: &[u8],
    ) -> Result<(), ToolError> {
        // Keep the mode of the file being replaced (a script stays executable).
        let mode = match dir.lstat(name.as_bytes()) {
            Ok(st) if st.kind() == cairn_rootfs::Kind::Dir => {
                return Err(path_err(path, "is a directory"))
            }
            Ok(st) => st.mode & 0o7777,
            Err(_) => 0o666,
        };
        // A temporary file beside it, synced, renamed over it: rename
        // replaces a symlink at `name` instead of following it.
        dir.write_replace(name.as_bytes(), content, mode, true)
            .map_err(|e| io_path_err(path, e))
    }
}

pub(crate) fn path_err(path: &str, reason: &str) -> ToolError {
    ToolError::Path {
        path: path.replace('\0', "\\0"),
        reason: reason.to_string(),
    }
}

/// Turns an OS error from resolution into words a workflow author can act on.
pub(crate) fn io_path_err(path: &str, e: std::io::Error) -> ToolError {
    let reason = match e.raw_os_error() {
        Some(libc::EXDEV) => "resolves outside the sandbox root (through `..`, an absolute symlink or a symlink leading out)".to_string(),
        Some(libc::ELOOP) => "goes through a /proc magic link or too many symlinks".to_string(),
        Some(libc::ENOENT) => "does not exist".to_string(),
        Some(libc::ENOTDIR) => "has a component that is not a directory".to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".to_string(),
        Some(libc::ENOSYS) => "cannot be resolved safely: this kernel lacks openat2 (Linux 5.6+ is required)".to_string(),
        Some(libc::ENAMETOOLONG) => "is too long".to_string(),
        Some(libc::EISDIR) => "is a directory".to_string(),
        _ => e.to_string(),
    };
    path_err(path, &reason)
}
