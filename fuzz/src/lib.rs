//! What the virtio fuzz targets share: a device's queues in guest memory that the fuzzer's
//! bytes fill, as a hostile driver would (descriptor tables, rings, indexes and buffers all
//! arbitrary), after the queues were set up as the transport does.

use std::sync::Arc;

use devices::virtio::{GuestMemory, IrqTrigger, VirtioDevice};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// Guest memory: the queues' areas, then buffers. Addresses past it fail as in a real guest.
pub const MEM_SIZE: usize = 1 << 20;
/// Each queue's descriptor table, rings and some room for buffers.
pub const QUEUE_STRIDE: u64 = 0x1000;
pub const QUEUE_SIZE: u16 = 16;

/// Activates `dev` on one 16-entry queue per `queue_max_sizes` entry, at 0x1000 apart, then
/// copies `data` over guest memory from address 0: the queues' tables, rings and indexes,
/// and whatever buffers the descriptors point at, are the fuzzer's.
pub fn activate(dev: &mut dyn VirtioDevice, data: &[u8]) -> GuestMemory {
    let mem: GuestMemory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap();
    let queues = (0..dev.queue_max_sizes().len())
        .map(|i| {
            let at = GuestAddress(i as u64 * QUEUE_STRIDE);
            MockSplitQueue::create(&mem, at, QUEUE_SIZE)
                .create_queue()
                .unwrap()
        })
        .collect();
    let irq = Arc::new(IrqTrigger::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    dev.set_acked_features(dev.avail_features());
    dev.activate(mem.clone(), queues, irq).unwrap();
    let n = data.len().min(MEM_SIZE);
    mem.write_slice(&data[..n], GuestAddress(0)).unwrap();
    mem
}
