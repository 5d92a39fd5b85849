//! The kernel half of "network shut": a seccomp filter installed in the child
//! between `fork` and `exec`, and a supervisor in the engine that answers and
//! reports what the filter stops.
//!
//! Why seccomp rather than Landlock or a network namespace: Landlock's network
//! rules (ABI 4) only govern TCP `bind`/`connect`, so UDP (DNS, QUIC) would go
//! through; a network namespace needs `CAP_SYS_ADMIN` or unprivileged user
//! namespaces, which containers often disable. A seccomp filter works for any
//! user once `no_new_privs` is set and refuses the one thing every internet
//! access needs first: a socket of an internet (or raw/packet) family.
//!
//! The filter allows `socket`/`socketpair` only for `AF_UNIX` (local IPC keeps
//! working). Every other family, and `io_uring_setup` (io_uring can create
//! sockets without the `socket` syscall), is handed to the engine with
//! `SECCOMP_RET_USER_NOTIF`: a supervisor thread receives the call, records
//! it as a refusal and answers `EACCES`, so the program sees an ordinary
//! "permission denied" and the engine can emit a `NetworkAccess` event.
//! `SECCOMP_RET_TRAP` would have been simpler to observe but kills programs
//! that do not handle SIGSYS.
//!
//! The fallbacks all refuse: when the kernel cannot create a listener, the
//! child installs the same filter answering `EACCES` itself (refused, not
//! reported); when the supervisor has stopped (the command ended but a process
//! that escaped its group still runs), the kernel answers `ENOSYS`.
//! Syscalls from another ABI (32-bit `int 0x80`, whose `socketcall`
//! multiplexer would hide the family, or x32) are refused wholesale with
//! `EACCES`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::sync::mpsc;

/// `AUDIT_ARCH_*` of the architecture the filter is built for.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

// Offsets into `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of args[0] (little-endian); `socket`'s domain is an `int`, so
/// the kernel ignores the high half as well.
const OFF_ARG0_LO: u32 = 16;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Refusals reported per command. A program retrying `socket` in a loop would
/// otherwise flood the event log; past this the calls are still refused.
const MAX_REPORTS: usize = 100;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter with `refuse` as the answer to internet sockets and io_uring.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn program(refuse: u32) -> Vec<libc::sock_filter> {
    let errno = libc::SECCOMP_RET_ERRNO | (libc::EACCES as u32 & libc::SECCOMP_RET_DATA);
    let allow = libc::SECCOMP_RET_ALLOW;
    // Layout (indices matter for the relative jumps):
    // 0 ld arch
    // 1 jeq AUDIT_ARCH ? 2 : errno
    // 2 ld nr
    // 3 jge 0x4000_0000 ? errno : 4       (x32 ABI on x86_64)
    // 4 jeq socket ? fam : 5
    // 5 jeq socketpair ? fam : 6
    // 6 jeq io_uring_setup ? refuse : 7
    // 7 ret allow
    // 8 fam: ld arg0
    // 9 jeq AF_UNIX ? 10 : 11
    // 10 ret allow
    // 11 refuse: ret refuse
    // 12 errno: ret errno
    vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 0, 10),
        stmt(BPF_LD_W_ABS, OFF_NR),
        jump(BPF_JGE_K, 0x4000_0000, 8, 0),
        jump(BPF_JEQ_K, libc::SYS_socket as u32, 3, 0),
        jump(BPF_JEQ_K, libc::SYS_socketpair as u32, 2, 0),
        jump(BPF_JEQ_K, libc::SYS_io_uring_setup as u32, 4, 0),
        stmt(BPF_RET_K, allow),
        stmt(BPF_LD_W_ABS, OFF_ARG0_LO),
        jump(BPF_JEQ_K, libc::AF_UNIX as u32, 0, 1),
        stmt(BPF_RET_K, allow),
        stmt(BPF_RET_K, refuse),
        stmt(BPF_RET_K, errno),
    ]
}

/// Compiled filters, built in the parent (allocation is not allowed after
/// `fork`) and installed in the child by [`NetFilter::install`].
pub(crate) struct NetFilter {
    /// Refusals go to the supervisor.
    notify: Vec<libc::sock_filter>,
    /// Refusals answered by the kernel alone.
    errno: Vec<libc::sock_filter>,
}

// The programs are plain data; the raw pointers inside `sock_filter` are absent.
unsafe impl Send for NetFilter {}
unsafe impl Sync for NetFilter {}

impl NetFilter {
    /// Builds the filters, or explains why this platform has none.
    pub(crate) fn build() -> Result<Self, &'static str> {
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            return Err("the network filter is only built for x86_64 and aarch64");
        }
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let errno = libc::SECCOMP_RET_ERRNO | (libc::EACCES as u32 & libc::SECCOMP_RET_DATA);
            Ok(NetFilter {
                notify: program(libc::SECCOMP_RET_USER_NOTIF),
                errno: program(errno),
            })
        }
    }

    /// Installs the filter on the calling thread. With `report` (a socket from
    /// [`ListenerChannel`]) the filter gets a listener, which is sent to the
    /// parent over `report`; if the kernel refuses to create one, the
    /// self-answering filter is installed instead. Async-signal-safe (raw
    /// syscalls, no allocation), so it may run between `fork` and `exec`.
    pub(crate) fn install(&self, report: Option<RawFd>) -> io::Result<()> {
        // SAFETY: plain prctl/seccomp/sendmsg/close calls; every pointer
        // handed to the kernel points at live memory for the call.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(report) = report {
                let prog = libc::sock_fprog {
                    len: self.notify.len() as u16,
                    filter: self.notify.as_ptr() as *mut libc::sock_filter,
                };
                let listener = libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                    &prog as *const libc::sock_fprog,
                );
                if listener >= 0 {
                    let listener = listener as RawFd;
                    let sent = cairn_sandbox::fdpass::send_fd(report, listener)
                        .map_err(io::Error::from_raw_os_error);
                    libc::close(listener);
                    // Unsent, the listener is closed and the kernel answers
                    // ENOSYS: still refused, but unreported, so fail instead.
                    return sent;
                }
                // EBUSY (an outer filter already has a listener) or a kernel
                // without user notification: refuse without reporting.
            }
            let prog = libc::sock_fprog {
                len: self.errno.len() as u16,
                filter: self.errno.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The socket pair over which the child hands its seccomp listener to the
/// parent.
pub(crate) struct ListenerChannel {
    parent: OwnedFd,
    child: OwnedFd,
}

impl ListenerChannel {
    /// A close-on-exec pair: the child's copies vanish at `exec`, so once the
    /// spawn has returned the parent can read without ever blocking.
    pub(crate) fn new() -> io::Result<Self> {
        let (parent, child) = cairn_sandbox::fdpass::seqpacket_pair()?;
        Ok(ListenerChannel { parent, child })
    }

    /// The end the child sends on.
    pub(crate) fn child_fd(&self) -> RawFd {
        self.child.as_raw_fd()
    }

    /// After the spawn: the listener the child sent, or `None` when it
    /// installed the self-answering filter.
    pub(crate) fn receive(self) -> Option<OwnedFd> {
        drop(self.child);
        cairn_sandbox::fdpass::recv_fd(self.parent.as_raw_fd())
    }
}

/// One socket (or io_uring) the filter refused.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// What was asked for, e.g. `socket(AF_INET, SOCK_STREAM)`.
    pub(crate) target: String,
    /// Why, and which process asked.
    pub(crate) reason: String,
}

/// The engine side of one command's filter: a thread answering the listener.
/// Dropping it stops the thread; the kernel then answers `ENOSYS` to anything
/// still under the filter.
pub(crate) struct Supervisor {
    /// Write end of a pipe the thread polls; closing it wakes the thread.
    stop: OwnedFd,
    /// Refusals, in the order they were answered.
    pub(crate) refusals: mpsc::UnboundedReceiver<Refusal>,
}

impl Supervisor {
    /// Starts the thread. If it cannot start, the listener is closed with it
    /// and the command's sockets are refused with `ENOSYS`, unreported.
    pub(crate) fn start(listener: OwnedFd) -> io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here.
        let (stop_rx, stop_tx) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("cairn-netfilter".into())
            .spawn(move || supervise(listener, stop_rx, tx))?;
        Ok(Supervisor {
            stop: stop_tx,
            refusals: rx,
        })
    }
}

impl Supervisor {
    /// Stops the thread (it exits once it sees the stop pipe close) and
    /// returns the refusals it queued; the channel ends when the thread does.
    pub(crate) fn stop(self) -> mpsc::UnboundedReceiver<Refusal> {
        drop(self.stop);
        self.refusals
    }
}

/// Answers every notification with `EACCES` until the command's run ends
/// (the stop pipe closes) or no process uses the filter any more (`POLLHUP`).
fn supervise(listener: OwnedFd, stop: OwnedFd, tx: mpsc::UnboundedSender<Refusal>) {
    let mut reported = 0usize;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads and writes the two pollfds above.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // SAFETY: an all-zero seccomp_notif is what NOTIF_RECV expects.
            let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
            // SAFETY: the ioctl fills `req`. After POLLIN it does not block:
            // if the caller died meanwhile it fails with ENOENT.
            let rc = unsafe {
                libc::ioctl(
                    listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_RECV,
                    &mut req,
                )
            };
            if rc != 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENOENT) | Some(libc::EINTR) => continue,
                    _ => return,
                }
            }
            // Reported before answering, so the event is queued before the
            // program can see the refusal, exit, and end the run.
            if reported < MAX_REPORTS {
                reported += 1;
                let mut refusal = describe(&req);
                if reported == MAX_REPORTS {
                    refusal
                        .reason
                        .push_str("; further refusals for this command are not reported");
                }
                let _ = tx.send(refusal);
            }
            let mut resp = libc::seccomp_notif_resp {
                id: req.id,
                val: 0,
                error: -libc::EACCES,
                flags: 0,
            };
            // SAFETY: the ioctl reads `resp`. ENOENT (the caller died) is fine.
            unsafe {
                libc::ioctl(
                    listener.as_raw_fd(),
                    libc::SECCOMP_IOCTL_NOTIF_SEND,
                    &mut resp,
                );
            }
            continue;
        }
        if fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return;
        }
    }
}

/// Names the refused call and the process that made it.
fn describe(req: &libc::seccomp_notif) -> Refusal {
    let nr = req.data.nr as libc::c_long;
    let target = if nr == libc::SYS_socket || nr == libc::SYS_socketpair {
        let call = if nr == libc::SYS_socket {
            "socket"
        } else {
            "socketpair"
        };
        format!(
            "{call}({}, {})",
            family_name(req.data.args[0] as u32 as i32),
            type_name(req.data.args[1] as u32 as i32)
        )
    } else if nr == libc::SYS_io_uring_setup {
        "io_uring_setup".to_string()
    } else {
        format!("syscall {nr}")
    };
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", req.pid))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    let who = if comm.is_empty() {
        format!("pid {}", req.pid)
    } else {
        format!("`{comm}`, pid {}", req.pid)
    };
    Refusal {
        target,
        reason: format!("network is shut for this workflow (seccomp refused it to {who})"),
    }
}

fn family_name(family: i32) -> String {
    let name = match family {
        libc::AF_UNSPEC => "AF_UNSPEC",
        libc::AF_INET => "AF_INET",
        libc::AF_INET6 => "AF_INET6",
        libc::AF_PACKET => "AF_PACKET",
        libc::AF_NETLINK => "AF_NETLINK",
        libc::AF_KEY => "AF_KEY",
        libc::AF_BLUETOOTH => "AF_BLUETOOTH",
        libc::AF_CAN => "AF_CAN",
        libc::AF_TIPC => "AF_TIPC",
        libc::AF_ALG => "AF_ALG",
        libc::AF_VSOCK => "AF_VSOCK",
        libc::AF_XDP => "AF_XDP",
        _ => return format!("family {family}"),
    };
    name.to_string()
}

fn type_name(ty: i32) -> String {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let name = match base {
        libc::SOCK_STREAM => "SOCK_STREAM",
        libc::SOCK_DGRAM => "SOCK_DGRAM",
        libc::SOCK_RAW => "SOCK_RAW",
        libc::SOCK_RDM => "SOCK_RDM",
        libc::SOCK_SEQPACKET => "SOCK_SEQPACKET",
        _ => return format!("type {base}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_families_and_types() {
        assert_eq!(family_name(libc::AF_INET6), "AF_INET6");
        assert_eq!(family_name(4242), "family 4242");
        assert_eq!(
            type_name(libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK),
            "SOCK_DGRAM"
        );
    }
}
