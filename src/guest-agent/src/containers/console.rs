//! A container process with a terminal: crun makes the pseudo-terminal and sends its master
//! side to the `--console-socket` (one descriptor in an SCM_RIGHTS message), before its
//! `create` or `exec --detach` returns.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixListener;

/// The master side crun sent to `listener` (its connection is already queued).
pub fn receive(listener: &UnixListener) -> Result<File, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("console socket: {e}"))?;
    let (conn, _) = listener
        .accept()
        .map_err(|e| format!("crun sent no terminal to the console socket: {e}"))?;
    let mut data = [0u8; 256];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all zeroes is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov`, `data` and `control`, which live across the call and
    // whose sizes it states.
    let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(format!(
            "console socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR stays inside its control buffer.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: a non-null header from CMSG_FIRSTHDR is inside `control`.
    let Some(cmsg) = (unsafe { cmsg.as_ref() }) else {
        return Err("crun's console message carried no terminal".into());
    };
    if cmsg.cmsg_level != libc::SOL_SOCKET || cmsg.cmsg_type != libc::SCM_RIGHTS {
        return Err("crun's console message carried no terminal".into());
    }
    // SAFETY: an SCM_RIGHTS message's data is at least one int, a descriptor now ours.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>()) };
    // SAFETY: the kernel installed `fd` in this process for us; nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}
