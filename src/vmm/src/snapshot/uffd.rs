//! The `Uffd` memory backend, with Firecracker's hand-over: guest RAM is anonymous memory
//! registered with a userfaultfd, and ember connects to the page-fault handler's Unix socket
//! and sends it, in one message, the userfaultfd (SCM_RIGHTS) and a JSON list of the guest
//! memory regions (`base_host_virt_addr`, `size`, `offset` in the memory file, `page_size`).
//! The handler then fills each page the guest first touches (UFFDIO_COPY).
//!
//! A handler's side (the tests') is in the test-support crate; the kernel's structures and
//! constants are public for it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::config::HugePages;
use crate::memory::GuestMemory;

// The userfaultfd ABI (linux/userfaultfd.h), which the libc crate does not carry.
/// The handler gets the mappings and the userfaultfd in one small message; a handler that
/// does not take it within this is not one.
const HANDLER_SEND_TIMEOUT: Duration = Duration::from_secs(1);
const UFFD_API: u64 = 0xaa;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
/// `_IOWR(0xAA, nr, size)`.
const UFFDIO_API: libc::Ioctl = 0xc018_aa3f_u32 as libc::Ioctl;
const UFFDIO_REGISTER: libc::Ioctl = 0xc020_aa00_u32 as libc::Ioctl;
pub const UFFDIO_COPY: libc::Ioctl = 0xc028_aa03_u32 as libc::Ioctl;
pub const UFFDIO_ZEROPAGE: libc::Ioctl = 0xc020_aa04_u32 as libc::Ioctl;

#[repr(C)]
#[derive(Debug, Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioCopy {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub copy: i64,
}

#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioZeropage {
    pub range: UffdioRange,
    pub mode: u64,
    pub zeropage: i64,
}

/// `struct uffd_msg`: the event, then (for a page fault) flags and address.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdMsg {
    pub event: u8,
    pub reserved: [u8; 7],
    pub arg: [u64; 3],
}

#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    #[error(
        "cannot create a userfaultfd (is it allowed here? see vm.unprivileged_userfaultfd): {0}"
    )]
    Create(#[source] std::io::Error),
    #[error("cannot register guest memory with the userfaultfd: {0}")]
    Register(#[source] std::io::Error),
    #[error("cannot reach the page-fault handler at {path}: {source}")]
    Connect {
        path: String,
        source: hostfile::Error,
    },
    #[error("cannot hand the userfaultfd to the page-fault handler at {path}: {reason}")]
    Send { path: String, reason: String },
}

/// One guest memory region as the handler is told of it (Firecracker's
/// `GuestRegionUffdMapping`). `page_size` is in bytes, and so is the deprecated
/// `page_size_kib` despite its name: Firecracker sends the same number in both, and its older
/// handlers read the second as bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMapping {
    pub base_host_virt_addr: u64,
    pub size: u64,
    pub offset: u64,
    pub page_size: u64,
    pub page_size_kib: u64,
}

/// Wraps an ioctl on a userfaultfd with a `repr(C)` argument.
pub fn uffd_ioctl<T>(fd: RawFd, request: libc::Ioctl, arg: &mut T) -> std::io::Result<()> {
    // SAFETY: `fd` is a userfaultfd and `request` one of the userfaultfd ioctls whose argument
    // is exactly `T` (the repr(C) copies of the kernel's structs above); the kernel reads and
    // writes only that struct, which `arg` borrows mutably for the call.
    let rc = unsafe { libc::ioctl(fd, request, arg as *mut T) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The userfaultfd and the connection to its handler, kept open while the VM lives: the
/// handler learns that ember has gone when the connection closes.
#[derive(Debug)]
pub struct Backend {
    _uffd: OwnedFd,
    _handler: UnixStream,
}

/// Registers all of `mem` (anonymous, not yet touched, on `pages`) with a new userfaultfd and
/// hands it to the handler listening at `path`.
pub fn hand_over(mem: &GuestMemory, pages: HugePages, path: &str) -> Result<Backend, UffdError> {
    // SAFETY: userfaultfd(2) takes only flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if raw < 0 {
        return Err(UffdError::Create(std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a descriptor the kernel just gave this process and nothing else owns.
    let uffd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_EVENT_REMOVE,
        ioctls: 0,
    };
    uffd_ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api).map_err(UffdError::Create)?;
    let mut mappings = Vec::new();
    let mut offset = 0;
    for region in mem.iter() {
        let start = region.as_ptr() as u64;
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start,
                len: region.len(),
            },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        uffd_ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER, &mut reg).map_err(UffdError::Register)?;
        mappings.push(RegionMapping {
            base_host_virt_addr: start,
            size: region.len(),
            offset,
            page_size: pages.page_size(),
            page_size_kib: pages.page_size(),
        });
        offset += region.len();
    }
    let send_err = |reason: String| UffdError::Send {
        path: path.to_string(),
        reason,
    };
    let socket = hostfile::connect(Path::new(path), HANDLER_SEND_TIMEOUT).map_err(|source| {
        UffdError::Connect {
            path: path.to_string(),
            source,
        }
    })?;
    let body = serde_json::to_vec(&mappings).map_err(|e| send_err(e.to_string()))?;
    socket
        .send_with_fd(&body[..], uffd.as_raw_fd())
        .map_err(|e| send_err(e.to_string()))?;
    Ok(Backend {
        _uffd: uffd,
        _handler: socket,
    })
}
