//! The one system call std does not offer: a non-blocking connect to a Unix socket (std's
//! `UnixStream::connect` waits while the listener's backlog is full, for ever if it never
//! accepts).

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::Error;

pub(crate) fn connect_nonblocking(path: &Path) -> Result<UnixStream, Error> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays 0: the path's terminator.
    if bytes.len() >= addr.sun_path.len() {
        return Err(Error::PathTooLong(bytes.len()));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socket() takes no pointers; its result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, flags, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: `fd` is a new socket that nothing else owns; the OwnedFd closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un that outlives the call, and `len` is its size.
    let rc = unsafe {
        libc::connect(
            owned.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.kind() {
            ErrorKind::WouldBlock => Error::Busy,
            _ => e.into(),
        });
    }
    Ok(UnixStream::from(owned))
}
