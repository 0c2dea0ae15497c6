//! The block device driven from the driver's side on real guest memory, including chains a
//! hostile guest would build: each one gets a device error or an unused chain, never a panic,
//! and never a byte written outside guest memory or the disk image.

use std::io::Write;
use std::sync::Arc;

use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};

use telemetry::BlockMetrics;

use super::{Block, BlockConfig, CacheType, IoEngine, Request, RequestError, RequestType};
use crate::rate_limiter::{BucketUpdate, RateLimiterConfig};
use crate::virtio::test_utils::{
    desc, irq, memory, ops_limiter, used, INDIRECT, MEM_SIZE, NEXT, WRITE,
};
use crate::virtio::{GuestMemory, VirtioDevice};

const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x20_0000;
const STATUS: u64 = 0x30_0000;

std::thread_local! {
    /// The engine the devices of this test thread use (`async_engine` runs the tests again
    /// with Async).
    static ENGINE: std::cell::Cell<IoEngine> = const { std::cell::Cell::new(IoEngine::Sync) };
}

struct Disk {
    path: std::path::PathBuf,
}

impl Disk {
    fn new(name: &str, bytes: &[u8]) -> Disk {
        // The same test runs once per engine, maybe at the same time: one file each.
        let engine = format!("{:?}", ENGINE.get());
        let path =
            std::env::temp_dir().join(format!("ember-blk-{}-{name}-{engine}", std::process::id()));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        Disk { path }
    }
    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn block(disk: &Disk, read_only: bool) -> Block {
    limited_block(
        disk,
        read_only,
        RateLimiterConfig::default(),
        Arc::default(),
    )
}

fn limited_block(
    disk: &Disk,
    read_only: bool,
    limiter: RateLimiterConfig,
    metrics: Arc<BlockMetrics>,
) -> Block {
    Block::new(&BlockConfig {
        id: "disk_7".into(),
        path: disk.path.clone(),
        read_only,
        cache: CacheType::Writeback,
        engine: ENGINE.get(),
        limiter,
        metrics,
    })
    .unwrap()
}

fn header(mem: &GuestMemory, kind: u32, sector: u64) {
    mem.write_obj(kind, GuestAddress(HDR)).unwrap();
    mem.write_obj(0u32, GuestAddress(HDR + 4)).unwrap();
    mem.write_obj(sector, GuestAddress(HDR + 8)).unwrap();
    mem.write_obj(0xeeu8, GuestAddress(STATUS)).unwrap();
}

/// Puts `descs` in the table (head at 0), makes the chain available, activates `dev` on
/// the queue and serves it. Returns the (head, len) used elements.
fn serve(mem: &GuestMemory, dev: &mut Block, descs: &[RawDescriptor]) -> Vec<(u32, u32)> {
    let mq = MockSplitQueue::create(mem, GuestAddress(0), 16);
    for (i, d) in descs.iter().enumerate() {
        mq.desc_table().store(i as u16, *d).unwrap();
    }
    mq.avail().ring().ref_at(0).unwrap().store(0u16);
    mq.avail().idx().store(1);
    let queue: Queue = mq.create_queue().unwrap();
    let irq = irq();
    dev.activate(mem.clone(), vec![queue], irq.clone()).unwrap();
    dev.process_queue();
    // Async requests answered (Sync ones already are).
    dev.drain();
    used(mem, &mq)
}

/// A request's chain: the header at HDR, `len` data bytes at `data` (`flags` WRITE when the
/// device writes them), and the status byte at STATUS.
fn chain(data: u64, len: u32, flags: u16) -> Vec<RawDescriptor> {
    vec![
        desc(HDR, 16, NEXT, 1),
        desc(data, len, NEXT | flags, 2),
        desc(STATUS, 1, WRITE, 0),
    ]
}

/// A request with no data (a flush, or an unknown type): the header and the status byte.
fn no_data() -> [RawDescriptor; 2] {
    [desc(HDR, 16, NEXT, 1), desc(STATUS, 1, WRITE, 0)]
}

/// `reads` reads made available on a queue of `size`: request r (chain head 3r) reads
/// sector r into its own 512 bytes at `DATA + 512 r`, with its status byte at `STATUS + r`.
fn posted_reads(mem: &GuestMemory, size: u16, reads: u16) -> MockSplitQueue<'_, GuestMemory> {
    let mq = MockSplitQueue::create(mem, GuestAddress(0), size);
    for r in 0..reads {
        let hdr = HDR + 16 * u64::from(r);
        mem.write_obj(0u32, GuestAddress(hdr)).unwrap();
        mem.write_obj(u64::from(r), GuestAddress(hdr + 8)).unwrap();
        let data = DATA + 512 * u64::from(r);
        let status = STATUS + u64::from(r);
        let d = 3 * r;
        let table = mq.desc_table();
        table.store(d, desc(hdr, 16, NEXT, d + 1)).unwrap();
        table
            .store(d + 1, desc(data, 512, NEXT | WRITE, d + 2))
            .unwrap();
        table.store(d + 2, desc(status, 1, WRITE, 0)).unwrap();
        mq.avail().ring().ref_at(r.into()).unwrap().store(d);
    }
    mq.avail().idx().store(reads);
    mq
}

/// Each of [`posted_reads`]' requests got its sector (a disk whose sector r is all r) and OK.
fn assert_reads_done(mem: &GuestMemory, reads: u16) {
    for r in 0..u64::from(reads) {
        let mut got = [0u8; 512];
        mem.read_slice(&mut got, GuestAddress(DATA + 512 * r))
            .unwrap();
        assert!(got.iter().all(|&b| b == r as u8), "read {r}");
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(STATUS + r)).unwrap(),
            VIRTIO_BLK_S_OK as u8
        );
    }
}

fn status(mem: &GuestMemory) -> u32 {
    u32::from(mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap())
}

#[test]
fn read_write_flush_and_get_id() {
    let contents: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let disk = Disk::new("rw", &contents);
    let mem = memory();

    let mut dev = block(&disk, false);
    header(&mem, 0, 1);
    let used = serve(&mem, &mut dev, &chain(DATA, 1024, WRITE));
    assert_eq!(used, vec![(0, 1025)]);
    assert_eq!(status(&mem), VIRTIO_BLK_S_OK);
    let mut got = vec![0u8; 1024];
    mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(got, &contents[512..1536]);

    let mut dev = block(&disk, false);
    mem.write_slice(&[0xab; 512], GuestAddress(DATA)).unwrap();
    header(&mem, 1, 15);
    let used = serve(&mem, &mut dev, &chain(DATA, 512, 0));
    assert_eq!(used, vec![(0, 1)]);
    assert_eq!(status(&mem), VIRTIO_BLK_S_OK);
    let after = disk.bytes();
    assert_eq!(&after[7680..], &[0xab; 512][..]);
    assert_eq!(&after[..7680], &contents[..7680]);

    let mut dev = block(&disk, false);
    header(&mem, 4, 0);
    serve(&mem, &mut dev, &no_data());
    assert_eq!(status(&mem), VIRTIO_BLK_S_OK);

    let mut dev = block(&disk, false);
    header(&mem, 8, 0);
    let used = serve(&mem, &mut dev, &chain(DATA, 20, WRITE));
    assert_eq!(used, vec![(0, 21)]);
    let mut id = [0u8; 20];
    mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id[..6], b"disk_7");
    assert!(id[6..].iter().all(|&b| b == 0));
}

#[test]
fn writes_to_a_read_only_disk_and_requests_past_the_end_fail_untouched() {
    let contents = vec![0x5a; 4096];
    let disk = Disk::new("ro", &contents);
    let mem = memory();
    let mut dev = block(&disk, true);
    assert_ne!(dev.avail_features() & (1 << 5), 0, "VIRTIO_BLK_F_RO");
    header(&mem, 1, 0);
    serve(&mem, &mut dev, &chain(DATA, 512, 0));
    assert_eq!(status(&mem), VIRTIO_BLK_S_IOERR);

    for (sector, len) in [
        (8u64, 512u32),
        (7, 1024),
        (u64::MAX / 512, 512),
        (u64::MAX, 512),
    ] {
        let mut dev = block(&disk, false);
        header(&mem, 1, sector);
        serve(&mem, &mut dev, &chain(DATA, len, 0));
        assert_eq!(status(&mem), VIRTIO_BLK_S_IOERR, "sector {sector}");
    }
    assert_eq!(disk.bytes(), contents, "the image is unchanged");

    let mut dev = block(&disk, false);
    header(&mem, 77, 0);
    serve(&mem, &mut dev, &no_data());
    assert_eq!(status(&mem), VIRTIO_BLK_S_UNSUPP);
}

/// Chains a hostile guest builds: each is returned with nothing written, the device keeps
/// working, and the disk is untouched.
#[test]
fn hostile_chains_get_device_errors_not_panics() {
    let contents = vec![0x11; 8192];
    let disk = Disk::new("hostile", &contents);
    let mem = memory();
    let outside = MEM_SIZE as u64 + 0x1000;
    let cases: Vec<(&str, Vec<RawDescriptor>)> = vec![
        (
            "a loop",
            vec![desc(HDR, 16, NEXT, 1), desc(DATA, 512, NEXT, 0)],
        ),
        ("a self loop", vec![desc(HDR, 16, NEXT, 0)]),
        ("next beyond the table", vec![desc(HDR, 16, NEXT, 500)]),
        (
            "header outside memory",
            vec![desc(outside, 16, NEXT, 1), desc(STATUS, 1, WRITE, 0)],
        ),
        (
            "header too short",
            vec![desc(HDR, 8, NEXT, 1), desc(STATUS, 1, WRITE, 0)],
        ),
        ("data outside memory", chain(outside, 512, 0)),
        (
            "data straddling the end of memory",
            chain(MEM_SIZE as u64 - 256, 512, 0),
        ),
        ("an address that overflows", chain(u64::MAX - 255, 512, 0)),
        ("a huge length", chain(DATA, u32::MAX, 0)),
        (
            "status outside memory",
            vec![
                desc(HDR, 16, NEXT, 1),
                desc(DATA, 512, NEXT, 2),
                desc(outside, 1, WRITE, 0),
            ],
        ),
        (
            "read-only status",
            vec![
                desc(HDR, 16, NEXT, 1),
                desc(DATA, 512, NEXT, 2),
                desc(STATUS, 1, 0, 0),
            ],
        ),
        ("data the wrong way", chain(DATA, 512, WRITE)),
        ("a partial sector", chain(DATA, 100, 0)),
        (
            "an indirect table outside memory",
            vec![desc(outside, 16 * 4, INDIRECT, 0)],
        ),
        (
            "an indirect table longer than the queue",
            vec![desc(DATA, 16 * 4096, INDIRECT, 0)],
        ),
    ];
    for (what, descs) in cases {
        let mut dev = block(&disk, false);
        header(&mem, 1, 0); // a write, so that any mistake would show in the disk
        mem.write_slice(&[0x99; 512], GuestAddress(DATA)).unwrap();
        let used = serve(&mem, &mut dev, &descs);
        assert!(used.len() <= 1, "{what}: {used:?}");
        if let Some(&(_, len)) = used.first() {
            assert_eq!(len, 0, "{what}: nothing written to the guest");
        }
        assert_eq!(status(&mem), 0xee, "{what}: status untouched");
        assert_eq!(disk.bytes(), contents, "{what}: the disk is untouched");
    }
}

#[test]
fn parse_checks_direction_and_layout() {
    let mem = memory();
    header(&mem, 0, 3);
    let chain = [
        Descriptor::new(HDR, 16, NEXT, 1),
        Descriptor::new(DATA, 1024, NEXT | WRITE, 2),
        Descriptor::new(STATUS, 1, WRITE, 0),
    ];
    let req = Request::parse(&mem, chain.into_iter()).unwrap();
    assert_eq!(
        (req.kind, req.sector, req.data_len()),
        (RequestType::In, 3, 1024)
    );
    assert_eq!(
        Request::parse(&mem, [].into_iter()),
        Err(RequestError::Empty)
    );
    let no_status = [Descriptor::new(HDR, 16, 0, 0)];
    assert_eq!(
        Request::parse(&mem, no_status.into_iter()),
        Err(RequestError::BadStatus)
    );
    let writable_header = [
        Descriptor::new(HDR, 16, WRITE, 0),
        Descriptor::new(STATUS, 1, WRITE, 0),
    ];
    assert_eq!(
        Request::parse(&mem, writable_header.into_iter()),
        Err(RequestError::BadHeader)
    );
    let mut many = vec![Descriptor::new(HDR, 16, NEXT, 0)];
    many.extend((0..4).map(|_| Descriptor::new(DATA, !511, NEXT | WRITE, 0)));
    many.push(Descriptor::new(STATUS, 1, WRITE, 0));
    let e = Request::parse(&mem, many.into_iter()).unwrap_err();
    assert!(
        matches!(e, RequestError::BufferOutsideMemory | RequestError::TooLong),
        "{e:?}"
    );
}

/// The used ring's (head, len) elements so far.
#[test]
fn a_throttled_queue_serves_each_request_once_when_tokens_come_back() {
    let contents: Vec<u8> = (0..4096u32).map(|i| (i / 512) as u8).collect();
    let disk = Disk::new("limited", &contents);
    let mem = memory();
    let metrics = Arc::new(BlockMetrics::default());
    // Two requests at once, then one every 50 ms.
    let limiter = ops_limiter(2, 100);
    let mut dev = limited_block(&disk, false, limiter, metrics.clone());
    let mq = posted_reads(&mem, 16, 5);
    let queue: Queue = mq.create_queue().unwrap();
    let irq = irq();
    dev.activate(mem.clone(), vec![queue], irq).unwrap();
    // Timed from before the bucket is emptied: on a slow host the checks between
    // could take long enough to refill it, and the wait below would look too short.
    let started = std::time::Instant::now();
    dev.process_queue();
    dev.drain();
    assert_eq!(used(&mem, &mq).len(), 2, "the bucket holds two requests");
    assert_eq!(metrics.rate_limiter_throttled_events.total(), 1);

    while used(&mem, &mq).len() < 5 {
        dev.on_limiter_timer();
        dev.drain();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    // Three more tokens at one per 50 ms.
    assert!(started.elapsed() >= std::time::Duration::from_millis(140));
    let heads: Vec<u32> = used(&mem, &mq).iter().map(|&(h, _)| h).collect();
    assert_eq!(
        heads,
        [0, 3, 6, 9, 12],
        "each request served once, in order"
    );
    assert_reads_done(&mem, 5);
    assert_eq!(metrics.read_count.total(), 5);
    assert_eq!(metrics.read_bytes.total(), 5 * 512);

    // A PATCH that lifts the limit frees the queue at once.
    dev.update_limiter(BucketUpdate::Keep, BucketUpdate::Disable);
    assert_eq!(dev.limiter_spec(), RateLimiterConfig::default());
}

#[test]
fn rescan_and_a_new_file_change_the_size_the_guest_reads_and_interrupt_it() {
    let disk = Disk::new("grow", &[1u8; 1024]);
    let other = Disk::new("other", &[9u8; 3072]);
    let mem = memory();
    let mut dev = block(&disk, false);
    let sectors = |dev: &Block| {
        let mut b = [0u8; 8];
        dev.read_config(0, &mut b);
        u64::from_le_bytes(b)
    };
    assert_eq!(sectors(&dev), 2);
    // Activated, so that the device has an interrupt to raise.
    let mq = MockSplitQueue::create(&mem, GuestAddress(0), 16);
    let irq = irq();
    dev.activate(mem.clone(), vec![mq.create_queue().unwrap()], irq.clone())
        .unwrap();
    assert_eq!(irq.status(), 0);
    let generation = dev.config_generation();

    std::fs::OpenOptions::new()
        .write(true)
        .open(&disk.path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    assert_eq!(sectors(&dev), 2, "nothing changes before the rescan");
    dev.rescan().unwrap();
    assert_eq!(sectors(&dev), 2048);
    assert_ne!(dev.config_generation(), generation);
    let config_bit = virtio_bindings::virtio_mmio::VIRTIO_MMIO_INT_CONFIG;
    assert_eq!(irq.status(), config_bit, "a configuration-change interrupt");
    irq.ack(config_bit);

    dev.replace_disk(&other.path).unwrap();
    assert_eq!(sectors(&dev), 6);
    assert_eq!(irq.status(), config_bit);
    assert!(dev
        .replace_disk(std::path::Path::new("/nonexistent/disk"))
        .is_err());
    assert_eq!(sectors(&dev), 6, "a failed replacement keeps the disk");
}

/// The same tests with the Async engine (io_uring), where the host kernel has it.
mod async_engine {
    use super::*;

    fn with_async(test: fn()) {
        if let Err(e) = super::super::io_uring::Ring::<()>::new(4) {
            eprintln!("SKIPPED the Async engine's block tests: no io_uring here ({e})");
            return;
        }
        ENGINE.set(IoEngine::Async);
        test();
    }

    /// Each named test of the Sync engine, again on the Async one.
    macro_rules! on_async {
        ($($test:ident),*) => {
            $(
                #[test]
                fn $test() {
                    with_async(super::$test);
                }
            )*
        };
    }

    on_async!(
        read_write_flush_and_get_id,
        writes_to_a_read_only_disk_and_requests_past_the_end_fail_untouched,
        hostile_chains_get_device_errors_not_panics,
        a_throttled_queue_serves_each_request_once_when_tokens_come_back,
        rescan_and_a_new_file_change_the_size_the_guest_reads_and_interrupt_it
    );

    /// Requests complete through the eventfd the event loop watches, each answered once,
    /// with its data and status.
    #[test]
    fn completions_arrive_through_the_eventfd() {
        with_async(completions);
    }

    fn completions() {
        let contents: Vec<u8> = (0..(64 * 512u32)).map(|i| (i / 512) as u8).collect();
        let disk = Disk::new("many", &contents);
        let mem = memory();
        let mut dev = block(&disk, false);
        let reads = 60u16;
        let mq = posted_reads(&mem, 256, reads);
        let irq = irq();
        dev.activate(mem.clone(), vec![mq.create_queue().unwrap()], irq.clone())
            .unwrap();
        dev.process_queue();
        let fd = dev
            .completion_fd()
            .expect("an Async device has a completion eventfd");
        let started = std::time::Instant::now();
        while used(&mem, &mq).len() < usize::from(reads) {
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the length given.
            let ready = unsafe { libc::poll(&mut poll, 1, 5000) };
            assert_eq!(ready, 1, "a completion within 5 s");
            dev.on_completions();
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
        }
        let heads: Vec<u32> = used(&mem, &mq).iter().map(|&(h, _)| h).collect();
        let mut sorted = heads.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..u32::from(reads)).map(|r| 3 * r).collect::<Vec<_>>()
        );
        assert!(used(&mem, &mq).iter().all(|&(_, len)| len == 513));
        assert_reads_done(&mem, reads);
        assert_ne!(irq.status(), 0, "the guest was interrupted");
    }
}
