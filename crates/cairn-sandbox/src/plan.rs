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

/// Where a step stands among steps on the same path: a fresh file system
/// first, then what is bound onto it, then what covers a bound path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    Fresh,
    Bind,
    Cover,
}

/// One step of the view, wanted at a path, before the steps are ordered.
#[derive(Debug)]
enum Want {
    /// The host's path bound at its own path. A `requested` read-only path
    /// already shown read-only by a bind above it is not bound again.
    Bind { read_only: bool, requested: bool },
    /// A fresh tmpfs.
    Tmpfs {
        flags: libc::c_ulong,
        data: &'static str,
    },
    /// The fresh `/proc`.
    Proc,
    /// The private `/dev/pts`.
    Devpts,
    /// A part of the fresh `/proc` made read-only.
    ProcReadOnly,
    /// A file of the fresh `/proc` covered.
    ProcMask,
    /// A symbolic link to `target`.
    Symlink { target: PathBuf },
    /// A host path covered with an empty read-only mount (Cairn's own
    /// files, `/etc`'s secrets), when a bind shows it.
    Cover,
}

impl Want {
    fn rank(&self) -> Rank {
        match self {
            Want::Tmpfs { .. } | Want::Proc | Want::Devpts | Want::Symlink { .. } => Rank::Fresh,
            Want::Bind { .. } | Want::ProcReadOnly => Rank::Bind,
            Want::Cover | Want::ProcMask => Rank::Cover,
        }
    }
}

/// What lies at and beneath a mount point of the new root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    /// The host's own tree at the same path.
    Host { read_only: bool },
    /// A file system of the sandbox's own: only what the plan creates.
    Fresh,
}

/// Builds the ops. Steps are wanted in any order and carried out sorted by
/// their path, parents first (`Path`'s order is component-wise), so that
/// every mount is made on top of the mounts above it and no later mount
/// covers an earlier one: a folder under `/tmp` is bound onto the private
/// `/tmp`, not beneath it, and a cover comes after the bind it covers.
struct Builder {
    wants: Vec<(PathBuf, Want)>,
    ops: Vec<Op>,
    labels: Vec<String>,
    /// Folders, files and links created on fresh layers (host paths).
    made: BTreeSet<PathBuf>,
    /// The mounts made so far, in order: the last one at or above a path
    /// is what shows there.
    layers: Vec<(PathBuf, Layer)>,
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
    fn new() -> Builder {
        Builder {
            wants: Vec::new(),
            ops: Vec::new(),
            labels: Vec::new(),
            made: BTreeSet::new(),
            layers: vec![(PathBuf::from("/"), Layer::Fresh)],
        }
    }

    fn want(&mut self, dst: impl Into<PathBuf>, want: Want) {
        self.wants.push((dst.into(), want));
    }

    fn push(&mut self, op: Op, label: String) {
        self.ops.push(op);
        self.labels.push(label);
    }

    /// Carries out the wanted steps in mount order.
    fn finish(mut self) -> Result<(Vec<Op>, Vec<String>), SandboxError> {
        let mut wants = std::mem::take(&mut self.wants);
        // Stable: steps on one path keep the order they were wanted in.
        wants.sort_by(|(a, x), (b, y)| a.cmp(b).then(x.rank().cmp(&y.rank())));
        for (dst, want) in wants {
            self.carry_out(&dst, want)?;
        }
        Ok((self.ops, self.labels))
    }

    /// The mount that shows at `p` now, and where it is mounted.
    fn layer_at(&self, p: &Path) -> (&Path, Layer) {
        self.layers
            .iter()
            .rev()
            .find(|(at, _)| p.starts_with(at))
            .map(|(at, l)| (at.as_path(), *l))
            .unwrap_or((Path::new("/"), Layer::Fresh))
    }

    fn exists_in_new_root(&self, p: &Path) -> bool {
        match self.layer_at(p) {
            (at, Layer::Fresh) => at == p || self.made.contains(p),
            (_, Layer::Host { .. }) => std::fs::symlink_metadata(p).is_ok(),
        }
    }

    /// Creates `p` and its missing ancestors on the fresh layer they lie
    /// in. A folder missing beneath a host bind is not made (that would
    /// write to the host, or fail on a read-only bind): the view is refused.
    fn dir(&mut self, p: &Path) -> Result<(), SandboxError> {
        let mut chain: Vec<&Path> = p.ancestors().collect();
        chain.reverse();
        for a in chain {
            if self.exists_in_new_root(a) {
                continue;
            }
            if let (at, Layer::Host { .. }) = self.layer_at(a) {
                return Err(SandboxError::Invalid(format!(
                    "cannot show `{}`: the folder `{}` is missing in the host folder `{}` shown there",
                    p.display(),
                    a.display(),
                    at.display()
                )));
            }
            self.push(Op::Dir(new_path(a)?), format!("creating {}", a.display()));
            self.made.insert(a.to_path_buf());
        }
        Ok(())
    }

    fn carry_out(&mut self, dst: &Path, want: Want) -> Result<(), SandboxError> {
        match want {
            Want::Bind {
                read_only,
                requested,
            } => self.bind(dst, read_only, requested),
            Want::Tmpfs { flags, data } => {
                self.dir(dst)?;
                self.push(
                    Op::Tmpfs {
                        dst: new_path(dst)?,
                        flags,
                        data: cstr(data)?,
                    },
                    format!("mounting a tmpfs on {}", dst.display()),
                );
                self.layers.push((dst.to_path_buf(), Layer::Fresh));
                Ok(())
            }
            Want::Proc => {
                self.dir(dst)?;
                self.push(Op::Proc(new_path(dst)?), "mounting a fresh /proc".into());
                self.layers.push((dst.to_path_buf(), Layer::Fresh));
                Ok(())
            }
            Want::Devpts => {
                self.dir(dst)?;
                self.push(
                    Op::Devpts(new_path(dst)?),
                    format!("mounting {}", dst.display()),
                );
                self.layers.push((dst.to_path_buf(), Layer::Fresh));
                Ok(())
            }
            Want::ProcReadOnly => {
                self.push(
                    Op::ProcReadOnly(new_path(dst)?),
                    format!("making {} read-only", dst.display()),
                );
                Ok(())
            }
            Want::ProcMask => {
                self.push(
                    Op::ProcMask(new_path(dst)?),
                    format!("hiding {}", dst.display()),
                );
                Ok(())
            }
            Want::Symlink { target } => {
                if let Some(parent) = dst.parent() {
                    self.dir(parent)?;
                }
                self.push(
                    Op::Symlink {
                        target: cstr(target.as_os_str().as_bytes())?,
                        link: new_path(dst)?,
                    },
                    format!("linking {} to {}", dst.display(), target.display()),
                );
                self.made.insert(dst.to_path_buf());
                Ok(())
            }
            Want::Cover => self.cover(dst),
        }
    }

    fn bind(&mut self, p: &Path, read_only: bool, requested: bool) -> Result<(), SandboxError> {
        if requested && read_only {
            if let (_, Layer::Host { read_only: true }) = self.layer_at(p) {
                // Already shown, read-only, by a bind above it.
                return Ok(());
            }
        }
        let is_dir = std::fs::metadata(p).map(|m| m.is_dir()).unwrap_or(false);
        if is_dir {
            self.dir(p)?;
        } else {
            if let Some(parent) = p.parent() {
                self.dir(parent)?;
            }
            if !self.exists_in_new_root(p) {
                self.push(Op::File(new_path(p)?), format!("creating {}", p.display()));
                self.made.insert(p.to_path_buf());
            }
        }
        self.push(
            Op::Bind {
                src: old_path(p)?,
                dst: new_path(p)?,
                read_only,
            },
            format!(
                "bind-mounting {} {}",
                p.display(),
                if read_only { "read-only" } else { "read-write" }
            ),
        );
        self.layers
            .push((p.to_path_buf(), Layer::Host { read_only }));
        Ok(())
    }

    fn cover(&mut self, p: &Path) -> Result<(), SandboxError> {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return Ok(());
        };
        if let (_, Layer::Fresh) = self.layer_at(p) {
            // Nothing of the host shows there (a fresh folder is empty):
            // absent from the view already.
            return Ok(());
        }
        let op = if meta.is_dir() {
            Op::MaskDir(new_path(p)?)
        } else {
            Op::MaskFile(new_path(p)?)
        };
        self.push(op, format!("hiding {}", p.display()));
        self.layers.push((p.to_path_buf(), Layer::Fresh));
        Ok(())
    }
}

/// Why a path asked to be shown cannot be: it lies in the sandbox's own
/// `/proc`, or inside (or at) a path that stays covered.
fn refuse_shown(what: &str, p: &Path, covers: &[PathBuf]) -> Result<(), SandboxError> {
    if p.starts_with("/proc") {
        return Err(SandboxError::Invalid(format!(
            "{what} `{}` lies in /proc, which the sandbox replaces with its own",
            p.display()
        )));
    }
    if let Some(c) = covers.iter().find(|c| p.starts_with(c)) {
        return Err(SandboxError::Invalid(format!(
            "{what} `{}` lies inside `{}`, which stays hidden from the sandbox (Cairn's own files or a secret of the host)",
            p.display(),
            c.display()
        )));
    }
    Ok(())
}

pub(crate) fn prepare(conf: &Confinement, cwd: &Path) -> Result<Prepared, SandboxError> {
    let (root, cwd) = checked_root(conf, cwd)?;
    let covers = covered_paths(conf, &root)?;

    let mut b = Builder::new();
    want_host_paths(&mut b, conf, &root, &covers)?;
    want_dev(&mut b);
    want_proc_and_tmp(&mut b);
    b.want(
        root.clone(),
        Want::Bind {
            read_only: false,
            requested: false,
        },
    );
    for c in covers {
        b.want(c, Want::Cover);
    }
    let (mut ops, mut labels) = b.finish()?;
    ops.push(Op::SealRoot(cstr(NEW_ROOT)?));
    labels.push("making the new root read-only".into());

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
    let counted = group.as_ref().map_or((false, false, false), |g| g.counts());
    let limits_note = limits_note(&lim, counted.1, failed.as_ref());
    let rlimits = uncounted_rlimits(&lim, counted);

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
        ops,
        labels,
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

/// The root and working directory, resolved once: the root must be a
/// folder other than `/`, and the working directory must lie inside it.
fn checked_root(conf: &Confinement, cwd: &Path) -> Result<(PathBuf, PathBuf), SandboxError> {
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
    Ok((root, cwd))
}

/// What stays covered, whatever is shown above it: the host's secrets in
/// `/etc`, its SSH host keys, and the paths the caller hides (the store).
fn covered_paths(conf: &Confinement, root: &Path) -> Result<Vec<PathBuf>, SandboxError> {
    // What stays covered, whatever is shown above it.
    let mut covers: Vec<PathBuf> = ETC_SECRETS.iter().map(PathBuf::from).collect();
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
        covers.extend(keys);
    }
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
        covers.push(h);
    }
    refuse_shown("the sandbox root", root, &covers)?;
    Ok(covers)
}

/// The host's system folders, read-only, and the paths the confinement
/// asks to show (read-only), none of them inside a covered path.
fn want_host_paths(
    b: &mut Builder,
    conf: &Confinement,
    root: &Path,
    covers: &[PathBuf],
) -> Result<(), SandboxError> {
    for name in SYSTEM {
        let p = Path::new("/").join(name);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&p)?;
            b.want(p, Want::Symlink { target });
        } else if meta.is_dir() {
            b.want(
                p,
                Want::Bind {
                    read_only: true,
                    requested: false,
                },
            );
        }
    }
    for extra in &conf.read_only {
        let p = std::fs::canonicalize(extra).map_err(|e| {
            SandboxError::Invalid(format!("read-only path `{}`: {e}", extra.display()))
        })?;
        refuse_shown("the read-only path", &p, covers)?;
        if p == root {
            // The root is shown read-write; it is what the program works in.
            continue;
        }
        b.want(
            p,
            Want::Bind {
                read_only: true,
                requested: true,
            },
        );
    }
    if conf.network == Network::Host {
        // A resolv.conf that points into /run (systemd-resolved) needs its
        // folder, or name resolution fails with the network open.
        if let Ok(target) = std::fs::read_link("/etc/resolv.conf") {
            let target = Path::new("/etc").join(target);
            if let Some(dir) = target.parent().and_then(|d| std::fs::canonicalize(d).ok()) {
                if dir.is_dir() && refuse_shown("", &dir, covers).is_ok() {
                    b.want(
                        dir,
                        Want::Bind {
                            read_only: true,
                            requested: true,
                        },
                    );
                }
            }
        }
    }
    Ok(())
}

/// `/dev`: a tmpfs with the harmless devices bound from the host, its own
/// `pts` and `shm`, and the links into `/proc/self/fd`.
fn want_dev(b: &mut Builder) {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    b.want(
        "/dev",
        Want::Tmpfs {
            flags: libc::MS_NOSUID | libc::MS_NOEXEC,
            data: "mode=0755,size=64k",
        },
    );
    for d in DEVICES {
        let p = Path::new("/dev").join(d);
        if p.exists() {
            b.want(
                p,
                Want::Bind {
                    read_only: false,
                    requested: false,
                },
            );
        }
    }
    b.want("/dev/pts", Want::Devpts);
    b.want(
        "/dev/ptmx",
        Want::Symlink {
            target: "pts/ptmx".into(),
        },
    );
    b.want(
        "/dev/shm",
        Want::Tmpfs {
            flags: nosuid_nodev,
            data: "mode=1777",
        },
    );
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        b.want(
            link,
            Want::Symlink {
                target: target.into(),
            },
        );
    }
}

/// The sandbox's own `/proc` (with the host-wide parts read-only or
/// masked) and fresh temporary folders.
fn want_proc_and_tmp(b: &mut Builder) {
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    b.want("/proc", Want::Proc);
    for p in PROC_READ_ONLY {
        b.want(Path::new("/proc").join(p), Want::ProcReadOnly);
    }
    for p in PROC_MASKED {
        b.want(Path::new("/proc").join(p), Want::ProcMask);
    }
    for tmp in ["/tmp", "/var/tmp"] {
        b.want(
            tmp,
            Want::Tmpfs {
                flags: nosuid_nodev,
                data: "mode=1777",
            },
        );
    }
}

/// The limits the control group does not count (all of them without a
/// group), as per-process rlimits.
fn uncounted_rlimits(
    lim: &crate::ResourceLimits,
    (by_memory, by_pids, by_cpu): (bool, bool, bool),
) -> Vec<(libc::__rlimit_resource_t, libc::rlimit)> {
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
    rlimits
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

#[cfg(test)]
mod order_tests {
    use std::path::{Path, PathBuf};

    use super::{Op, Plan, NEW_ROOT};
    use crate::{Confinement, SandboxError};

    /// What a mount op puts at its path, as the tests compare it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Shown {
        Host { read_only: bool },
        Fresh,
        Cover,
    }

    /// The mounts of a plan in order, at their host paths.
    fn mounts(plan: &Plan) -> Vec<(PathBuf, Shown)> {
        let at = |c: &std::ffi::CString| {
            let s = c.to_str().unwrap();
            PathBuf::from(s.strip_prefix(NEW_ROOT).unwrap())
        };
        plan.ops
            .iter()
            .filter_map(|op| match op {
                Op::Bind { dst, read_only, .. } => Some((
                    at(dst),
                    Shown::Host {
                        read_only: *read_only,
                    },
                )),
                Op::Tmpfs { dst, .. } | Op::Proc(dst) | Op::Devpts(dst) => {
                    Some((at(dst), Shown::Fresh))
                }
                Op::MaskFile(dst) | Op::MaskDir(dst) => Some((at(dst), Shown::Cover)),
                _ => None,
            })
            .collect()
    }

    /// What shows at `p` once every mount is made: the last mount at it or
    /// above it (a later mount above covers an earlier one beneath).
    fn top(plan: &Plan, p: &Path) -> Option<(PathBuf, Shown)> {
        mounts(plan)
            .into_iter()
            .rev()
            .find(|(at, _)| p.starts_with(at))
    }

    fn prepare(conf: &Confinement) -> Result<Plan, SandboxError> {
        conf.prepare(&conf.root).map(|p| p.plan)
    }

    fn dir_in(parent: &str) -> Option<tempfile::TempDir> {
        Path::new(parent)
            .is_dir()
            .then(|| tempfile::tempdir_in(parent).unwrap())
    }

    #[test]
    fn folders_under_the_private_tmp_folders_are_bound_on_top_of_them() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let ro_tmp = tempfile::tempdir().unwrap();
        let file_tmp = tempfile::NamedTempFile::new().unwrap();
        let extra: Vec<tempfile::TempDir> = ["/var/tmp", "/dev/shm"]
            .iter()
            .filter_map(|d| dir_in(d))
            .collect();
        let mut conf = Confinement::new(&root);
        conf.read_only.push(ro_tmp.path().into());
        conf.read_only.push(file_tmp.path().into());
        conf.read_only
            .extend(extra.iter().map(|d| d.path().to_path_buf()));
        let plan = prepare(&conf).unwrap();

        assert_eq!(
            top(&plan, &root),
            Some((root.clone(), Shown::Host { read_only: false }))
        );
        for p in conf.read_only.iter().map(|p| p.canonicalize().unwrap()) {
            assert_eq!(
                top(&plan, &p),
                Some((p.clone(), Shown::Host { read_only: true })),
                "{} is covered: {:?}",
                p.display(),
                mounts(&plan)
            );
        }
        // The private folders are still private where nothing was asked.
        for p in ["/tmp/elsewhere", "/var/tmp/elsewhere", "/dev/shm/elsewhere"] {
            assert_eq!(top(&plan, Path::new(p)).unwrap().1, Shown::Fresh, "{p}");
        }
    }

    #[test]
    fn no_later_mount_covers_an_earlier_one() {
        let root = tempfile::tempdir().unwrap();
        let ro = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("pinned")).unwrap();
        let mut conf = Confinement::new(root.path());
        conf.read_only.push(ro.path().into());
        conf.read_only.push(root.path().join("pinned"));
        conf.read_only.push("/usr/share".into());
        let plan = prepare(&conf).unwrap();
        let m = mounts(&plan);
        for (i, (p, _)) in m.iter().enumerate() {
            if let Some((q, _)) = m[i + 1..].iter().find(|(q, _)| p.starts_with(q) && p != q) {
                panic!(
                    "{} is mounted after {} beneath it: {m:?}",
                    q.display(),
                    p.display()
                );
            }
        }
        // A read-only path inside the root is read-only there.
        let pinned = root.path().canonicalize().unwrap().join("pinned");
        assert_eq!(
            top(&plan, &pinned).unwrap(),
            (pinned, Shown::Host { read_only: true })
        );
        // One already shown read-only by a system folder is not bound again.
        assert!(!m.iter().any(|(p, _)| p == Path::new("/usr/share")));
    }

    #[test]
    fn covers_come_after_the_binds_they_cover() {
        // The store in the root, and one beside it in a folder shown
        // read-only: both under /tmp.
        let root = tempfile::tempdir().unwrap();
        let beside = tempfile::tempdir().unwrap();
        let root_p = root.path().canonicalize().unwrap();
        let beside_p = beside.path().canonicalize().unwrap();
        std::fs::create_dir(root_p.join(".cairn")).unwrap();
        std::fs::write(root_p.join("cairn.db"), "").unwrap();
        std::fs::write(beside_p.join("other.db"), "").unwrap();
        let mut conf = Confinement::new(&root_p);
        conf.read_only.push(beside_p.clone());
        conf.hidden = vec![
            root_p.join(".cairn"),
            root_p.join("cairn.db"),
            beside_p.join("other.db"),
        ];
        let plan = prepare(&conf).unwrap();
        for h in &conf.hidden {
            assert_eq!(
                top(&plan, h),
                Some((h.clone(), Shown::Cover)),
                "{} shows: {:?}",
                h.display(),
                mounts(&plan)
            );
        }
        // A hidden path that no bind shows needs no cover.
        let unseen = tempfile::tempdir().unwrap();
        std::fs::write(unseen.path().join("x.db"), "").unwrap();
        conf.hidden.push(unseen.path().join("x.db"));
        let plan = prepare(&conf).unwrap();
        assert_eq!(
            top(&plan, &unseen.path().canonicalize().unwrap().join("x.db"))
                .unwrap()
                .1,
            Shown::Fresh
        );
    }

    #[test]
    fn a_path_that_cannot_be_shown_is_refused_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let root_p = root.path().canonicalize().unwrap();
        std::fs::create_dir_all(root_p.join(".cairn/objects")).unwrap();
        let mut conf = Confinement::new(&root_p);
        conf.hidden.push(root_p.join(".cairn"));
        conf.read_only.push(root_p.join(".cairn/objects"));
        let e = prepare(&conf).unwrap_err().to_string();
        assert!(e.contains("stays hidden"), "{e}");

        let mut conf = Confinement::new(&root_p);
        conf.read_only.push("/proc/self".into());
        let e = prepare(&conf).unwrap_err().to_string();
        assert!(e.contains("/proc"), "{e}");

        if Path::new("/etc/ssl/private").exists() {
            let mut conf = Confinement::new(&root_p);
            conf.read_only.push("/etc/ssl/private".into());
            let e = prepare(&conf).unwrap_err().to_string();
            assert!(e.contains("stays hidden"), "{e}");
        }
    }
}
