//! The host side of vsock: Unix sockets. `CONNECT <port>\n` from a host process names the
//! guest port it wants; guest-initiated connections go to `<uds_path>_<port>`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The longest `CONNECT` line taken: "CONNECT 4294967295\n" is 19 bytes.
pub const MAX_CONNECT_LINE: usize = 32;

/// The guest port a complete `CONNECT <port>\n` line names; `None` for anything else.
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let digits = line.strip_prefix(b"CONNECT ")?.strip_suffix(b"\n")?;
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Connects to a Unix stream socket without ever blocking: a listener whose backlog is full
/// refuses (EAGAIN) instead of stalling the VMM thread, so a guest cannot hang it by opening
/// connections nobody accepts.
pub fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    // SAFETY: a plain syscall; the result is checked before it is used as a descriptor.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor this function just opened and nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un that outlives the call, and `len` is within it.
    let r = unsafe {
        libc::connect(
            fd,
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_connect_line_names_a_port() {
        assert_eq!(parse_connect(b"CONNECT 52\n"), Some(52));
        assert_eq!(parse_connect(b"CONNECT 4294967295\n"), Some(u32::MAX));
        for bad in [
            &b"CONNECT 4294967296\n"[..],
            b"CONNECT 52",
            b"CONNECT \n",
            b"CONNECT -1\n",
            b"CONNECT 5 2\n",
            b"connect 52\n",
            b"CONNECT  52\n",
            b"CONNECT 52\r\n",
            b"CONNECT 00000000052\n",
            b"HELLO\n",
        ] {
            assert_eq!(
                parse_connect(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_nonblocking_connect_reaches_a_listener_and_fails_cleanly_without_one() {
        let dir = std::env::temp_dir().join(format!("ember-vsock-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut s = connect_nonblocking(&path).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        use std::io::{Read, Write};
        s.write_all(b"hi").unwrap();
        let mut b = [0u8; 2];
        peer.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hi");
        let missing = connect_nonblocking(&dir.join("missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
