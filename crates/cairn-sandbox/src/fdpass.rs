//! Handing descriptors from a child to the engine (`SCM_RIGHTS` over a
//! socket pair): the sandbox's PID 1 sends its proxy listener this way,
//! and the tools' network filter its seccomp listener. One copy, since the
//! sending half runs between `fork` and `exec`, where every line counts.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

fn errno() -> i32 {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

/// Room for one `SCM_RIGHTS` control message carrying one descriptor,
/// aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Sends `fd` over the Unix socket `sock`; the error is the `errno`.
///
/// # Safety
///
/// `sock` and `fd` must be open descriptors. Async-signal-safe: it may be
/// called between `fork` and `exec`.
pub unsafe fn send_fd(sock: RawFd, fd: RawFd) -> Result<(), i32> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut buf = CmsgBuf([0; 64]);
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf.0.as_mut_ptr().cast();
    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
    let cmsg = libc::CMSG_FIRSTHDR(&msg);
    (*cmsg).cmsg_level = libc::SOL_SOCKET;
    (*cmsg).cmsg_type = libc::SCM_RIGHTS;
    (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
    loop {
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) >= 0 {
            return Ok(());
        }
        if errno() != libc::EINTR {
            return Err(errno());
        }
    }
}

/// Receives a descriptor sent with [`send_fd`], without blocking.
pub fn recv_fd(sock: RawFd) -> Option<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut buf = CmsgBuf([0; 64]);
    // SAFETY: recvmsg fills buffers that live for the call; the control
    // message is read only within the length it reports.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buf.0.as_mut_ptr().cast();
        msg.msg_controllen = buf.0.len() as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC);
        if n <= 0 {
            return None;
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const RawFd);
        Some(OwnedFd::from_raw_fd(fd))
    }
}

/// A close-on-exec `SOCK_SEQPACKET` pair, for handing descriptors over.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
