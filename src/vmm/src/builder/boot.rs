//! What the guest finds in memory at boot: the kernel and initrd, the command line, the boot
//! information of its entry protocol, the MP table, the ACPI tables and the early GDT and IDT.

use std::path::Path;

use arch::boot_params::{self, InitrdPlacement};
use arch::layout::{self, CMDLINE_ADDR, CMDLINE_MAX_SIZE};
use arch::{BootProtocol, KernelEntry};
use vm_memory::{Bytes, GuestAddress};

use super::BuildError;
use crate::memory::GuestMemory;

pub(super) fn load_kernel(mem: &GuestMemory, path: &str) -> Result<KernelEntry, BuildError> {
    let mut file = open(path, "kernel image")?;
    Ok(arch::loader::load_kernel(mem, &mut file)?)
}

fn open(path: &str, what: &'static str) -> Result<std::fs::File, BuildError> {
    hostfile::open(Path::new(path), hostfile::Kind::Regular, false).map_err(|source| {
        BuildError::Open {
            what,
            path: path.to_string(),
            source,
        }
    })
}

/// Loads the initrd below `low_ram_end`, where the kernel can reach it.
pub(super) fn load_initrd(
    mem: &GuestMemory,
    path: &str,
    kernel: &KernelEntry,
    low_ram_end: u64,
) -> Result<InitrdPlacement, BuildError> {
    let mut file = open(path, "initrd")?;
    Ok(arch::loader::load_initrd(
        mem,
        &mut file,
        kernel,
        low_ram_end,
    )?)
}

pub(super) fn write_cmdline(mem: &GuestMemory, cmdline: &str) -> Result<(), BuildError> {
    if cmdline.len() + 1 > CMDLINE_MAX_SIZE {
        return Err(BuildError::CmdlineTooLong { len: cmdline.len() });
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))?;
    Ok(())
}

/// What the boot information and tables describe besides the kernel.
pub(super) struct Machine<'a> {
    pub vcpus: u8,
    pub mem_bytes: u64,
    pub cmdline_size: usize,
    pub virtio_mmio: &'a [arch::acpi::VirtioMmio],
    /// `--enable-pci`: the PCI root bus is there.
    pub pci: bool,
}

pub(super) fn write_boot_info(
    mem: &GuestMemory,
    kernel: &KernelEntry,
    initrd: Option<InitrdPlacement>,
    machine: &Machine,
) -> Result<(), BuildError> {
    let pci = machine.pci.then_some(arch::acpi::PciBus {
        ecam: layout::PCI_ECAM_START,
        ecam_len: layout::PCI_ECAM_SIZE,
        window: layout::PCI_BAR_WINDOW_START,
        window_len: layout::PCI_BAR_WINDOW_SIZE,
    });
    let reserved: &[(u64, u64)] = match pci {
        Some(p) => &[(p.ecam, p.ecam_len)],
        None => &[],
    };
    let e820 = boot_params::e820_map(&layout::ram_regions(machine.mem_bytes), reserved);
    arch::mptable::write(mem, machine.vcpus)?;
    let acpi = arch::acpi::Machine {
        cpus: machine.vcpus,
        virtio_mmio: machine.virtio_mmio,
        pci,
    };
    let rsdp = arch::acpi::write(mem, &acpi)?;
    match kernel.protocol {
        BootProtocol::Linux64 => {
            let params = boot_params::zero_page(
                kernel.setup_header,
                machine.cmdline_size,
                initrd,
                &e820,
                rsdp,
            )?;
            boot_params::write_zero_page(mem, &params)?;
        }
        BootProtocol::Pvh => boot_params::write_pvh_info(mem, initrd, &e820, rsdp)?,
    }
    let gdt = arch::gdt::table(kernel.protocol == BootProtocol::Linux64);
    for (i, entry) in gdt.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(layout::GDT_ADDR + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(layout::IDT_ADDR))?;
    Ok(())
}
