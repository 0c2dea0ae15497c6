//! The net device driven from the driver's side, on a real TAP in a network namespace of its
//! own, including chains a hostile guest would build: each is returned unused or dropped,
//! never a panic, never a write outside guest memory, never a bad frame on the TAP.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::{Arc, Mutex};

use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};

use super::{MmdsLink, Net, NetConfig};
use crate::rate_limiter::{bucket, BucketUpdate, RateLimiterConfig};
use crate::virtio::test_utils::{desc, irq, memory, MEM_SIZE, NEXT, WRITE};
use crate::virtio::{GuestMemory, VirtioDevice};

const RX_Q: u64 = 0x1000;
const TX_Q: u64 = 0x8000;

/// A network namespace with one TAP (`tap0`, 10.77.0.1/24); the calling thread joins it.
struct Namespace(String);

impl Namespace {
    fn enter(tag: &str) -> Option<Namespace> {
        let name = format!("ember-unit-{}-{tag}", std::process::id());
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok(&["netns", "add", &name]) {
            eprintln!("SKIPPED net device tests: cannot create a network namespace");
            return None;
        }
        let ns = Namespace(name);
        let exec = |cmd: &[&str]| {
            let mut args = vec!["netns", "exec", &ns.0];
            args.extend_from_slice(cmd);
            assert!(ok(&args), "{cmd:?}");
        };
        exec(&["ip", "tuntap", "add", "tap0", "mode", "tap"]);
        exec(&["ip", "addr", "add", "10.77.0.1/24", "dev", "tap0"]);
        exec(&["ip", "link", "set", "tap0", "up"]);
        let file = std::fs::File::open(format!("/var/run/netns/{}", ns.0)).unwrap();
        // SAFETY: setns takes a descriptor we own; it moves only this thread.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0);
        Some(ns)
    }

    /// Frames the TAP's host side received from ember.
    fn frames_from_ember(&self) -> u64 {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.0,
                "cat",
                "/sys/class/net/tap0/statistics/rx_packets",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Rig {
    mem: GuestMemory,
    rx: MockSplitQueue<'static, GuestMemory>,
    tx: MockSplitQueue<'static, GuestMemory>,
    net: Net,
    rx_avail: u16,
    tx_avail: u16,
}

impl Rig {
    fn new(mmds: Option<MmdsLink>) -> Rig {
        Rig::limited(mmds, RateLimiterConfig::default(), Arc::default())
    }

    fn limited(
        mmds: Option<MmdsLink>,
        tx_limiter: RateLimiterConfig,
        metrics: Arc<telemetry::NetMetrics>,
    ) -> Rig {
        let mem: &'static GuestMemory = Box::leak(Box::new(memory()));
        let rx = MockSplitQueue::create(mem, GuestAddress(RX_Q), 16);
        let tx = MockSplitQueue::create(mem, GuestAddress(TX_Q), 16);
        let mut net = Net::new(&NetConfig {
            id: "eth0".into(),
            tap: "tap0".into(),
            guest_mac: Some([6, 0, 0, 0, 0, 2]),
            mtu: None,
            mmds,
            rx_limiter: RateLimiterConfig::default(),
            tx_limiter,
            metrics,
        })
        .unwrap();
        net.set_acked_features(net.avail_features());
        let queues: Vec<Queue> = vec![rx.create_queue().unwrap(), tx.create_queue().unwrap()];
        let irq = irq();
        net.activate(mem.clone(), queues, irq).unwrap();
        Rig {
            mem: mem.clone(),
            rx,
            tx,
            net,
            rx_avail: 0,
            tx_avail: 0,
        }
    }

    /// Makes a chain (its descriptors at table index `at`..) available on a queue.
    fn offer(&mut self, tx: bool, at: u16, descs: &[RawDescriptor]) {
        let (q, avail) = match tx {
            true => (&self.tx, &mut self.tx_avail),
            false => (&self.rx, &mut self.rx_avail),
        };
        for (i, d) in descs.iter().enumerate() {
            q.desc_table().store(at + i as u16, *d).unwrap();
        }
        q.avail()
            .ring()
            .ref_at(usize::from(*avail % 16))
            .unwrap()
            .store(at);
        *avail += 1;
        q.avail().idx().store(*avail);
    }

    /// The used elements of a queue so far: (head, len).
    fn used(&self, tx: bool) -> Vec<(u32, u32)> {
        let q = if tx { &self.tx } else { &self.rx };
        let idx: u16 = self
            .mem
            .read_obj(GuestAddress(q.used_addr().0 + 2))
            .unwrap();
        (0..idx)
            .map(|i| {
                let at = q.used_addr().0 + 4 + 8 * u64::from(i);
                (
                    self.mem.read_obj(GuestAddress(at)).unwrap(),
                    self.mem.read_obj(GuestAddress(at + 4)).unwrap(),
                )
            })
            .collect()
    }
}

/// A virtio-net header and an Ethernet broadcast frame of `len` bytes, at `addr`.
fn put_frame(mem: &GuestMemory, addr: u64, len: usize) -> u32 {
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&[0xff; 6]);
    frame.extend_from_slice(&[6, 0, 0, 0, 0, 2]);
    frame.extend_from_slice(&[0x88, 0xb5]);
    frame.resize(12 + len, 0x5a);
    mem.write_slice(&frame, GuestAddress(addr)).unwrap();
    frame.len() as u32
}

#[test]
fn frames_and_hostile_chains_both_ways() {
    let Some(ns) = Namespace::enter("frames") else {
        return;
    };
    let mut rig = Rig::new(None);
    let before = ns.frames_from_ember();

    // TX: one good frame, then chains a hostile driver would make.
    let len = put_frame(&rig.mem, 0x10_0000, 100);
    rig.offer(
        true,
        0,
        &[
            desc(0x10_0000, 12, NEXT, 1),
            desc(0x10_000c, len - 12, 0, 0),
        ],
    );
    rig.offer(true, 2, &[desc(0x10_0000, len, WRITE, 0)]);
    rig.offer(true, 3, &[desc(MEM_SIZE as u64 - 8, 64, 0, 0)]);
    rig.offer(true, 4, &[desc(0x10_0000, 8, 0, 0)]);
    rig.offer(
        true,
        5,
        &[
            desc(0x10_0000, 40_000, NEXT, 6),
            desc(0x10_0000, 40_000, 0, 0),
        ],
    );
    // A chain that loops on itself ends at the queue size: 16 × 20 bytes of the guest's own
    // memory, which is a frame like any other.
    rig.offer(true, 7, &[desc(0x10_0000, 20, NEXT, 7)]);
    rig.net.process_tx();
    let used = rig.used(true);
    assert_eq!(used.len(), 6, "{used:?}");
    assert!(used.iter().all(|&(_, n)| n == 0));
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        ns.frames_from_ember() - before,
        2,
        "only the good frame and the looped one reached the TAP"
    );

    // RX: the host side sends three frames (ARP requests for three addresses). The first
    // meets a buffer too small, the second a read-only one, the third a good one.
    let udp = std::net::UdpSocket::bind("10.77.0.1:0").unwrap();
    for host in 2..5u8 {
        let _ = udp.send_to(b"x", (Ipv4Addr::new(10, 77, 0, host), 9));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    rig.offer(false, 0, &[desc(0x20_0000, 10, WRITE, 0)]);
    rig.offer(false, 1, &[desc(0x20_0000, 2048, 0, 0)]);
    rig.offer(
        false,
        2,
        &[
            desc(0x30_0000, 20, NEXT | WRITE, 3),
            desc(0x30_0014, 2028, WRITE, 0),
        ],
    );
    rig.net.process_rx();
    let used = rig.used(false);
    assert_eq!(used.len(), 3, "{used:?}");
    assert_eq!((used[0].1, used[1].1), (0, 0));
    assert_eq!(used[2].0, 2);
    // The host may also send IPv6 chatter on a new link, so the frame is one of those or an
    // ARP request; either way whole, with its header.
    assert!((12 + 42..=2048).contains(&used[2].1), "{used:?}");
    let mut got = [0u8; 26];
    rig.mem
        .read_slice(&mut got, GuestAddress(0x30_0000))
        .unwrap();
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
    assert!(
        matches!(got[24..26], [0x08, 0x06] | [0x86, 0xdd]),
        "{got:?}"
    );
    // Nothing was written past the 10-byte buffer the first frame met.
    let mut after = [0u8; 4];
    rig.mem
        .read_slice(&mut after, GuestAddress(0x20_000a))
        .unwrap();
    assert_eq!(after, [0; 4]);
}

#[test]
fn the_mmds_answers_arp_and_its_frames_stay_off_the_tap() {
    let Some(ns) = Namespace::enter("mmds") else {
        return;
    };
    let store = Arc::new(Mutex::new(mmds::DataStore::default()));
    let ip = Ipv4Addr::new(169, 254, 169, 254);
    let mut rig = Rig::new(Some(MmdsLink { ip, store }));
    let before = ns.frames_from_ember();
    let mut arp = vec![0u8; 12];
    arp.extend_from_slice(&[0xff; 6]);
    arp.extend_from_slice(&[6, 0, 0, 0, 0, 2, 0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1, 6, 0, 0, 0, 0, 2, 10, 77, 0, 2]);
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&ip.octets());
    rig.mem.write_slice(&arp, GuestAddress(0x10_0000)).unwrap();
    rig.offer(false, 0, &[desc(0x20_0000, 2048, WRITE, 0)]);
    rig.offer(true, 0, &[desc(0x10_0000, arp.len() as u32, 0, 0)]);
    rig.net.process_tx();
    let used = rig.used(false);
    assert_eq!(used, vec![(0, 12 + 42)]);
    let mut reply = [0u8; 54];
    rig.mem
        .read_slice(&mut reply, GuestAddress(0x20_0000))
        .unwrap();
    assert_eq!(&reply[12..18], &[6, 0, 0, 0, 0, 2]);
    assert_eq!(&reply[12 + 14 + 6..12 + 14 + 8], &[0, 2], "an ARP reply");
    assert_eq!(&reply[12 + 14 + 14..12 + 14 + 18], &ip.octets());
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        ns.frames_from_ember(),
        before,
        "the ARP request did not reach the TAP"
    );
}

#[test]
fn without_rx_buffers_frames_wait_in_the_tap() {
    let Some(_ns) = Namespace::enter("backpressure") else {
        return;
    };
    let mut rig = Rig::new(None);
    // Broadcasts need no ARP: each send is one frame on the TAP.
    let udp = std::net::UdpSocket::bind("10.77.0.1:0").unwrap();
    udp.set_broadcast(true).unwrap();
    for _ in 0..5 {
        udp.send_to(b"x", (Ipv4Addr::new(10, 77, 0, 255), 9))
            .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    // No buffers: nothing is used however often ember is woken, and it holds one frame
    // (the others stay in the TAP, whose queue the host bounds), which is not lost.
    for _ in 0..3 {
        assert!(!rig.net.process_rx());
    }
    assert!(rig.net.has_waiting_frame());
    assert!(rig.used(false).is_empty());
    // A buffer: the held frame goes to the guest.
    rig.offer(false, 0, &[desc(0x20_0000, 2048, WRITE, 0)]);
    assert!(rig.net.process_rx());
    assert_eq!(rig.used(false).len(), 1);
}

#[test]
fn a_throttled_tx_queue_sends_each_frame_once_when_tokens_come_back() {
    let Some(ns) = Namespace::enter("limited") else {
        return;
    };
    let metrics = Arc::new(telemetry::NetMetrics::default());
    // Two frames at once, then one every 50 ms; and 1 MB of bandwidth that never binds.
    let limiter = RateLimiterConfig {
        bandwidth: bucket(1 << 20, 1000),
        ops: bucket(2, 100),
    };
    let mut rig = Rig::limited(None, limiter, metrics.clone());
    let before = ns.frames_from_ember();
    let len = put_frame(&rig.mem, 0x10_0000, 200);
    for i in 0..5 {
        rig.offer(true, i, &[desc(0x10_0000, len, 0, 0)]);
    }
    // Timed from before the bucket is emptied: on a slow host the checks between
    // could take long enough to refill it, and the wait below would look too short.
    let started = std::time::Instant::now();
    rig.net.process_tx();
    assert_eq!(rig.used(true).len(), 2);
    assert_eq!(ns.frames_from_ember() - before, 2);
    while rig.used(true).len() < 5 {
        rig.net.on_tx_limiter_timer();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(140),
        "{:?}",
        started.elapsed()
    );
    let heads: Vec<u32> = rig.used(true).iter().map(|&(h, _)| h).collect();
    assert_eq!(heads, [0, 1, 2, 3, 4], "each frame once, in order");
    assert_eq!(ns.frames_from_ember() - before, 5);
    assert_eq!(metrics.tx_packets_count.total(), 5);
    assert_eq!(metrics.tx_bytes_count.total(), 5 * u64::from(len - 12));
    assert!(metrics.tx_rate_limiter_throttled.total() >= 1);

    // A PATCH that removes the ops bucket lets a burst through at once.
    rig.net
        .update_limiters(None, Some((BucketUpdate::Keep, BucketUpdate::Disable)));
    for i in 5..10 {
        rig.offer(true, i, &[desc(0x10_0000, len, 0, 0)]);
    }
    rig.net.process_tx();
    assert_eq!(rig.used(true).len(), 10);
    assert_eq!(rig.net.limiter_specs().1.ops, None);
}
