//! The entropy device from the driver's side on real guest memory: buffers filled with
//! random bytes, requests capped, chains a hostile guest would build answered with nothing,
//! and the rate limiter holding requests in the ring until its timer fires.

use std::sync::Arc;

use telemetry::EntropyMetrics;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::{Entropy, EntropyConfig, MAX_REQUEST};
use crate::rate_limiter::RateLimiterConfig;
use crate::virtio::test_utils::{desc, irq, memory, ops_limiter, used, MEM_SIZE, NEXT, WRITE};
use crate::virtio::{GuestMemory, VirtioDevice};

const BUF: u64 = 0x10_0000;

/// A device on a 16-entry queue whose chains start at the given heads, activated.
fn rig<'m>(
    mem: &'m GuestMemory,
    descs: &[RawDescriptor],
    heads: &[u16],
    limiter: RateLimiterConfig,
) -> (
    Entropy,
    MockSplitQueue<'m, GuestMemory>,
    Arc<EntropyMetrics>,
) {
    let mq = MockSplitQueue::create(mem, GuestAddress(0), 16);
    for (i, d) in descs.iter().enumerate() {
        mq.desc_table().store(i as u16, *d).unwrap();
    }
    for (slot, head) in heads.iter().enumerate() {
        mq.avail().ring().ref_at(slot).unwrap().store(*head);
    }
    mq.avail().idx().store(heads.len() as u16);
    let metrics = Arc::new(EntropyMetrics::default());
    let mut dev = Entropy::new(&EntropyConfig {
        limiter,
        metrics: metrics.clone(),
    })
    .unwrap();
    let irq = irq();
    dev.activate(mem.clone(), vec![mq.create_queue().unwrap()], irq)
        .unwrap();
    (dev, mq, metrics)
}

#[test]
fn buffers_are_filled_with_random_bytes_and_requests_are_capped() {
    let mem = memory();
    // Head 0: two buffers (16 + 48 bytes); head 2: one buffer larger than the cap.
    let descs = [
        desc(BUF, 16, WRITE | NEXT, 1),
        desc(BUF + 16, 48, WRITE, 0),
        desc(BUF + 4096, MAX_REQUEST + 4096, WRITE, 0),
    ];
    let (mut dev, mq, metrics) = rig(&mem, &descs, &[0, 2], RateLimiterConfig::default());
    // Activation leaves the work to the VMM thread.
    assert!(used(&mem, &mq).is_empty());
    assert_eq!(dev.queue_events()[0].read().unwrap(), 1);
    assert!(dev.process_queue());
    assert_eq!(used(&mem, &mq), vec![(0, 64), (2, MAX_REQUEST)]);
    let mut a = [0u8; 64];
    mem.read_slice(&mut a, GuestAddress(BUF)).unwrap();
    assert!(a.iter().filter(|&&b| b != 0).count() > 32, "{a:?}");
    // Past the cap nothing was written.
    let past: u64 = mem
        .read_obj(GuestAddress(BUF + 4096 + u64::from(MAX_REQUEST)))
        .unwrap();
    assert_eq!(past, 0);
    assert_eq!(metrics.entropy_bytes.total(), 64 + u64::from(MAX_REQUEST));
}

#[test]
fn hostile_chains_get_nothing() {
    let mem = memory();
    let descs = [
        // A device-readable buffer.
        desc(BUF, 64, 0, 0),
        // A buffer running off the end of guest memory.
        desc(MEM_SIZE as u64 - 8, 64, WRITE, 0),
        // A buffer at an address that wraps.
        desc(u64::MAX - 4, 64, WRITE, 0),
        // A zero-length buffer: a valid request for nothing.
        desc(BUF, 0, WRITE, 0),
    ];
    let (mut dev, mq, metrics) = rig(&mem, &descs, &[0, 1, 2, 3], RateLimiterConfig::default());
    dev.process_queue();
    assert_eq!(used(&mem, &mq), vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
    assert_eq!(metrics.invalid_reqs_count.total(), 3);
    let tail: u64 = mem.read_obj(GuestAddress(MEM_SIZE as u64 - 8)).unwrap();
    assert_eq!(tail, 0, "nothing written at the end of memory");
}

#[test]
fn the_rate_limiter_holds_requests_in_the_ring_until_its_timer() {
    let mem = memory();
    let descs: Vec<RawDescriptor> = (0..4).map(|i| desc(BUF + 64 * i, 64, WRITE, 0)).collect();
    // Two requests a 100 ms.
    let limiter = ops_limiter(2, 100);
    let (mut dev, mq, metrics) = rig(&mem, &descs, &[0, 1, 2, 3], limiter);
    dev.process_queue();
    assert_eq!(used(&mem, &mq).len(), 2, "the bucket holds two requests");
    assert_eq!(metrics.entropy_rate_limiter_throttled.total(), 1);
    let started = std::time::Instant::now();
    while used(&mem, &mq).len() < 4 {
        dev.on_limiter_timer();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(40));
    let heads: Vec<u32> = used(&mem, &mq).iter().map(|u| u.0).collect();
    assert_eq!(heads, vec![0, 1, 2, 3], "each once, in order");
}
