//! The virtio-pci transport: a hostile driver's configuration-space and BAR accesses in any
//! order and width (status, features, queue set-up, MSI-X table and control, notifications),
//! with the device raising its interrupts in between, over an entropy device.
#![no_main]
use std::sync::Arc;

use devices::pci::msix::Message;
use devices::virtio::pci::{MsiRouter, PciInterrupt, PciTransport, BAR_SIZE};
use devices::virtio::rng::{Entropy, EntropyConfig};
use devices::virtio::{Interrupt, InterruptKind};
use libfuzzer_sys::fuzz_target;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

#[derive(Debug)]
struct NoRoutes;

impl MsiRouter for NoRoutes {
    fn route(&self, _messages: &[Option<Message>]) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let dev = Entropy::new(&EntropyConfig {
        limiter: Default::default(),
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let irqfds = (0..2).map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap()).collect();
    let irq = Arc::new(PciInterrupt::new(1, irqfds, Box::new(NoRoutes)));
    let mut t = PciTransport::new(Arc::new(std::sync::Mutex::new(dev)), mem, irq.clone());
    // Each access: kind, width, a 16-bit offset, an 8-byte value.
    for op in data.chunks_exact(12) {
        let len = [1usize, 2, 4, 8][usize::from(op[1] & 3)];
        let offset = u64::from(u16::from_le_bytes([op[2], op[3]]));
        let value = &op[4..4 + len];
        let mut out = [0u8; 8];
        match op[0] % 6 {
            0 => t.config_read(offset % 0x1000, &mut out[..len]),
            1 => t.config_write(offset % 0x1000, value),
            2 => t.bar_read(offset % (BAR_SIZE + 0x100), &mut out[..len]),
            3 => t.bar_write(offset % (BAR_SIZE + 0x100), value),
            4 => {
                let _ = irq.trigger(InterruptKind::Queue(u16::from(op[2])));
            }
            _ => {
                let _ = irq.trigger(InterruptKind::Config);
            }
        }
    }
});
