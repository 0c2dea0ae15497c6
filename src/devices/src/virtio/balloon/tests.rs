//! The balloon from the driver's side on real guest memory: inflated pages are dropped (they
//! read back as zeros), page numbers outside guest memory are counted and skipped, the
//! driver's `actual` is taken from its configuration writes, the target from the host, and
//! statistics are read from the buffer the driver posts.

use std::sync::Arc;

use telemetry::BalloonMetrics;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::{Balloon, BalloonConfig, DEFLATE, INFLATE, STATS};
use crate::virtio::test_utils::{irq, memory, MEM_SIZE, NEXT, WRITE};
use crate::virtio::{GuestMemory, VirtioDevice};

const PFNS: u64 = 0x10_0000;
const PAGES: u64 = 0x40_0000;

fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, 0))
}

fn balloon(stats: u16) -> (Balloon, Arc<BalloonMetrics>) {
    let metrics = Arc::new(BalloonMetrics::default());
    let b = Balloon::new(&BalloonConfig {
        amount_mib: 4,
        deflate_on_oom: true,
        stats_polling_interval_s: stats,
        free_page_hinting: false,
        free_page_reporting: false,
        host_page_size: 4096,
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
    let irq = irq();
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
        free_page_hinting: false,
        free_page_reporting: true,
        host_page_size: 4096,
        metrics: metrics.clone(),
    })
    .unwrap();
    assert_ne!(b.avail_features() & super::Feature::Reporting.bit(), 0);
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

#[test]
fn on_huge_pages_only_whole_huge_pages_go_back() {
    const HUGE: u64 = 2 << 20;
    let mem = memory();
    let touch = |addr: u64| mem.write_obj(0xabu8, GuestAddress(addr)).unwrap();
    let byte = |addr: u64| mem.read_obj::<u8>(GuestAddress(addr)).unwrap();
    for addr in [HUGE - 4096, HUGE, 2 * HUGE - 4096, 2 * HUGE] {
        touch(addr);
    }
    // A 4 KiB page and a range that covers no whole huge page: valid, nothing given back.
    assert!(crate::sys::discard_guest_pages(
        &mem,
        GuestAddress(HUGE),
        4096,
        HUGE
    ));
    assert!(crate::sys::discard_guest_pages(
        &mem,
        GuestAddress(HUGE - 4096),
        HUGE,
        HUGE
    ));
    assert_eq!(byte(HUGE), 0xab);
    assert_eq!(byte(HUGE - 4096), 0xab);
    // From the page before a huge page to the page after it: only that huge page goes.
    assert!(crate::sys::discard_guest_pages(
        &mem,
        GuestAddress(HUGE - 4096),
        HUGE + 8192,
        HUGE
    ));
    assert_eq!(
        [HUGE - 4096, HUGE, 2 * HUGE - 4096, 2 * HUGE].map(byte),
        [0xab, 0, 0, 0xab]
    );
    // Outside guest memory is still refused.
    assert!(!crate::sys::discard_guest_pages(
        &mem,
        GuestAddress(MEM_SIZE as u64),
        HUGE,
        HUGE
    ));
}

fn hinting_balloon() -> (Balloon, Arc<BalloonMetrics>) {
    let metrics = Arc::new(BalloonMetrics::default());
    let b = Balloon::new(&BalloonConfig {
        amount_mib: 0,
        deflate_on_oom: false,
        stats_polling_interval_s: 1,
        free_page_hinting: true,
        free_page_reporting: true,
        host_page_size: 4096,
        metrics: metrics.clone(),
    })
    .unwrap();
    (b, metrics)
}

fn hint_cmd(b: &Balloon) -> u32 {
    let mut cmd = [0u8; 4];
    b.read_config(8, &mut cmd);
    u32::from_le_bytes(cmd)
}

#[test]
fn a_hinting_run_gives_back_the_blocks_of_the_current_run_only() {
    use super::hinting::HintingError;
    let mem = memory();
    let (mut b, metrics) = hinting_balloon();
    assert_ne!(b.avail_features() & super::Feature::FreePageHint.bit(), 0);
    // Inflate, deflate, statistics, hinting, reporting: Linux's order.
    assert_eq!(b.queue_events().len(), 5);
    assert_eq!(
        b.start_hinting(Default::default()),
        Err(HintingError::NoDriver)
    );
    let mqs = activate(&mut b, &mem);
    let hints = &mqs[3];
    let generation = b.config_generation();
    b.start_hinting(Default::default()).unwrap();
    assert_eq!((hint_cmd(&b), b.hinting_status().unwrap().host_cmd), (2, 2));
    assert_ne!(b.config_generation(), generation, "the driver is told");

    for page in 0..8u64 {
        mem.write_obj(0xabu8, GuestAddress(PAGES + page * 4096))
            .unwrap();
    }
    let id = |n: u32, at: u64| {
        mem.write_obj(n.to_le(), GuestAddress(at)).unwrap();
        desc(at, 4, 0)
    };
    // Run 2 starts; a 2-page block; a block not page-aligned; a command ID of 8 bytes.
    post(hints, 0, id(2, PFNS));
    post(hints, 1, desc(PAGES, 8192, WRITE));
    post(hints, 2, desc(PAGES + 2 * 4096 + 512, 4096, WRITE));
    post(hints, 3, desc(PFNS + 16, 8, 0));
    assert!(b.process_hints());
    let byte = |page: u64| {
        mem.read_obj::<u8>(GuestAddress(PAGES + page * 4096))
            .unwrap()
    };
    assert_eq!([0, 1, 2, 3].map(byte), [0, 0, 0xab, 0xab]);
    assert_eq!(metrics.free_page_hint_count.total(), 2);
    assert_eq!(metrics.free_page_hint_freed.total(), 8192);
    assert_eq!(metrics.free_page_hint_fails.total(), 1);
    assert_eq!(metrics.invalid_reqs_count.total(), 1);
    assert_eq!(b.hinting_status().unwrap().guest_cmd, Some(2));

    // STOP: acknowledged with DONE; a block sent after it stays the guest's.
    post(hints, 4, id(0, PFNS + 32));
    post(hints, 5, desc(PAGES + 4 * 4096, 4096, WRITE));
    assert!(b.process_hints());
    assert_eq!(byte(4), 0xab);
    let status = b.hinting_status().unwrap();
    assert_eq!((status.host_cmd, status.guest_cmd), (1, Some(0)));
    assert_eq!(hint_cmd(&b), 1);
    assert_eq!(crate::virtio::test_utils::used(&mem, hints).len(), 6);

    // A run without the acknowledgement waits at STOP; a block of an older run is ignored.
    b.start_hinting(super::StartHintingCmd {
        acknowledge_on_stop: false,
    })
    .unwrap();
    assert_eq!(hint_cmd(&b), 3);
    post(hints, 6, id(2, PFNS + 48));
    post(hints, 7, desc(PAGES + 5 * 4096, 4096, WRITE));
    post(hints, 8, id(0, PFNS + 64));
    assert!(b.process_hints());
    assert_eq!(byte(5), 0xab);
    assert_eq!(hint_cmd(&b), 3);
    b.stop_hinting().unwrap();
    assert_eq!(hint_cmd(&b), 1);

    // A snapshot keeps the state; the restored balloon, once running, says DONE and tells
    // the driver.
    let mut saved = b.hinting_state().unwrap();
    saved.host_cmd = 3;
    let (mut restored, _) = hinting_balloon();
    restored.restore_hinting(saved);
    assert_eq!(hint_cmd(&restored), 3);
    let _mqs = activate(&mut restored, &mem);
    let generation = restored.config_generation();
    restored.restored();
    assert_eq!((hint_cmd(&restored), saved.last_cmd_id), (1, 3));
    assert_ne!(restored.config_generation(), generation);
}

#[test]
fn hinting_requests_on_a_balloon_without_it_are_refused() {
    use super::hinting::HintingError;
    let mem = memory();
    let (mut b, _) = balloon(0);
    let _mqs = activate(&mut b, &mem);
    assert_eq!(
        b.start_hinting(Default::default()),
        Err(HintingError::NotEnabled)
    );
    assert_eq!(b.stop_hinting(), Err(HintingError::NotEnabled));
    assert_eq!(b.hinting_status(), Err(HintingError::NotEnabled));
    assert_eq!(b.hinting_state(), None);
    assert_eq!(hint_cmd(&b), 0);
}
