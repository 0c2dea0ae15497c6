//! The Async engine's ring: reads, writes and flushes of a disk image handed to the host
//! kernel through io_uring, completed later through an eventfd the VMM event loop watches.
//! The ring may only read, write and sync (io_uring restrictions, as Firecracker sets them),
//! so that it cannot be used to reach what the VMM thread's seccomp filter forbids.
//!
//! This is the one place where the kernel is given pointers into guest memory that it uses
//! after the call returns: each request keeps its buffer list and a handle on guest memory
//! until its completion is taken, and dropping the ring first waits for every request.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::register::Restriction;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestAddress, GuestMemoryBackend as _};
use vmm_sys_util::eventfd::EventFd;

use crate::virtio::GuestMemory;

/// What a request is, for the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
}

/// One submitted request: what its completion needs, and what the kernel reads and writes
/// until then.
#[derive(Debug)]
struct InFlight<T> {
    token: T,
    /// The bytes the request moves; anything else is an I/O error.
    expected: u64,
    /// Stays where it is (a boxed slice) until the completion: the kernel may read it late.
    _iovecs: Iovecs,
    /// Keeps guest memory mapped while the kernel may touch it.
    _mem: GuestMemory,
}

/// A request's buffer list as the kernel reads it: addresses in guest memory.
#[derive(Debug)]
struct Iovecs(#[allow(dead_code)] Box<[libc::iovec]>);

// SAFETY: the pointers are addresses for the kernel; Rust code never dereferences them, so
// the list may move to another thread (the device's owner) like any other data.
unsafe impl Send for Iovecs {}

/// One finished request: its token, and whether it moved all its bytes.
#[derive(Debug)]
pub struct Completion<T> {
    pub token: T,
    pub result: Result<(), i32>,
}

pub struct Ring<T> {
    ring: IoUring,
    completions: EventFd,
    slots: Vec<Option<InFlight<T>>>,
    free: Vec<usize>,
}

impl<T> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl<T> Ring<T> {
    /// A ring for `depth` requests at a time. Fails where the kernel has no io_uring (or
    /// forbids it: `kernel.io_uring_disabled`, or a seccomp filter of the caller's).
    pub fn new(depth: u32) -> io::Result<Self> {
        let ring = IoUring::builder().setup_r_disabled().build(depth)?;
        let completions = EventFd::new(libc::EFD_NONBLOCK)?;
        let submitter = ring.submitter();
        // Every completion signals the eventfd (IORING_REGISTER_EVENTFD_ASYNC would leave
        // out those posted from this thread's task work, which nothing would then notice).
        submitter.register_eventfd(completions.as_raw_fd())?;
        submitter.register_restrictions(&mut [
            Restriction::sqe_op(opcode::Readv::CODE),
            Restriction::sqe_op(opcode::Writev::CODE),
            Restriction::sqe_op(opcode::Fsync::CODE),
            Restriction::sqe_flags_allowed(squeue::Flags::IO_DRAIN.bits()),
        ])?;
        submitter.register_enable_rings()?;
        let depth = depth as usize;
        Ok(Ring {
            ring,
            completions,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
        })
    }

    /// The eventfd that becomes readable when requests complete.
    pub fn completion_fd(&self) -> RawFd {
        self.completions.as_raw_fd()
    }

    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// No room for another request until one completes.
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Queues a read or write of guest buffers `data` at byte `offset` of `disk`, or a flush
    /// of `disk` (which starts after every request queued before it has completed). Buffers
    /// must have been checked to lie inside `mem`. Nothing reaches the kernel before
    /// [`Ring::submit`]. Err(token) if the ring is full or a buffer is not in `mem`.
    pub fn queue(
        &mut self,
        op: Op,
        disk: &File,
        offset: u64,
        mem: &GuestMemory,
        data: &[(GuestAddress, u32)],
        token: T,
    ) -> Result<(), T> {
        let Some(slot) = self.free.pop() else {
            return Err(token);
        };
        let mut iovecs = Vec::with_capacity(data.len());
        for &(addr, len) in data {
            let Ok(slice) = mem.get_slice(addr, len as usize) else {
                self.free.push(slot);
                return Err(token);
            };
            if op == Op::Read {
                // The kernel writes these pages: a diff snapshot must see them.
                slice.bitmap().mark_dirty(0, len as usize);
            }
            iovecs.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: len as usize,
            });
        }
        let iovecs = iovecs.into_boxed_slice();
        let fd = types::Fd(disk.as_raw_fd());
        // Requests of one queue stay under u32 buffers (the ring's size bounds a chain).
        let count = iovecs.len() as u32;
        let entry = match op {
            Op::Read => opcode::Readv::new(fd, iovecs.as_ptr(), count)
                .offset(offset)
                .build(),
            Op::Write => opcode::Writev::new(fd, iovecs.as_ptr(), count)
                .offset(offset)
                .build(),
            Op::Flush => opcode::Fsync::new(fd)
                .build()
                .flags(squeue::Flags::IO_DRAIN),
        };
        let expected = data.iter().map(|&(_, len)| u64::from(len)).sum();
        let entry = entry.user_data(slot as u64);
        // SAFETY: the entry points at `iovecs` (a boxed slice kept, unmoved, in the slot
        // until its completion is taken) and at guest memory that `mem` keeps mapped for as
        // long (the slot holds a clone; dropping the ring waits for every request first).
        // Every buffer was found inside `mem` above.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            self.free.push(slot);
            return Err(token);
        }
        self.slots[slot] = Some(InFlight {
            token,
            expected,
            _iovecs: Iovecs(iovecs),
            _mem: mem.clone(),
        });
        Ok(())
    }

    /// Hands every queued request to the kernel.
    pub fn submit(&mut self) -> io::Result<()> {
        self.ring.submit().map(|_| ())
    }

    /// The requests that have finished, oldest first; clears the eventfd.
    pub fn completions(&mut self) -> Vec<Completion<T>> {
        let _ = self.completions.read();
        let finished: Vec<cqueue::Entry> = self.ring.completion().collect();
        finished
            .into_iter()
            .filter_map(|cqe| self.finish(cqe.user_data() as usize, cqe.result()))
            .collect()
    }

    fn finish(&mut self, slot: usize, result: i32) -> Option<Completion<T>> {
        let done = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        let result = match u64::try_from(result) {
            Ok(n) if n == done.expected => Ok(()),
            // A short transfer: the file shrank under the guest.
            Ok(_) => Err(libc::EIO),
            Err(_) => Err(-result),
        };
        Some(Completion {
            token: done.token,
            result,
        })
    }

    /// Waits until every request in flight has completed, and returns them all: before a
    /// snapshot, a reset, a new disk file, or dropping the ring.
    pub fn drain(&mut self) -> Vec<Completion<T>> {
        let mut done = Vec::new();
        while self.in_flight() > 0 {
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("the disk's io_uring cannot wait for its requests: {e}");
                    break;
                }
            }
            done.extend(self.completions());
        }
        done
    }
}

/// Whether this host can run the Async engine: a ring can be made (and is dropped).
pub fn probe() -> io::Result<()> {
    Ring::<()>::new(1).map(drop)
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // The kernel may still write into guest memory: wait for it.
        self.drain();
    }
}
