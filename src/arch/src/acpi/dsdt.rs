//! The DSDT: the devices a guest cannot discover by itself. The serial port and the i8042
//! (so that a kernel which trusts ACPI over probing still finds them), each virtio-mmio
//! device (`LNRO0005`, how kernels without `virtio_mmio.device=` support find them), and the
//! `\_S5_` sleep type that lets the guest power off through the FADT's sleep control register.

use super::aml::{self, Resources};
use super::{PciBus, VirtioMmio};
use crate::layout::{
    COM1_PORTS, I8042_COMMAND_PORT, I8042_IRQ, I8042_PORT, PCI_CONFIG_PORTS, SERIAL_IRQ,
};

/// The sleep type of S5 (soft off), written with SLP_EN to the sleep control register.
pub const S5_SLEEP_TYPE: u8 = 5;

fn legacy_devices(sb: &mut Vec<u8>) {
    let mut com1 = Vec::new();
    aml::name_object(&mut com1, "_HID", &aml::dword(aml::eisa_id("PNP0501")));
    aml::name_object(&mut com1, "_UID", &aml::integer(0));
    aml::name_object(&mut com1, "_DDN", &aml::string("COM1"));
    let crs = Resources::default()
        .io(COM1_PORTS.base, COM1_PORTS.len)
        .interrupt(SERIAL_IRQ)
        .encode();
    aml::name_object(&mut com1, "_CRS", &crs);
    aml::device(sb, "COM1", &com1);

    let mut ps2 = Vec::new();
    aml::name_object(&mut ps2, "_HID", &aml::dword(aml::eisa_id("PNP0303")));
    let crs = Resources::default()
        .io(I8042_PORT, 1)
        .io(I8042_COMMAND_PORT, 1)
        .interrupt(I8042_IRQ)
        .encode();
    aml::name_object(&mut ps2, "_CRS", &crs);
    aml::device(sb, "PS2_", &ps2);
}

fn virtio_device(sb: &mut Vec<u8>, index: usize, dev: &VirtioMmio) {
    let mut body = Vec::new();
    aml::name_object(&mut body, "_HID", &aml::string("LNRO0005"));
    aml::name_object(&mut body, "_UID", &aml::integer(index as u64));
    aml::name_object(&mut body, "_CCA", &aml::integer(1));
    let crs = Resources::default()
        .memory32(dev.addr as u32, dev.len as u32)
        .interrupt(dev.gsi)
        .encode();
    aml::name_object(&mut body, "_CRS", &crs);
    aml::device(sb, &format!("V{index:03}"), &body);
}

/// The PCI host bridge (`--enable-pci`): a PCI Express root (`PNP0A08`, compatible with
/// `PNP0A03`) decoding bus 0, configuration mechanism #1's ports and the BAR window. Its
/// functions are found by enumeration, so none is named here.
fn pci_host_bridge(sb: &mut Vec<u8>, pci: &PciBus) {
    let mut body = Vec::new();
    aml::name_object(&mut body, "_HID", &aml::dword(aml::eisa_id("PNP0A08")));
    aml::name_object(&mut body, "_CID", &aml::dword(aml::eisa_id("PNP0A03")));
    aml::name_object(&mut body, "_ADR", &aml::integer(0));
    aml::name_object(&mut body, "_SEG", &aml::integer(0));
    aml::name_object(&mut body, "_UID", &aml::integer(0));
    aml::name_object(&mut body, "_BBN", &aml::integer(0));
    let crs = Resources::default()
        .bus_numbers(0, 0)
        .io(PCI_CONFIG_PORTS.base, PCI_CONFIG_PORTS.len)
        .memory_window(pci.window as u32, pci.window_len as u32)
        .encode();
    aml::name_object(&mut body, "_CRS", &crs);
    aml::device(sb, "PCI0", &body);
}

/// The DSDT's AML body (the table header is added by the caller).
pub fn body(virtio_mmio: &[VirtioMmio], pci: Option<&PciBus>) -> Vec<u8> {
    let mut sb = Vec::new();
    legacy_devices(&mut sb);
    for (index, dev) in virtio_mmio.iter().enumerate() {
        virtio_device(&mut sb, index, dev);
    }
    if let Some(pci) = pci {
        pci_host_bridge(&mut sb, pci);
    }
    let mut out = Vec::new();
    aml::scope(&mut out, "\\_SB_", &sb);
    let s5: Vec<Vec<u8>> = [S5_SLEEP_TYPE, 0, 0, 0]
        .iter()
        .map(|&n| aml::integer(u64::from(n)))
        .collect();
    aml::name_object(&mut out, "\\_S5_", &aml::package(&s5));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn each_virtio_device_is_named_with_its_window_and_line() {
        let devs = [
            VirtioMmio {
                addr: 0xd000_0000,
                len: 0x1000,
                gsi: 5,
            },
            VirtioMmio {
                addr: 0xd000_1000,
                len: 0x1000,
                gsi: 6,
            },
        ];
        let aml = body(&devs, None);
        for (i, d) in devs.iter().enumerate() {
            let at = find(&aml, format!("V{i:03}").as_bytes()).expect("device name");
            let rest = &aml[at..];
            assert!(find(rest, b"LNRO0005\0").is_some());
            let mut mem = vec![0x86, 9, 0, 1];
            mem.extend_from_slice(&(d.addr as u32).to_le_bytes());
            mem.extend_from_slice(&0x1000u32.to_le_bytes());
            mem.extend_from_slice(&[0x89, 6, 0, 3, 1]);
            mem.extend_from_slice(&d.gsi.to_le_bytes());
            assert!(find(rest, &mem).is_some(), "V{i:03}'s resources");
        }
        assert!(find(&aml, b"V002").is_none());
        assert!(
            find(&aml, b"PCI0").is_none(),
            "no PCI bus without --enable-pci"
        );
    }

    #[test]
    fn the_pci_host_bridge_decodes_bus_0_its_ports_and_the_bar_window() {
        let pci = PciBus {
            ecam: 0xe000_0000,
            ecam_len: 0x10_0000,
            window: 0xc000_0000,
            window_len: 0x1000_0000,
        };
        let aml = body(&[], Some(&pci));
        let at = find(&aml, b"PCI0").expect("host bridge");
        let rest = &aml[at..];
        let pnp0a08 = aml::dword(aml::eisa_id("PNP0A08"));
        let pnp0a03 = aml::dword(aml::eisa_id("PNP0A03"));
        assert!(find(rest, &pnp0a08).is_some() && find(rest, &pnp0a03).is_some());
        assert!(find(rest, &[0x47, 1, 0xf8, 0x0c, 0xf8, 0x0c, 1, 8]).is_some());
        let mut window = vec![0x87, 23, 0, 0, 0x0c, 1, 0, 0, 0, 0];
        window.extend_from_slice(&0xc000_0000u32.to_le_bytes());
        window.extend_from_slice(&0xcfff_ffffu32.to_le_bytes());
        assert!(find(rest, &window).is_some());
    }

    #[test]
    fn the_soft_off_sleep_type_is_five() {
        let aml = body(&[], None);
        let at = find(&aml, b"\\_S5_").expect("_S5_");
        // Name, path, then Package(4) { 5, 0, 0, 0 }: 6 bytes and the length byte.
        assert_eq!(aml[at - 1], 0x08);
        assert_eq!(&aml[at + 5..], &[0x12, 7, 4, 0x0a, 5, 0, 0, 0]);
    }
}
