//! The `Uffd` memory backend, with Firecracker's hand-over: guest RAM is anonymous memory
//! registered with a userfaultfd, and ember connects to the page-fault handler's Unix socket
//! and sends it, in one message, the userfaultfd (SCM_RIGHTS) and a JSON list of the guest
//! memory regions (`base_host_virt_addr`, `size`, `offset` in the memory file, `page_size`).
//! The handler then fills each page the guest first touches (UFFDIO_COPY).
//!
//! The handler's side ([`Handler`]) lives here too, for the tests and the benchmark.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::memory::GuestMemory;

const PAGE_SIZE: u64 = 4096;

// The userfaultfd ABI (linux/userfaultfd.h), which the libc crate does not carry.
const UFFD_API: u64 = 0xaa;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMOVE: u8 = 0x15;
/// `_IOWR(0xAA, nr, size)`.
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xc020_aa04;

#[repr(C)]
#[derive(Debug, Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
struct UffdioRange {
    start: u64,
    len: u64,
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
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Debug, Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

/// `struct uffd_msg`: the event, then (for a page fault) flags and address.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved: [u8; 7],
    arg: [u64; 3],
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
        source: std::io::Error,
    },
    #[error("cannot hand the userfaultfd to the page-fault handler at {path}: {reason}")]
    Send { path: String, reason: String },
}

/// One guest memory region as the handler is told of it (Firecracker's
/// `GuestRegionUffdMapping`; `page_size_kib` for its older handlers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMapping {
    pub base_host_virt_addr: u64,
    pub size: u64,
    pub offset: u64,
    pub page_size: u64,
    pub page_size_kib: u64,
}

/// Wraps an ioctl on a userfaultfd with a `repr(C)` argument.
fn uffd_ioctl<T>(fd: RawFd, request: libc::c_ulong, arg: &mut T) -> std::io::Result<()> {
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

/// Registers all of `mem` (anonymous, not yet touched) with a new userfaultfd and hands it
/// to the handler listening at `path`.
pub fn hand_over(mem: &GuestMemory, path: &str) -> Result<Backend, UffdError> {
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
            page_size: PAGE_SIZE,
            page_size_kib: PAGE_SIZE / 1024,
        });
        offset += region.len();
    }
    let send_err = |reason: String| UffdError::Send {
        path: path.to_string(),
        reason,
    };
    let socket = UnixStream::connect(path).map_err(|source| UffdError::Connect {
        path: path.to_string(),
        source,
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

/// A page-fault handler: the memory file, and the userfaultfd and regions ember sent.
#[derive(Debug)]
pub struct Handler {
    uffd: OwnedFd,
    /// Ember's end of it closes when ember exits.
    ember: UnixStream,
    regions: Vec<RegionMapping>,
    /// The memory file, mapped read-only.
    file_map: *const u8,
    file_len: usize,
    /// Ranges the balloon gave back: they are zero from now on, not the file's.
    removed: Vec<(u64, u64)>,
    pub pages_copied: u64,
}

// SAFETY: `file_map` is a read-only shared mapping that only this handler reads; moving the
// handler to another thread moves that only reader with it.
unsafe impl Send for Handler {}

impl Handler {
    /// Takes ember's message from `stream` and maps `memory_file`.
    pub fn accept(stream: &UnixStream, memory_file: &File) -> std::io::Result<Self> {
        let mut buf = vec![0u8; 64 * 1024];
        let (len, fd) = stream
            .recv_with_fd(&mut buf[..])
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        let fd = fd.ok_or_else(|| std::io::Error::other("no userfaultfd came with the message"))?;
        let regions: Vec<RegionMapping> = serde_json::from_slice(&buf[..len])?;
        let file_len = usize::try_from(memory_file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the memory file is too large"))?;
        // SAFETY: a new read-only shared mapping of a file this handler holds open; the kernel
        // picks the address, and nothing else is mapped there.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                file_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                memory_file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Handler {
            uffd: OwnedFd::from(fd),
            ember: stream.try_clone()?,
            regions,
            file_map: map as *const u8,
            file_len,
            removed: Vec::new(),
            pages_copied: 0,
        })
    }

    pub fn regions(&self) -> &[RegionMapping] {
        &self.regions
    }

    /// Serves events until ember's connection closes (its process ended).
    pub fn serve(&mut self) -> std::io::Result<()> {
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.uffd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.ember.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds, borrowed for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                // Ember sends nothing after its first message: this is its exit.
                return Ok(());
            }
            if fds[0].revents & libc::POLLIN == 0 {
                continue;
            }
            let mut msg = UffdMsg::default();
            let size = std::mem::size_of::<UffdMsg>();
            // SAFETY: reads at most `size` bytes into `msg`, a plain repr(C) struct of that size.
            let got = unsafe {
                libc::read(
                    self.uffd.as_raw_fd(),
                    (&mut msg as *mut UffdMsg).cast(),
                    size,
                )
            };
            if got < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    continue;
                }
                return Err(e);
            }
            if got == 0 {
                return Ok(());
            }
            match msg.event {
                UFFD_EVENT_PAGEFAULT => self.fill(msg.arg[1] & !(PAGE_SIZE - 1))?,
                UFFD_EVENT_REMOVE => self.removed.push((msg.arg[0], msg.arg[1])),
                _ => {}
            }
        }
    }

    /// Fills the page at host address `addr` from the file (or with zeros once removed).
    fn fill(&mut self, addr: u64) -> std::io::Result<()> {
        let zero = self.removed.iter().any(|&(s, e)| addr >= s && addr < e);
        let Some(region) = self
            .regions
            .iter()
            .find(|r| addr >= r.base_host_virt_addr && addr < r.base_host_virt_addr + r.size)
        else {
            return Err(std::io::Error::other(format!(
                "a fault at {addr:#x} is outside guest memory"
            )));
        };
        let file_offset = region.offset + (addr - region.base_host_virt_addr);
        let result = if zero || file_offset + PAGE_SIZE > self.file_len as u64 {
            let mut z = UffdioZeropage {
                range: UffdioRange {
                    start: addr,
                    len: PAGE_SIZE,
                },
                ..Default::default()
            };
            uffd_ioctl(self.uffd.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z)
        } else {
            let mut copy = UffdioCopy {
                dst: addr,
                // In bounds: checked against the file's length just above.
                src: self.file_map as u64 + file_offset,
                len: PAGE_SIZE,
                ..Default::default()
            };
            uffd_ioctl(self.uffd.as_raw_fd(), UFFDIO_COPY, &mut copy)
        };
        match result {
            Ok(()) => {
                self.pages_copied += 1;
                Ok(())
            }
            // Another fault on the same page was served first.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            // Ember has gone away.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `accept` made; nothing refers to it any more.
        unsafe { libc::munmap(self.file_map as *mut libc::c_void, self.file_len) };
    }
}
