//! Landlock, the second wall: the mount namespace already decides what
//! exists; Landlock rules say again, in the kernel's access checks, that only
//! the root, `/tmp` and the devices may be written. Raw system calls rather
//! than the `landlock` crate because the rules are applied between `fork`
//! and `exec`, where nothing may allocate.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::{cstr, SandboxError};

const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
/// Everything from `REMOVE_DIR` to `MAKE_SYM` (ABI 1).
const MAKE_AND_REMOVE: u64 = 0b1_1111_1111 << 4;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
const IOCTL_DEV: u64 = 1 << 15;

const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version this kernel offers (0: none).
pub fn abi() -> u32 {
    static ABI: OnceLock<u32> = OnceLock::new();
    *ABI.get_or_init(|| {
        // SAFETY: the version query takes no attribute.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<RulesetAttr>(),
                0usize,
                CREATE_RULESET_VERSION,
            )
        };
        if v < 0 {
            0
        } else {
            v as u32
        }
    })
}

/// Rules planned in the engine, applied in the child.
#[derive(Debug)]
pub(crate) struct Rules {
    handled: u64,
    scoped: u64,
    attr_size: usize,
    /// Paths (in the new root) and what is allowed beneath each.
    rules: Vec<(CString, u64)>,
}

impl Rules {
    /// Rules for this kernel's ABI, or `None` without Landlock.
    pub(crate) fn plan(writable: &[&Path]) -> Result<Option<Rules>, SandboxError> {
        let abi = abi();
        if abi == 0 {
            return Ok(None);
        }
        let mut handled = EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | MAKE_AND_REMOVE;
        if abi >= 2 {
            handled |= REFER;
        }
        if abi >= 3 {
            handled |= TRUNCATE;
        }
        if abi >= 5 {
            handled |= IOCTL_DEV;
        }
        let (scoped, attr_size) = match abi {
            1..=3 => (0, 8),
            4 | 5 => (0, 16),
            _ => (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24),
        };
        let read = EXECUTE | READ_FILE | READ_DIR;
        let mut rules = vec![
            (cstr("/")?, read),
            // No writes to /proc: sysctls and triggers are machine-wide.
            (cstr("/proc")?, read),
            (
                cstr("/dev")?,
                handled & (read | WRITE_FILE | TRUNCATE | IOCTL_DEV),
            ),
        ];
        for w in writable {
            rules.push((cstr(w.as_os_str().as_bytes())?, handled));
        }
        Ok(Some(Rules {
            handled,
            scoped,
            attr_size,
            rules,
        }))
    }

    /// Restricts the calling process. Async-signal-safe.
    pub(crate) unsafe fn apply(&self) -> Result<(), i32> {
        let attr = RulesetAttr {
            handled_access_fs: self.handled,
            handled_access_net: 0,
            scoped: self.scoped,
        };
        let fd = libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            self.attr_size,
            0u32,
        );
        if fd < 0 {
            return Err(errno());
        }
        let fd = fd as libc::c_int;
        for (path, access) in &self.rules {
            let pfd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if pfd < 0 {
                // A folder the plan expected but the view lacks: no rule,
                // so nothing is allowed beneath it (the safe direction).
                continue;
            }
            let rule = PathBeneath {
                allowed_access: *access,
                parent_fd: pfd,
            };
            let rc = libc::syscall(
                libc::SYS_landlock_add_rule,
                fd,
                RULE_PATH_BENEATH,
                &rule as *const PathBeneath,
                0u32,
            );
            let e = errno();
            libc::close(pfd);
            if rc != 0 {
                libc::close(fd);
                return Err(e);
            }
        }
        let rc = libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32);
        let e = errno();
        libc::close(fd);
        if rc != 0 {
            return Err(e);
        }
        Ok(())
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
