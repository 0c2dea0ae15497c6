//! For the device tests: reading what a device put in a mock queue's used ring.

use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::GuestMemory;

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
            common: super::VirtioCommon::new((1 << VIRTIO_F_VERSION_1) | 0b101, sizes).unwrap(),
            activations: std::sync::Arc::clone(&activations),
            resets: 0,
            restored: 0,
        };
        (device, activations)
    }
}

impl super::VirtioDevice for CountingDevice {
    fn common(&self) -> &super::VirtioCommon {
        &self.common
    }
    fn common_mut(&mut self) -> &mut super::VirtioCommon {
        &mut self.common
    }
    fn device_type(&self) -> u32 {
        Self::TYPE
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::device::read_config_bytes(&[1, 2, 3, 4, 5, 6, 7, 8], offset, data);
    }
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
