//! Turning a [`Confinement`] into a plan the child can carry out without
//! allocating: every mount decided, every path a C string.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::{cstr, landlock, Confinement, Network, Prepared, SandboxError};

/// Where the new root is assembled (inside the child's private base tmpfs).
pub(crate) const NEW_ROOT: &str = "/newroot";
/// Where the host's root stays reachable while the new one is assembled.
pub(crate) const OLD_ROOT: &str = "/oldroot";

/// System folders every sandbox sees read-only (when the host has them).
const SYSTEM: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc",
];

/// Files of `/etc` that hold secrets; masked when present.
const ETC_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssl/private",
];

/// Parts of `/proc` that change the whole machine when written (sysctls,
/// interrupts): read-only. The kernel lets the engine's uid write them when
/// that uid is root, capabilities or not.
const PROC_READ_ONLY: &[&str] = &["sys", "irq", "bus", "fs"];

/// Files of `/proc` that are hidden: a machine-wide trigger and leaks of
/// kernel memory, keys and timers.
const PROC_MASKED: &[&str] = &[
    "sysrq-trigger",
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
];

/// Device nodes bound from the host's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Fixed steps of the child, reported by number when they fail. Mount
/// operations are reported as `STEP_OPS + index`.
pub(crate) mod step {
    pub const UNSHARE: u32 = 0;
    pub const SETGROUPS: u32 = 1;
    pub const UID_MAP: u32 = 2;
    pub const GID_MAP: u32 = 3;
    pub const FORK: u32 = 4;
    pub const PARENT_GONE: u32 = 5;
    pub const PRIVATE: u32 = 6;
    pub const BASE: u32 = 7;
    pub const PIVOT: u32 = 8;
    pub const CWD: u32 = 9;
    pub const NETWORK: u32 = 10;
    pub const RLIMIT: u32 = 11;
    pub const NO_NEW_PRIVS: u32 = 12;
    pub const LANDLOCK: u32 = 13;
    pub const CAPS: u32 = 14;
    pub const SECCOMP: u32 = 15;
    pub const UNSHARE_REST: u32 = 16;
    pub const CGROUP: u32 = 17;
    pub const OPS: u32 = 100;
}

/// One step of assembling the new root. Paths are already absolute in the
/// child's view while assembling (`/newroot/...`, `/oldroot/...`).
#[derive(Debug)]
pub(crate) enum Op {
    /// `mkdir`, tolerating an existing folder.
    Dir(CString),
    /// An empty file to bind a file onto.
    File(CString),
    /// A bind mount (recursive), made read-only when asked.
    Bind {
        src: CString,
        dst: CString,
        read_only: bool,
    },
    /// Covers a file with the read-only null device.
    MaskFile(CString),
    /// Covers a folder with an empty read-only tmpfs.
    MaskDir(CString),
    /// A fresh tmpfs.
    Tmpfs {
        dst: CString,
        flags: libc::c_ulong,
        data: CString,
    },
    /// A fresh `proc` for the new PID namespace.
    Proc(CString),
    /// A private `devpts` instance; a failure only leaves out `/dev/pts`.
    Devpts(CString),
    /// Makes part of the fresh `/proc` read-only (bound onto itself);
    /// skipped when this kernel's `/proc` lacks it.
    ProcReadOnly(CString),
    /// Covers a file of the fresh `/proc` with the read-only null device;
    /// skipped when absent.
    ProcMask(CString),
    /// A symbolic link.
    Symlink { target: CString, link: CString },
    /// Makes the skeleton tmpfs read-only once everything is mounted on it.
    SealRoot(CString),
}

/// Everything the child needs, allocated in the engine.
#[derive(Debug)]
pub(crate) struct Plan {
    pub unshare_flags: libc::c_int,
    pub uid_map: CString,
    pub gid_map: CString,
    pub ops: Vec<Op>,
    labels: Vec<String>,
    pub cwd: CString,
    pub landlock: Option<landlock::Rules>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The tree's control group, joined first thing in the child.
    pub group: Option<crate::cgroup::Group>,
    /// Why limits that were asked for apply less than fully (per process,
    /// or not at all), for the engine to report.
    pub limits_note: Option<String>,
    pub proxy: bool,
    pub seccomp: Vec<libc::sock_filter>,
}

// sock_filter holds no pointers; the plan is plain data.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Plan {
    /// Words for a step number the child reported.
    pub(crate) fn step_name(&self, n: u32) -> String {
        if n >= step::OPS {
            return self
                .labels
                .get((n - step::OPS) as usize)
                .cloned()
                .unwrap_or_else(|| format!("mount step {n}"));
        }
        match n {
            step::UNSHARE => "unshare (user and PID namespaces)",
            step::UNSHARE_REST => "unshare (mount, network, IPC, UTS and cgroup namespaces)",
            step::SETGROUPS => "writing /proc/self/setgroups",
            step::UID_MAP => "writing /proc/self/uid_map",
            step::GID_MAP => "writing /proc/self/gid_map",
            step::FORK => "forking PID 1 of the new PID namespace",
            step::PARENT_GONE => "waiting for the parent (it died)",
            step::PRIVATE => "making the mount tree private",
            step::BASE => "mounting the base tmpfs",
            step::PIVOT => "switching to the new root (pivot_root)",
            step::CWD => "entering the working directory",
            step::NETWORK => "setting up loopback and the proxy listener",
            step::RLIMIT => "setting resource limits",
            step::NO_NEW_PRIVS => "setting no_new_privs",
            step::LANDLOCK => "applying Landlock rules",
            step::CAPS => "dropping capabilities",
            step::SECCOMP => "installing the seccomp filter",
            step::CGROUP => "joining the control group of the node's limits",
            _ => "an unknown step",
        }
        .to_string()
    }
}

/// Builds the ops while tracking which folders exist in the new root.
struct Builder {
    ops: Vec<Op>,
    labels: Vec<String>,
    /// Folders created in the skeleton (host paths).
    made: BTreeSet<PathBuf>,
    /// Host folders bound into the new root: what lies beneath them exists.
    bound: Vec<PathBuf>,
}

fn new_path(p: &Path) -> Result<CString, SandboxError> {
    let mut v = NEW_ROOT.as_bytes().to_vec();
    v.extend_from_slice(p.as_os_str().as_bytes());
    cstr(v)
}

fn old_path(p: &Path) -> Result<CString, SandboxError> {
    let mut v = OLD_ROOT.as_bytes().to_vec();
    v.extend_from_slice(p.as_os_str().as_bytes());
    cstr(v)
}

impl Builder {
    fn push(&mut self, op: Op, label: String) {
        self.ops.push(op);
        self.labels.push(label);
    }

    fn exists_in_new_root(&self, p: &Path) -> bool {
        p == Path::new("/") || self.made.contains(p) || self.bound.iter().any(|b| p.starts_with(b))
    }

    /// Creates `p` and its missing ancestors in the skeleton.
    fn dir(&mut self, p: &Path) -> Result<(), SandboxError> {
        let mut chain: Vec<&Path> = p.ancestors().collect();
        chain.reverse();
        for a in chain {
            if self.exists_in_new_root(a) {
                continue;
            }
            self.push(Op::Dir(new_path(a)?), format!("creating {}", a.display()));
            self.made.insert(a.to_path_buf());
        }
        Ok(())
    }

    fn bind(&mut self, src: &Path, dst: &Path, read_only: bool) -> Result<(), SandboxError> {
        let is_dir = std::fs::metadata(src).map(|m| m.is_dir()).unwrap_or(false);
        if is_dir {
            self.dir(dst)?;
        } else {
            if let Some(parent) = dst.parent() {
                self.dir(parent)?;
            }
            if !self.exists_in_new_root(dst) {
                self.push(
                    Op::File(new_path(dst)?),
                    format!("creating {}", dst.display()),
                );
            }
        }
        self.push(
            Op::Bind {
                src: old_path(src)?,
                dst: new_path(dst)?,
                read_only,
            },
            format!(
                "bind-mounting {} {}",
                src.display(),
                if read_only { "read-only" } else { "read-write" }
            ),
        );
        if is_dir {
            self.bound.push(dst.to_path_buf());
        }
        Ok(())
    }

    fn tmpfs(&mut self, dst: &Path, flags: libc::c_ulong, data: &str) -> Result<(), SandboxError> {
        self.dir(dst)?;
        self.push(
            Op::Tmpfs {
                dst: new_path(dst)?,
                flags,
                data: cstr(data)?,
            },
            format!("mounting a tmpfs on {}", dst.display()),
        );
        Ok(())
    }

    fn symlink(&mut self, target: &Path, link: &Path) -> Result<(), SandboxError> {
        if let Some(parent) = link.parent() {
            self.dir(parent)?;
        }
        self.push(
            Op::Symlink {
                target: cstr(target.as_os_str().as_bytes())?,
                link: new_path(link)?,
            },
            format!("linking {} to {}", link.display(), target.display()),
        );
        Ok(())
    }

    fn mask(&mut self, p: &Path) -> Result<(), SandboxError> {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return Ok(());
        };
        if !self.bound.iter().any(|b| p.starts_with(b) && p != b) {
            // Not beneath anything bound from the host: not visible in the
            // new root anyway (a skeleton folder is empty).
            return Ok(());
        }
        let op = if meta.is_dir() {
            Op::MaskDir(new_path(p)?)
        } else {
            Op::MaskFile(new_path(p)?)
        };
        self.push(op, format!("hiding {}", p.display()));
        Ok(())
    }
}

pub(crate) fn prepare(conf: &Confinement, cwd: &Path) -> Result<Prepared, SandboxError> {
    let root = std::fs::canonicalize(&conf.root)
        .map_err(|e| SandboxError::Invalid(format!("root `{}`: {e}", conf.root.display())))?;
    if !root.is_dir() {
        return Err(SandboxError::Invalid(format!(
            "root `{}` is not a folder",
            root.display()
        )));
    }
    if root == Path::new("/") {
        return Err(SandboxError::Invalid(
            "the root `/` would expose the whole host; choose a project folder".into(),
        ));
    }
    let cwd = std::fs::canonicalize(cwd).map_err(|e| {
        SandboxError::Invalid(format!("working directory `{}`: {e}", cwd.display()))
    })?;
    if !cwd.starts_with(&root) {
        return Err(SandboxError::Invalid(format!(
            "working directory `{}` is outside the sandbox root `{}`",
            cwd.display(),
            root.display()
        )));
    }

    let mut b = Builder {
        ops: Vec::new(),
        labels: Vec::new(),
        made: BTreeSet::new(),
        bound: Vec::new(),
    };
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;

    for name in SYSTEM {
        let p = Path::new("/").join(name);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&p)?;
            b.symlink(&target, &p)?;
        } else if meta.is_dir() {
            b.bind(&p, &p, true)?;
        }
    }
    for extra in &conf.read_only {
        let p = std::fs::canonicalize(extra).map_err(|e| {
            SandboxError::Invalid(format!("read-only path `{}`: {e}", extra.display()))
        })?;
        if !b.exists_in_new_root(&p) || !p.is_dir() {
            b.bind(&p, &p, true)?;
        }
    }
    for secret in ETC_SECRETS {
        b.mask(Path::new(secret))?;
    }
    if let Ok(entries) = std::fs::read_dir("/etc/ssh") {
        let mut keys: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ssh_host_") && n.ends_with("_key"))
            })
            .collect();
        keys.sort();
        for k in keys {
            b.mask(&k)?;
        }
    }
    if conf.network == Network::Host {
        // A resolv.conf that points into /run (systemd-resolved) needs its
        // folder, or name resolution fails with the network open.
        if let Ok(target) = std::fs::read_link("/etc/resolv.conf") {
            let target = Path::new("/etc").join(target);
            if let Some(dir) = target.parent().and_then(|d| std::fs::canonicalize(d).ok()) {
                if !b.exists_in_new_root(&dir) && dir.is_dir() {
                    b.bind(&dir, &dir, true)?;
                }
            }
        }
    }

    // /dev: a tmpfs with the harmless devices bound from the host.
    b.tmpfs(
        Path::new("/dev"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "mode=0755,size=64k",
    )?;
    for d in DEVICES {
        let p = Path::new("/dev").join(d);
        if p.exists() {
            b.bind(&p, &p, false)?;
        }
    }
    b.dir(Path::new("/dev/pts"))?;
    b.push(
        Op::Devpts(new_path(Path::new("/dev/pts"))?),
        "mounting /dev/pts".into(),
    );
    b.symlink(Path::new("pts/ptmx"), Path::new("/dev/ptmx"))?;
    b.tmpfs(Path::new("/dev/shm"), nosuid_nodev, "mode=1777")?;
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        b.symlink(Path::new(target), Path::new(link))?;
    }

    b.dir(Path::new("/proc"))?;
    b.push(
        Op::Proc(new_path(Path::new("/proc"))?),
        "mounting a fresh /proc".into(),
    );
    for p in PROC_READ_ONLY {
        let p = Path::new("/proc").join(p);
        b.push(
            Op::ProcReadOnly(new_path(&p)?),
            format!("making {} read-only", p.display()),
        );
    }
    for p in PROC_MASKED {
        let p = Path::new("/proc").join(p);
        b.push(
            Op::ProcMask(new_path(&p)?),
            format!("hiding {}", p.display()),
        );
    }
    b.tmpfs(Path::new("/tmp"), nosuid_nodev, "mode=1777")?;
    b.tmpfs(Path::new("/var/tmp"), nosuid_nodev, "mode=1777")?;

    b.bind(&root, &root, false)?;
    for h in &conf.hidden {
        // A path that does not exist yet cannot be covered; the store
        // creates its files before any node runs.
        let Ok(h) = std::fs::canonicalize(h) else {
            continue;
        };
        if h == root || root.starts_with(&h) {
            return Err(SandboxError::Invalid(format!(
                "the sandbox root `{}` lies inside the hidden path `{}` (the store?)",
                root.display(),
                h.display()
            )));
        }
        b.mask(&h)?;
    }
    b.push(
        Op::SealRoot(cstr(NEW_ROOT)?),
        "making the new root read-only".into(),
    );

    let writable: Vec<&Path> = vec![
        Path::new("/tmp"),
        Path::new("/var/tmp"),
        Path::new("/dev/shm"),
        &root,
    ];
    let landlock = landlock::Rules::plan(&writable)?;

    let lim = conf.limits;
    // A group counts the whole tree; what it does not count stays an
    // rlimit. A group that cannot be made leaves every limit to rlimits
    // rather than refusing the node.
    let (group, failed) = match crate::cgroup::Group::create(&lim) {
        Ok(g) => (g, None),
        Err(e) => (None, Some(e)),
    };
    let (by_memory, by_pids, by_cpu) = group.as_ref().map_or((false, false, false), |g| g.counts());
    let limits_note = limits_note(&lim, by_pids, failed.as_ref());
    let mut rlimits = Vec::new();
    if let Some(m) = lim.memory_bytes.filter(|_| !by_memory) {
        rlimits.push((
            libc::RLIMIT_AS,
            libc::rlimit {
                rlim_cur: m,
                rlim_max: m,
            },
        ));
    }
    if let Some(n) = lim.processes.filter(|_| !by_pids) {
        rlimits.push((
            libc::RLIMIT_NPROC,
            libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            },
        ));
    }
    if let Some(c) = lim.cpu_seconds.filter(|_| !by_cpu) {
        rlimits.push((
            libc::RLIMIT_CPU,
            libc::rlimit {
                rlim_cur: c,
                rlim_max: c.saturating_add(1),
            },
        ));
    }

    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if conf.network != Network::Host {
        flags |= libc::CLONE_NEWNET;
    }
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let plan = Plan {
        unshare_flags: flags,
        uid_map: cstr(format!("{uid} {uid} 1\n"))?,
        gid_map: cstr(format!("{gid} {gid} 1\n"))?,
        ops: b.ops,
        labels: b.labels,
        cwd: cstr(cwd.as_os_str().as_bytes())?,
        landlock,
        rlimits,
        group,
        limits_note,
        proxy: conf.network == Network::Proxy,
        seccomp: crate::child::seccomp_program(),
    };
    Prepared::new(plan, conf.network == Network::Proxy)
}

/// What to tell the engine when the limits asked for apply less than fully:
/// the group could not be made (each limit falls back to an rlimit, per
/// process), and without a group a process limit binds nobody when the
/// engine runs as root (the kernel exempts root from `RLIMIT_NPROC`).
fn limits_note(
    lim: &crate::ResourceLimits,
    by_pids: bool,
    failed: Option<&std::io::Error>,
) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let unbound = lim.processes.is_some() && !by_pids && root;
    match (failed, unbound) {
        (None, false) => None,
        (Some(e), false) => Some(format!(
            "no control group for the node's limits ({e}): they apply to each process alone"
        )),
        (Some(e), true) => Some(format!(
            "no control group for the node's limits ({e}): they apply to each process alone, \
             and the process limit is not enforced for an engine running as root"
        )),
        (None, true) => Some(
            "no control group counts processes here (see `cairn doctor`): the process limit \
             is not enforced for an engine running as root"
                .into(),
        ),
    }
}

#[cfg(test)]
mod limits_note_tests {
    use super::limits_note;
    use crate::ResourceLimits;

    #[test]
    fn a_weakened_limit_is_said_and_a_counted_one_is_not() {
        let procs = ResourceLimits {
            processes: Some(10),
            ..ResourceLimits::default()
        };
        let mem = ResourceLimits {
            memory_bytes: Some(1 << 30),
            ..ResourceLimits::default()
        };
        // Counted by a group: nothing to say.
        assert_eq!(limits_note(&procs, true, None), None);
        assert_eq!(limits_note(&mem, false, None), None);
        // The group could not be made: every limit is per process.
        let e = std::io::Error::from_raw_os_error(libc::EACCES);
        let note = limits_note(&mem, false, Some(&e)).unwrap();
        assert!(note.contains("each process alone"), "{note}");
        // No group counts processes: for root the limit binds nobody.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        match limits_note(&procs, false, None) {
            Some(n) => {
                assert!(root);
                assert!(n.contains("not enforced"), "{n}");
            }
            None => assert!(!root),
        }
    }
}
