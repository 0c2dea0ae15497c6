//! The VMM's system calls that neither std nor kvm-ioctls wraps safely, each behind a safe
//! function whose comment says why it is sound. (Guest memory slots are in [`crate::vm`],
//! the userfaultfd in [`crate::snapshot::uffd`], and the guest-memory atomics of the
//! instruction emulator in its `atomic` module: their soundness is those modules' own.)

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use kvm_bindings::{kvm_run, kvm_xsave};
use kvm_ioctls::VcpuFd;
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

ioctl_io_nr!(KVM_GET_STATS_FD, kvm_bindings::KVMIO, 0xce);

/// The file of KVM's counters for `vcpu` (KVM_GET_STATS_FD), or None when this KVM has none
/// (before Linux 5.14).
pub fn vcpu_stats_file(vcpu: &VcpuFd) -> Option<File> {
    // SAFETY: KVM_GET_STATS_FD takes no argument and only returns a new file descriptor
    // (or -1); `vcpu` is a valid vCPU descriptor for the duration of the call.
    let fd = unsafe { ioctl(vcpu, KVM_GET_STATS_FD()) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by KVM and nothing else owns it.
    Some(unsafe { File::from_raw_fd(fd) })
}

/// Gives a vCPU its saved extended state.
pub fn set_xsave(vcpu: &VcpuFd, xsave: &kvm_xsave) -> Result<(), kvm_ioctls::Error> {
    // SAFETY: Ember never asks for dynamically enabled XSTATE features
    // (arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM)), so KVM copies only the 4,096-byte `kvm_xsave`
    // this reference points to.
    unsafe { vcpu.set_xsave(xsave) }
}

/// The suberror and data words of kvm_run's `internal` exit member. Meaningful right after
/// KVM_RUN returned KVM_EXIT_INTERNAL_ERROR; otherwise it reads whatever the union holds.
pub fn internal_error_data(run: &kvm_run) -> (u32, Vec<u64>) {
    // SAFETY: the member is plain integers, valid for any bit pattern, and lies inside the
    // union, so reading it is defined whichever member KVM filled last.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let n = (internal.ndata as usize).min(internal.data.len());
    (internal.suberror, internal.data[..n].to_vec())
}

/// The next offset at or after `from` where `file` has data (`SEEK_DATA`) or a hole
/// (`SEEK_HOLE`); None past the last data.
pub fn seek_data_or_hole(file: &File, from: u64, whence: i32) -> std::io::Result<Option<u64>> {
    let from = i64::try_from(from).map_err(std::io::Error::other)?;
    // SAFETY: lseek(2) on a descriptor `file` owns; it moves only that file's offset.
    let at = unsafe { libc::lseek(file.as_raw_fd(), from, whence) };
    if at < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(at as u64))
}

/// A free range of the address space that starts on an alignment boundary, fenced by
/// inaccessible guard mappings on both sides, so that the next mapping of its length (which
/// the kernel places in the highest gap that fits) most likely lands in it. Dropping it
/// removes the guards.
#[derive(Debug)]
pub struct AlignedHole {
    pub start: usize,
    guards: [(usize, usize); 2],
}

/// Makes a hole of `len` bytes at an `align` boundary (a power of two), or None if the
/// address space has no room for `len + align` bytes.
pub fn aligned_hole(len: usize, align: usize) -> Option<AlignedHole> {
    let span = len.checked_add(align)?;
    // SAFETY: a new private, inaccessible, unreserved mapping at an address the kernel
    // chooses; it overlaps nothing of this process.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let base = base as usize;
    let start = (base + align - 1) & !(align - 1);
    let hole = AlignedHole {
        start,
        guards: [
            (base, start - base),
            (start + len, base + span - start - len),
        ],
    };
    // SAFETY: [start, start + len) lies inside the mapping made above, which nothing else
    // knows of.
    unsafe { libc::munmap(start as *mut libc::c_void, len) };
    Some(hole)
}

impl Drop for AlignedHole {
    fn drop(&mut self) {
        for (addr, len) in self.guards {
            if len > 0 {
                // SAFETY: each guard is a part of the mapping `aligned_hole` made, never
                // handed out; unmapping it touches nothing else.
                unsafe { libc::munmap(addr as *mut libc::c_void, len) };
            }
        }
    }
}
