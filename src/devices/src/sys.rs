//! The devices' system calls that std does not wrap, each behind a safe function whose
//! comment says why it is sound. (The Async block engine's ring is in
//! [`crate::virtio::block`]'s `io_uring` module: its soundness is that module's own.)

use std::fs::File;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::virtio::GuestMemory;

/// `_IOW('T', 202, int)` and friends, from <linux/if_tun.h>.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;

/// `struct ifreq` as TUNSETIFF reads it: the name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Attaches `tun` (an open /dev/net/tun) to the TAP device `name` (shorter than IFNAMSIZ)
/// with `flags` (IFF_*).
pub fn tun_attach(tun: &File, name: &str, flags: libc::c_short) -> std::io::Result<()> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags,
        _pad: [0; 22],
    };
    let len = name.len().min(libc::IFNAMSIZ - 1);
    req.name[..len].copy_from_slice(&name.as_bytes()[..len]);
    // SAFETY: TUNSETIFF reads an ifreq, which `req` is laid out as; the kernel only reads
    // and writes within it.
    let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(tun, TUNSETIFF, &mut req) };
    match rc < 0 {
        true => Err(std::io::Error::last_os_error()),
        false => Ok(()),
    }
}

/// Sets the length of the virtio-net header on every frame of the TAP.
pub fn tun_set_vnet_hdr_len(tun: &File, len: usize) -> std::io::Result<()> {
    let size = libc::c_int::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: TUNSETVNETHDRSZ reads one int from `size`.
    let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(tun, TUNSETVNETHDRSZ, &size) };
    match rc < 0 {
        true => Err(std::io::Error::last_os_error()),
        false => Ok(()),
    }
}

/// Which offloaded packets (TUN_F_*) the TAP may hand over.
pub fn tun_set_offload(tun: &File, flags: u32) -> std::io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its argument by value and touches no memory of ours.
    let rc = unsafe {
        vmm_sys_util::ioctl::ioctl_with_val(tun, TUNSETOFFLOAD, libc::c_ulong::from(flags))
    };
    match rc < 0 {
        true => Err(std::io::Error::last_os_error()),
        false => Ok(()),
    }
}

/// Whether this network namespace has an interface named `name`.
pub fn interface_exists(name: &str) -> bool {
    let Ok(c_name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: `c_name` is a valid NUL-terminated string for the duration of the call.
    unsafe { libc::if_nametoindex(c_name.as_ptr()) != 0 }
}

/// Gives the host back the whole host pages (of `host_page` bytes) in `[addr, addr + len)`
/// (page-aligned, inside one region); false if the range is not guest RAM. On huge pages a
/// range smaller than one gives nothing back: the guest's page stays in the host's, as in
/// Firecracker.
pub fn discard_guest_pages(
    mem: &GuestMemory,
    addr: GuestAddress,
    len: u64,
    host_page: u64,
) -> bool {
    let Some(region) = mem.find_region(addr) else {
        return false;
    };
    let offset = addr.0 - region.start_addr().0;
    let Some(end) = offset.checked_add(len).filter(|&end| end <= region.len()) else {
        return false;
    };
    // Regions start on a huge page boundary in guest and host address space alike.
    let (offset, end) = (
        offset.next_multiple_of(host_page),
        end / host_page * host_page,
    );
    if offset >= end {
        return true;
    }
    let len = end - offset;
    let Ok(host) = region.get_host_address(vm_memory::MemoryRegionAddress(offset)) else {
        return false;
    };
    // SAFETY: [host, host + len) lies inside this region's private anonymous mapping, which
    // Ember made and keeps for the VM's life. MADV_DONTNEED only drops its pages: the next
    // access, by the guest or by Ember, sees zeros. No Rust reference points into guest RAM.
    unsafe { libc::madvise(host.cast(), len as usize, libc::MADV_DONTNEED) == 0 }
}
