use std::sync::{Arc, Mutex};

use super::*;
use crate::pci::config::tests::IDS;
use crate::pci::config::{Bar, ConfigSpace};

/// A function with one 16-KiB BAR whose bytes are their own offset's low byte.
struct Fake {
    config: ConfigSpace,
    written: Vec<(u64, Vec<u8>)>,
}

impl PciFunction for Fake {
    fn config_read(&self, offset: u64, data: &mut [u8]) {
        self.config.read(offset, data);
    }
    fn config_write(&mut self, offset: u64, data: &[u8]) {
        self.config.write(offset, data);
    }
    fn bar(&self) -> Option<(u64, u64)> {
        let addr = self.config.bar_address(0)?;
        self.config.memory_enabled().then_some((addr, 0x4000))
    }
    fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(offset as u8);
    }
    fn bar_write(&mut self, offset: u64, data: &[u8]) {
        self.written.push((offset, data.to_vec()));
    }
}

fn fake(bar: u64) -> Arc<Mutex<Fake>> {
    let mut config = ConfigSpace::new(IDS, &[Bar { size: 0x4000 }]);
    config.set_bar_address(0, bar);
    Arc::new(Mutex::new(Fake {
        config,
        written: Vec::new(),
    }))
}

#[derive(Clone, Default)]
struct Moves(Arc<Mutex<Vec<(u64, u64)>>>);

impl BarMoved for Moves {
    fn moved(&mut self, from: u64, to: u64) {
        self.0.lock().unwrap().push((from, to));
    }
}

fn cf8(device: u8, reg: u8) -> [u8; 4] {
    (0x8000_0000u32 | (u32::from(device) << 11) | u32::from(reg)).to_le_bytes()
}

fn read_io(io: &mut PciConfigIo, device: u8, reg: u8) -> u32 {
    io.write(0, &cf8(device, reg));
    let mut b = [0u8; 4];
    io.read(4, &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn mechanism_one_and_ecam_see_the_same_functions() {
    let root = Arc::new(Mutex::new(PciRoot::new()));
    let slot = root.lock().unwrap().add(fake(0xc000_0000), None).unwrap();
    assert_eq!(slot, 1);
    let mut io = PciConfigIo::new(root.clone());
    let mut ecam = PciEcam::new(root.clone());
    assert_eq!(read_io(&mut io, 0, 0), 0x0008_1b36, "host bridge at 00.0");
    assert_eq!(read_io(&mut io, 0, 8) >> 8, 0x06_00_00);
    assert_eq!(read_io(&mut io, 1, 0), 0x1042_1af4);
    assert_eq!(read_io(&mut io, 2, 0), u32::MAX, "empty slot");
    let mut b = [0u8; 4];
    ecam.read(1 << 15, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0x1042_1af4);
    ecam.read((1 << 15) | (1 << 12), &mut b);
    assert_eq!(u32::from_le_bytes(b), u32::MAX, "function 1 absent");
    // Byte and word reads through the data window's offsets.
    io.write(0, &cf8(1, 0));
    let mut w = [0u8; 2];
    io.read(6, &mut w);
    assert_eq!(u16::from_le_bytes(w), 0x1042);
    // The latch reads back; a disabled latch or another bus selects nothing.
    let mut latch = [0u8; 4];
    io.read(0, &mut latch);
    assert_eq!(latch, cf8(1, 0));
    io.write(0, &(0x0000_0800u32).to_le_bytes());
    io.read(4, &mut b);
    assert_eq!(b, [0xff; 4]);
    io.write(0, &(0x8001_0800u32).to_le_bytes());
    io.read(4, &mut b);
    assert_eq!(b, [0xff; 4]);
}

#[test]
fn bars_decode_where_the_guest_puts_them_and_ioeventfds_follow() {
    let root = Arc::new(Mutex::new(PciRoot::new()));
    let f = fake(0xc000_0000);
    let moves = Moves::default();
    root.lock()
        .unwrap()
        .add(f.clone(), Some(Box::new(moves.clone())))
        .unwrap();
    let mut window = PciBarWindow::new(root.clone(), 0xc000_0000);
    let mut io = PciConfigIo::new(root.clone());
    let mut b = [0u8; 4];
    window.read(0x10, &mut b);
    assert_eq!(b, [0x10; 4]);
    window.write(0x3000, &[1, 0]);
    assert_eq!(f.lock().unwrap().written, vec![(0x3000, vec![1, 0])]);

    // Sizing as Linux does it: decoding off, all ones, read, the address back, decoding on.
    let write = |io: &mut PciConfigIo, reg: u8, v: u32| {
        io.write(0, &cf8(1, reg));
        io.write(4, &v.to_le_bytes());
    };
    write(&mut io, 4, 0);
    window.read(0x10, &mut b);
    assert_eq!(b, [0xff; 4], "decoding off");
    write(&mut io, 0x10, u32::MAX);
    write(&mut io, 0x14, u32::MAX);
    assert_eq!(read_io(&mut io, 1, 0x10), 0xffff_c00c);
    write(&mut io, 0x10, 0xc000_0000);
    write(&mut io, 0x14, 0);
    write(&mut io, 4, 2);
    assert!(moves.0.lock().unwrap().is_empty(), "back where it was");

    // Moved: the window answers at the new place only, and the owner is told once.
    write(&mut io, 0x10, 0xc001_0000);
    assert_eq!(*moves.0.lock().unwrap(), vec![(0xc000_0000, 0xc001_0000)]);
    window.read(0x10, &mut b);
    assert_eq!(b, [0xff; 4]);
    window.read(0x1_0010, &mut b);
    assert_eq!(b, [0x10; 4]);
    // An access straddling the BAR's end reaches nothing.
    window.read(0x1_3ffe, &mut b);
    assert_eq!(b, [0xff; 4]);
}

#[test]
fn the_bus_holds_31_devices() {
    let mut root = PciRoot::new();
    for i in 0..MAX_DEVICES as u64 {
        root.add(fake(0xc000_0000 + i * 0x4000), None).unwrap();
    }
    assert_eq!(root.add(fake(0xd000_0000), None), Err(BusFull));
}

#[test]
fn odd_accesses_read_ones_and_change_nothing() {
    let root = Arc::new(Mutex::new(PciRoot::new()));
    root.lock().unwrap().add(fake(0xc000_0000), None).unwrap();
    let mut io = PciConfigIo::new(root.clone());
    // A byte write to the latch is not a latch write.
    io.write(0, &cf8(1, 0));
    io.write(0, &[0]);
    let mut latch = [0u8; 4];
    io.read(0, &mut latch);
    assert_eq!(latch, cf8(1, 0));
    // Past the data window, a 4-byte access at 0xcfe.
    let mut b = [0u8; 4];
    io.read(6, &mut b);
    assert_eq!(b, [0xff; 4]);
    io.write(6, &[0; 4]);
    io.write(9, &[0; 4]);
    // ECAM past the header, and offsets past the window's bus.
    let mut ecam = PciEcam::new(root);
    ecam.read((1 << 15) | 0x100, &mut b);
    assert_eq!(b, [0; 4], "extended space of a present function");
    ecam.write((1 << 15) | 0xffc, &[1; 4]);
    ecam.write(u64::MAX - 3, &[1; 4]);
}
