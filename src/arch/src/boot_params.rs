//! What the kernel is told at entry: the e820 memory map, and the two ways of handing it over
//! (the Linux zero page for the 64-bit entry, `hvm_start_info` for PVH).

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
// PVH's memory map types are e820's, so one map serves both protocols.
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_MEMMAP_TYPE_RAM as E820_RAM,
    XEN_HVM_MEMMAP_TYPE_RESERVED as E820_RESERVED, XEN_HVM_START_MAGIC_VALUE,
};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::layout::{
    CMDLINE_ADDR, EBDA_START, HIMEM_START, PVH_INFO_ADDR, PVH_MEMMAP_ADDR, PVH_MEMMAP_MAX_ENTRIES,
    PVH_MODLIST_ADDR, ZERO_PAGE_ADDR,
};

/// "HdrS", the boot protocol header magic.
const HDRS_MAGIC: u32 = 0x5372_6448;
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `type_of_loader` for a boot loader without an assigned ID.
const LOADER_UNDEFINED: u8 = 0xff;
const KERNEL_ALIGNMENT: u32 = 0x0100_0000;

/// One e820 entry: `[addr, addr + size)` of type `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// Errors while writing the boot information.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the memory map has {0} entries, more than the boot protocol can carry")]
    TooManyE820Entries(usize),
    #[error("cannot write the boot information into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// Where the initrd was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitrdPlacement {
    pub addr: u64,
    pub size: u64,
}

/// The e820 map for the given RAM regions: low memory up to the EBDA, the EBDA and BIOS area
/// reserved (the MP table lives there), then every RAM region from 1 MiB on and the
/// `reserved` ranges (PCI's ECAM window, which a kernel checks before it trusts the MCFG
/// table), in address order.
pub fn e820_map(ram: &[(GuestAddress, u64)], reserved: &[(u64, u64)]) -> Vec<E820Entry> {
    let mut map = vec![
        E820Entry {
            addr: 0,
            size: EBDA_START,
            kind: E820_RAM,
        },
        E820Entry {
            addr: EBDA_START,
            size: HIMEM_START - EBDA_START,
            kind: E820_RESERVED,
        },
    ];
    for &(start, size) in ram {
        let begin = start.0.max(HIMEM_START);
        let end = start.0 + size;
        if end > begin {
            map.push(E820Entry {
                addr: begin,
                size: end - begin,
                kind: E820_RAM,
            });
        }
    }
    for &(addr, size) in reserved {
        map.push(E820Entry {
            addr,
            size,
            kind: E820_RESERVED,
        });
    }
    map.sort_by_key(|e| e.addr);
    map
}

/// Builds the zero page for the 64-bit Linux entry. `header` is the bzImage's setup header
/// (absent for an ELF vmlinux); `rsdp` is the ACPI root pointer's address.
pub fn zero_page(
    header: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<InitrdPlacement>,
    e820: &[E820Entry],
    rsdp: u64,
) -> Result<boot_params, Error> {
    let mut params = boot_params::default();
    if let Some(hdr) = header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = LOADER_UNDEFINED;
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.header = HDRS_MAGIC;
    params.hdr.kernel_alignment = KERNEL_ALIGNMENT;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = u32::try_from(cmdline_len).unwrap_or(u32::MAX);
    params.acpi_rsdp_addr = rsdp;
    if let Some(initrd) = initrd {
        params.hdr.ramdisk_image = initrd.addr as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
        params.ext_ramdisk_image = (initrd.addr >> 32) as u32;
        params.ext_ramdisk_size = (initrd.size >> 32) as u32;
    }
    if e820.len() > params.e820_table.len() {
        return Err(Error::TooManyE820Entries(e820.len()));
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(e820) {
        *slot = boot_e820_entry {
            addr: entry.addr,
            size: entry.size,
            r#type: entry.kind,
        };
    }
    params.e820_entries = e820.len() as u8;
    Ok(params)
}

/// Writes the zero page at its fixed address.
pub fn write_zero_page<M: GuestMemory>(mem: &M, params: &boot_params) -> Result<(), Error> {
    mem.write_obj(*params, GuestAddress(ZERO_PAGE_ADDR))?;
    Ok(())
}

/// Writes `hvm_start_info`, its module list (the initrd) and memory map for the PVH entry,
/// with the ACPI root pointer's address `rsdp`.
pub fn write_pvh_info<M: GuestMemory>(
    mem: &M,
    initrd: Option<InitrdPlacement>,
    e820: &[E820Entry],
    rsdp: u64,
) -> Result<(), Error> {
    if e820.len() > PVH_MEMMAP_MAX_ENTRIES {
        return Err(Error::TooManyE820Entries(e820.len()));
    }
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        cmdline_paddr: CMDLINE_ADDR,
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: e820.len() as u32,
        rsdp_paddr: rsdp,
        ..Default::default()
    };
    for (i, entry) in e820.iter().enumerate() {
        let item = hvm_memmap_table_entry {
            addr: entry.addr,
            size: entry.size,
            type_: entry.kind,
            reserved: 0,
        };
        mem.write_obj(item, GuestAddress(PVH_MEMMAP_ADDR + 24 * i as u64))?;
    }
    if let Some(initrd) = initrd {
        let module = hvm_modlist_entry {
            paddr: initrd.addr,
            size: initrd.size,
            ..Default::default()
        };
        mem.write_obj(module, GuestAddress(PVH_MODLIST_ADDR))?;
        info.nr_modules = 1;
        info.modlist_paddr = PVH_MODLIST_ADDR;
    }
    mem.write_obj(info, GuestAddress(PVH_INFO_ADDR))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ram_regions;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn reserved_ranges_sit_in_address_order() {
        let ecam = (0xe000_0000, 0x10_0000);
        let map = e820_map(&ram_regions(4096 << 20), &[ecam]);
        let addrs: Vec<u64> = map.iter().map(|e| e.addr).collect();
        assert_eq!(addrs, [0, EBDA_START, HIMEM_START, 0xe000_0000, 1 << 32]);
        assert_eq!(map[3].kind, E820_RESERVED);
        assert_eq!(map[3].size, 0x10_0000);
    }

    #[test]
    fn e820_covers_both_sides_of_the_gap() {
        let map = e820_map(&ram_regions(4096 << 20), &[]);
        let ram: u64 = map
            .iter()
            .filter(|e| e.kind == E820_RAM)
            .map(|e| e.size)
            .sum();
        assert_eq!(ram, (4096 << 20) - HIMEM_START + EBDA_START);
        assert_eq!(map.last().unwrap().addr, 1 << 32);
        assert_eq!(
            map[1],
            E820Entry {
                addr: EBDA_START,
                size: 0x60400,
                kind: E820_RESERVED
            }
        );
    }

    #[test]
    fn zero_page_fields_sit_where_the_boot_protocol_says() {
        let e820 = e820_map(&ram_regions(128 << 20), &[]);
        let initrd = InitrdPlacement {
            addr: 0x7000_0000,
            size: 0x1234,
        };
        let params = zero_page(None, 42, Some(initrd), &e820, 0xe0000).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_zero_page(&mem, &params).unwrap();
        let base = ZERO_PAGE_ADDR;
        let u32_at = |off: u64| mem.read_obj::<u32>(GuestAddress(base + off)).unwrap();
        assert_eq!(mem.read_obj::<u8>(GuestAddress(base + 0x1e8)).unwrap(), 3);
        assert_eq!(u32_at(0x202), HDRS_MAGIC);
        assert_eq!(
            mem.read_obj::<u16>(GuestAddress(base + 0x1fe)).unwrap(),
            0xaa55
        );
        assert_eq!(u32_at(0x228), CMDLINE_ADDR as u32);
        assert_eq!(u32_at(0x218), 0x7000_0000);
        assert_eq!(u32_at(0x21c), 0x1234);
        let rsdp = mem.read_obj::<u64>(GuestAddress(base + 0x70)).unwrap();
        assert_eq!(rsdp, 0xe0000, "acpi_rsdp_addr");
        // The third e820 entry (20 bytes each from 0x2d0): RAM from 1 MiB to 128 MiB.
        let third = base + 0x2d0 + 2 * 20;
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(third)).unwrap(),
            HIMEM_START
        );
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(third + 8)).unwrap(),
            (128 << 20) - HIMEM_START
        );
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(third + 16)).unwrap(),
            E820_RAM
        );
    }

    #[test]
    fn pvh_info_lists_memory_and_initrd() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let e820 = e820_map(&ram_regions(128 << 20), &[]);
        let initrd = InitrdPlacement {
            addr: 0x10_0000,
            size: 77,
        };
        write_pvh_info(&mem, Some(initrd), &e820, 0xe0000).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(PVH_INFO_ADDR)).unwrap();
        assert_eq!(info.magic, XEN_HVM_START_MAGIC_VALUE);
        assert_eq!(info.memmap_entries, 3);
        assert_eq!(info.nr_modules, 1);
        assert_eq!(info.rsdp_paddr, 0xe0000);
        let module: hvm_modlist_entry = mem.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!((module.paddr, module.size), (0x10_0000, 77));
    }

    #[test]
    fn too_many_entries_is_an_error() {
        let e820 = vec![
            E820Entry {
                addr: 0,
                size: 1,
                kind: E820_RAM
            };
            200
        ];
        assert!(matches!(
            zero_page(None, 1, None, &e820, 0),
            Err(Error::TooManyE820Entries(200))
        ));
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        assert!(write_pvh_info(&mem, None, &e820, 0).is_err());
    }
}
