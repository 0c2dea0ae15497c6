//! The container side's system calls that std does not wrap, each behind a safe function
//! whose comment says why it is sound.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

#[derive(Debug)]
pub enum RecvFdError {
    Io(std::io::Error),
    /// The message carried no SCM_RIGHTS descriptor.
    NoDescriptor,
}

/// The descriptor in the next message on `conn` (one SCM_RIGHTS descriptor, as crun sends
/// a terminal's master to its console socket), now ours.
pub fn recv_fd(conn: &UnixStream) -> Result<File, RecvFdError> {
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
        return Err(RecvFdError::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR stays inside its control buffer.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: a non-null header from CMSG_FIRSTHDR is inside `control`.
    let Some(cmsg) = (unsafe { cmsg.as_ref() }) else {
        return Err(RecvFdError::NoDescriptor);
    };
    if cmsg.cmsg_level != libc::SOL_SOCKET || cmsg.cmsg_type != libc::SCM_RIGHTS {
        return Err(RecvFdError::NoDescriptor);
    }
    // SAFETY: an SCM_RIGHTS message's data is at least one int, a descriptor now ours.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>()) };
    // SAFETY: the kernel installed `fd` in this process for us; nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// SIOCSIFHWADDR on an inet socket: busybox's `ip link set address` needs packet sockets,
/// which the guest kernel leaves out.
pub fn set_mac(interface: &str, mac: [u8; 6]) -> Result<(), String> {
    const SIOCSIFHWADDR: libc::c_ulong = 0x8924;
    const ARPHRD_ETHER: libc::sa_family_t = 1;
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (to, from) in req.ifr_name.iter_mut().zip(interface.bytes()) {
        *to = from as libc::c_char;
    }
    // SAFETY: writing the union's hwaddr member, which the ioctl reads.
    unsafe {
        req.ifr_ifru.ifru_hwaddr.sa_family = ARPHRD_ETHER;
        for (to, from) in req.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac) {
            *to = from as libc::c_char;
        }
    }
    // SAFETY: a new socket owned by nothing else; closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `req` is a complete ifreq (the name is NUL-terminated: at most 15 bytes were
    // copied into 16 zeroed ones) that outlives the call.
    let rc = unsafe { libc::ioctl(fd, SIOCSIFHWADDR as _, &req) };
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(format!("cannot give {interface} the MAC address: {err}"));
    }
    Ok(())
}

/// mount(2) with every argument a string.
pub fn mount(
    source: &str,
    at: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} has a NUL byte"));
    let (source, dir, fstype, data) = (c(source)?, c(&at.to_string_lossy())?, c(fstype)?, c(data)?);
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            dir.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// Drops the cached blocks of a block device (BLKFLSBUF).
pub fn flush_block_cache(device: &File) -> std::io::Result<()> {
    const BLKFLSBUF: libc::c_int = 0x1261;
    // SAFETY: BLKFLSBUF takes no argument and touches no memory of ours.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), BLKFLSBUF as _, 0) };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Detaches whatever is mounted at `path` (MNT_DETACH); nothing there is no error.
pub fn unmount_detached(path: &Path) {
    if let Ok(path) = CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Sends `signal` to `pid`.
pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> std::io::Result<()> {
    // SAFETY: kill(2) with a pid and a signal number; nothing is borrowed.
    match unsafe { libc::kill(pid, signal) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Gives the terminal whose master is `terminal` a size in characters.
pub fn set_window_size(terminal: &File, width: u16, height: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize, which `size` is, from a terminal's master.
    match unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSWINSZ, &size) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Ends the sending side of the socket `conn` (a vsock connection held as a File).
pub fn shutdown_write(conn: &File) {
    // SAFETY: shutdown(2) on a socket `conn` owns; no memory is passed.
    unsafe { libc::shutdown(conn.as_raw_fd(), libc::SHUT_WR) };
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> std::io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and nothing else owns them.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Makes this process the one that orphaned descendants are reparented to.
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments; no memory is passed.
    match unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Waits for any child to end: its pid and wait status, or None when there is no child.
pub fn wait_any() -> Option<(libc::pid_t, libc::c_int)> {
    let mut status = 0;
    // SAFETY: waits for any child; `status` is a valid out-pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
    (pid > 0).then_some((pid, status))
}
