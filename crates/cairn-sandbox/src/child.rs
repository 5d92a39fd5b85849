//! The child's half: carrying out a [`Plan`] between `fork` and `exec`.
//!
//! Everything here runs in a process forked from a multi-threaded engine, so
//! it only makes system calls and never allocates (another thread may have
//! held the allocator's lock at the fork).

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::ptr::null;

use crate::fdpass::send_fd;
use crate::plan::{step, Op, Plan, NEW_ROOT, OLD_ROOT};
use crate::Prepared;

fn errno() -> i32 {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

/// Reports the failing step to the engine and returns the error for
/// `pre_exec`.
unsafe fn fail(report: RawFd, step: u32, errno: i32) -> io::Error {
    let mut buf = [0u8; 8];
    buf[..4].copy_from_slice(&step.to_ne_bytes());
    buf[4..].copy_from_slice(&errno.to_ne_bytes());
    libc::write(report, buf.as_ptr().cast(), buf.len());
    io::Error::from_raw_os_error(errno)
}

macro_rules! check {
    ($report:expr, $step:expr, $call:expr) => {
        if $call < 0 {
            return Err(fail($report, $step, errno()));
        }
    };
}

unsafe fn write_file(path: &[u8], data: &[u8]) -> Result<(), i32> {
    let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(errno());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let e = errno();
    libc::close(fd);
    if n != data.len() as isize {
        return Err(if n < 0 { e } else { libc::EIO });
    }
    Ok(())
}

/// See [`Prepared::enter`].
pub(crate) unsafe fn enter(prep: &Prepared, proxy_tx: Option<RawFd>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let plan = &prep.plan;
    let report = prep.report_tx.as_raw_fd();

    user_namespace(plan, report)?;

    // The write end stays open in this process while it lives: the child
    // sees POLLHUP on the read end once it is gone.
    let mut alive = [0 as RawFd; 2];
    check!(
        report,
        step::FORK,
        libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC)
    );
    let pid = libc::fork();
    check!(report, step::FORK, pid);
    if pid > 0 {
        wait_and_exit(pid, alive[1]);
    }

    // PID 1 of the new namespace from here on.
    libc::close(alive[1]);
    check!(
        report,
        step::PARENT_GONE,
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0)
    );
    let mut pfd = libc::pollfd {
        fd: alive[0],
        events: libc::POLLIN,
        revents: 0,
    };
    if libc::poll(&mut pfd, 1, 0) != 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
        // The parent died before the death signal was armed.
        libc::_exit(127);
    }
    libc::close(alive[0]);
    check!(
        report,
        step::UNSHARE_REST,
        libc::unshare(plan.unshare_flags & !(libc::CLONE_NEWUSER | libc::CLONE_NEWPID))
    );
    // No user namespaces below this one: they would hand the program a
    // full set of capabilities over new namespaces, a large attack surface
    // of the kernel for no need of a build. Best effort: the limit is this
    // namespace's own (the host's /proc is still mounted here).
    let _ = write_file(b"/proc/sys/user/max_user_namespaces\0", b"0");

    lock_down(plan, report, proxy_tx)?;
    close_on_exec_from(3);
    Ok(())
}

/// Joins the control group and enters new user and PID namespaces, with
/// the engine's user and group mapped to themselves.
///
/// # Safety
/// Called between fork and exec: async-signal-safe calls only.
unsafe fn user_namespace(plan: &Plan, report: RawFd) -> io::Result<()> {
    // First, while this process is still the engine's in every way: the
    // group must hold the tree before anything in it can fork.
    if let Some(g) = &plan.group {
        if let Err(e) = g.join() {
            return Err(fail(report, step::CGROUP, e));
        }
    }
    // Only the user and PID namespaces here: the others are PID 1's own,
    // so that this process's exit has no namespace to tear down.
    let here = libc::CLONE_NEWUSER | libc::CLONE_NEWPID;
    check!(
        report,
        step::UNSHARE,
        libc::unshare(plan.unshare_flags & here)
    );
    if let Err(e) = write_file(b"/proc/self/setgroups\0", b"deny") {
        // Kernels before 3.19 lack the file and need nothing.
        if e != libc::ENOENT {
            return Err(fail(report, step::SETGROUPS, e));
        }
    }
    if let Err(e) = write_file(b"/proc/self/uid_map\0", plan.uid_map.as_bytes()) {
        return Err(fail(report, step::UID_MAP, e));
    }
    if let Err(e) = write_file(b"/proc/self/gid_map\0", plan.gid_map.as_bytes()) {
        return Err(fail(report, step::GID_MAP, e));
    }
    Ok(())
}

/// In PID 1, once alone: the new root, then every wall in turn (limits,
/// no new privileges, Landlock, no capabilities, seccomp last).
///
/// # Safety
/// Called between fork and exec: async-signal-safe calls only.
unsafe fn lock_down(plan: &Plan, report: RawFd, proxy_tx: Option<RawFd>) -> io::Result<()> {
    build_root(plan, report)?;
    libc::sethostname(b"cairn".as_ptr().cast(), 5);
    if plan.proxy {
        if let Err(e) = proxy_listener(proxy_tx) {
            return Err(fail(report, step::NETWORK, e));
        }
    }
    for (res, lim) in &plan.rlimits {
        check!(report, step::RLIMIT, libc::setrlimit(*res, lim));
    }
    check!(
        report,
        step::NO_NEW_PRIVS,
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    );
    if let Some(rules) = &plan.landlock {
        if let Err(e) = rules.apply() {
            return Err(fail(report, step::LANDLOCK, e));
        }
    }
    if let Err(e) = drop_capabilities() {
        return Err(fail(report, step::CAPS, e));
    }
    let prog = libc::sock_fprog {
        len: plan.seccomp.len() as u16,
        filter: plan.seccomp.as_ptr() as *mut libc::sock_filter,
    };
    check!(
        report,
        step::SECCOMP,
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const _
        )
    );
    Ok(())
}

/// Marks every descriptor from `first` on close-on-exec, so the program
/// inherits only its standard streams, whatever the engine (or a library
/// in it) left inheritable; the ones still needed until `exec` (the report
/// pipe, the seccomp listener's channel) stay usable until then.
unsafe fn close_on_exec_from(first: u32) {
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    if libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) == 0 {
        return;
    }
    // Before Linux 5.11.
    for fd in first as i32..4096 {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
}

/// The spawned process's life after the fork: wait for PID 1 and end the
/// same way. Closes everything first, so the engine's pipes reach EOF when
/// the sandbox's processes close them, not when this one does.
unsafe fn wait_and_exit(pid: libc::pid_t, keep: RawFd) -> ! {
    if libc::syscall(libc::SYS_close_range, 0u32, (keep - 1) as u32, 0u32) != 0
        || libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32) != 0
    {
        for fd in 0..4096 {
            if fd != keep {
                libc::close(fd);
            }
        }
    }
    let mut status = 0;
    loop {
        let r = libc::waitpid(pid, &mut status, 0);
        if r == pid {
            break;
        }
        if r < 0 && errno() != libc::EINTR {
            libc::_exit(127);
        }
    }
    if libc::WIFEXITED(status) {
        libc::_exit(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    libc::_exit(127);
}

/// Assembles the new root and switches to it.
unsafe fn build_root(plan: &Plan, report: RawFd) -> io::Result<()> {
    const OLD: &[u8] = b"oldroot\0";
    const NEW: &[u8] = b"newroot\0";
    let c = |s: &[u8]| s.as_ptr() as *const libc::c_char;

    check!(
        report,
        step::PRIVATE,
        libc::mount(
            null(),
            c(b"/\0"),
            null(),
            libc::MS_REC | libc::MS_PRIVATE,
            null()
        )
    );
    // A private base: the host's /tmp is covered in this namespace only, and
    // the host root moves beneath it as /oldroot.
    check!(
        report,
        step::BASE,
        libc::mount(
            c(b"tmpfs\0"),
            c(b"/tmp\0"),
            c(b"tmpfs\0"),
            libc::MS_NOSUID | libc::MS_NODEV,
            c(b"mode=0755,size=64k\0").cast()
        )
    );
    check!(report, step::BASE, libc::chdir(c(b"/tmp\0")));
    check!(report, step::BASE, libc::mkdir(c(NEW), 0o755));
    check!(report, step::BASE, libc::mkdir(c(OLD), 0o755));
    check!(
        report,
        step::PIVOT,
        libc::syscall(libc::SYS_pivot_root, c(b".\0"), c(OLD))
    );
    check!(report, step::PIVOT, libc::chdir(c(b"/\0")));
    check!(
        report,
        step::BASE,
        libc::mount(
            c(b"tmpfs\0"),
            c(b"/newroot\0"),
            c(b"tmpfs\0"),
            libc::MS_NOSUID | libc::MS_NODEV,
            c(b"mode=0755,size=256k\0").cast()
        )
    );
    debug_assert_eq!(NEW_ROOT, "/newroot");
    debug_assert_eq!(OLD_ROOT, "/oldroot");

    for (i, op) in plan.ops.iter().enumerate() {
        if let Err(e) = run_op(op) {
            return Err(fail(report, step::OPS + i as u32, e));
        }
    }

    check!(report, step::PIVOT, libc::chdir(c(b"/newroot\0")));
    check!(
        report,
        step::PIVOT,
        libc::syscall(libc::SYS_pivot_root, c(b".\0"), c(b".\0"))
    );
    // The old root (the base tmpfs with the host beneath it) now sits on top
    // of the new one; detaching it leaves nothing of the host reachable.
    check!(
        report,
        step::PIVOT,
        libc::umount2(c(b".\0"), libc::MNT_DETACH)
    );
    check!(report, step::PIVOT, libc::chdir(c(b"/\0")));
    check!(report, step::CWD, libc::chdir(plan.cwd.as_ptr()));
    Ok(())
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Binds `src` on `dst` and makes it read-only; a `dst` this kernel's
/// `/proc` does not have is skipped. Runs between fork and exec: no
/// allocation.
unsafe fn bind_read_only_if_there(
    src: *const libc::c_char,
    dst: *const libc::c_char,
    flags: libc::c_ulong,
) -> Result<(), i32> {
    if libc::mount(src, dst, null(), flags, null()) != 0 {
        return if errno() == libc::ENOENT {
            Ok(())
        } else {
            Err(errno())
        };
    }
    read_only(dst)
}

/// Makes a mount (and everything beneath it) read-only.
unsafe fn read_only(path: *const libc::c_char) -> Result<(), i32> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let rc = libc::syscall(
        libc::SYS_mount_setattr,
        libc::AT_FDCWD,
        path,
        AT_RECURSIVE,
        &attr as *const MountAttr,
        std::mem::size_of::<MountAttr>(),
    );
    if rc == 0 {
        return Ok(());
    }
    if errno() != libc::ENOSYS {
        return Err(errno());
    }
    // Before Linux 5.12: a plain remount, keeping the flags the kernel
    // locked on the source (dropping one is refused).
    let mut st: libc::statvfs = std::mem::zeroed();
    if libc::statvfs(path, &mut st) != 0 {
        return Err(errno());
    }
    let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID;
    for (st_flag, ms_flag) in [
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    if libc::mount(null(), path, null(), flags, null()) != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Mounts a new filesystem of type `fstype` (its own name as its source) at
/// `dst`; `data` empty passes no options.
unsafe fn mount_new(fstype: &CStr, dst: &CStr, flags: libc::c_ulong, data: &CStr) -> libc::c_int {
    let data = if data.is_empty() {
        null()
    } else {
        data.as_ptr().cast()
    };
    libc::mount(fstype.as_ptr(), dst.as_ptr(), fstype.as_ptr(), flags, data)
}

unsafe fn run_op(op: &Op) -> Result<(), i32> {
    let ok = |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(errno()) };
    match op {
        Op::Dir(p) => {
            if libc::mkdir(p.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                return Err(errno());
            }
            Ok(())
        }
        Op::File(p) => {
            let fd = libc::open(
                p.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                0o644,
            );
            if fd < 0 {
                return Err(errno());
            }
            libc::close(fd);
            Ok(())
        }
        Op::Bind {
            src,
            dst,
            read_only: ro,
        } => {
            ok(libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                null(),
                libc::MS_BIND | libc::MS_REC,
                null(),
            ))?;
            if *ro {
                read_only(dst.as_ptr())?;
            }
            Ok(())
        }
        Op::MaskFile(dst) => {
            ok(libc::mount(
                c"/oldroot/dev/null".as_ptr(),
                dst.as_ptr(),
                null(),
                libc::MS_BIND,
                null(),
            ))?;
            read_only(dst.as_ptr())
        }
        Op::MaskDir(dst) => ok(mount_new(
            c"tmpfs",
            dst,
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0555,size=4k",
        )),
        Op::Tmpfs { dst, flags, data } => ok(mount_new(c"tmpfs", dst, *flags, data)),
        Op::Proc(dst) => ok(mount_new(
            c"proc",
            dst,
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"",
        )),
        Op::Devpts(dst) => {
            // Optional: without it there are no pseudo-terminals, nothing else.
            mount_new(
                c"devpts",
                dst,
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620",
            );
            Ok(())
        }
        Op::ProcReadOnly(dst) => {
            bind_read_only_if_there(dst.as_ptr(), dst.as_ptr(), libc::MS_BIND | libc::MS_REC)
        }
        Op::ProcMask(dst) => {
            bind_read_only_if_there(c"/oldroot/dev/null".as_ptr(), dst.as_ptr(), libc::MS_BIND)
        }
        Op::Symlink { target, link } => {
            if libc::symlink(target.as_ptr(), link.as_ptr()) != 0 && errno() != libc::EEXIST {
                return Err(errno());
            }
            Ok(())
        }
        Op::SealRoot(dst) => ok(libc::mount(
            null(),
            dst.as_ptr(),
            null(),
            libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            null(),
        )),
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Empties the bounding, ambient, inheritable, permitted and effective
/// sets: the program runs with no capability even in its own namespaces, so
/// it cannot undo a mount (uncover the store) or build new ones.
unsafe fn drop_capabilities() -> Result<(), i32> {
    for cap in 0..64 {
        if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno() != libc::EINVAL {
            return Err(errno());
        }
    }
    libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0,
        0,
        0,
    );
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    if libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Brings loopback up, listens on 127.0.0.1:PROXY_PORT and sends the
/// listener to the engine.
unsafe fn proxy_listener(tx: Option<RawFd>) -> Result<(), i32> {
    let Some(tx) = tx else {
        return Err(libc::EINVAL);
    };
    let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        return Err(errno());
    }
    let mut ifr: libc::ifreq = std::mem::zeroed();
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    let rc = libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr);
    let e = errno();
    libc::close(s);
    if rc != 0 {
        return Err(e);
    }
    let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if l < 0 {
        return Err(errno());
    }
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: crate::PROXY_PORT.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    if libc::bind(
        l,
        &addr as *const libc::sockaddr_in as *const libc::sockaddr,
        std::mem::size_of::<libc::sockaddr_in>() as u32,
    ) != 0
        || libc::listen(l, 128) != 0
    {
        let e = errno();
        libc::close(l);
        return Err(e);
    }
    let sent = send_fd(tx, l);
    libc::close(l);
    sent
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// The belt-and-braces filter: no `ptrace`, `process_vm_readv/writev` or
/// `pidfd_getfd` (the PID namespace already hides the engine; this also
/// keeps a program from reading its own sandbox's processes' memory), no
/// kernel keyring calls, and
/// nothing from another system-call ABI, whose numbers would slip past it.
pub(crate) fn seccomp_program() -> Vec<libc::sock_filter> {
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let jge = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let st = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let j = |code, k, jt, jf| libc::sock_filter { code, jt, jf, k };
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    // The kernel keyring is not namespaced by mount or PID: keys of the
    // engine's uid would be within reach.
    let denied = [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
    ];
    let n = denied.len() as u8;
    let mut p = vec![
        st(ld, 4),                // arch
        j(jeq, AUDIT_ARCH, 1, 0), // native ? next+1 : next
        st(ret, eperm),
        st(ld, 0),                     // nr
        j(jge, 0x4000_0000, n + 1, 0), // x32 numbers: refuse
    ];
    for (i, nr) in denied.iter().enumerate() {
        // Jump to the EPERM return after the ALLOW below.
        p.push(j(jeq, *nr as u32, n - i as u8, 0));
    }
    p.push(st(ret, libc::SECCOMP_RET_ALLOW));
    p.push(st(ret, eperm));
    p
}
