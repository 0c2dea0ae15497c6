//! Guest-virtual to guest-physical translation through the guest's own page tables, so that
//! Ember can read the instruction at RIP and the memory it touches. Every table entry is
//! guest-controlled: reads go through [`GuestMemory`] and fail cleanly outside it.

use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const PAGE_SIZE_BIT: u64 = 1 << 7;
/// Bits 12..51 of an entry: the next table or the frame.
const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

const CR0_PG: u64 = 1 << 31;
const CR0_WP: u64 = 1 << 16;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const EFER_LMA: u64 = 1 << 10;

/// The paging state of a vCPU, from its special registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging {
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    #[error("guest address {0:#x} is not mapped by the guest's page tables")]
    NotPresent(u64),
    #[error("guest address {0:#x} is mapped read-only")]
    ReadOnly(u64),
    #[error("guest address {0:#x} is not canonical")]
    NonCanonical(u64),
    #[error("a page table of the guest lies outside its memory at {0:#x}")]
    TableOutsideMemory(u64),
    #[error("the access at guest address {0:#x} spans two pages in different frames")]
    SplitAccess(u64),
    #[error("the guest uses a paging mode Ember does not walk (32-bit, PAE legacy or 5-level)")]
    UnsupportedMode,
}

impl Paging {
    /// The physical address of `gva`; `write` also requires every level to allow writes when
    /// CR0.WP is set (a supervisor write, as the emulated instructions are kernel code).
    pub fn translate(&self, mem: &GuestMemory, gva: u64, write: bool) -> Result<u64, WalkError> {
        if self.cr0 & CR0_PG == 0 {
            return Ok(gva);
        }
        if self.efer & EFER_LMA == 0 || self.cr4 & CR4_PAE == 0 || self.cr4 & CR4_LA57 != 0 {
            return Err(WalkError::UnsupportedMode);
        }
        let sign = (gva as i64) >> 47;
        if sign != 0 && sign != -1 {
            return Err(WalkError::NonCanonical(gva));
        }
        let check_write = write && self.cr0 & CR0_WP != 0;
        let mut table = self.cr3 & ADDR_MASK;
        // The shift of each level's index, from the PML4 down; a leaf at a level maps a page
        // of 1 << shift bytes (large pages at the PDPT and PD levels).
        for shift in [39u32, 30, 21, 12] {
            let index = (gva >> shift) & 0x1ff;
            let entry_addr = table + index * 8;
            let entry: u64 = mem
                .read_obj(GuestAddress(entry_addr))
                .map_err(|_| WalkError::TableOutsideMemory(entry_addr))?;
            if entry & PRESENT == 0 {
                return Err(WalkError::NotPresent(gva));
            }
            if check_write && entry & WRITABLE == 0 {
                return Err(WalkError::ReadOnly(gva));
            }
            if shift == 12 || (shift != 39 && entry & PAGE_SIZE_BIT != 0) {
                let page_mask = (1u64 << shift) - 1;
                return Ok((entry & ADDR_MASK & !page_mask) | (gva & page_mask));
            }
            table = entry & ADDR_MASK;
        }
        Err(WalkError::UnsupportedMode)
    }
}
