//! For the device tests: reading what a device put in a mock queue's used ring.

use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::GuestMemory;

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
