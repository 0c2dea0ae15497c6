//! The memory file. A Full snapshot writes all of guest RAM, region after region. A Diff
//! snapshot writes a file of the same size that holds only the pages written since the last
//! snapshot (every other page is a hole, so the file takes little disk space): those the
//! guest wrote, from KVM's dirty log, and those the VMM wrote, from guest memory's own
//! bitmap. `rebase-snap` copies a diff's pages onto its base.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use vm_memory::bitmap::{AtomicBitmap, Bitmap};
use vm_memory::MmapRegion;
use vm_memory::{Address, Bytes, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::SnapshotError;
use crate::memory::{GuestMemory, PAGE_SIZE};
use crate::vm::Vm;

type GuestRegion = vm_memory::GuestRegionMmap<AtomicBitmap>;

fn memory_error(path: &str) -> impl Fn(String) -> SnapshotError + '_ {
    move |reason| SnapshotError::Memory {
        path: path.to_string(),
        reason,
    }
}

/// Writes guest RAM to `path`, region after region; returns the regions. Dirty logs, if
/// kept, start again from here.
pub fn write_memory(
    mem: &GuestMemory,
    vm: &Vm,
    track_dirty: bool,
    path: &str,
) -> Result<Vec<(u64, u64)>, SnapshotError> {
    let fail = memory_error(path);
    let mut out = hostfile::create(Path::new(path)).map_err(|e| fail(e.to_string()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut regions = Vec::new();
    for region in mem.iter() {
        let (start, len) = (region.start_addr(), region.len());
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            mem.read_slice(&mut buf[..n], start.unchecked_add(done))
                .map_err(|e| fail(e.to_string()))?;
            out.write_all(&buf[..n]).map_err(|e| fail(e.to_string()))?;
            done += n as u64;
        }
        regions.push((start.raw_value(), len));
    }
    out.sync_all().map_err(|e| fail(e.to_string()))?;
    if track_dirty {
        // Reading the dirty log clears it; what it says is already in the file.
        for (slot, region) in mem.iter().enumerate() {
            dirty_pages(region, vm, slot).map_err(&fail)?;
        }
    }
    Ok(regions)
}

/// The pages of `region` (KVM slot `slot`) written since the last call (by the guest or by
/// the VMM), as page indices within the region; both logs are cleared.
fn dirty_pages(region: &GuestRegion, vm: &Vm, slot: usize) -> Result<Vec<u64>, String> {
    let len = region.len();
    let kvm_log = vm
        .fd()
        .get_dirty_log(slot as u32, len as usize)
        .map_err(|e| format!("cannot read KVM's dirty page log: {e}"))?;
    let mapping: &MmapRegion<AtomicBitmap> = region;
    let vmm_log = mapping.bitmap();
    let mut pages = Vec::new();
    for page in 0..len / PAGE_SIZE {
        let by_guest = kvm_log
            .get((page / 64) as usize)
            .is_some_and(|word| word & (1 << (page % 64)) != 0);
        if by_guest || vmm_log.dirty_at((page * PAGE_SIZE) as usize) {
            pages.push(page);
        }
    }
    vmm_log.reset();
    Ok(pages)
}

/// Writes a Diff memory file at `path`: as large as guest RAM, holding only the pages
/// written since the last snapshot (or since the VM started). Returns the regions.
pub fn write_diff_memory(
    mem: &GuestMemory,
    vm: &Vm,
    path: &str,
) -> Result<Vec<(u64, u64)>, SnapshotError> {
    let fail = memory_error(path);
    let out = hostfile::create(Path::new(path)).map_err(|e| fail(e.to_string()))?;
    let total: u64 = mem.iter().map(|r| r.len()).sum();
    out.set_len(total).map_err(|e| fail(e.to_string()))?;
    let mut regions = Vec::new();
    let mut file_offset = 0;
    let mut page = vec![0u8; PAGE_SIZE as usize];
    for (slot, region) in mem.iter().enumerate() {
        for index in dirty_pages(region, vm, slot).map_err(&fail)? {
            let offset = index * PAGE_SIZE;
            region
                .read_slice(&mut page, MemoryRegionAddress(offset))
                .map_err(|e| fail(e.to_string()))?;
            out.write_all_at(&page, file_offset + offset)
                .map_err(|e| fail(e.to_string()))?;
        }
        regions.push((region.start_addr().raw_value(), region.len()));
        file_offset += region.len();
    }
    out.sync_all().map_err(|e| fail(e.to_string()))?;
    Ok(regions)
}
