//! The virtio-pci transport on the PCI root bus: a hostile driver's configuration accesses
//! (through the 0xcf8/0xcfc ports and ECAM, to the host bridge, the function and empty
//! slots) and BAR accesses (through the BAR window, wherever the driver has moved the BAR)
//! in any order and width, with the device raising its interrupts in between, over an
//! entropy device; then a snapshot of whatever state that left, restored into a fresh one.
#![no_main]
use std::sync::{Arc, Mutex};

use devices::bus::BusDevice;
use devices::pci::msix::Message;
use devices::pci::root::{BarMoved, PciBarWindow, PciConfigIo, PciEcam, PciRoot};
use devices::virtio::pci::{MsiRouter, PciInterrupt, PciTransport};
use devices::virtio::rng::{Entropy, EntropyConfig};
use devices::virtio::{Interrupt, InterruptKind};
use libfuzzer_sys::fuzz_target;
use devices::virtio::GuestMemory;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

const WINDOW: u64 = 0xc000_0000;

#[derive(Debug)]
struct NoRoutes;

impl MsiRouter for NoRoutes {
    fn route(&self, _messages: &[Option<Message>]) -> std::io::Result<()> {
        Ok(())
    }
}

struct NoEvents;

impl BarMoved for NoEvents {
    fn moved(&mut self, _from: u64, _to: u64) {}
}

fn transport(mem: &GuestMemory) -> (PciTransport, Arc<PciInterrupt>) {
    let dev = Entropy::new(&EntropyConfig {
        limiter: Default::default(),
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let irqfds = (0..2).map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap()).collect();
    let irq = Arc::new(PciInterrupt::new(1, irqfds, Box::new(NoRoutes)));
    let mut t = PciTransport::new(Arc::new(Mutex::new(dev)), mem.clone(), irq.clone());
    t.set_bar_address(WINDOW);
    (t, irq)
}

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (t, irq) = transport(&mem);
    let t = Arc::new(Mutex::new(t));
    let root = Arc::new(Mutex::new(PciRoot::new()));
    root.lock()
        .unwrap()
        .add(t.clone(), Some(Box::new(NoEvents)))
        .unwrap();
    let mut io = PciConfigIo::new(root.clone());
    let mut ecam = PciEcam::new(root.clone());
    let mut window = PciBarWindow::new(root.clone(), WINDOW);
    // Each access: kind, width, a 20-bit offset, an 8-byte value.
    for op in data.chunks_exact(12) {
        let len = [1usize, 2, 4, 8][usize::from(op[1] & 3)];
        let offset = u64::from(u32::from_le_bytes([op[2], op[3], op[1] >> 4, 0]));
        let value = &op[4..4 + len];
        let mut out = [0u8; 8];
        match op[0] % 8 {
            0 => io.read(offset % 8, &mut out[..len]),
            1 => io.write(offset % 8, value),
            2 => ecam.read(offset, &mut out[..len]),
            3 => ecam.write(offset, value),
            4 => window.read(offset, &mut out[..len]),
            5 => window.write(offset, value),
            6 => {
                let _ = irq.trigger(InterruptKind::Queue(u16::from(op[2])));
            }
            _ => {
                let _ = irq.trigger(InterruptKind::Config);
            }
        }
    }
    let saved = t.lock().unwrap().snapshot();
    let (mut fresh, _) = transport(&mem);
    let _ = fresh.restore(&saved);
});
