//! Identity page tables for the 64-bit Linux entry, which starts with paging on: the first
//! GiB mapped with 2 MiB pages covers the kernel, the zero page and the command line.

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

use crate::layout::{PDPT_ADDR, PD_ADDR, PML4_ADDR};

const PRESENT_WRITABLE: u64 = 0x3;
const HUGE_PAGE: u64 = 0x80;
const TWO_MIB: u64 = 2 << 20;

/// The 512 page-directory entries that map `[0, 1 GiB)` one to one.
pub fn identity_pd() -> Vec<u64> {
    (0..512u64)
        .map(|i| (i * TWO_MIB) | PRESENT_WRITABLE | HUGE_PAGE)
        .collect()
}

/// Writes PML4 → PDPT → PD and returns the value for CR3.
pub fn write_identity_tables<M: GuestMemory>(mem: &M) -> Result<u64, GuestMemoryError> {
    mem.write_obj(PDPT_ADDR | PRESENT_WRITABLE, GuestAddress(PML4_ADDR))?;
    mem.write_obj(PD_ADDR | PRESENT_WRITABLE, GuestAddress(PDPT_ADDR))?;
    for (i, pde) in identity_pd().into_iter().enumerate() {
        mem.write_obj(pde, GuestAddress(PD_ADDR + 8 * i as u64))?;
    }
    Ok(PML4_ADDR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    /// Walks the tables as the MMU would for a virtual address below 1 GiB.
    fn translate(mem: &GuestMemoryMmap, cr3: u64, va: u64) -> u64 {
        let read = |addr: u64| mem.read_obj::<u64>(GuestAddress(addr)).unwrap();
        let pml4e = read(cr3 + 8 * ((va >> 39) & 511));
        let pdpte = read((pml4e & !0xfff) + 8 * ((va >> 30) & 511));
        let pde = read((pdpte & !0xfff) + 8 * ((va >> 21) & 511));
        assert_eq!(pde & HUGE_PAGE, HUGE_PAGE);
        (pde & !0x1f_ffff & !HUGE_PAGE & !PRESENT_WRITABLE) | (va & 0x1f_ffff)
    }

    #[test]
    fn first_gib_is_identity_mapped() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let cr3 = write_identity_tables(&mem).unwrap();
        for va in [0u64, 0x7000, 0x100_0000, 0x3fff_ffff, 0x1234_5678] {
            assert_eq!(translate(&mem, cr3, va), va);
        }
    }
}
