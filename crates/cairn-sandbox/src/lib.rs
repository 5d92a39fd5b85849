//! Cairn's Linux process sandbox: one job, starting a program confined.
//!
//! A [`Confinement`] says what the program may see; [`Confinement::prepare`]
//! turns it, in the engine, into a [`Prepared`] plan (every path as a C
//! string, every mount decided), and [`Prepared::enter`] carries the plan out
//! between `fork` and `exec` (from `Command::pre_exec`), where nothing may
//! allocate. The walls, in the order the child builds them:
//!
//! 1. **Namespaces.** The spawned process unshares a user, mount, PID, IPC
//!    and UTS namespace (and a network namespace unless the network is
//!    open), maps its own uid and gid, and forks: the grandchild is PID 1 of
//!    the new PID namespace and runs the program; the spawned process waits
//!    for it and exits with its status. Each dies with its parent
//!    (`PR_SET_PDEATHSIG`), and when PID 1 dies the kernel kills everything
//!    else in the namespace, `setsid` and double-forked children included.
//! 2. **File system.** A fresh root on a tmpfs: the system folders
//!    (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc`) bound read-only, `/etc`'s
//!    secrets (`shadow`, `gshadow`, SSH host keys, `ssl/private`) masked, a
//!    private `/tmp`, a fresh `/proc` (its machine-wide parts read-only or
//!    masked), a minimal `/dev`, the sandbox root
//!    read-write at its own path, and the [`Confinement::hidden`] paths (the
//!    store, its locks and logs) covered by empty read-only mounts. The old
//!    root is detached, so nothing else of the host is reachable.
//! 3. **Landlock**, where the kernel has it: the same view again as access
//!    rules (writes only beneath the root, `/tmp`, `/dev`), and on ABI 6 no
//!    abstract Unix sockets or signals outside the sandbox.
//! 4. **Limits** ([`ResourceLimits`]) the tree's control group does not
//!    count, as rlimits; `no_new_privs`, no
//!    capabilities (bounding, ambient and effective sets emptied), and a
//!    seccomp filter refusing `ptrace`, `process_vm_readv/writev` and
//!    `pidfd_getfd` and the kernel keyring calls.
//!
//! Before all of these, when there are limits and the machine offers a
//! place for it, the spawned process joins a control group of its own
//! ([`cgroup`]), so everything it starts is counted together.
//!
//! When the kernel refuses a step (user namespaces disabled, a container's
//! seccomp policy), the program is not started: [`Prepared::failure`] names
//! the step and the error, and [`SandboxError::Unavailable`] says how to opt
//! out. There is no silent fallback to running unconfined.

#![warn(missing_docs)]

pub mod cgroup;
mod child;
pub mod fdpass;
mod landlock;
mod plan;
mod probe;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

pub use landlock::abi as landlock_abi;
pub use probe::{probe, Check, Report};

/// The port the proxy listener takes inside a sandbox's own network
/// namespace (free by construction: nothing else lives there).
pub const PROXY_PORT: u16 = 3128;

/// What the program may reach over the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// A network namespace of its own with nothing in it: no interface up,
    /// none of the host's abstract Unix sockets.
    None,
    /// The host's network.
    Host,
    /// A network namespace of its own with only loopback up and a TCP
    /// listener on `127.0.0.1:`[`PROXY_PORT`] created by the child and handed
    /// to the engine ([`Prepared::take_proxy_listener`]), which accepts on it
    /// and forwards what its policy allows.
    Proxy,
}

/// Resource ceilings of one sandboxed process tree. Each is counted over the
/// whole tree in a control group where [`cgroup::support`] offers one, and
/// is an rlimit of each process otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceLimits {
    /// Memory in bytes: the tree's resident memory (`memory.max`, no swap;
    /// the OOM killer ends the tree beyond it), or each process's address
    /// space (`RLIMIT_AS`: allocations beyond fail).
    pub memory_bytes: Option<u64>,
    /// Tasks (processes and threads) of the tree (`pids.max`: `fork`
    /// fails beyond), or of the sandbox's user (`RLIMIT_NPROC`, counted per
    /// user namespace, and not enforced when the engine runs as root,
    /// which the kernel exempts).
    pub processes: Option<u64>,
    /// CPU seconds: of the whole tree (the engine reads the group's usage
    /// and kills it when over), or of each process (`RLIMIT_CPU`: SIGXCPU at
    /// the limit, SIGKILL a second later).
    pub cpu_seconds: Option<u64>,
}

impl ResourceLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.memory_bytes.is_some() || self.processes.is_some() || self.cpu_seconds.is_some()
    }
}

/// What a confined program may see and do.
#[derive(Debug, Clone)]
pub struct Confinement {
    /// The sandbox root: the only host folder the program may write.
    pub root: PathBuf,
    /// Paths (files or folders) to cover with an empty read-only mount even
    /// when they lie inside the root: the store, its locks, the logs.
    pub hidden: Vec<PathBuf>,
    /// Extra host folders visible read-only (toolchains outside `/usr`).
    pub read_only: Vec<PathBuf>,
    /// The network.
    pub network: Network,
    /// Resource ceilings.
    pub limits: ResourceLimits,
}

impl Confinement {
    /// Confinement to `root`, network shut, nothing hidden, no limits.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Confinement {
            root: root.into(),
            hidden: Vec::new(),
            read_only: Vec::new(),
            network: Network::None,
            limits: ResourceLimits::default(),
        }
    }

    /// Plans the confinement of a program started in `cwd` (which must lie
    /// inside the root). Done in the engine, before `fork`.
    pub fn prepare(&self, cwd: &Path) -> Result<Prepared, SandboxError> {
        plan::prepare(self, cwd)
    }
}

/// Why a program cannot be confined.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The confinement itself is wrong (a root that is not a folder, a
    /// working directory outside it).
    #[error("sandbox: {0}")]
    Invalid(String),
    /// The kernel refused a step of building the sandbox.
    #[error("{0}")]
    Unavailable(String),
    /// A descriptor or pipe for the sandbox could not be created.
    #[error("sandbox: {0}")]
    Io(#[from] io::Error),
}

/// The setting a workflow uses to run its processes unconfined, named in
/// every error that refuses to start a process without a sandbox.
pub const OPT_OUT_HINT: &str =
    "to run without the sandbox, set `sandbox: { isolation: none }` in the workflow (or on the node)";

/// A step of building the sandbox, as reported by the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What the child was doing.
    pub step: String,
    /// The kernel's answer.
    pub errno: i32,
}

impl Failure {
    /// The error for a caller: what failed, why, and the way out.
    pub fn into_error(self) -> SandboxError {
        let err = io::Error::from_raw_os_error(self.errno);
        let userns =
            self.step.starts_with("unshare (user") || self.step.starts_with("writing /proc/self");
        let refused = matches!(
            self.errno,
            libc::EPERM | libc::EACCES | libc::ENOSPC | libc::EINVAL | libc::ENOSYS
        );
        let why = if userns && refused {
            " (unprivileged user namespaces are disabled here: kernel.unprivileged_userns_clone=0, user.max_user_namespaces=0, an AppArmor restriction or a container's seccomp policy; `cairn doctor` shows which walls this machine supports)"
        } else if self.step.starts_with("unshare") && refused {
            " (a container's seccomp policy or a namespace limit; `cairn doctor` shows which walls this machine supports)"
        } else {
            ""
        };
        SandboxError::Unavailable(format!(
            "cannot build the process sandbox: {} failed: {err}{why}; {OPT_OUT_HINT}",
            self.step
        ))
    }
}

/// A confinement planned for one spawn. Build it with
/// [`Confinement::prepare`], call [`Prepared::enter`] from `pre_exec`, and
/// after a failed spawn ask [`Prepared::failure`] what went wrong.
#[derive(Debug)]
pub struct Prepared {
    pub(crate) plan: plan::Plan,
    /// The child writes the failing step here; the engine reads it.
    report_rx: OwnedFd,
    pub(crate) report_tx: OwnedFd,
    /// The proxy listener comes back over this pair (taken once).
    proxy: std::sync::Mutex<Option<(OwnedFd, OwnedFd)>>,
    /// The child's end of that pair, read without locking after `fork`.
    proxy_tx: Option<RawFd>,
}

impl Prepared {
    pub(crate) fn new(plan: plan::Plan, proxy: bool) -> Result<Prepared, SandboxError> {
        let (report_rx, report_tx) = pipe()?;
        set_nonblocking(report_rx.as_raw_fd())?;
        let proxy = if proxy {
            Some(fdpass::seqpacket_pair()?)
        } else {
            None
        };
        let proxy_tx = proxy.as_ref().map(|(_, tx)| tx.as_raw_fd());
        Ok(Prepared {
            plan,
            report_rx,
            report_tx,
            proxy: std::sync::Mutex::new(proxy),
            proxy_tx,
        })
    }

    /// Builds the sandbox around the calling process and returns in the
    /// confined process, which should `exec` the program next. The process
    /// that called it never returns: it waits for the confined one and exits
    /// with its status (or dies of its signal).
    ///
    /// # Safety
    ///
    /// Only to be called in a freshly forked child (`pre_exec`), once. It
    /// makes only async-signal-safe system calls and does not allocate.
    pub unsafe fn enter(&self) -> io::Result<()> {
        child::enter(self, self.proxy_tx)
    }

    /// After a failed spawn: the step of the sandbox that failed, if the
    /// failure was the sandbox's.
    pub fn failure(&self) -> Option<Failure> {
        let mut buf = [0u8; 8];
        // SAFETY: reads into a live buffer from a non-blocking pipe.
        let n = unsafe {
            libc::read(
                self.report_rx.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n != 8 {
            return None;
        }
        let step = u32::from_ne_bytes(buf[..4].try_into().ok()?);
        let errno = i32::from_ne_bytes(buf[4..].try_into().ok()?);
        Some(Failure {
            step: self.plan.step_name(step),
            errno,
        })
    }

    /// The control group counting the tree's limits, when the confinement
    /// has limits and this machine offers a place for the group
    /// ([`cgroup::support`]). The engine polls its CPU time, kills it on
    /// timeout or cancel, reads [`cgroup::Group::hit`] once the process
    /// ended and removes it.
    pub fn cgroup(&self) -> Option<&cgroup::Group> {
        self.plan.group.as_ref()
    }

    /// Why the confinement's limits apply less than fully here, if they do:
    /// no control group could be made for them, or a process limit binds
    /// nobody. The program still runs; the engine reports this.
    pub fn limits_note(&self) -> Option<&str> {
        self.plan.limits_note.as_deref()
    }

    /// With [`Network::Proxy`], after the spawn: the listening socket the
    /// child created in its network namespace.
    pub fn take_proxy_listener(&self) -> Option<OwnedFd> {
        let (rx, tx) = self.proxy.lock().ok()?.take()?;
        drop(tx);
        fdpass::recv_fd(rx.as_raw_fd())
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a valid descriptor.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A path as a C string, or an [`SandboxError::Invalid`] naming it.
pub(crate) fn cstr(p: impl AsRef<[u8]>) -> Result<CString, SandboxError> {
    CString::new(p.as_ref().to_vec())
        .map_err(|_| SandboxError::Invalid("a path contains a NUL byte".into()))
}

/// Marks the calling process non-dumpable: no core dumps, and its
/// `/proc/<pid>` entries (environ, mem, fd) become unreadable to other
/// processes of the same user; `ptrace` attach is refused. The engine calls
/// it at start.
pub fn make_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
