//! Guest RAM: anonymous, private, not reserved up front (MAP_NORESERVE), laid out around the
//! MMIO gap by [`arch::layout::ram_regions`]. Pages cost host memory only once touched. A
//! restored microVM's RAM is instead the snapshot's memory file mapped copy-on-write.
//!
//! Each anonymous region starts on a 2 MiB boundary of the host's address space, as its guest
//! address does: where the host backs it with transparent huge pages, KVM can then map the
//! guest's 2 MiB ranges whole (a huge page is used by KVM only when host and guest addresses
//! agree modulo 2 MiB), so the guest takes one fault per 2 MiB instead of 512.
//!
//! On 2 MiB huge pages (`huge_pages: "2M"`) the mapping is hugetlbfs and *is* reserved: the
//! host's pool must hold every page when the microVM starts, so a pool too small is an error
//! at InstanceStart instead of a SIGBUS in the middle of the guest's life.

use std::fs::File;

use vm_memory::bitmap::{AtomicBitmap, NewBitmap};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use crate::config::HugePages;

/// The guest's pages: the unit of the dirty logs, the memory file and the page-fault handler.
pub const PAGE_SIZE: u64 = 4096;
/// The host's transparent huge pages, and the boundary anonymous guest RAM is mapped on.
const HUGE_PAGE: usize = 2 << 20;

/// Devices' writes are logged in each region's bitmap, for diff snapshots.
pub type GuestMemory = devices::virtio::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{mib} MiB of guest memory cannot be mapped on this host: {reason}")]
    Map { mib: u64, reason: String },
}

/// vm-memory allocates each region's dirty-page bitmap (a bit per page) before it maps the
/// region, and an allocation that fails aborts the process. Trying the allocation first turns
/// a size this host cannot hold into an error. (The probe is lazily backed: it costs no RSS.)
fn bitmap_fits(total: u64) -> Result<(), Error> {
    let bytes = total / PAGE_SIZE / 8;
    let fits = usize::try_from(bytes)
        .ok()
        .is_some_and(|bytes| Vec::<u8>::new().try_reserve_exact(bytes).is_ok());
    if fits {
        return Ok(());
    }
    Err(Error::Map {
        mib: total >> 20,
        reason: format!(
            "its dirty-page bitmap of {} MiB cannot be allocated",
            bytes >> 20
        ),
    })
}

/// Where `mem_bytes` of guest RAM go (guest address, length), around the MMIO gap.
pub fn layout(mem_bytes: u64) -> Vec<(u64, u64)> {
    arch::layout::ram_regions(mem_bytes)
        .into_iter()
        .map(|(addr, size)| (addr.0, size))
        .collect()
}

/// Maps `mem_bytes` of guest RAM on `pages`.
pub fn create(mem_bytes: u64, pages: HugePages) -> Result<GuestMemory, Error> {
    create_regions(&layout(mem_bytes), pages)
}

/// Maps guest RAM from a snapshot's memory file, region after region (`regions`: guest
/// address and length, in the file's order). The mapping is private: a page is read from the
/// file when the guest first touches it, and what the guest writes stays in this process.
pub fn from_file(file: &File, regions: &[(u64, u64)]) -> Result<GuestMemory, Error> {
    let flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
    map_regions(regions, flags, Some(file), |e| e)
}

/// Anonymous guest RAM laid out as `regions` (guest address, length) on `pages`: a new
/// microVM's, or a snapshot's for a page-fault handler to fill.
pub fn create_regions(regions: &[(u64, u64)], pages: HugePages) -> Result<GuestMemory, Error> {
    let anonymous = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    match pages {
        HugePages::None => map_regions(regions, anonymous | libc::MAP_NORESERVE, None, |e| e),
        HugePages::Hugetlbfs2M => {
            let total: u64 = regions.iter().map(|r| r.1).sum();
            let flags = anonymous | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
            map_regions(regions, flags, None, |e| huge_pool_shortage(total, &e))
        }
    }
}

/// Maps each of `regions` with `flags`, from `file` (region after region) or anonymous;
/// `explain` turns a failed mapping's error into the reason shown.
fn map_regions(
    regions: &[(u64, u64)],
    flags: libc::c_int,
    file: Option<&File>,
    explain: impl Fn(String) -> String,
) -> Result<GuestMemory, Error> {
    let total: u64 = regions.iter().map(|r| r.1).sum();
    let fail = |reason: String| Error::Map {
        mib: total >> 20,
        reason,
    };
    bitmap_fits(total)?;
    let mut mapped = Vec::with_capacity(regions.len());
    let mut offset = 0u64;
    for &(addr, len) in regions {
        let size = usize::try_from(len)
            .map_err(|_| fail("it does not fit the host's address space".into()))?;
        let mut builder = MmapRegionBuilder::new_with_bitmap(size, AtomicBitmap::with_len(size));
        if let Some(file) = file {
            let file = file.try_clone().map_err(|e| fail(e.to_string()))?;
            builder = builder.with_file_offset(FileOffset::new(file, offset));
        }
        // Only anonymous memory can have transparent huge pages (hugetlbfs is aligned anyway).
        let thp = file.is_none() && flags & libc::MAP_HUGETLB == 0;
        let hole = thp
            .then(|| crate::sys::aligned_hole(size, HUGE_PAGE))
            .flatten();
        let region = builder
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(flags)
            .build()
            .map_err(|e| fail(explain(e.to_string())))?;
        if let Some(hole) = hole {
            if region.as_ptr() as usize != hole.start {
                log::debug!("guest RAM at {addr:#x} is not on a 2 MiB boundary of the host");
            }
        }
        let region = GuestRegionMmap::new(region, GuestAddress(addr))
            .ok_or_else(|| fail(format!("the region at {addr:#x} wraps around")))?;
        mapped.push(region);
        offset += len;
    }
    GuestMemoryMmap::from_regions(mapped).map_err(|e| fail(e.to_string()))
}

/// Why a hugetlbfs mapping of `total` bytes failed, with what the host's 2 MiB pool holds.
fn huge_pool_shortage(total: u64, error: &str) -> String {
    let pool = |name: &str| {
        let path = format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{name}");
        hostfile::read(std::path::Path::new(&path), 4096)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let needed = total / (2 << 20);
    match (pool("free_hugepages"), pool("resv_hugepages")) {
        (Some(free), Some(reserved)) => format!(
            "it needs {needed} huge pages of 2 MiB and the host's pool has {} unreserved \
             (raise vm.nr_hugepages) ({error})",
            free.saturating_sub(reserved)
        ),
        _ => format!(
            "it needs {needed} huge pages of 2 MiB and this host has no 2 MiB hugetlbfs pool \
             ({error})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_too_large_for_its_bitmap_is_an_error_not_an_abort() {
        // 2^62 bytes: a bitmap of 2^47 bytes, more than any host can allocate.
        let e = create(1 << 62, HugePages::None).unwrap_err().to_string();
        assert!(e.contains("cannot be mapped on this host"), "{e}");
        assert!(bitmap_fits(128 << 20).is_ok());
    }

    #[test]
    fn anonymous_guest_ram_starts_on_a_2_mib_boundary() {
        use vm_memory::GuestMemoryBackend;
        for mib in [3u64, 130, 256, 4096 + 8] {
            // A small mapping first, so that the address space's top is not aligned.
            let _perturb = vec![0u8; 12 << 10];
            let memory = create(mib << 20, HugePages::None).unwrap();
            for region in memory.iter() {
                let host = region.as_ptr() as usize;
                assert_eq!(host % HUGE_PAGE, 0, "{mib} MiB: region at {host:#x}");
            }
        }
    }
}
