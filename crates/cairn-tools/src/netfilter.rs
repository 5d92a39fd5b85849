//! The kernel half of "network shut": a seccomp filter installed in the child
//! between `fork` and `exec`.
//!
//! Why seccomp rather than Landlock or a network namespace: Landlock's network
//! rules (ABI 4) only govern TCP `bind`/`connect`, so UDP (DNS, QUIC) would go
//! through; a network namespace needs `CAP_SYS_ADMIN` or unprivileged user
//! namespaces, which containers often disable. A seccomp filter works for any
//! user once `no_new_privs` is set and refuses the one thing every internet
//! access needs first: a socket of an internet (or raw/packet) family.
//!
//! The filter allows `socket`/`socketpair` only for `AF_UNIX` (local IPC keeps
//! working) and answers every other family with `EACCES`. `io_uring_setup` is
//! refused too, because io_uring can create sockets without the `socket`
//! syscall. Syscalls from another ABI (32-bit `int 0x80`, whose `socketcall`
//! multiplexer would hide the family, or x32) are refused wholesale.

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

/// A compiled filter, built in the parent (allocation is not allowed after
/// `fork`) and installed in the child by [`NetFilter::install`].
pub(crate) struct NetFilter {
    program: Vec<libc::sock_filter>,
}

// The program is plain data; the raw pointers inside `sock_filter` are absent.
unsafe impl Send for NetFilter {}
unsafe impl Sync for NetFilter {}

impl NetFilter {
    /// Builds the filter, or explains why this platform has none.
    pub(crate) fn build() -> Result<Self, &'static str> {
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            return Err("the network filter is only built for x86_64 and aarch64");
        }
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let errno = libc::SECCOMP_RET_ERRNO | (libc::EACCES as u32 & libc::SECCOMP_RET_DATA);
            let allow = libc::SECCOMP_RET_ALLOW;
            // Layout (indices matter for the relative jumps):
            // 0 ld arch
            // 1 jeq AUDIT_ARCH ? 2 : deny
            // 2 ld nr
            // 3 jge 0x4000_0000 ? deny : 4        (x32 ABI on x86_64)
            // 4 jeq socket ? fam : 5
            // 5 jeq socketpair ? fam : 6
            // 6 jeq io_uring_setup ? deny : 7
            // 7 ret allow
            // 8 fam: ld arg0
            // 9 jeq AF_UNIX ? 10 : 11
            // 10 ret allow
            // 11 deny: ret errno
            let program = vec![
                stmt(BPF_LD_W_ABS, OFF_ARCH),
                jump(BPF_JEQ_K, AUDIT_ARCH, 0, 9),
                stmt(BPF_LD_W_ABS, OFF_NR),
                jump(BPF_JGE_K, 0x4000_0000, 7, 0),
                jump(BPF_JEQ_K, libc::SYS_socket as u32, 3, 0),
                jump(BPF_JEQ_K, libc::SYS_socketpair as u32, 2, 0),
                jump(BPF_JEQ_K, libc::SYS_io_uring_setup as u32, 4, 0),
                stmt(BPF_RET_K, allow),
                stmt(BPF_LD_W_ABS, OFF_ARG0_LO),
                jump(BPF_JEQ_K, libc::AF_UNIX as u32, 0, 1),
                stmt(BPF_RET_K, allow),
                stmt(BPF_RET_K, errno),
            ];
            Ok(NetFilter { program })
        }
    }

    /// Installs the filter on the calling thread. Async-signal-safe (two
    /// `prctl`s, no allocation), so it may run between `fork` and `exec`.
    pub(crate) fn install(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: plain prctl calls; `prog` points at live memory for the call.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
