//! Who holds a lease, well enough to tell from the same machine that the
//! holder is dead: a process crashed (even by SIGKILL) leaves its lease
//! behind until it expires, and a resume on its machine need not wait.
//!
//! A holder is named by its machine's boot (`/proc/sys/kernel/random/boot_id`,
//! new at every boot) and PID namespace (`/proc/self/ns/pid`: containers on
//! one kernel share the boot id but not their process ids), its pid, and
//! that process's start time (`/proc/<pid>/stat`), so that a pid the kernel
//! gave to another process since is not taken for the holder. Only a
//! process with the same boot and namespace can look the pid up; anyone
//! else treats the holder as alive until its lease expires.

use std::io::ErrorKind;

/// This process as a lease row records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// `<boot id>/<pid namespace>`; `None` when this process cannot name
    /// them (no `/proc`, or a `/proc` of another namespace).
    pub(crate) host: Option<String>,
    /// The host's name, for people only (two machines may share it).
    pub(crate) hostname: String,
    /// The process id.
    pub(crate) pid: u32,
    /// The process's start time, in clock ticks after boot.
    pub(crate) start: Option<u64>,
}

/// What this process can tell about a lease's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Its process has ended (or is a zombie): the lease may be taken now.
    Dead,
    /// Its process runs on this machine.
    Alive,
    /// Another machine's (or namespace's) process, or one this process may
    /// not look at: only the lease's expiry tells.
    Unknown,
}

impl Holder {
    /// This process.
    pub(crate) fn this_process() -> Holder {
        Holder::of(std::process::id())
    }

    /// The process `pid` of this machine, as it would name itself.
    pub(crate) fn of(pid: u32) -> Holder {
        let found = stat(pid).ok().flatten();
        // A `/proc` whose `self` is not this process belongs to another PID
        // namespace: the pids it shows are not the ones ours mean.
        let ours = stat(std::process::id())
            .ok()
            .flatten()
            .is_some_and(|s| s.pid == std::process::id());
        Holder {
            host: if ours { host_key() } else { None },
            hostname: hostname(),
            pid,
            start: found.map(|s| s.start),
        }
    }

    /// What this process (`self`) can tell about the lease holder `other`.
    pub(crate) fn judge(&self, other: &Holder) -> Liveness {
        let (Some(mine), Some(theirs)) = (&self.host, &other.host) else {
            return Liveness::Unknown;
        };
        if mine != theirs || other.pid == 0 {
            return Liveness::Unknown;
        }
        match stat(other.pid) {
            Ok(None) => Liveness::Dead,
            Ok(Some(s)) if s.zombie => Liveness::Dead,
            // The pid now names another process: the holder is gone.
            Ok(Some(s)) if other.start.is_some_and(|t| t != s.start) => Liveness::Dead,
            Ok(Some(_)) if other.start.is_some() => Liveness::Alive,
            // Without a start time the pid alone proves nothing.
            Ok(Some(_)) | Err(()) => Liveness::Unknown,
        }
    }

    /// How people read it: `pid 4242 on build-3`.
    pub(crate) fn describe(&self) -> String {
        if self.hostname.is_empty() {
            format!("pid {}", self.pid)
        } else {
            format!("pid {} on {}", self.pid, self.hostname)
        }
    }
}

/// `<boot id>/<pid namespace>`, or `None` when either cannot be read.
fn host_key() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let ns = ns.to_str()?;
    (!boot.is_empty() && !ns.is_empty()).then(|| format!("{boot}/{ns}"))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy)]
struct Stat {
    pid: u32,
    zombie: bool,
    start: u64,
}

/// `Ok(None)` when no such process exists; `Err` when it cannot be told
/// (no permission, an unreadable line).
fn stat(pid: u32) -> Result<Option<Stat>, ()> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(line) => parse_stat(&line).map(Some).ok_or(()),
        // ESRCH: the process went away while being read.
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            if exists(pid) {
                // Hidden, not gone: a `/proc` mounted with `hidepid` does not
                // show other users' processes.
                Err(())
            } else {
                Ok(None)
            }
        }
        Err(_) => Err(()),
    }
}

/// Whether a process `pid` exists, by `kill(pid, 0)`: no signal is sent, and
/// only a pid that names no process fails with ESRCH (one of another user
/// fails with EPERM, and exists).
fn exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists and may be
    // signalled; nothing is delivered.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Reads `pid (comm) state ... starttime ...`: the command name may hold
/// spaces and parentheses, so the fields are counted after its last `)`.
fn parse_stat(line: &str) -> Option<Stat> {
    let (head, tail) = line.rsplit_once(')')?;
    let pid = head.split_once(' ')?.0.trim().parse().ok()?;
    let fields: Vec<&str> = tail.split_whitespace().collect();
    // Field 3 (state) is the first after the name; field 22 (starttime)
    // is the twentieth.
    let state = fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(Stat {
        pid,
        zombie: matches!(*state, "Z" | "X" | "x"),
        start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_past_hostile_command_names() {
        let line =
            "4242 (a) b (c) ) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.pid, s.zombie, s.start), (4242, false, 987654));
        let z = "7 (x) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert!(parse_stat(z).unwrap().zombie);
        assert!(parse_stat("7 (x) S 1").is_none());
    }

    #[test]
    fn this_process_is_alive_and_an_ended_one_is_dead() {
        let me = Holder::this_process();
        assert!(me.host.is_some(), "this test needs a Linux /proc");
        assert_eq!(me.judge(&me), Liveness::Alive);

        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = stat(pid).unwrap().map(|s| s.start);
        let theirs = Holder {
            pid,
            start,
            ..me.clone()
        };
        child.wait().unwrap();
        assert_eq!(me.judge(&theirs), Liveness::Dead);

        // Same pid, another start time: the pid was given to another process.
        let reused = Holder {
            start: me.start.map(|t| t + 1),
            ..me.clone()
        };
        assert_eq!(me.judge(&reused), Liveness::Dead);

        // Another machine (or namespace): only the expiry tells.
        let elsewhere = Holder {
            host: Some("another-boot/pid:[1]".into()),
            pid,
            ..me.clone()
        };
        assert_eq!(me.judge(&elsewhere), Liveness::Unknown);
        let unnamed = Holder {
            host: None,
            ..me.clone()
        };
        assert_eq!(me.judge(&unnamed), Liveness::Unknown);
    }

    #[test]
    fn a_pid_exists_until_its_process_is_reaped_whoever_owns_it() {
        assert!(exists(std::process::id()));
        // PID 1 exists, whether or not this process may signal it.
        assert!(exists(1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!exists(pid));
        // Out of range: never taken for gone (and never a process group).
        assert!(exists(u32::MAX));
    }

    #[test]
    fn a_zombie_holder_is_dead() {
        let me = Holder::this_process();
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it exits.
        let t0 = std::time::Instant::now();
        while !stat(pid).unwrap().is_some_and(|s| s.zombie) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let start = stat(pid).unwrap().map(|s| s.start);
        let theirs = Holder {
            pid,
            start,
            ..me.clone()
        };
        assert_eq!(me.judge(&theirs), Liveness::Dead);
        let mut child = child;
        child.wait().unwrap();
    }
}
