//! The Intel MultiProcessor table (spec 1.4): how a kernel without ACPI finds every CPU, the
//! IOAPIC and the routing of the 24 interrupt lines. Serialised by hand, byte by byte, so the
//! layout is explicit and no `unsafe` is needed.

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

use crate::checksum::checksum;
use crate::layout::{IOAPIC_ADDR, IOAPIC_PINS, LAPIC_ADDR, MPTABLE_ADDR};

/// Most vCPUs Ember runs; the whole table then still fits in the 1 KiB EBDA.
pub const MAX_CPUS: u8 = 32;

/// The first byte of each configuration-table entry: what the entry describes.
enum Entry {
    Processor = 0,
    Bus = 1,
    Ioapic = 2,
    IoInterrupt = 3,
    LocalInterrupt = 4,
}

/// A processor entry's flags.
const CPU_ENABLED: u8 = 1;
const CPU_BOOT_PROCESSOR: u8 = 2;

/// The kind of an interrupt assignment entry.
enum Interrupt {
    Vectored = 0,
    Nmi = 1,
    ExtInt = 3,
}

const SPEC_REV: u8 = 4;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const ISA_BUS_ID: u8 = 0;
const FLOATING_POINTER_LEN: usize = 16;
const HEADER_LEN: usize = 44;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the MP table supports 1 to {MAX_CPUS} vCPUs, not {0}")]
    CpuCount(u8),
    #[error("cannot write the MP table into guest memory: {0}")]
    GuestMemory(#[from] GuestMemoryError),
}

/// The floating pointer and configuration table for `cpus` vCPUs, to be placed at `addr`.
pub fn build(cpus: u8, addr: u64) -> Result<Vec<u8>, Error> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(Error::CpuCount(cpus));
    }
    let ioapic_id = cpus;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..cpus {
        let flags = CPU_ENABLED | if cpu == 0 { CPU_BOOT_PROCESSOR } else { 0 };
        entries.extend_from_slice(&[Entry::Processor as u8, cpu, APIC_VERSION, flags]);
        // CPU signature (family 6) and feature flags (FPU, APIC), then 8 reserved bytes.
        entries.extend_from_slice(&0x600u32.to_le_bytes());
        entries.extend_from_slice(&0x201u32.to_le_bytes());
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[Entry::Bus as u8, ISA_BUS_ID]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[Entry::Ioapic as u8, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    count += 1;
    // Every IOAPIC pin is an ordinary vectored interrupt, ISA IRQ n on pin n, as KVM's
    // default routing wires them. The 8259's ExtINT reaches the CPUs through LINT0 only (the
    // local entry below): an IOAPIC pin listed as ExtINT makes Linux believe the 8259 is
    // cascaded through that pin, so IRQ 0 (the timer) has no IOAPIC pin of its own and
    // `setup_IO_APIC` oopses on a hardware-virtualisation host.
    for pin in 0..IOAPIC_PINS {
        entries.extend_from_slice(&[
            Entry::IoInterrupt as u8,
            Interrupt::Vectored as u8,
            0,
            0,
            ISA_BUS_ID,
            pin,
            ioapic_id,
            pin,
        ]);
        count += 1;
    }
    for (kind, lint) in [(Interrupt::ExtInt as u8, 0u8), (Interrupt::Nmi as u8, 1u8)] {
        entries.extend_from_slice(&[
            Entry::LocalInterrupt as u8,
            kind,
            0,
            0,
            ISA_BUS_ID,
            0,
            0xff,
            lint,
        ]);
        count += 1;
    }

    let table_addr = addr + FLOATING_POINTER_LEN as u64;
    let table_len = (HEADER_LEN + entries.len()) as u16;
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(b"PCMP");
    header.extend_from_slice(&table_len.to_le_bytes());
    header.extend_from_slice(&[SPEC_REV, 0]);
    header.extend_from_slice(b"EMBER   ");
    header.extend_from_slice(b"EMBER-VM    ");
    header.extend_from_slice(&[0; 6]); // OEM table pointer and size
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&LAPIC_ADDR.to_le_bytes());
    header.extend_from_slice(&[0; 4]); // extended table length, checksum, reserved
    let mut table = header;
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut floating = Vec::with_capacity(FLOATING_POINTER_LEN);
    floating.extend_from_slice(b"_MP_");
    floating.extend_from_slice(&(table_addr as u32).to_le_bytes());
    floating.extend_from_slice(&[1, SPEC_REV, 0, 0, 0, 0, 0, 0]);
    floating[10] = checksum(&floating);

    floating.extend_from_slice(&table);
    Ok(floating)
}

/// Writes the MP table into the EBDA.
pub fn write<M: GuestMemory>(mem: &M, cpus: u8) -> Result<(), Error> {
    let bytes = build(cpus, MPTABLE_ADDR)?;
    mem.write_slice(&bytes, GuestAddress(MPTABLE_ADDR))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::byte_sum;

    #[test]
    fn checksums_are_zero() {
        for cpus in [1, 2, 4, MAX_CPUS] {
            let bytes = build(cpus, MPTABLE_ADDR).unwrap();
            assert_eq!(byte_sum(&bytes[..16]), 0, "floating pointer, {cpus} cpus");
            let len = u16::from_le_bytes([bytes[20], bytes[21]]) as usize;
            assert_eq!(
                byte_sum(&bytes[16..16 + len]),
                0,
                "config table, {cpus} cpus"
            );
            assert_eq!(bytes.len(), 16 + len);
        }
    }

    #[test]
    fn lists_one_processor_entry_per_cpu_with_the_bsp_first() {
        let bytes = build(4, MPTABLE_ADDR).unwrap();
        let pointer = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        assert_eq!(u64::from(pointer), MPTABLE_ADDR + 16);
        let entries = &bytes[16 + HEADER_LEN..];
        for cpu in 0..4 {
            let e = &entries[cpu * 20..cpu * 20 + 20];
            assert_eq!((e[0], e[1]), (Entry::Processor as u8, cpu as u8));
            assert_eq!(e[3] & CPU_BOOT_PROCESSOR != 0, cpu == 0);
        }
        assert_eq!(entries[80], Entry::Bus as u8);
    }

    #[test]
    fn every_ioapic_pin_is_vectored_and_extint_is_on_lint0_only() {
        let cpus = 2;
        let bytes = build(cpus, MPTABLE_ADDR).unwrap();
        // Processors (20 bytes each), the bus (8) and the IOAPIC (8), then 8-byte entries.
        let first = 16 + HEADER_LEN + 20 * usize::from(cpus) + 16;
        let entries: Vec<&[u8]> = bytes[first..].chunks(8).collect();
        let io: Vec<_> = entries
            .iter()
            .filter(|e| e[0] == Entry::IoInterrupt as u8)
            .collect();
        assert_eq!(io.len(), usize::from(IOAPIC_PINS));
        for (pin, e) in io.iter().enumerate() {
            assert_eq!(e[1], Interrupt::Vectored as u8, "pin {pin}");
            assert_eq!(
                (e[5], e[7]),
                (pin as u8, pin as u8),
                "ISA IRQ {pin} on pin {pin}"
            );
        }
        let local: Vec<_> = entries
            .iter()
            .filter(|e| e[0] == Entry::LocalInterrupt as u8)
            .collect();
        assert_eq!(local.len(), 2);
        assert_eq!((local[0][1], local[0][7]), (Interrupt::ExtInt as u8, 0));
        assert_eq!((local[1][1], local[1][7]), (Interrupt::Nmi as u8, 1));
    }

    #[test]
    fn largest_table_fits_in_the_ebda() {
        assert!(build(MAX_CPUS, MPTABLE_ADDR).unwrap().len() <= 1024);
    }

    #[test]
    fn rejects_bad_cpu_counts() {
        assert!(matches!(build(0, MPTABLE_ADDR), Err(Error::CpuCount(0))));
        assert!(matches!(build(33, MPTABLE_ADDR), Err(Error::CpuCount(33))));
    }
}
