//! The shim's system calls that std does not wrap, each behind a safe function whose comment
//! says why it is sound.

use std::fs::File;
use std::process::Command;

/// Sends SIGKILL to `pid`; the caller knows the pid is the process it means.
pub fn kill(pid: i32) {
    // SAFETY: kill(2) touches no memory of ours.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// poll(2) on `fds`; the number ready, or -1 with errno set.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> i32 {
    // SAFETY: `fds` is a live slice of pollfds, and its length is passed with it.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// Waits for the exclusive lock of `file` (released when it closes): two shims starting
/// containers of one image make its image once.
pub fn flock(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor we own; a failure only means no lock, and the
    // temporary-file rename keeps a race harmless.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
}

/// The child runs in the network namespace `ns` (where its TAP is).
pub fn enter_netns(command: &mut Command, ns: std::fs::File) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // SAFETY: setns(2) on a descriptor the closure owns (moved in, open until exec closes
    // it): async-signal-safe, and all the closure does between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The child gets SIGKILL when the thread that spawned it ends (with the shim, or killed).
pub fn kill_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
    // parent; it is all the closure does between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
