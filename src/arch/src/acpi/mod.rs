//! ACPI tables, written below 1 MiB at boot next to the MP table: RSDP → XSDT → FADT (→ DSDT)
//! and MADT. A kernel with ACPI finds its CPUs, interrupt controller, legacy devices and
//! virtio-mmio devices there (a stock distribution kernel needs that: it reads no
//! `virtio_mmio.device=` words), and powers the VM off through the FADT's sleep control
//! register. Kernels without ACPI keep using the MP table. The tables live in guest memory,
//! so a snapshot keeps them.

pub mod aml;
mod dsdt;
mod tables;

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

use crate::layout::{ACPI_RSDP_ADDR, ACPI_TABLES_ADDR, ACPI_TABLES_END};
pub use dsdt::S5_SLEEP_TYPE;

/// A virtio-mmio device as the DSDT describes it: its window and its interrupt line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioMmio {
    pub addr: u64,
    pub len: u64,
    pub gsi: u32,
}

/// The PCI root bus under `--enable-pci`: its ECAM window (for the MCFG table) and the
/// window its functions' BARs are placed in (for the host bridge in the DSDT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciBus {
    pub ecam: u64,
    pub ecam_len: u64,
    pub window: u64,
    pub window_len: u64,
}

/// What the tables describe.
#[derive(Debug)]
pub struct Machine<'a> {
    pub cpus: u8,
    pub virtio_mmio: &'a [VirtioMmio],
    pub pci: Option<PciBus>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the ACPI tables take {0} bytes, more than the {ACPI_TABLES_ADDR:#x}-{ACPI_TABLES_END:#x} area")]
    TooLarge(u64),
    #[error("cannot write the ACPI tables into guest memory: {0}")]
    GuestMemory(#[from] GuestMemoryError),
}

/// The tables and the addresses they go to, RSDP last.
pub fn build(machine: &Machine) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    let mut placed = Vec::new();
    let mut next = ACPI_TABLES_ADDR;
    let mut place = |bytes: Vec<u8>| -> Result<u64, Error> {
        let addr = next;
        next = (addr + bytes.len() as u64).next_multiple_of(8);
        if next > ACPI_TABLES_END {
            return Err(Error::TooLarge(next - ACPI_TABLES_ADDR));
        }
        placed.push((addr, bytes));
        Ok(addr)
    };
    let pci = machine.pci.as_ref();
    let dsdt = dsdt::body(machine.virtio_mmio, pci);
    let dsdt = place(tables::sdt(b"DSDT", 2, b"EMBERDSD", &dsdt))?;
    let mut listed = vec![
        place(tables::fadt(dsdt))?,
        place(tables::madt(machine.cpus))?,
    ];
    if let Some(pci) = pci {
        listed.push(place(tables::mcfg(pci.ecam, pci.ecam_len))?);
    }
    let xsdt = place(tables::xsdt(&listed))?;
    placed.push((ACPI_RSDP_ADDR, tables::rsdp(xsdt)));
    Ok(placed)
}

/// Writes the tables; returns the RSDP's address, for the boot information.
pub fn write<M: GuestMemory>(mem: &M, machine: &Machine) -> Result<u64, Error> {
    for (addr, bytes) in build(machine)? {
        mem.write_slice(&bytes, GuestAddress(addr))?;
    }
    Ok(ACPI_RSDP_ADDR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::byte_sum;

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn the_rsdp_leads_through_the_xsdt_to_every_table() {
        let devs: Vec<VirtioMmio> = (0..19)
            .map(|i| VirtioMmio {
                addr: 0xd000_0000 + 0x1000 * i,
                len: 0x1000,
                gsi: 5 + i as u32,
            })
            .collect();
        let pci = PciBus {
            ecam: 0xe000_0000,
            ecam_len: 0x10_0000,
            window: 0xc000_0000,
            window_len: 0x1000_0000,
        };
        walk(&devs, None, &[b"FACP", b"APIC"]);
        walk(&[], Some(pci), &[b"FACP", b"APIC", b"MCFG"]);
    }

    fn walk(devs: &[VirtioMmio], pci: Option<PciBus>, expected: &[&[u8; 4]]) {
        let placed = build(&Machine {
            cpus: 32,
            virtio_mmio: devs,
            pci,
        })
        .unwrap();
        let at = |addr: u64| {
            placed
                .iter()
                .find(|(a, _)| *a == addr)
                .map(|(_, b)| b)
                .unwrap()
        };
        let rsdp = at(ACPI_RSDP_ADDR);
        let xsdt = at(u64_at(rsdp, 24));
        assert_eq!(&xsdt[..4], b"XSDT");
        let mut seen = Vec::new();
        for i in 0..(xsdt.len() - 36) / 8 {
            let table = at(u64_at(xsdt, 36 + 8 * i));
            assert_eq!(byte_sum(table), 0);
            seen.push(table[..4].to_vec());
            if &table[..4] == b"FACP" {
                let dsdt = at(u64_at(table, 140));
                assert_eq!(&dsdt[..4], b"DSDT");
                assert_eq!(byte_sum(dsdt), 0);
            }
        }
        let expected: Vec<Vec<u8>> = expected.iter().map(|s| s.to_vec()).collect();
        assert_eq!(seen, expected);
        // Nothing overlaps, and all of it is below 1 MiB.
        let mut spans: Vec<(u64, u64)> = placed
            .iter()
            .map(|(a, b)| (*a, a + b.len() as u64))
            .collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        assert!(spans.last().unwrap().1 <= ACPI_TABLES_END);
    }
}
