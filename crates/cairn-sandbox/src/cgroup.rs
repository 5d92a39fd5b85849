//! Counting a sandbox's whole process tree in a control group of its own.
//!
//! Rlimits are per process (`RLIMIT_AS`, `RLIMIT_CPU`) or per user
//! (`RLIMIT_NPROC`, which the kernel does not enforce for root), and they
//! do not say when they were hit. A control group counts every process a
//! node starts, enforces the limit in the kernel and keeps counters that
//! name the limit afterwards. So when a spawn has limits, it gets a group of
//! its own (`cairn-sbx-<engine pid>-<n>`), the spawned process joins it
//! between `fork` and `exec` (before it unshares anything), and everything
//! it starts stays in it.
//!
//! Where the group is made is decided once per process ([`support`]):
//!
//! * **cgroup v2**, when this process's v2 group offers the `memory` and
//!   `pids` controllers and is *delegated* to it: the root of the
//!   hierarchy or of a cgroup namespace (a container), a group systemd
//!   marked delegated (`trusted.delegate` / `user.delegate` extended
//!   attribute, set for `Delegate=yes` units), or, for an ordinary user, a
//!   group it may write below one it may not (handed to it). A writable
//!   group alone is not enough: root may write every group, and a user
//!   every group of their own systemd manager. Because of v2's
//!   "no internal processes" rule, a group holding processes cannot hand
//!   controllers to children; the engine does what systemd's
//!   `DelegateSubgroup=` and container init scripts do: it moves itself
//!   into a leaf `cairn-engine-<pid>` and makes the sandbox groups beside
//!   that leaf. When the group's parent is delegated and already hands out
//!   both controllers (the engine already runs in such a leaf, for instance
//!   an engine started by another engine), the groups go beside the
//!   engine's group without moving anything. When other processes share the
//!   engine's group, it is left alone and v1 or rlimits are used.
//! * **cgroup v1**, per controller: the `memory`, `pids` and `cpuacct`
//!   hierarchies, each where this process's group in it is writable.
//! * **none**: the limits stay rlimits, and the hit limit is inferred from
//!   the exit signal and stderr.
//!
//! CPU time has no kernel limit on a whole tree: the engine reads the
//! group's usage (`cpu.stat` `usage_usec`, v1 `cpuacct.usage`) while the
//! process runs and kills the group once it is over ([`Group::cpu_used`],
//! [`Group::kill`]).
//!
//! Groups left by an engine that died (its pid no longer running, the
//! group older than a minute) are removed when the next engine looks for
//! its place ([`support`]).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::ResourceLimits;

/// Prefix of the groups made for sandboxed process trees.
const SANDBOX_PREFIX: &str = "cairn-sbx-";
/// Prefix of the leaf the engine moves itself into on cgroup v2.
const ENGINE_PREFIX: &str = "cairn-engine-";

/// Which cgroup version counts a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The unified hierarchy.
    V2,
    /// A per-controller (legacy) hierarchy.
    V1,
}

/// A limit the kernel's counters show was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The tree's memory reached its ceiling and the kernel's OOM killer
    /// ended a process of it.
    Memory,
    /// A `fork` (or a new thread) was refused because the tree had as many
    /// tasks as allowed.
    Processes,
    /// The tree's CPU time passed its ceiling and the engine killed it.
    CpuTime,
}

impl Limit {
    /// The limit's name in a workflow's `limits` (`memory`, `processes`,
    /// `cpu`).
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Processes => "processes",
            Limit::CpuTime => "cpu",
        }
    }
}

/// What this machine offers for tree-wide limits, decided once per process.
#[derive(Debug, Clone)]
pub struct Support {
    /// Where the memory limit is counted, if in a group.
    pub memory: Option<Version>,
    /// Where the process limit is counted, if in a group.
    pub processes: Option<Version>,
    /// Where the CPU time is counted, if in a group.
    pub cpu: Option<Version>,
    /// Words for `cairn doctor`: what is used, where, and why not more.
    pub detail: String,
    place: Place,
}

impl Support {
    /// Whether any limit is counted in a control group.
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.processes.is_some() || self.cpu.is_some()
    }

    /// The folders sandbox groups are made in, one per hierarchy used
    /// (to check that none is left behind).
    pub fn bases(&self) -> Vec<PathBuf> {
        let p = &self.place;
        [&p.v2, &p.v1_memory, &p.v1_pids, &p.v1_cpuacct]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The groups this process made that still exist.
    pub fn leftovers(&self) -> Vec<PathBuf> {
        let mine = format!("{SANDBOX_PREFIX}{}-", std::process::id());
        self.bases()
            .iter()
            .filter_map(|b| std::fs::read_dir(b).ok())
            .flat_map(|d| d.flatten())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
            .map(|e| e.path())
            .collect()
    }
}

/// The folders sandbox groups are made in.
#[derive(Debug, Clone, Default)]
struct Place {
    v2: Option<PathBuf>,
    v1_memory: Option<PathBuf>,
    v1_pids: Option<PathBuf>,
    v1_cpuacct: Option<PathBuf>,
}

static SUPPORT: OnceLock<Support> = OnceLock::new();

/// What this process uses for tree-wide limits. The first call decides:
/// on cgroup v2 it may move the engine into a leaf group of its own, and it
/// removes the groups that engines which are gone left behind. Call it at
/// start, before any process is spawned, so the engine's group holds only
/// the engine when it looks.
pub fn support() -> &'static Support {
    SUPPORT.get_or_init(|| {
        let s = detect(true);
        sweep(&s.place);
        s
    })
}

/// What [`support`] would decide, without moving this process or removing
/// anything (for `cairn doctor`).
pub fn inspect() -> Support {
    match SUPPORT.get() {
        Some(s) => s.clone(),
        None => detect(false),
    }
}

/// What the kernel says of this process's mounts and groups, read once per
/// decision: every hierarchy looked at reads the same two files.
struct ProcView {
    mountinfo: String,
    cgroup: String,
}

impl ProcView {
    fn read() -> ProcView {
        ProcView {
            mountinfo: std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            cgroup: std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
        }
    }
}

fn detect(act: bool) -> Support {
    let view = ProcView::read();
    let v2 = find_v2(&view, act);
    let mut place = Place::default();
    let mut notes = Vec::new();
    match v2 {
        Ok((base, how)) => {
            notes.push(format!("cgroup v2 in {} ({how})", base.display()));
            place.v2 = Some(base);
        }
        Err(why) => {
            notes.push(why);
            place.v1_memory = v1_dir(&view, "memory");
            place.v1_pids = v1_dir(&view, "pids");
            place.v1_cpuacct = v1_dir(&view, "cpuacct");
            let found: Vec<String> = [
                ("memory", &place.v1_memory),
                ("pids", &place.v1_pids),
                ("cpuacct", &place.v1_cpuacct),
            ]
            .iter()
            .filter_map(|(n, d)| d.as_ref().map(|d| format!("{n} in {}", d.display())))
            .collect();
            if found.is_empty() {
                notes.push("no writable cgroup v1 memory, pids or cpuacct hierarchy".into());
            } else {
                notes.push(format!("cgroup v1: {}", found.join(", ")));
            }
        }
    }
    let v = |v2: bool, v1: &Option<PathBuf>| {
        if v2 {
            Some(Version::V2)
        } else {
            v1.as_ref().map(|_| Version::V1)
        }
    };
    let is_v2 = place.v2.is_some();
    let s = Support {
        memory: v(is_v2, &place.v1_memory),
        processes: v(is_v2, &place.v1_pids),
        cpu: v(is_v2, &place.v1_cpuacct),
        detail: String::new(),
        place,
    };
    let by = |what: &str, v: Option<Version>, fallback: &str| match v {
        Some(Version::V2) => format!("{what}: cgroup v2"),
        Some(Version::V1) => format!("{what}: cgroup v1"),
        None => format!("{what}: {fallback}"),
    };
    let uses = [
        by("memory", s.memory, "RLIMIT_AS per process"),
        by("processes", s.processes, "RLIMIT_NPROC (not for root)"),
        by("cpu", s.cpu, "RLIMIT_CPU per process"),
    ]
    .join(", ");
    Support {
        detail: format!("{uses}; {}", notes.join("; ")),
        ..s
    }
}

/// Where the unified hierarchy is mounted.
fn v2_mount(view: &ProcView) -> Option<PathBuf> {
    view.mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split(' ').next()? != "cgroup2" {
            return None;
        }
        pre.split(' ').nth(4).map(|m| PathBuf::from(unescape(m)))
    })
}

/// mountinfo escapes spaces and a few others as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let n = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's group in the hierarchy whose `/proc/self/cgroup` line
/// names `controller` (`""` for v2).
fn own_group(view: &ProcView, controller: &str) -> Option<String> {
    view.cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            ctl.is_empty()
        } else {
            ctl.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_string())
    })
}

fn words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn has_both(list: &[String]) -> bool {
    ["memory", "pids"]
        .iter()
        .all(|c| list.iter().any(|w| w == c))
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access on a valid C string.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Whether `dir` is this process's to divide: the root of what it sees,
/// marked delegated (systemd sets `trusted.delegate`, or `user.delegate`
/// in a user's manager, on `Delegate=yes` units), or, for an ordinary
/// user, a group handed to it: one it may write below one it may not.
/// Writable alone says nothing for root, nor inside a user's own systemd
/// tree, whose groups the user may all write.
fn delegated(dir: &Path, group: &str, root: bool) -> bool {
    // A container's cgroup file system is often mounted read-only.
    if !writable(dir) {
        return false;
    }
    if group == "/" {
        return true;
    }
    let marked = CString::new(dir.as_os_str().as_bytes()).is_ok_and(|c| {
        [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
            // SAFETY: a size query (null buffer) on valid C strings.
            unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
        })
    });
    marked || (!root && dir.parent().is_some_and(|p| !writable(p)))
}

fn parent_group(group: &str) -> Option<String> {
    if group == "/" {
        return None;
    }
    let p = Path::new(group).parent()?.to_str()?.to_string();
    Some(if p.is_empty() { "/".into() } else { p })
}

/// The v2 folder sandbox groups go in, and how it was found; or why v2
/// cannot be used.
fn find_v2(view: &ProcView, act: bool) -> Result<(PathBuf, String), String> {
    let Some(mount) = v2_mount(view) else {
        return Err("no cgroup v2 hierarchy".into());
    };
    let Some(own) = own_group(view, "") else {
        return Err(format!(
            "cgroup v2 at {}, but this process is in no v2 group",
            mount.display()
        ));
    };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    decide_v2(&mount, &own, root, act)
}

/// [`find_v2`] for the hierarchy mounted at `mount`, this process being in
/// `own` (as root when `root`).
fn decide_v2(mount: &Path, own: &str, root: bool, act: bool) -> Result<(PathBuf, String), String> {
    let own = own.to_string();
    let dir = |g: &str| mount.join(g.trim_start_matches('/'));
    let g = dir(&own);
    let offered = words(&g.join("cgroup.controllers"));
    if !has_both(&offered) {
        return Err(format!(
            "cgroup v2 group {own} offers no memory and pids controllers (only: {})",
            if offered.is_empty() {
                "none".into()
            } else {
                offered.join(" ")
            }
        ));
    }
    // Beside the engine, when the parent already hands both out.
    if let Some(parent) = parent_group(&own) {
        let p = dir(&parent);
        if has_both(&words(&p.join("cgroup.subtree_control"))) && delegated(&p, &parent, root) {
            return Ok((p, format!("beside the engine's group {own}")));
        }
    }
    if !delegated(&g, &own, root) {
        return Err(format!(
            "cgroup v2 group {own} is not delegated to this process (run the engine in a unit with Delegate=yes, or as the user owning the group)"
        ));
    }
    if has_both(&words(&g.join("cgroup.subtree_control"))) {
        return Ok((g, "the engine's own group".into()));
    }
    // Checked before anything moves, and by `cairn doctor` alike: a shell
    // that started the engine in its own group keeps the group from being
    // divided, and the engine does not move what is not its own.
    if shared(&g) {
        return Err(format!(
            "cgroup v2 group {own} holds other processes too; start the engine in a group of its own (systemd-run --scope -p Delegate=yes, or a unit with Delegate=yes)"
        ));
    }
    if !act {
        return Ok((
            g,
            format!("the engine's group {own}; the engine moves into a leaf of it"),
        ));
    }
    enable_below(&g).map(|moved| {
        let how = if moved {
            format!("the engine's group {own}; the engine moved into {ENGINE_PREFIX}<pid>")
        } else {
            format!("the engine's group {own}")
        };
        (g, how)
    })
}

/// Whether processes other than this one are in `g`, which is not the
/// hierarchy's root (the root has no `cgroup.events`, and may hand out
/// controllers whatever it holds).
fn shared(g: &Path) -> bool {
    if !g.join("cgroup.events").exists() {
        return false;
    }
    let me = std::process::id().to_string();
    std::fs::read_to_string(g.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .any(|pid| pid.trim() != me && !pid.trim().is_empty())
}

/// Hands `memory` and `pids` to `g`'s children, moving this process into a
/// leaf first when `g` holds it. Returns whether it moved.
fn enable_below(g: &Path) -> Result<bool, String> {
    let control = g.join("cgroup.subtree_control");
    let enable = || std::fs::write(&control, "+memory +pids");
    match enable() {
        Ok(()) => return Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => return Err(format!("cannot enable controllers in {}: {e}", g.display())),
    }
    let leaf = g.join(format!("{ENGINE_PREFIX}{}", std::process::id()));
    let moved = std::fs::create_dir(&leaf)
        .or_else(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(e)
            }
        })
        .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), "0"));
    if let Err(e) = moved {
        let _ = std::fs::remove_dir(&leaf);
        return Err(format!(
            "cannot move the engine into a leaf of {}: {e}",
            g.display()
        ));
    }
    match enable() {
        Ok(()) => Ok(true),
        Err(e) => {
            // Other processes share the group: it is not the engine's to
            // divide. Put everything back as it was.
            let _ = std::fs::write(g.join("cgroup.procs"), "0");
            let _ = std::fs::remove_dir(&leaf);
            Err(format!(
                "cannot enable controllers in {} ({e}): other processes share the engine's group; start the engine in a group of its own",
                g.display()
            ))
        }
    }
}

/// This process's group in the v1 hierarchy of `controller`, when it is
/// mounted and writable.
fn v1_dir(view: &ProcView, controller: &str) -> Option<PathBuf> {
    let mount = view.mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut f = post.split(' ');
        if f.next()? != "cgroup" {
            return None;
        }
        let opts = f.nth(1)?;
        if !opts.split(',').any(|o| o == controller) {
            return None;
        }
        pre.split(' ').nth(4).map(|m| PathBuf::from(unescape(m)))
    })?;
    let own = own_group(view, controller)?;
    let dir = mount.join(own.trim_start_matches('/'));
    writable(&dir).then_some(dir)
}

/// How old a group must be before a sweep may take it: an engine in
/// another PID namespace (its pid invisible here) may have just made it
/// and not yet moved its process in.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Removes the groups of engines that are no longer running, and their
/// empty leaves.
fn sweep(place: &Place) {
    let me = std::process::id();
    for base in [
        &place.v2,
        &place.v1_memory,
        &place.v1_pids,
        &place.v1_cpuacct,
    ]
    .into_iter()
    .flatten()
    {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let rest = name
                .strip_prefix(SANDBOX_PREFIX)
                .or_else(|| name.strip_prefix(ENGINE_PREFIX));
            let Some(pid) = rest.and_then(|r| r.split('-').next()?.parse::<u32>().ok()) else {
                continue;
            };
            // A group with this process's pid is from an earlier process
            // (none is made before this sweep); our own leaf is not.
            let ours_now = pid == me && name.starts_with(ENGINE_PREFIX);
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_AFTER);
            if old && !ours_now && (pid == me || !alive(pid)) {
                // Fails (EBUSY) while it still holds processes: left alone.
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The control group of one sandboxed process tree. Made by
/// [`crate::Confinement::prepare`] when there are limits and a place for
/// them; joined by the child before it unshares; killed and removed when
/// dropped (the engine removes it sooner with [`Group::remove`]).
#[derive(Debug)]
pub struct Group {
    /// The group's folder in each hierarchy it lives in.
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each, for the child to write itself into.
    procs: Vec<CString>,
    version: Version,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    cpu: Option<PathBuf>,
    cpu_limit: Option<Duration>,
}

impl Group {
    /// A group for a tree with `limits`, or `None` when no limit is set or
    /// none can be counted in a group here. Each limit the group does not
    /// count stays an rlimit ([`Group::counts`]).
    pub(crate) fn create(limits: &ResourceLimits) -> io::Result<Option<Group>> {
        if !limits.any() {
            return Ok(None);
        }
        let s = support();
        let name = format!(
            "{SANDBOX_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut g = Group {
            dirs: Vec::new(),
            procs: Vec::new(),
            version: Version::V1,
            memory: None,
            pids: None,
            cpu: None,
            cpu_limit: limits.cpu_seconds.map(Duration::from_secs),
        };
        if let Some(base) = &s.place.v2 {
            g.version = Version::V2;
            let d = g.make(base, &name)?;
            g.memory = Some(d.clone());
            g.pids = Some(d.clone());
            g.cpu = Some(d);
        } else {
            let p = &s.place;
            if let (Some(_), Some(base)) = (limits.memory_bytes, &p.v1_memory) {
                g.memory = Some(g.make(base, &name)?);
            }
            if let (Some(_), Some(base)) = (limits.processes, &p.v1_pids) {
                g.pids = Some(g.make(base, &name)?);
            }
            if let (Some(_), Some(base)) = (limits.cpu_seconds, &p.v1_cpuacct) {
                g.cpu = Some(g.make(base, &name)?);
            }
            if g.dirs.is_empty() {
                return Ok(None);
            }
        }
        g.set_limits(limits)?;
        Ok(Some(g))
    }

    /// Makes `base/name` and remembers it (so a failure later removes it).
    fn make(&mut self, base: &Path, name: &str) -> io::Result<PathBuf> {
        let d = base.join(name);
        std::fs::create_dir(&d)?;
        self.dirs.push(d.clone());
        self.procs.push(
            crate::cstr(d.join("cgroup.procs").as_os_str().as_bytes()).map_err(io::Error::other)?,
        );
        Ok(d)
    }

    fn set_limits(&self, limits: &ResourceLimits) -> io::Result<()> {
        let set = |dir: &Path, file: &str, value: String| {
            std::fs::write(dir.join(file), value).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("setting {file} of {}: {e}", dir.display()),
                )
            })
        };
        let optional = |r: io::Result<()>| match r {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        };
        match self.version {
            Version::V2 => {
                let d = &self.dirs[0];
                if let Some(m) = limits.memory_bytes {
                    set(d, "memory.max", m.to_string())?;
                    // Without swap accounting the file is absent.
                    optional(set(d, "memory.swap.max", "0".into()))?;
                    // The tree fails as a whole, not one process of it.
                    optional(set(d, "memory.oom.group", "1".into()))?;
                }
                if let Some(n) = limits.processes {
                    set(d, "pids.max", n.to_string())?;
                }
            }
            Version::V1 => {
                if let (Some(m), Some(d)) = (limits.memory_bytes, &self.memory) {
                    set(d, "memory.limit_in_bytes", m.to_string())?;
                    optional(set(d, "memory.memsw.limit_in_bytes", m.to_string()))?;
                }
                if let (Some(n), Some(d)) = (limits.processes, &self.pids) {
                    set(d, "pids.max", n.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// The cgroup version the group lives in.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Which of (memory, processes, CPU time) this group counts; the others
    /// are left to rlimits.
    pub fn counts(&self) -> (bool, bool, bool) {
        (
            self.memory.is_some(),
            self.pids.is_some(),
            self.cpu.is_some(),
        )
    }

    /// The CPU-time ceiling the engine enforces by polling, if any.
    pub fn cpu_limit(&self) -> Option<Duration> {
        self.cpu.as_ref().and(self.cpu_limit)
    }

    /// Moves the calling process into the group.
    ///
    /// # Safety
    ///
    /// Between `fork` and `exec`: only `open`, `write` and `close`.
    pub(crate) unsafe fn join(&self) -> Result<(), i32> {
        for p in &self.procs {
            let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(*libc::__errno_location());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let e = *libc::__errno_location();
            libc::close(fd);
            if n != 1 {
                return Err(if n < 0 { e } else { libc::EIO });
            }
        }
        Ok(())
    }

    /// CPU time the tree has used so far (`None` when not counted here).
    pub fn cpu_used(&self) -> Option<Duration> {
        let d = self.cpu.as_ref()?;
        match self.version {
            Version::V2 => {
                let stat = std::fs::read_to_string(d.join("cpu.stat")).ok()?;
                let us = field(&stat, "usage_usec")?;
                Some(Duration::from_micros(us))
            }
            Version::V1 => {
                let ns = std::fs::read_to_string(d.join("cpuacct.usage")).ok()?;
                Some(Duration::from_nanos(ns.trim().parse().ok()?))
            }
        }
    }

    /// Kills every process in the group (on v2 with `cgroup.kill` where the
    /// kernel has it, otherwise one by one through pidfds, so a recycled pid
    /// is never signalled).
    pub fn kill(&self) {
        if self.version == Version::V2
            && std::fs::write(self.dirs[0].join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        for d in &self.dirs {
            kill_members(d);
        }
    }

    /// Which limit the kernel's counters show was hit, if any. Read once
    /// the tree has ended.
    pub fn hit(&self) -> Option<Limit> {
        if let Some(d) = &self.memory {
            let oom = match self.version {
                Version::V2 => std::fs::read_to_string(d.join("memory.events"))
                    .ok()
                    .and_then(|s| field(&s, "oom_kill").max(field(&s, "oom_group_kill"))),
                // The count is there since Linux 4.13, long before the
                // 5.6 the file tools need.
                Version::V1 => std::fs::read_to_string(d.join("memory.oom_control"))
                    .ok()
                    .and_then(|s| field(&s, "oom_kill")),
            };
            if oom.unwrap_or(0) > 0 {
                return Some(Limit::Memory);
            }
        }
        if let Some(d) = &self.pids {
            let max = std::fs::read_to_string(d.join("pids.events"))
                .ok()
                .and_then(|s| field(&s, "max"));
            if max.unwrap_or(0) > 0 {
                return Some(Limit::Processes);
            }
        }
        None
    }

    /// Removes the group's folders; false while some still hold processes
    /// (call [`Group::kill`] and try again shortly).
    pub fn remove(&self) -> bool {
        let mut all = true;
        for d in &self.dirs {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => all = false,
            }
        }
        all
    }

    /// Whether the group's folders are gone.
    pub fn removed(&self) -> bool {
        self.dirs.iter().all(|d| !d.exists())
    }

    /// The group's folders (for tests and diagnostics).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for _ in 0..20 {
            if self.remove() {
                return;
            }
            self.kill();
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A `key value` line's value in a flat-keyed cgroup file.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// Kills each process listed in `dir`'s `cgroup.procs`, through a pidfd
/// opened before checking the process is still a member.
fn kill_members(dir: &Path) {
    let procs = dir.join("cgroup.procs");
    let rel = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    for _ in 0..10 {
        let Ok(list) = std::fs::read_to_string(&procs) else {
            return;
        };
        let pids: Vec<libc::pid_t> = list.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: pidfd_open takes a pid and flags.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int;
            if fd < 0 {
                continue;
            }
            // The pidfd pins the process it was opened for: if that is
            // still a member, the signal reaches it and nothing else.
            let member = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .ok()
                .zip(rel.as_ref())
                .is_some_and(|(c, r)| c.lines().any(|l| l.ends_with(&format!("/{r}"))));
            if member {
                // SAFETY: a valid pidfd, no siginfo.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd,
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    );
                }
            }
            // SAFETY: fd was opened above.
            unsafe { libc::close(fd) };
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_by_key() {
        let t = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(field(t, "max"), Some(3));
        assert_eq!(field(t, "oom_kill"), Some(1));
        assert_eq!(field(t, "oom"), Some(1));
        assert_eq!(field(t, "missing"), None);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    /// A fake v2 hierarchy: `own` offers `offered`, its parent hands out
    /// `parent_hands`.
    fn fake(own: &str, offered: &str, parent_hands: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let g = t.path().join(own.trim_start_matches('/'));
        std::fs::create_dir_all(&g).unwrap();
        std::fs::write(g.join("cgroup.controllers"), offered).unwrap();
        std::fs::write(g.join("cgroup.subtree_control"), "").unwrap();
        std::fs::write(
            g.parent().unwrap().join("cgroup.subtree_control"),
            parent_hands,
        )
        .unwrap();
        t
    }

    /// Marks `dir` delegated the way systemd does; false (and says so)
    /// where the file system keeps no user attributes.
    fn mark(dir: &Path) -> bool {
        let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C strings and a one-byte value.
        let rc = unsafe {
            libc::setxattr(
                c.as_ptr(),
                c"user.delegate".as_ptr(),
                b"1".as_ptr().cast(),
                1,
                0,
            )
        };
        if rc != 0 {
            eprintln!(
                "skipped: {} keeps no user attributes: {}",
                dir.display(),
                io::Error::last_os_error()
            );
        }
        rc == 0
    }

    #[test]
    fn v2_needs_memory_and_pids_offered() {
        let t = fake("/a/b", "cpu io hugetlb", "cpu io");
        let e = decide_v2(t.path(), "/a/b", false, false).unwrap_err();
        assert!(e.contains("offers no memory and pids"), "{e}");
        assert!(e.contains("cpu io hugetlb"), "{e}");
    }

    #[test]
    fn v2_groups_go_beside_the_engine_when_the_parent_hands_both_out() {
        let t = fake("/a/b", "cpu memory pids", "cpu memory pids");
        if !mark(&t.path().join("a")) {
            return;
        }
        let (base, how) = decide_v2(t.path(), "/a/b", false, true).unwrap();
        assert_eq!(base, t.path().join("a"));
        assert!(how.contains("beside"), "{how}");
        // Nothing was enabled in the engine's own group.
        let own = std::fs::read_to_string(t.path().join("a/b/cgroup.subtree_control")).unwrap();
        assert_eq!(own, "");
    }

    #[test]
    fn v2_groups_go_below_an_owned_group_after_enabling_the_controllers() {
        let t = fake("/a/b", "memory pids", "cpu");
        if !mark(&t.path().join("a/b")) {
            return;
        }
        let (base, how) = decide_v2(t.path(), "/a/b", false, false).unwrap();
        assert_eq!(base, t.path().join("a/b"));
        assert!(how.contains("moves into a leaf"), "{how}");
        let (base, _) = decide_v2(t.path(), "/a/b", false, true).unwrap();
        assert_eq!(base, t.path().join("a/b"));
        let control = std::fs::read_to_string(t.path().join("a/b/cgroup.subtree_control")).unwrap();
        assert_eq!(control, "+memory +pids");
    }

    #[test]
    fn v2_needs_a_delegated_group_or_the_namespace_root() {
        let t = fake("/a/b", "memory pids", "memory pids");
        // Writable, but neither the root nor marked delegated; and for an
        // ordinary user the parent is writable too: not handed over.
        for root in [true, false] {
            let e = decide_v2(t.path(), "/a/b", root, false).unwrap_err();
            assert!(e.contains("not delegated"), "{e}");
        }
        // The root of a cgroup namespace (a container) is its own.
        std::fs::write(t.path().join("cgroup.controllers"), "memory pids").unwrap();
        std::fs::write(t.path().join("cgroup.subtree_control"), "").unwrap();
        let (base, _) = decide_v2(t.path(), "/", true, false).unwrap();
        assert_eq!(base, t.path());
    }

    #[test]
    fn v2_leaves_a_group_shared_with_other_processes_alone() {
        let t = fake("/a/b", "memory pids", "cpu");
        if !mark(&t.path().join("a/b")) {
            return;
        }
        let g = t.path().join("a/b");
        std::fs::write(g.join("cgroup.events"), "populated 1\n").unwrap();
        std::fs::write(g.join("cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        assert!(decide_v2(t.path(), "/a/b", true, false).is_ok());
        std::fs::write(
            g.join("cgroup.procs"),
            format!("1\n{}\n", std::process::id()),
        )
        .unwrap();
        let e = decide_v2(t.path(), "/a/b", true, true).unwrap_err();
        assert!(e.contains("holds other processes"), "{e}");
        // Nothing was touched.
        let control = std::fs::read_to_string(g.join("cgroup.subtree_control")).unwrap();
        assert_eq!(control, "");
    }

    #[test]
    fn parents_of_groups() {
        assert_eq!(parent_group("/"), None);
        assert_eq!(parent_group("/a").as_deref(), Some("/"));
        assert_eq!(parent_group("/a/b").as_deref(), Some("/a"));
    }
}
