//! A page-fault handler for the `Uffd` backend (the other end of [`super::uffd`]): it takes
//! ember's message (the userfaultfd and the regions), maps the memory file, and fills each
//! page the guest first touches from it, or with zeros once the balloon gave it back, a whole
//! backing page at a time (4 KiB, or 2 MiB on huge pages). The tests use it; a production
//! handler is the platform's own.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use vmm::snapshot::uffd::{
    uffd_ioctl, RegionMapping, UffdMsg, UffdioCopy, UffdioRange, UffdioZeropage, UFFDIO_COPY,
    UFFDIO_ZEROPAGE, UFFD_EVENT_PAGEFAULT, UFFD_EVENT_REMOVE,
};

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
    /// Zeros to copy from where UFFDIO_ZEROPAGE cannot serve (hugetlbfs), as large as the
    /// largest page.
    zeros: Vec<u8>,
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
        if let Some(r) = regions.iter().find(|r| {
            !r.page_size.is_power_of_two()
                || r.page_size > 1 << 30
                || r.base_host_virt_addr % r.page_size != 0
        }) {
            return Err(std::io::Error::other(format!(
                "ember sent a region with a page size of {} at {:#x}",
                r.page_size, r.base_host_virt_addr
            )));
        }
        let largest = regions.iter().map(|r| r.page_size).max().unwrap_or(0);
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
            zeros: vec![0; largest as usize],
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
                UFFD_EVENT_PAGEFAULT => self.fill(msg.arg[1])?,
                UFFD_EVENT_REMOVE => self.removed.push((msg.arg[0], msg.arg[1])),
                _ => {}
            }
        }
    }

    /// Copies `len` bytes at host address `src` into the guest page at `dst`, waking it.
    fn copy(&self, dst: u64, src: u64, len: u64) -> std::io::Result<()> {
        let mut copy = UffdioCopy {
            dst,
            src,
            len,
            ..Default::default()
        };
        uffd_ioctl(self.uffd.as_raw_fd(), UFFDIO_COPY, &mut copy)
    }

    /// Fills the page holding host address `addr` from the file (or with zeros once removed).
    fn fill(&mut self, addr: u64) -> std::io::Result<()> {
        let Some(region) = self
            .regions
            .iter()
            .find(|r| addr >= r.base_host_virt_addr && addr < r.base_host_virt_addr + r.size)
        else {
            return Err(std::io::Error::other(format!(
                "a fault at {addr:#x} is outside guest memory"
            )));
        };
        let page = region.page_size;
        let addr = addr & !(page - 1);
        let zero = self.removed.iter().any(|&(s, e)| addr >= s && addr < e);
        let file_offset = region.offset + (addr - region.base_host_virt_addr);
        let from_file = !zero && file_offset + page <= self.file_len as u64;
        let result = match (from_file, page) {
            // In bounds: checked against the file's length just above.
            (true, _) => self.copy(addr, self.file_map as u64 + file_offset, page),
            (false, 4096) => {
                let mut z = UffdioZeropage {
                    range: UffdioRange {
                        start: addr,
                        len: page,
                    },
                    ..Default::default()
                };
                uffd_ioctl(self.uffd.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z)
            }
            // Huge pages have no zero page: copied from a buffer of zeros.
            (false, _) => self.copy(addr, self.zeros.as_ptr() as u64, page),
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
