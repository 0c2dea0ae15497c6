//! The fixed-layout ACPI tables (ACPI 6.5, chapter 5.2): RSDP, XSDT, FADT and MADT, and the
//! header every system description table starts with. Serialised field by field, like the
//! MP table, so the layout is explicit and no `unsafe` is needed.

use crate::checksum::checksum;
use crate::layout::{ACPI_SLEEP_PORT, IOAPIC_ADDR, LAPIC_ADDR};

const OEM_ID: &[u8; 6] = b"EMBER ";
const CREATOR_ID: &[u8; 4] = b"EMBR";
const HEADER_LEN: usize = 36;

/// A system description table: the 36-byte header, then `body`; the checksum is set.
pub fn sdt(signature: &[u8; 4], revision: u8, table_id: &[u8; 8], body: &[u8]) -> Vec<u8> {
    let len = (HEADER_LEN + body.len()) as u32;
    let mut t = Vec::with_capacity(len as usize);
    t.extend_from_slice(signature);
    t.extend_from_slice(&len.to_le_bytes());
    t.extend_from_slice(&[revision, 0]);
    t.extend_from_slice(OEM_ID);
    t.extend_from_slice(table_id);
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(CREATOR_ID);
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t.extend_from_slice(body);
    t[9] = checksum(&t);
    t
}

/// The root pointer (revision 2, 36 bytes) to the XSDT at `xsdt`.
pub fn rsdp(xsdt: u64) -> Vec<u8> {
    let mut r = Vec::with_capacity(36);
    r.extend_from_slice(b"RSD PTR ");
    r.push(0); // checksum of the first 20 bytes
    r.extend_from_slice(OEM_ID);
    r.push(2);
    r.extend_from_slice(&0u32.to_le_bytes()); // no RSDT
    r.extend_from_slice(&36u32.to_le_bytes());
    r.extend_from_slice(&xsdt.to_le_bytes());
    r.extend_from_slice(&[0; 4]); // extended checksum, reserved
    r[8] = checksum(&r[..20]);
    r[32] = checksum(&r);
    r
}

pub fn xsdt(tables: &[u64]) -> Vec<u8> {
    let body: Vec<u8> = tables.iter().flat_map(|a| a.to_le_bytes()).collect();
    sdt(b"XSDT", 1, b"EMBERXSD", &body)
}

/// A Generic Address Structure for a byte-wide I/O port.
fn io_port(port: u16) -> [u8; 12] {
    let mut g = [0u8; 12];
    g[..4].copy_from_slice(&[1, 8, 0, 1]); // system I/O, 8 bits, offset 0, byte access
    g[4..6].copy_from_slice(&port.to_le_bytes());
    g
}

// FADT flags (ACPI 5.2.9, table 5.10) and IA-PC boot architecture flags (table 5.11).
const FLAG_PWR_BUTTON: u32 = 1 << 4;
const FLAG_SLP_BUTTON: u32 = 1 << 5;
const FLAG_RESET_REG_SUP: u32 = 1 << 10;
const FLAG_HW_REDUCED_ACPI: u32 = 1 << 20;
const BOOT_8042: u16 = 1 << 1;
const BOOT_VGA_NOT_PRESENT: u16 = 1 << 2;
const BOOT_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;
/// The i8042's command port and the command that pulses the reset line.
const RESET_PORT: u16 = 0x64;
const RESET_VALUE: u8 = 0xfe;
pub const FADT_LEN: usize = 276;

/// The FADT (revision 6.5) of a hardware-reduced machine pointing at the DSDT at `dsdt`: no
/// fixed power or sleep button, no PM timer or GPE blocks; the sleep control and status
/// registers are one I/O port ([`ACPI_SLEEP_PORT`]), where writing SLP_EN with the S5
/// sleep type powers the VM off; the reset register is the i8042's reset command.
pub fn fadt(dsdt: u64) -> Vec<u8> {
    let mut b = vec![0u8; FADT_LEN - HEADER_LEN];
    // Offsets below are the table's, less the header's 36 bytes.
    let at = |off: usize| off - HEADER_LEN;
    let boot_arch = BOOT_8042 | BOOT_VGA_NOT_PRESENT | BOOT_CMOS_RTC_NOT_PRESENT;
    b[at(109)..at(111)].copy_from_slice(&boot_arch.to_le_bytes());
    let flags = FLAG_PWR_BUTTON | FLAG_SLP_BUTTON | FLAG_RESET_REG_SUP | FLAG_HW_REDUCED_ACPI;
    b[at(112)..at(116)].copy_from_slice(&flags.to_le_bytes());
    b[at(116)..at(128)].copy_from_slice(&io_port(RESET_PORT));
    b[at(128)] = RESET_VALUE;
    b[at(131)] = 5; // minor version: 6.5
    b[at(140)..at(148)].copy_from_slice(&dsdt.to_le_bytes());
    b[at(244)..at(256)].copy_from_slice(&io_port(ACPI_SLEEP_PORT));
    b[at(256)..at(268)].copy_from_slice(&io_port(ACPI_SLEEP_PORT));
    b[at(268)..at(276)].copy_from_slice(b"EMBERVMM");
    sdt(b"FACP", 6, b"EMBERFAC", &b)
}

/// The MADT: the local APIC of each of `cpus` vCPUs (APIC ID = index) and the IOAPIC, with
/// ID `cpus` as in the MP table, its pins from GSI 0 (ISA IRQ n is GSI n: no overrides).
pub fn madt(cpus: u8) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&LAPIC_ADDR.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // flags: no 8259 pair to mask
    for cpu in 0..cpus {
        b.extend_from_slice(&[0, 8, cpu, cpu]);
        b.extend_from_slice(&1u32.to_le_bytes()); // enabled
    }
    b.extend_from_slice(&[1, 12, cpus, 0]);
    b.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    sdt(b"APIC", 5, b"EMBERAPI", &b)
}

/// The MCFG: one ECAM window, for segment 0, covering the buses that fit in `len` (1 MiB
/// each).
pub fn mcfg(ecam: u64, len: u64) -> Vec<u8> {
    let last_bus = (len >> 20).saturating_sub(1).min(255) as u8;
    let mut body = vec![0u8; 8];
    body.extend_from_slice(&ecam.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&[0, last_bus]);
    body.extend_from_slice(&[0; 4]);
    sdt(b"MCFG", 1, b"EMBERMCF", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::byte_sum;

    #[test]
    fn the_mcfg_names_one_ecam_window_for_bus_0() {
        let t = mcfg(0xe000_0000, 0x10_0000);
        assert_eq!(t.len(), 36 + 8 + 16);
        assert_eq!(
            u64::from_le_bytes(t[44..52].try_into().unwrap()),
            0xe000_0000
        );
        assert_eq!(&t[52..56], &[0, 0, 0, 0], "segment 0, buses 0 to 0");
    }

    #[test]
    fn every_table_checksums_to_zero_and_states_its_length() {
        for t in [
            xsdt(&[0x1000, 0x2000]),
            fadt(0xe1000),
            madt(4),
            sdt(b"DSDT", 2, b"EMBERDSD", &[1, 2, 3]),
            mcfg(0xe000_0000, 0x10_0000),
        ] {
            assert_eq!(byte_sum(&t), 0, "{:?}", &t[..4]);
            assert_eq!(
                u32::from_le_bytes(t[4..8].try_into().unwrap()) as usize,
                t.len()
            );
        }
        assert_eq!(fadt(0).len(), FADT_LEN);
    }

    #[test]
    fn the_rsdp_has_both_checksums() {
        let r = rsdp(0xe0040);
        assert_eq!(r.len(), 36);
        assert_eq!(byte_sum(&r[..20]), 0);
        assert_eq!(byte_sum(&r), 0);
        assert_eq!(u64::from_le_bytes(r[24..32].try_into().unwrap()), 0xe0040);
    }

    #[test]
    fn the_fadt_is_hardware_reduced_with_its_sleep_and_reset_registers() {
        let f = fadt(0x1234_5678);
        let flags = u32::from_le_bytes(f[112..116].try_into().unwrap());
        assert_ne!(flags & FLAG_HW_REDUCED_ACPI, 0);
        assert_eq!(
            u64::from_le_bytes(f[140..148].try_into().unwrap()),
            0x1234_5678
        );
        assert_eq!(&f[244..250], &[1, 8, 0, 1, 0x00, 0x06]);
        assert_eq!(f[128], 0xfe);
        assert_eq!(u16::from_le_bytes([f[120], f[121]]), 0x64);
    }

    #[test]
    fn the_madt_lists_each_cpu_then_the_ioapic() {
        let m = madt(3);
        let entries = &m[44..];
        for cpu in 0..3u8 {
            let e = &entries[8 * cpu as usize..8 * cpu as usize + 8];
            assert_eq!(e, &[0, 8, cpu, cpu, 1, 0, 0, 0]);
        }
        assert_eq!(&entries[24..28], &[1, 12, 3, 0]);
        assert_eq!(entries.len(), 24 + 12);
    }
}
