//! The guest-physical memory map. One table, so that boot code, devices and the test guest
//! agree on where everything is.

use vm_memory::GuestAddress;

/// The boot GDT (four 8-byte entries).
pub const GDT_ADDR: u64 = 0x500;
/// An empty IDT: the kernel installs its own before enabling interrupts.
pub const IDT_ADDR: u64 = 0x520;
/// PVH `hvm_start_info`, followed by the module list and the memory map.
pub const PVH_INFO_ADDR: u64 = 0x6000;
pub const PVH_MODLIST_ADDR: u64 = 0x6040;
pub const PVH_MEMMAP_ADDR: u64 = 0x6100;
/// Entries that fit between the PVH memory map and the zero page.
pub const PVH_MEMMAP_MAX_ENTRIES: usize = ((ZERO_PAGE_ADDR - PVH_MEMMAP_ADDR) / 24) as usize;
/// The Linux zero page (`struct boot_params`).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer for the 64-bit entry.
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// Identity page tables for the 64-bit entry: PML4, PDPT, PD.
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
pub const PD_ADDR: u64 = 0xb000;
/// The kernel command line and its largest size, NUL included (x86 COMMAND_LINE_SIZE).
pub const CMDLINE_ADDR: u64 = 0x20000;
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Start of the extended BIOS data area; the MP table lives here.
pub const EBDA_START: u64 = 0x9fc00;
pub const MPTABLE_ADDR: u64 = EBDA_START;
/// The ACPI root pointer, where a kernel also finds it by scanning the BIOS area, and the
/// tables after it, up to the end of that area.
pub const ACPI_RSDP_ADDR: u64 = 0xe_0000;
pub const ACPI_TABLES_ADDR: u64 = ACPI_RSDP_ADDR + 0x40;
pub const ACPI_TABLES_END: u64 = HIMEM_START;
/// The I/O port of the ACPI sleep control and status registers (hardware-reduced ACPI).
pub const ACPI_SLEEP_PORT: u16 = 0x600;
/// The legacy I/O ports, where the devices sit and where the DSDT says they are: COM1's
/// eight registers, the i8042's data port and its command port four above, and PCI
/// configuration mechanism #1's address and data ports (eight in all).
pub const COM1_PORTS: Ports = Ports {
    base: 0x3f8,
    len: 8,
};
pub const I8042_PORT: u16 = 0x60;
pub const I8042_COMMAND_PORT: u16 = I8042_PORT + 4;
pub const PCI_CONFIG_PORTS: Ports = Ports {
    base: 0xcf8,
    len: 8,
};

/// A range of I/O ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub base: u16,
    pub len: u8,
}
/// Where high memory (and the kernel) starts.
pub const HIMEM_START: u64 = 0x10_0000;
/// The hole below 4 GiB left for devices; RAM that does not fit below it goes above 4 GiB.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// Under `--enable-pci`: the window the PCI functions' memory BARs are placed in (the
/// first 256 MiB of the gap), and ECAM for PCI bus 0 (32 devices × 8 functions × 4 KiB).
pub const PCI_BAR_WINDOW_START: u64 = MMIO_GAP_START;
pub const PCI_BAR_WINDOW_SIZE: u64 = 0x1000_0000;
pub const PCI_ECAM_START: u64 = 0xe000_0000;
pub const PCI_ECAM_SIZE: u64 = 0x10_0000;
/// virtio-mmio devices, one 4 KiB window each, from here upwards.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// The in-kernel IOAPIC and local APIC.
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// Three pages KVM needs for its real-mode TSS, inside the MMIO gap.
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
/// Legacy IRQs: COM1 and the i8042 keyboard; virtio devices take the lines after them.
pub const SERIAL_IRQ: u32 = 4;
pub const I8042_IRQ: u32 = 1;
/// The i8042's auxiliary (mouse) port, ISA IRQ 12. A virtio-mmio device may share the line
/// (both are edge-triggered and Linux requests both as shared); only Linux's probe of the
/// empty port ever raises it.
pub const I8042_AUX_IRQ: u32 = 12;
pub const FIRST_VIRTIO_IRQ: u32 = 5;
pub const LAST_VIRTIO_IRQ: u32 = 23;
/// IOAPIC pins, as the MP table announces them.
pub const IOAPIC_PINS: u8 = 24;

// The fixed low-memory areas must not overlap; checked when the crate compiles.
const _: () = {
    assert!(PVH_MEMMAP_ADDR + 24 * PVH_MEMMAP_MAX_ENTRIES as u64 <= ZERO_PAGE_ADDR);
    assert!(ZERO_PAGE_ADDR + 4096 <= BOOT_STACK_TOP);
    assert!(PD_ADDR + 4096 <= CMDLINE_ADDR);
    assert!(CMDLINE_ADDR + CMDLINE_MAX_SIZE as u64 <= EBDA_START);
    assert!(MPTABLE_ADDR + 1024 <= ACPI_RSDP_ADDR);
    assert!(PCI_BAR_WINDOW_START + PCI_BAR_WINDOW_SIZE <= VIRTIO_MMIO_BASE);
    assert!(VIRTIO_MMIO_BASE + 32 * VIRTIO_MMIO_SIZE <= PCI_ECAM_START);
    assert!(PCI_ECAM_START + PCI_ECAM_SIZE <= IOAPIC_ADDR as u64);
};

/// The guest RAM regions for `mem_bytes` of memory: below the MMIO gap first, the rest
/// above 4 GiB.
pub fn ram_regions(mem_bytes: u64) -> Vec<(GuestAddress, u64)> {
    let low = mem_bytes.min(MMIO_GAP_START);
    let mut regions = vec![(GuestAddress(0), low)];
    if mem_bytes > MMIO_GAP_START {
        regions.push((GuestAddress(MMIO_GAP_END), mem_bytes - MMIO_GAP_START));
    }
    regions
}

/// The guest-physical address of the `index`th virtio-mmio window.
pub fn virtio_mmio_addr(index: u32) -> u64 {
    VIRTIO_MMIO_BASE + u64::from(index) * VIRTIO_MMIO_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_guest_is_one_region() {
        assert_eq!(ram_regions(128 << 20), vec![(GuestAddress(0), 128 << 20)]);
    }

    #[test]
    fn large_guest_straddles_the_gap() {
        let r = ram_regions(4096 << 20);
        assert_eq!(r[0], (GuestAddress(0), MMIO_GAP_START));
        assert_eq!(
            r[1],
            (GuestAddress(MMIO_GAP_END), (4096 << 20) - MMIO_GAP_START)
        );
    }

    #[test]
    fn the_last_virtio_window_is_below_the_ioapic() {
        assert!(virtio_mmio_addr(LAST_VIRTIO_IRQ - FIRST_VIRTIO_IRQ) < u64::from(IOAPIC_ADDR));
    }
}
