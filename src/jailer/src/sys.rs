//! The jailer's system calls that std does not wrap, each a thin safe function over libc.
//! This is the jailer's only `unsafe`.

use std::ffi::{CStr, CString};
use std::io::{Error, Result};
use std::os::fd::RawFd;
use std::path::Path;

fn cstr(path: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::new(std::io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
}

fn check(rc: libc::c_int) -> Result<libc::c_int> {
    match rc {
        -1 => Err(Error::last_os_error()),
        rc => Ok(rc),
    }
}

/// A character device node with mode `mode` (permission bits).
pub fn mknod_char(path: &Path, mode: u32, major: u32, minor: u32) -> Result<()> {
    let p = cstr(path)?;
    // SAFETY: `p` is a NUL-terminated path that outlives the call.
    check(unsafe {
        libc::mknod(
            p.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    })?;
    Ok(())
}

/// `chown` without following a final symlink (the jail's own files only).
pub fn lchown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

pub fn unshare(flags: libc::c_int) -> Result<()> {
    // SAFETY: unshare takes only flags.
    check(unsafe { libc::unshare(flags) })?;
    Ok(())
}

/// Joins the namespace behind `fd` (of type `nstype`).
pub fn setns(fd: RawFd, nstype: libc::c_int) -> Result<()> {
    // SAFETY: setns reads only its two integer arguments; a bad fd is an error, not UB.
    check(unsafe { libc::setns(fd, nstype) })?;
    Ok(())
}

/// `mount(2)` with no filesystem type or data: bind mounts and propagation changes.
pub fn mount(source: Option<&Path>, target: &Path, flags: libc::c_ulong) -> Result<()> {
    let src = source.map(cstr).transpose()?;
    let tgt = cstr(target)?;
    let src_ptr = src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: the strings are NUL-terminated and outlive the call; fstype and data are NULL,
    // which mount accepts for binds and propagation changes.
    check(unsafe {
        libc::mount(
            src_ptr,
            tgt.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    })?;
    Ok(())
}

pub fn umount_detach(target: &Path) -> Result<()> {
    let t = cstr(target)?;
    // SAFETY: `t` is NUL-terminated and outlives the call.
    check(unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) })?;
    Ok(())
}

pub fn pivot_root(new_root: &Path, put_old: &Path) -> Result<()> {
    let n = cstr(new_root)?;
    let o = cstr(put_old)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; pivot_root has no libc
    // wrapper, so it goes through syscall(2) with its two pointer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) };
    check(rc as libc::c_int)?;
    Ok(())
}

pub fn chroot(path: &Path) -> Result<()> {
    std::os::unix::fs::chroot(path)
}

/// The resource argument of setrlimit, whose C type differs between glibc and musl.
#[cfg(target_env = "gnu")]
pub type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
pub type RlimitResource = libc::c_int;

/// Sets both the soft and the hard limit of `resource`.
pub fn setrlimit(resource: RlimitResource, value: u64) -> Result<()> {
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: `limit` is a valid rlimit that outlives the call.
    check(unsafe { libc::setrlimit(resource, &limit) })?;
    Ok(())
}

/// Drops every supplementary group, then the gid, then the uid (real, effective, saved).
pub fn drop_privileges(uid: u32, gid: u32) -> Result<()> {
    // SAFETY: an empty group list with a null pointer is valid for setgroups.
    check(unsafe { libc::setgroups(0, std::ptr::null()) })?;
    // SAFETY: setresgid and setresuid take only integers.
    check(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(uid, uid, uid) })?;
    Ok(())
}

pub fn setsid() -> Result<()> {
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() })?;
    Ok(())
}

pub fn dup2(from: RawFd, to: RawFd) -> Result<()> {
    // SAFETY: dup2 takes only descriptors; a bad one is an error.
    check(unsafe { libc::dup2(from, to) })?;
    Ok(())
}

/// Closes every descriptor from `first` up.
pub fn close_from(first: u32) -> Result<()> {
    // SAFETY: close_range takes only integers; closing descriptors this process owns is its
    // own business, and no Rust object holds one of them (the jailer opens none before this).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    check(rc as libc::c_int)?;
    Ok(())
}

pub enum Forked {
    Parent { child: libc::pid_t },
    Child,
}

/// `fork(2)`. Only called while the jailer is single-threaded.
pub fn fork() -> Result<Forked> {
    // SAFETY: the jailer has one thread, so the child's copy of the process is consistent.
    match check(unsafe { libc::fork() })? {
        0 => Ok(Forked::Child),
        child => Ok(Forked::Parent { child }),
    }
}

/// Replaces the process with `path`, given `args` (argv[0] first) and an empty environment.
/// Returns only on failure.
pub fn exec(path: &CStr, args: &[CString]) -> Error {
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: `path`, every argv string and both NULL-terminated arrays outlive the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Error::last_os_error()
}

/// The time on `clock` (CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID, ...) in microseconds.
pub fn clock_us(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}
