//! What this machine's kernel lets the sandbox do, for `cairn doctor`.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::{landlock, Confinement, Network};

/// One wall and whether it stands here.
#[derive(Debug, Clone)]
pub struct Check {
    /// The wall, e.g. `user namespace`.
    pub name: &'static str,
    /// Whether it works on this machine.
    pub ok: bool,
    /// Whether the sandbox refuses to run without it (the others are
    /// second walls or optional features).
    pub required: bool,
    /// What was found, or what is missing and why.
    pub detail: String,
}

/// Every check, in the order `cairn doctor` prints them.
#[derive(Debug, Clone)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether every required wall stands.
    pub fn sandbox_ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok || !c.required)
    }
}

/// Forks a child that unshares `flags` and reports the errno (0: success).
fn try_unshare(flags: libc::c_int) -> i32 {
    // SAFETY: the child only calls unshare and _exit (async-signal-safe).
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return *libc::__errno_location();
        }
        if pid == 0 {
            let rc = libc::unshare(flags);
            libc::_exit(if rc == 0 {
                0
            } else {
                *libc::__errno_location() & 0xff
            });
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                return libc::ECHILD;
            }
        }
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            libc::EINTR
        }
    }
}

fn ns_check(name: &'static str, flags: libc::c_int) -> Check {
    let e = try_unshare(flags);
    Check {
        name,
        ok: e == 0,
        required: true,
        detail: if e == 0 {
            "available".into()
        } else {
            format!("unshare refused: {}", std::io::Error::from_raw_os_error(e))
        },
    }
}

/// Starts `true` confined to a fresh temporary folder: the whole chain
/// (namespaces, mounts, proc, pivot, Landlock, seccomp) at once.
fn end_to_end() -> Check {
    let name = "confined process";
    let dir = std::env::temp_dir().join(format!("cairn-doctor-{}", std::process::id()));
    let result = (|| -> Result<(), String> {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut conf = Confinement::new(&dir);
        conf.network = Network::None;
        let prep = std::sync::Arc::new(conf.prepare(&dir).map_err(|e| e.to_string())?);
        let p2 = prep.clone();
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            "test -d /proc/self && test ! -e /etc/shadow -o ! -s /etc/shadow",
        ])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: enter is async-signal-safe and allocation-free.
        unsafe {
            cmd.pre_exec(move || p2.enter());
        }
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("the confined test program failed ({s})")),
            Err(e) => Err(match prep.failure() {
                Some(f) => f.into_error().to_string(),
                None => e.to_string(),
            }),
        }
    })();
    let _ = std::fs::remove_dir_all(&dir);
    Check {
        name,
        ok: result.is_ok(),
        required: true,
        detail: match result {
            Ok(()) => "a program ran with its own root, /proc and no network".into(),
            Err(e) => e,
        },
    }
}

fn seccomp_check() -> Check {
    let action = libc::SECCOMP_RET_USER_NOTIF;
    // SAFETY: queries whether an action is available; reads `action`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    Check {
        name: "seccomp (with user notification)",
        ok: rc == 0,
        required: true,
        detail: if rc == 0 {
            "available: ptrace and process_vm_* refused, blocked sockets reported".into()
        } else {
            format!("unavailable: {}", std::io::Error::last_os_error())
        },
    }
}

fn landlock_check() -> Check {
    let abi = landlock::abi();
    Check {
        name: "Landlock",
        ok: abi > 0,
        required: false,
        detail: match abi {
            0 => "not offered by this kernel (or disabled at boot): the mount namespace is the only file-system wall".into(),
            1..=5 => format!("ABI {abi}: file-system rules"),
            _ => format!("ABI {abi}: file-system rules, abstract sockets and signals scoped"),
        },
    }
}

fn cgroup_check() -> Check {
    let s = crate::cgroup::inspect();
    Check {
        name: "cgroups (tree-wide limits)",
        ok: s.memory.is_some() && s.processes.is_some() && s.cpu.is_some(),
        required: false,
        detail: s.detail,
    }
}

fn dumpable_check() -> Check {
    // SAFETY: prctl query without pointers.
    let d = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    Check {
        name: "engine non-dumpable",
        ok: d == 0,
        required: true,
        detail: if d == 0 {
            "set: no core dumps, /proc/<engine> unreadable, ptrace attach refused".into()
        } else {
            "not set in this process".into()
        },
    }
}

/// Runs every check. Forks short-lived children; takes a few milliseconds.
pub fn probe() -> Report {
    let user = libc::CLONE_NEWUSER;
    Report {
        checks: vec![
            ns_check("user namespace", user),
            ns_check("mount namespace", user | libc::CLONE_NEWNS),
            ns_check("PID namespace", user | libc::CLONE_NEWPID),
            ns_check("network namespace", user | libc::CLONE_NEWNET),
            end_to_end(),
            seccomp_check(),
            landlock_check(),
            cgroup_check(),
            dumpable_check(),
        ],
    }
}
