//! The balloon from the driver's side on real guest memory: inflated pages are dropped (they
//! read back as zeros), page numbers outside guest memory are counted and skipped, the
//! driver's `actual` is taken from its configuration writes, the target from the host, and
//! statistics are read from the buffer the driver posts.

use std::sync::Arc;

use telemetry::BalloonMetrics;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{Balloon, BalloonConfig, DEFLATE, INFLATE, STATS};
use crate::virtio::{GuestMemory, IrqTrigger, VirtioDevice};

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const PFNS: u64 = 0x10_0000;
const PAGES: u64 = 0x40_0000;
const MEM_SIZE: usize = 8 << 20;

fn memory() -> GuestMemory {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, 0))
}

fn balloon(stats: u16) -> (Balloon, Arc<BalloonMetrics>) {
    let metrics = Arc::new(BalloonMetrics::default());
    let b = Balloon::new(&BalloonConfig {
        amount_mib: 4,
        deflate_on_oom: true,
        stats_polling_interval_s: stats,
        free_page_reporting: false,
        metrics: metrics.clone(),
    })
    .unwrap();
    (b, metrics)
}

/// Activates `b` with a queue per queue index; returns the mock queues.
fn activate<'m>(b: &mut Balloon, mem: &'m GuestMemory) -> Vec<MockSplitQueue<'m, GuestMemory>> {
    let n = b.queue_events().len();
    let mqs: Vec<_> = (0..n)
        .map(|i| MockSplitQueue::create(mem, GuestAddress(0x20_0000 + 0x1_0000 * i as u64), 16))
        .collect();
    let queues = mqs.iter().map(|q| q.create_queue().unwrap()).collect();
    let irq = Arc::new(IrqTrigger::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    b.activate(mem.clone(), queues, irq).unwrap();
    mqs
}

/// Makes one chain of one descriptor available on `mq`.
fn post(mq: &MockSplitQueue<GuestMemory>, slot: u16, d: RawDescriptor) {
    mq.desc_table().store(slot, d).unwrap();
    mq.avail().ring().ref_at(slot.into()).unwrap().store(slot);
    mq.avail().idx().store(slot + 1);
}

#[test]
fn inflated_pages_go_back_to_the_host_and_read_as_zeros() {
    let mem = memory();
    let (mut b, metrics) = balloon(0);
    assert_eq!(
        b.queue_events().len(),
        2,
        "no statistics queue without an interval"
    );
    let mqs = activate(&mut b, &mem);
    // Three pages with data, two of them consecutive, and one page number past the end.
    let pfns: [u32; 4] = [
        (PAGES >> 12) as u32,
        (PAGES >> 12) as u32 + 1,
        (PAGES >> 12) as u32 + 5,
        (MEM_SIZE as u32 >> 12) + 10,
    ];
    for p in &pfns[..3] {
        mem.write_obj(0xabu8, GuestAddress(u64::from(*p) << 12))
            .unwrap();
    }
    for (i, p) in pfns.iter().enumerate() {
        mem.write_obj(*p, GuestAddress(PFNS + 4 * i as u64))
            .unwrap();
    }
    // A page that is not inflated keeps its data.
    mem.write_obj(0xcdu8, GuestAddress(PAGES + 2 * 4096))
        .unwrap();
    post(&mqs[INFLATE], 0, desc(PFNS, 16, 0));
    assert!(b.process_pfns(INFLATE));
    for p in &pfns[..3] {
        let byte: u8 = mem.read_obj(GuestAddress(u64::from(*p) << 12)).unwrap();
        assert_eq!(byte, 0, "page {p:#x}");
    }
    let kept: u8 = mem.read_obj(GuestAddress(PAGES + 2 * 4096)).unwrap();
    assert_eq!(kept, 0xcd);
    assert_eq!(metrics.inflate_count.total(), 3);
    assert_eq!(metrics.invalid_reqs_count.total(), 1);

    // Deflating needs nothing but counting.
    post(&mqs[DEFLATE], 0, desc(PFNS, 8, 0));
    assert!(b.process_pfns(DEFLATE));
    assert_eq!(metrics.deflate_count.total(), 2);
}

#[test]
fn a_buffer_of_more_page_numbers_than_a_driver_sends_is_refused_unread() {
    let mem = memory();
    let (mut b, metrics) = balloon(0);
    let mqs = activate(&mut b, &mem);
    // Page numbers of one page, 0, all over memory: read one by one, each would be a discard.
    post(&mqs[INFLATE], 0, desc(0, u32::MAX, 0));
    assert!(b.process_pfns(INFLATE), "the chain is given back");
    assert_eq!(metrics.inflate_count.total(), 0);
    assert_eq!(metrics.invalid_reqs_count.total(), 1);
}

#[test]
fn target_and_actual_in_the_configuration_space() {
    let (mut b, _) = balloon(0);
    let mut space = [0u8; 8];
    b.read_config(0, &mut space);
    assert_eq!(u32::from_le_bytes(space[..4].try_into().unwrap()), 4 * 256);
    // The driver writes actual; writes to num_pages are ignored.
    b.write_config(4, &300u32.to_le_bytes());
    b.write_config(0, &7u32.to_le_bytes());
    b.read_config(0, &mut space);
    assert_eq!(u32::from_le_bytes(space[..4].try_into().unwrap()), 4 * 256);
    assert_eq!(u32::from_le_bytes(space[4..].try_into().unwrap()), 300);
    let generation = b.config_generation();
    b.set_target_mib(64);
    assert_ne!(b.config_generation(), generation);
    let stats = b.stats();
    assert_eq!((stats.target_mib, stats.target_pages), (64, 64 * 256));
    assert_eq!(stats.actual_pages, 300);
    // A write past the end changes nothing.
    b.write_config(u64::MAX - 1, &[1, 2, 3, 4]);
    assert_eq!(b.stats().actual_pages, 300);
}

#[test]
fn statistics_come_from_the_drivers_buffer() {
    let mem = memory();
    let (mut b, metrics) = balloon(1);
    assert_eq!(b.queue_events().len(), 3);
    let mqs = activate(&mut b, &mem);
    // free_memory (4) = 1 MiB, total_memory (5) = 8 MiB, an unknown tag (99).
    let mut buf = Vec::new();
    for (tag, value) in [(4u16, 1u64 << 20), (5, 8 << 20), (99, 5)] {
        buf.extend_from_slice(&tag.to_le_bytes());
        buf.extend_from_slice(&value.to_le_bytes());
    }
    mem.write_slice(&buf, GuestAddress(PFNS)).unwrap();
    post(&mqs[STATS], 0, desc(PFNS, buf.len() as u32, 0));
    b.process_stats();
    let stats = b.stats();
    assert_eq!(stats.free_memory, Some(1 << 20));
    assert_eq!(stats.total_memory, Some(8 << 20));
    assert_eq!(stats.swap_in, None);
    assert_eq!(metrics.stats_updates_count.total(), 1);
    // The tick hands the buffer back to the driver.
    b.request_stats();
    let used: u16 = mem
        .read_obj(GuestAddress(mqs[STATS].used_addr().0 + 2))
        .unwrap();
    assert_eq!(used, 1);
    let json = serde_json::to_value(&stats).unwrap();
    assert!(json.get("swap_in").is_none() && json["total_memory"] == 8 << 20);
}

#[test]
fn reported_free_ranges_go_back_to_the_host_and_bad_ones_are_counted() {
    let mem = memory();
    let metrics = Arc::new(BalloonMetrics::default());
    let mut b = Balloon::new(&BalloonConfig {
        amount_mib: 0,
        deflate_on_oom: false,
        stats_polling_interval_s: 1,
        free_page_reporting: true,
        metrics: metrics.clone(),
    })
    .unwrap();
    assert_ne!(b.avail_features() & (1 << super::F_REPORTING), 0);
    assert_eq!(
        b.queue_events().len(),
        4,
        "inflate, deflate, statistics, reporting"
    );
    let mqs = activate(&mut b, &mem);
    let reporting = &mqs[3];
    for page in 0..4u64 {
        mem.write_obj(0xabu8, GuestAddress(PAGES + page * 4096))
            .unwrap();
    }
    // One chain: a 2-page free range (device-writable, as Linux posts them), a range that is
    // not page-aligned, one past guest memory, and one the device may only read.
    let ranges = [
        (PAGES, 8192, WRITE),
        (PAGES + 2 * 4096 + 512, 4096, WRITE),
        (MEM_SIZE as u64, 4096, WRITE),
        (PAGES + 3 * 4096, 4096, 0),
    ];
    for (i, &(addr, len, flags)) in ranges.iter().enumerate() {
        let next = if i + 1 < ranges.len() { NEXT } else { 0 };
        let d = Descriptor::new(addr, len, flags | next, i as u16 + 1);
        reporting
            .desc_table()
            .store(i as u16, RawDescriptor::from(d))
            .unwrap();
    }
    reporting.avail().ring().ref_at(0).unwrap().store(0);
    reporting.avail().idx().store(1);
    assert!(b.process_reports());
    for page in 0..2u64 {
        let byte: u8 = mem.read_obj(GuestAddress(PAGES + page * 4096)).unwrap();
        assert_eq!(byte, 0, "reported page {page} went back to the host");
    }
    for page in 2..4u64 {
        let byte: u8 = mem.read_obj(GuestAddress(PAGES + page * 4096)).unwrap();
        assert_eq!(byte, 0xab, "page {page} was not validly reported");
    }
    assert_eq!(metrics.free_page_report_count.total(), 4);
    assert_eq!(metrics.free_page_report_freed.total(), 8192);
    assert_eq!(metrics.free_page_report_fails.total(), 3);
    assert_eq!(
        crate::virtio::test_utils::used(&mem, reporting),
        vec![(0, 0)]
    );
}
