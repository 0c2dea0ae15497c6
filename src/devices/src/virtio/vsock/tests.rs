//! The vsock device from the driver's side on real guest memory, with real host Unix
//! sockets: both connection directions, data and credit, shutdown and reset, and the
//! packets a hostile guest would send.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use telemetry::VsockMetrics;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::tempdir::TempDir;

use super::packet::*;
use super::{Vsock, VsockConfig, BUF_ALLOC};
use crate::virtio::test_utils::{irq, memory, MEM_SIZE, NEXT, WRITE};
use crate::virtio::{GuestMemory, VirtioDevice};

const CID: u64 = 3;
const QSIZE: u16 = 64;
const RX_BUFS: u64 = 0x40_0000;
const TX_BUFS: u64 = 0x80_0000;

/// A fresh directory, removed when the test ends (passed or not).
fn scratch(name: &str) -> TempDir {
    TempDir::new_with_prefix(std::env::temp_dir().join(format!("ember-vsock-{name}-"))).unwrap()
}

/// A split virtqueue of QSIZE at `.0`: the descriptor table, then the available ring at
/// +0x400, then the used ring at +0x800 (virtio-queue's mock lets its rings overlap past 32
/// entries).
#[derive(Debug, Clone, Copy)]
struct Ring(u64);

impl Ring {
    fn desc(self) -> u64 {
        self.0
    }

    fn avail(self) -> u64 {
        self.0 + 0x400
    }

    fn used(self) -> u64 {
        self.0 + 0x800
    }

    fn queue(self) -> Queue {
        let mut q = Queue::new(QSIZE).unwrap();
        q.set_size(QSIZE);
        let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
        let (lo, hi) = split(self.desc());
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.avail());
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.used());
        q.set_used_ring_address(lo, hi);
        q.set_ready(true);
        q
    }
}

/// The guest driver's side: the RX and TX queues, and how far it has read and filled them.
struct Driver {
    mem: GuestMemory,
    rx: Ring,
    tx: Ring,
    rx_posted: u16,
    rx_seen: u16,
    tx_posted: u16,
}

impl Driver {
    /// Makes a chain of `descs` available on `ring` (chain `n`), in 4-descriptor slots.
    fn push(&self, ring: Ring, n: u16, descs: &[Descriptor]) {
        let base = (n * 4) % QSIZE;
        for (i, d) in descs.iter().enumerate() {
            let i = i as u16;
            let last = i + 1 == descs.len() as u16;
            let (flags, next) = match last {
                true => (d.flags(), 0),
                false => (d.flags() | NEXT, base + i + 1),
            };
            let raw = RawDescriptor::from(Descriptor::new(d.addr().0, d.len(), flags, next));
            let at = ring.desc() + 16 * u64::from(base + i);
            self.mem.write_obj(raw, GuestAddress(at)).unwrap();
        }
        let slot = ring.avail() + 4 + 2 * u64::from(n % QSIZE);
        self.mem.write_obj(base, GuestAddress(slot)).unwrap();
        self.mem
            .write_obj(n + 1, GuestAddress(ring.avail() + 2))
            .unwrap();
    }

    /// How many chains the device has returned on `ring`.
    fn used_count(&self, ring: Ring) -> u16 {
        self.mem.read_obj(GuestAddress(ring.used() + 2)).unwrap()
    }

    /// Posts an RX chain.
    fn post_rx_chain(&mut self, descs: &[Descriptor]) {
        self.push(self.rx, self.rx_posted, descs);
        self.rx_posted += 1;
    }

    /// Posts `n` RX buffers of a header and 4 KiB, as Linux 6.1 does (two descriptors).
    fn post_rx(&mut self, n: u16) {
        for _ in 0..n {
            let at = RX_BUFS + u64::from(self.rx_posted % 16) * 0x2000;
            self.post_rx_chain(&[
                Descriptor::new(at, HEADER_LEN as u32, WRITE, 0),
                Descriptor::new(at + 0x100, 4096, WRITE, 0),
            ]);
        }
    }

    /// Packets the device put in RX buffers since the last call.
    fn received(&mut self) -> Vec<(Header, Vec<u8>)> {
        let used_idx = self.used_count(self.rx);
        let mut out = Vec::new();
        for k in self.rx_seen..used_idx {
            let entry = self.rx.used() + 4 + 8 * u64::from(k % QSIZE);
            let head: u32 = self.mem.read_obj(GuestAddress(entry)).unwrap();
            let len: u32 = self.mem.read_obj(GuestAddress(entry + 4)).unwrap();
            let at = RX_BUFS + u64::from(head / 4) * 0x2000;
            let mut raw = [0u8; HEADER_LEN];
            self.mem.read_slice(&mut raw, GuestAddress(at)).unwrap();
            let h = Header::parse(&raw);
            assert_eq!(len as usize, HEADER_LEN + h.len as usize);
            let mut payload = vec![0u8; h.len as usize];
            self.mem
                .read_slice(&mut payload, GuestAddress(at + 0x100))
                .unwrap();
            out.push((h, payload));
        }
        self.rx_seen = used_idx;
        out
    }

    /// Queues a packet on TX: the header and payload in two descriptors.
    fn send(&mut self, h: Header, payload: &[u8]) {
        let at = TX_BUFS + u64::from(self.tx_posted % 16) * 0x2_0000;
        self.mem
            .write_slice(&h.to_bytes(), GuestAddress(at))
            .unwrap();
        self.mem
            .write_slice(payload, GuestAddress(at + 0x100))
            .unwrap();
        let mut descs = vec![Descriptor::new(at, HEADER_LEN as u32, 0, 0)];
        if !payload.is_empty() {
            descs.push(Descriptor::new(at + 0x100, payload.len() as u32, 0, 0));
        }
        self.send_raw(&descs);
    }

    /// Queues a raw chain on TX.
    fn send_raw(&mut self, descs: &[Descriptor]) {
        self.push(self.tx, self.tx_posted, descs);
        self.tx_posted += 1;
    }
}

fn header(op: u16, src_port: u32, dst_port: u32, len: u32) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len,
        kind: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 256 << 10,
        fwd_cnt: 0,
    }
}

/// The device, started, with its socket in a scratch directory tagged `name` (kept until
/// the test ends), and a driver on its queues.
fn rig(name: &str) -> (TempDir, Vsock, Driver, Arc<VsockMetrics>) {
    let mem = memory();
    let dir = scratch(name);
    let path = dir.as_path().join("v.sock");
    let metrics = Arc::new(VsockMetrics::default());
    let mut dev = Vsock::new(VsockConfig {
        guest_cid: CID,
        uds_path: path.clone(),
        listener: UnixListener::bind(&path).unwrap(),
        metrics: metrics.clone(),
    })
    .unwrap();
    let rings: Vec<Ring> = (0..3).map(|i| Ring(0x20_0000 + 0x1_0000 * i)).collect();
    let queues = rings.iter().map(|r| r.queue()).collect();
    let irq = irq();
    dev.activate(mem.clone(), queues, irq).unwrap();
    let driver = Driver {
        mem,
        rx: rings[0],
        tx: rings[1],
        rx_posted: 0,
        rx_seen: 0,
        tx_posted: 0,
    };
    (dir, dev, driver, metrics)
}

/// Runs the device as the event loop would after `events` on every connection.
fn pump(dev: &mut Vsock) {
    dev.process_tx();
    let ids: Vec<u32> = dev.conns.keys().copied().collect();
    for id in ids {
        dev.on_conn_event(id, EventSet::IN | EventSet::OUT);
    }
    dev.process_rx();
}

/// Every connection's deadline passes, and the timer fires.
fn expire_deadlines(dev: &mut Vsock) {
    for c in dev.conns.values_mut() {
        c.deadline = Some(std::time::Instant::now());
    }
    dev.on_timer();
}

/// The device holds no connection and, once it has closed what it dropped (the VMM
/// thread's next pass), the host end reads the end of the stream and nothing before it.
fn assert_host_closed(dev: &mut Vsock, host: &mut UnixStream) {
    assert_eq!(dev.connections(), 0);
    dev.closed.clear();
    let mut rest = Vec::new();
    host.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

fn read_line(s: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap() == 1 {
        line.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    String::from_utf8(line).unwrap()
}

/// A host connection through `CONNECT 52`, accepted by the guest; returns the host stream
/// and ember's port for it.
fn host_connection(dev: &mut Vsock, d: &mut Driver) -> (UnixStream, u32) {
    let mut host = UnixStream::connect(dev.uds_path.clone()).unwrap();
    host.write_all(b"CONNECT 52\n").unwrap();
    dev.accept_all();
    d.post_rx(1);
    dev.process_rx();
    let got = d.received();
    assert_eq!(got.len(), 1);
    let req = got[0].0;
    assert_eq!((req.op, req.dst_cid, req.dst_port), (OP_REQUEST, CID, 52));
    assert_eq!(req.src_cid, HOST_CID);
    d.send(header(OP_RESPONSE, 52, req.src_port, 0), &[]);
    dev.process_tx();
    assert_eq!(read_line(&mut host), format!("OK {}\n", req.src_port));
    (host, req.src_port)
}

#[test]
fn a_host_connection_carries_data_both_ways_and_its_close_reaches_the_guest() {
    let (_dir, mut dev, mut d, metrics) = rig("host");
    let (mut host, port) = host_connection(&mut dev, &mut d);
    // Host to guest.
    host.write_all(b"hello guest").unwrap();
    d.post_rx(4);
    pump(&mut dev);
    let got = d.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.op, got[0].1.as_slice()),
        (OP_RW, &b"hello guest"[..])
    );
    // Guest to host.
    d.send(header(OP_RW, 52, port, 11), b"hello host!");
    pump(&mut dev);
    let mut b = [0u8; 11];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello host!");
    assert_eq!(metrics.tx_bytes_count.total(), 11);
    assert_eq!(metrics.rx_bytes_count.total(), 11);
    // The host closes: the guest is told it will get and take nothing more.
    drop(host);
    let id = *dev.ports.values().next().unwrap();
    dev.on_conn_event(id, EventSet::IN | EventSet::HANG_UP);
    dev.process_rx();
    let got = d.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0.op, OP_SHUTDOWN);
    assert_eq!(got[0].0.flags, SHUTDOWN_RCV | SHUTDOWN_SEND);
    // The guest's RST ends the connection.
    d.send(header(OP_RST, 52, port, 0), &[]);
    dev.process_tx();
    assert_eq!(dev.connections(), 0);
}

#[test]
fn a_guest_connection_reaches_the_port_socket_and_a_missing_one_is_refused() {
    let (dir, mut dev, mut d, _) = rig("guest");
    let listener = UnixListener::bind(dir.as_path().join("v.sock_1234")).unwrap();
    d.post_rx(4);
    d.send(header(OP_REQUEST, 7000, 1234, 0), &[]);
    d.send(header(OP_REQUEST, 7001, 999, 0), &[]);
    pump(&mut dev);
    let got = d.received();
    let ops: Vec<(u16, u32)> = got.iter().map(|(h, _)| (h.op, h.dst_port)).collect();
    assert!(ops.contains(&(OP_RESPONSE, 7000)), "{ops:?}");
    assert!(ops.contains(&(OP_RST, 7001)), "{ops:?}");
    let (mut peer, _) = listener.accept().unwrap();
    d.send(header(OP_RW, 7000, 1234, 3), b"abc");
    // The guest will send no more: the host reads the end after the data.
    let mut shut = header(OP_SHUTDOWN, 7000, 1234, 0);
    shut.flags = SHUTDOWN_SEND;
    d.send(shut, &[]);
    pump(&mut dev);
    let mut all = Vec::new();
    peer.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"abc");
}

#[test]
fn a_guest_that_sends_past_its_credit_is_reset_and_ember_holds_at_most_the_credit() {
    let (_dir, mut dev, mut d, _) = rig("credit");
    let (host, port) = host_connection(&mut dev, &mut d);
    // The host reads nothing: its socket buffer fills, then ember's buffer, then the
    // guest is over its credit.
    let chunk = vec![7u8; 64 << 10];
    let mut sent = 0usize;
    d.post_rx(8);
    while dev.connections() == 1 && sent < 64 << 20 {
        d.send(header(OP_RW, 52, port, chunk.len() as u32), &chunk);
        dev.process_tx();
        sent += chunk.len();
        let conn = dev.conns.values().next();
        assert!(conn.is_none_or(|c| c.pending_len() <= BUF_ALLOC as usize));
    }
    dev.process_rx();
    let ops: Vec<u16> = d.received().iter().map(|(h, _)| h.op).collect();
    assert!(ops.contains(&OP_RST), "{ops:?} after {sent} bytes");
    // The host socket's buffer took the rest (its size depends on the host's settings).
    eprintln!("reset after {sent} bytes");
    drop(host);
}

#[test]
fn a_malformed_connect_line_is_refused_and_the_host_sees_the_end() {
    let (_dir, mut dev, _d, _) = rig("connect");
    for bad in [
        &b"CONNECT x\n"[..],
        b"HELLO WORLD THIS IS FAR TOO LONG FOR A LINE\n",
    ] {
        let mut host = UnixStream::connect(dev.uds_path.clone()).unwrap();
        host.write_all(bad).unwrap();
        dev.accept_all();
        // Closed on the VMM thread's next pass.
        dev.closed.clear();
        let mut rest = Vec::new();
        let _ = host.read_to_end(&mut rest);
        assert!(rest.is_empty());
    }
    assert_eq!(dev.connections(), 0);
}

#[test]
fn an_unanswered_request_times_out_and_the_host_socket_closes() {
    let (_dir, mut dev, mut d, _) = rig("timeout");
    let mut host = UnixStream::connect(dev.uds_path.clone()).unwrap();
    host.write_all(b"CONNECT 52\n").unwrap();
    dev.accept_all();
    d.post_rx(2);
    dev.process_rx();
    assert_eq!(d.received()[0].0.op, OP_REQUEST);
    expire_deadlines(&mut dev);
    dev.process_rx();
    assert_eq!(d.received()[0].0.op, OP_RST);
    assert_host_closed(&mut dev, &mut host);
}

#[test]
fn hostile_packets_are_dropped_or_reset_and_the_device_keeps_working() {
    let (_dir, mut dev, mut d, metrics) = rig("hostile");
    d.post_rx(16);
    let at = TX_BUFS + 0x10_0000;
    let h = |op, kind| Header {
        kind,
        ..header(op, 9, 1, 0)
    };
    // A header cut short.
    d.mem
        .write_slice(&h(OP_REQUEST, TYPE_STREAM).to_bytes(), GuestAddress(at))
        .unwrap();
    d.send_raw(&[Descriptor::new(at, 20, 0, 0)]);
    // A length past the chain, and one past the largest payload.
    let mut long = h(OP_RW, TYPE_STREAM);
    long.len = 100;
    d.send(long, &[1; 10]);
    long.len = u32::MAX;
    d.send(long, &[]);
    // A device-writable buffer, one outside guest memory, one whose address wraps.
    d.send_raw(&[Descriptor::new(at, HEADER_LEN as u32, WRITE, 0)]);
    d.send_raw(&[Descriptor::new(MEM_SIZE as u64 - 8, 64, 0, 0)]);
    d.send_raw(&[Descriptor::new(u64::MAX - 8, 64, 0, 0)]);
    // Wrong CIDs: from another guest, to a third.
    d.send(
        Header {
            src_cid: 77,
            ..h(OP_REQUEST, TYPE_STREAM)
        },
        &[],
    );
    d.send(
        Header {
            dst_cid: 4,
            ..h(OP_REQUEST, TYPE_STREAM)
        },
        &[],
    );
    d.send(
        Header {
            src_cid: u64::MAX,
            ..h(OP_REQUEST, TYPE_STREAM)
        },
        &[],
    );
    // A seqpacket, an unknown op, data for no connection: each gets an RST.
    d.send(h(OP_REQUEST, 2), &[]);
    d.send(h(99, TYPE_STREAM), &[]);
    d.send(h(OP_RW, TYPE_STREAM), &[]);
    pump(&mut dev);
    let got = d.received();
    let rsts = got.iter().filter(|(h, _)| h.op == OP_RST).count();
    assert_eq!((rsts, got.len()), (3, 3), "{got:?}");
    assert!(got
        .iter()
        .all(|(h, _)| h.dst_cid == CID && h.src_cid == HOST_CID));
    assert_eq!(metrics.invalid_packets.total(), 10);
    assert!(
        d.mem
            .read_obj::<u64>(GuestAddress(MEM_SIZE as u64 - 8))
            .unwrap()
            == 0
    );
    // Still works.
    let (mut host, port) = host_connection(&mut dev, &mut d);
    d.send(header(OP_RW, 52, port, 2), b"ok");
    pump(&mut dev);
    let mut b = [0u8; 2];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ok");
}

#[test]
fn a_guest_that_sends_without_reading_stalls_its_own_tx_queue_not_ember() {
    let (_dir, mut dev, mut d, _) = rig("stall");
    // 272 packets for no connection, each owed an RST, with no RX buffers at first: after
    // 256 the device stops reading them.
    for _ in 0..17 {
        for i in 0..16 {
            d.send(header(OP_RW, 9000 + i, 1, 0), &[]);
        }
        dev.process_tx();
    }
    assert_eq!(dev.orphan_rsts.len(), super::MAX_ORPHAN_RSTS);
    assert!(dev.tx_stalled);
    assert_eq!(d.used_count(d.tx), 256, "16 packets wait in the ring");
    let mut rsts = 0;
    for _ in 0..40 {
        d.post_rx(16);
        dev.process_rx();
        rsts += d.received().iter().filter(|(h, _)| h.op == OP_RST).count();
    }
    assert_eq!(rsts, 272);
    assert!(!dev.tx_stalled);
}

#[test]
fn a_receive_buffer_with_no_room_after_the_header_is_not_the_end_of_the_stream() {
    let (_dir, mut dev, mut d, metrics) = rig("tiny");
    let (mut host, _) = host_connection(&mut dev, &mut d);
    host.write_all(b"data").unwrap();
    // A header-only buffer first, then a real one.
    let at = RX_BUFS + 0x3_0000;
    d.post_rx_chain(&[Descriptor::new(at, HEADER_LEN as u32, WRITE, 0)]);
    pump(&mut dev);
    assert_eq!(metrics.invalid_packets.total(), 1);
    d.rx_seen += 1;
    d.post_rx(1);
    dev.process_rx();
    let got = d.received();
    assert_eq!((got[0].0.op, got[0].1.as_slice()), (OP_RW, &b"data"[..]));
}

#[test]
fn a_host_connection_that_never_names_a_port_is_closed_after_its_deadline() {
    let (_dir, mut dev, _d, _) = rig("silent");
    let mut host = UnixStream::connect(dev.uds_path.clone()).unwrap();
    host.write_all(b"CONN").unwrap();
    dev.accept_all();
    assert_eq!(dev.connections(), 1);
    let deadline = dev.conns.values().next().unwrap().deadline.unwrap();
    let wait = deadline - std::time::Instant::now();
    assert!(wait > super::CONNECT_LINE_TIMEOUT / 2, "{wait:?}");
    expire_deadlines(&mut dev);
    assert_host_closed(&mut dev, &mut host);
}

/// After a restore the guest is told of the transport reset (event 0 in its event buffer),
/// and nothing enters the RX queue until it has handled it (it gives the buffer back), or
/// until the wait runs out: a connection the host opens at once is not reset with the old.
#[test]
fn after_a_restore_the_guest_handles_the_reset_before_any_new_connection() {
    use crate::virtio::VirtioDevice;
    let (_dir, mut dev, mut d, _) = rig("restored");
    let event = Ring(0x20_0000 + 0x2_0000);
    let event_buf = 0x30_0000;
    d.mem
        .write_obj(0xffff_ffffu32, GuestAddress(event_buf))
        .unwrap();
    d.push(event, 0, &[Descriptor::new(event_buf, 4, WRITE, 0)]);
    dev.restored();
    assert_eq!(d.used_count(event), 1);
    assert_eq!(d.mem.read_obj::<u32>(GuestAddress(event_buf)).unwrap(), 0);

    let mut host = UnixStream::connect(dev.uds_path.clone()).unwrap();
    host.write_all(b"CONNECT 52\n").unwrap();
    dev.accept_all();
    d.post_rx(1);
    dev.process_rx();
    assert!(
        d.received().is_empty(),
        "a packet went in before the reset was handled"
    );
    // The driver handled the event and gave the buffer back.
    d.push(event, 1, &[Descriptor::new(event_buf, 4, WRITE, 0)]);
    dev.common.queue_event(2).write(1).unwrap();
    dev.event_queue_kicked();
    dev.process_rx();
    let got = d.received();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.op, got[0].0.dst_port), (OP_REQUEST, 52));

    // A guest that never gives the buffer back is served once the wait has run out.
    dev.restored();
    let mut other = UnixStream::connect(dev.uds_path.clone()).unwrap();
    other.write_all(b"CONNECT 53\n").unwrap();
    dev.accept_all();
    d.post_rx(1);
    dev.process_rx();
    assert!(d.received().is_empty());
    dev.reset_unacked = Some(std::time::Instant::now());
    dev.process_rx();
    let got = d.received();
    assert_eq!((got[0].0.op, got[0].0.dst_port), (OP_REQUEST, 53));
    drop((host, other));
}
