//! For the device tests: guest memory, descriptors, an interrupt, limiters, a device that
//! counts what a transport does to it, and reading what a device put in a used ring.

use std::sync::Arc;

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{GuestMemory, IrqTrigger};

/// Descriptor flags, as the tests write them.
pub const NEXT: u16 = VRING_DESC_F_NEXT as u16;
pub const WRITE: u16 = VRING_DESC_F_WRITE as u16;
pub const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// The size of the tests' guest memory, which starts at address 0.
pub const MEM_SIZE: usize = 16 << 20;

pub fn memory() -> GuestMemory {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

/// A descriptor of `len` bytes at `addr`, chained to `next` if `flags` has NEXT.
pub fn desc(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, next))
}

/// An interrupt whose eventfd nobody reads.
pub fn irq() -> Arc<IrqTrigger> {
    Arc::new(IrqTrigger::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()))
}

/// A limiter of `size` requests each `refill_ms` milliseconds, no bandwidth limit.
pub fn ops_limiter(size: u64, refill_ms: u64) -> crate::rate_limiter::RateLimiterConfig {
    crate::rate_limiter::RateLimiterConfig {
        bandwidth: None,
        ops: crate::rate_limiter::bucket(size, refill_ms),
    }
}

/// The (head, length) elements of `mq`'s used ring, in order.
pub fn used(mem: &GuestMemory, mq: &MockSplitQueue<GuestMemory>) -> Vec<(u32, u32)> {
    let used_idx: u16 = mem.read_obj(GuestAddress(mq.used_addr().0 + 2)).unwrap();
    (0..used_idx)
        .map(|i| {
            let at = mq.used_addr().0 + 4 + 8 * u64::from(i);
            (
                mem.read_obj(GuestAddress(at)).unwrap(),
                mem.read_obj(GuestAddress(at + 4)).unwrap(),
            )
        })
        .collect()
}

/// A device for the transports' tests that counts what they do to it: type 42, features
/// VERSION_1 and bits 0 and 2, configuration bytes 1 to 8.
#[derive(Debug)]
pub struct CountingDevice {
    pub common: super::VirtioCommon,
    pub activations: std::sync::Arc<std::sync::atomic::AtomicU32>,
    pub resets: u32,
    pub restored: u32,
}

impl CountingDevice {
    pub const TYPE: u32 = 42;

    /// The device with queues of `sizes`, and its activation counter.
    pub fn new(sizes: &[u16]) -> (Self, std::sync::Arc<std::sync::atomic::AtomicU32>) {
        use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
        let activations = std::sync::Arc::default();
        let device = CountingDevice {
            common: super::VirtioCommon::new(
                Self::TYPE,
                (1 << VIRTIO_F_VERSION_1) | 0b101,
                sizes,
                std::sync::Arc::new(telemetry::EntropyMetrics::default()),
            )
            .unwrap()
            .with_config_space(vec![1, 2, 3, 4, 5, 6, 7, 8]),
            activations: std::sync::Arc::clone(&activations),
            resets: 0,
            restored: 0,
        };
        (device, activations)
    }
}

impl super::VirtioDevice for CountingDevice {
    super::common_accessors!();
    fn activated(&mut self) {
        self.activations
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn reset_device(&mut self) {
        self.resets += 1;
    }
    fn restored(&mut self) {
        self.restored += 1;
    }
}
