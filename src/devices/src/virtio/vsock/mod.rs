//! virtio-vsock with Firecracker's host side: guest streams become host Unix-socket streams.
//!
//! - Host to guest: a host process connects to `uds_path` and writes `CONNECT <port>\n`;
//!   ember sends the guest a REQUEST for that port and, on its RESPONSE, answers the host
//!   `OK <host_port>\n`. If the guest refuses (an RST) or does not answer in time, the host
//!   socket is closed.
//! - Guest to host: a REQUEST to CID 2 port P is connected to `<uds_path>_P`, or refused
//!   with an RST.
//!
//! Everything runs on the VMM thread. Each connection's socket is watched edge-triggered;
//! connections with something for the guest wait in a queue served in turn as RX buffers
//! come. What the guest sends is checked (CIDs, lengths, ops, credit) and anything wrong is
//! dropped or answered with an RST; it never stops the device.

mod conn;
pub mod host;
pub mod packet;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::{EventOps, Events, MutEventSubscriber};
use telemetry::VsockMetrics;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory as _, Permissions};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use self::conn::{owe, Conn, Line, Next, State};
use self::packet::*;
use crate::virtio::device::{checked_queues, read_config_bytes};
use crate::virtio::{ActivateError, GuestMemory, InterruptKind, IrqTrigger, VirtioDevice};

pub use self::conn::BUF_ALLOC;

/// virtio-vsock's device ID (virtio 1.2, 5).
pub const VIRTIO_ID_VSOCK: u32 = 19;
pub const QUEUE_SIZE: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
const EVENT: usize = 2;
/// Connections at once (Firecracker's limit too); more are refused.
pub const MAX_CONNS: usize = 1023;
/// RSTs for packets that match no connection, waiting for RX buffers; while this many wait,
/// the TX queue is not read, so a guest that sends without reading cannot grow it.
const MAX_ORPHAN_RSTS: usize = 256;
/// How long the guest has to answer a REQUEST, or a full SHUTDOWN with an RST.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Ports ember gives host-initiated connections start here.
const FIRST_HOST_PORT: u32 = 1 << 30;

/// What the builder needs to make the vsock device; the listener is bound by `PUT /vsock`.
#[derive(Debug)]
pub struct VsockConfig {
    pub guest_cid: u64,
    pub uds_path: PathBuf,
    pub listener: UnixListener,
    pub metrics: Arc<VsockMetrics>,
}

struct Active {
    mem: GuestMemory,
    queues: Vec<Queue>,
    irq: Arc<IrqTrigger>,
}

/// Why a TX chain is not a packet.
#[derive(Debug, PartialEq, Eq)]
enum Bad {
    WriteOnly,
    OutsideMemory,
    Short,
    Length,
}

pub struct Vsock {
    cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    acked_features: u64,
    queue_events: [EventFd; 3],
    timer: TimerFd,
    armed: Option<Instant>,
    active: Option<Active>,
    conns: HashMap<u32, Conn>,
    /// (host port, guest port) to connection.
    ports: HashMap<(u32, u32), u32>,
    /// Connections with something for the guest, served in turn.
    queue: VecDeque<u32>,
    orphan_rsts: VecDeque<Header>,
    tx_stalled: bool,
    /// New connections, watched from the VMM thread's next `process`.
    to_watch: Vec<u32>,
    /// Ended connections, unwatched and closed there (a reset runs on a vCPU thread).
    closed: Vec<Conn>,
    next_id: u32,
    next_port: u32,
    metrics: Arc<VsockMetrics>,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Vsock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vsock")
            .field("cid", &self.cid)
            .field("conns", &self.conns.len())
            .finish()
    }
}

/// The chain's device-writable buffers, capped at a header and the largest payload.
fn writable_buffers(
    mem: &GuestMemory,
    chain: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
) -> Option<Vec<(GuestAddress, usize)>> {
    let mut out = Vec::new();
    let mut room = HEADER_LEN + MAX_PAYLOAD as usize;
    for d in chain {
        if !d.is_write_only() || !mem.check_range(d.addr(), d.len() as usize, Permissions::Write) {
            return None;
        }
        let len = (d.len() as usize).min(room);
        if len > 0 {
            out.push((d.addr(), len));
            room -= len;
        }
    }
    Some(out)
}

/// Reads a TX chain (header and payload) into `buf`; returns the header.
fn read_packet(
    mem: &GuestMemory,
    chain: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
    buf: &mut Vec<u8>,
) -> Result<Header, Bad> {
    buf.clear();
    let cap = HEADER_LEN + MAX_PAYLOAD as usize;
    for d in chain {
        if d.is_write_only() {
            return Err(Bad::WriteOnly);
        }
        let len = d.len() as usize;
        if !mem.check_range(d.addr(), len, Permissions::Read) {
            return Err(Bad::OutsideMemory);
        }
        let take = len.min(cap - buf.len());
        let at = buf.len();
        buf.resize(at + take, 0);
        mem.read_slice(&mut buf[at..], d.addr())
            .map_err(|_| Bad::OutsideMemory)?;
    }
    let Some(raw) = buf.first_chunk::<HEADER_LEN>() else {
        return Err(Bad::Short);
    };
    let header = Header::parse(raw);
    if header.len > MAX_PAYLOAD || header.len as usize > buf.len() - HEADER_LEN {
        return Err(Bad::Length);
    }
    buf.truncate(HEADER_LEN + header.len as usize);
    Ok(header)
}

/// Writes `bytes` across `bufs`; false if they do not fit.
fn write_buffers(mem: &GuestMemory, bufs: &[(GuestAddress, usize)], bytes: &[u8]) -> bool {
    let mut done = 0;
    for &(addr, len) in bufs {
        if done == bytes.len() {
            break;
        }
        let n = len.min(bytes.len() - done);
        if mem.write_slice(&bytes[done..done + n], addr).is_err() {
            return false;
        }
        done += n;
    }
    done == bytes.len()
}

fn op_for(bit: u8) -> u16 {
    match bit {
        owe::RST => OP_RST,
        owe::REQUEST => OP_REQUEST,
        owe::RESPONSE => OP_RESPONSE,
        owe::SHUTDOWN => OP_SHUTDOWN,
        owe::CREDIT_UPDATE => OP_CREDIT_UPDATE,
        _ => OP_CREDIT_REQUEST,
    }
}

impl Vsock {
    pub fn new(config: VsockConfig) -> std::io::Result<Self> {
        config.listener.set_nonblocking(true)?;
        let event = || EventFd::new(libc::EFD_NONBLOCK);
        Ok(Vsock {
            cid: config.guest_cid,
            uds_path: config.uds_path,
            listener: config.listener,
            acked_features: 0,
            queue_events: [event()?, event()?, event()?],
            timer: TimerFd::new()?,
            armed: None,
            active: None,
            conns: HashMap::new(),
            ports: HashMap::new(),
            queue: VecDeque::new(),
            orphan_rsts: VecDeque::new(),
            tx_stalled: false,
            to_watch: Vec::new(),
            closed: Vec::new(),
            next_id: 1,
            next_port: FIRST_HOST_PORT,
            metrics: config.metrics,
            buf: Vec::new(),
        })
    }

    pub fn guest_cid(&self) -> u64 {
        self.cid
    }

    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    fn add_conn(&mut self, conn: Conn) -> u32 {
        while self.next_id == 0 || self.conns.contains_key(&self.next_id) {
            self.next_id = self.next_id.wrapping_add(1);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        if conn.state != State::ReadingConnect {
            self.ports.insert((conn.local_port, conn.peer_port), id);
        }
        self.conns.insert(id, conn);
        self.to_watch.push(id);
        self.metrics.conns_added.inc();
        id
    }

    fn remove_conn(&mut self, id: u32) {
        if let Some(conn) = self.conns.remove(&id) {
            if self.ports.get(&(conn.local_port, conn.peer_port)) == Some(&id) {
                self.ports.remove(&(conn.local_port, conn.peer_port));
            }
            self.closed.push(conn);
            self.metrics.conns_removed.inc();
        }
    }

    /// Ends a connection with an RST to the guest (the host socket closes once it is sent).
    fn kill(&mut self, id: u32) {
        if let Some(conn) = self.conns.get_mut(&id) {
            match conn.state {
                // The guest never heard of it.
                State::ReadingConnect => return self.remove_conn(id),
                _ => {
                    conn.owed = owe::RST;
                    conn.deadline = None;
                }
            }
            self.metrics.conns_killed.inc();
            self.schedule(id);
        }
    }

    /// Queues a connection for the RX loop if it is not queued already.
    fn schedule(&mut self, id: u32) {
        if let Some(conn) = self.conns.get_mut(&id) {
            if !conn.queued {
                conn.queued = true;
                self.queue.push_back(id);
            }
        }
    }

    fn orphan_rst(&mut self, to: &Header) {
        if self.orphan_rsts.len() < MAX_ORPHAN_RSTS {
            self.orphan_rsts.push_back(Header {
                src_cid: HOST_CID,
                dst_cid: self.cid,
                src_port: to.dst_port,
                dst_port: to.src_port,
                kind: TYPE_STREAM,
                op: OP_RST,
                ..Header::default()
            });
        }
    }

    /// Reads every packet the guest queued, while the RSTs owed for them have room.
    pub fn process_tx(&mut self) -> bool {
        let Some(mut active) = self.active.take() else {
            return false;
        };
        let mut buf = std::mem::take(&mut self.buf);
        let mut used_any = false;
        self.tx_stalled = false;
        loop {
            if self.orphan_rsts.len() >= MAX_ORPHAN_RSTS {
                self.tx_stalled = true;
                break;
            }
            let Some(chain) = active.queues[TX].pop_descriptor_chain(&active.mem) else {
                break;
            };
            let head = chain.head_index();
            let packet = read_packet(&active.mem, chain, &mut buf);
            if active.queues[TX].add_used(&active.mem, head, 0).is_err() {
                log::debug!("vsock: TX used ring update failed");
            }
            used_any = true;
            match packet {
                Ok(header) => self.on_guest_packet(&header, &buf[HEADER_LEN..]),
                Err(why) => {
                    self.metrics.invalid_packets.inc();
                    log::debug!("vsock: a TX chain that is not a packet: {why:?}");
                }
            }
        }
        if used_any {
            let _ = active.irq.trigger(InterruptKind::Queue);
        }
        self.buf = buf;
        self.active = Some(active);
        used_any
    }

    fn on_guest_packet(&mut self, h: &Header, payload: &[u8]) {
        self.metrics.tx_packets_count.inc();
        if h.src_cid != self.cid || h.dst_cid != HOST_CID {
            self.metrics.invalid_packets.inc();
            log::debug!(
                "vsock: a packet from CID {} to CID {}",
                h.src_cid,
                h.dst_cid
            );
            return;
        }
        if h.kind != TYPE_STREAM {
            self.metrics.invalid_packets.inc();
            if h.op != OP_RST {
                self.orphan_rst(h);
            }
            return;
        }
        let Some(&id) = self.ports.get(&(h.dst_port, h.src_port)) else {
            match h.op {
                OP_REQUEST => self.guest_connect(h),
                OP_RST => {}
                _ => self.orphan_rst(h),
            }
            return;
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.update_peer(h);
        match (h.op, conn.state) {
            (OP_RESPONSE, State::Requested) => {
                conn.state = State::Established;
                conn.deadline = None;
                let line = format!("OK {}\n", conn.local_port);
                if conn.send_line_to_host(line.as_bytes()).is_err() {
                    self.metrics.tx_write_fails.inc();
                    return self.kill(id);
                }
            }
            (OP_RW, State::Established) if conn.peer_shutdown & SHUTDOWN_SEND == 0 => {
                self.metrics.tx_bytes_count.add(payload.len() as u64);
                match conn.send_to_host(payload) {
                    Ok(true) => {}
                    Ok(false) => {
                        self.metrics.invalid_packets.inc();
                        log::debug!("vsock: the guest sent past its credit; reset");
                        return self.kill(id);
                    }
                    Err(_) => {
                        self.metrics.tx_write_fails.inc();
                        return self.kill(id);
                    }
                }
            }
            (OP_SHUTDOWN, State::Established) => {
                conn.peer_shutdown |= h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if conn.finish_guest_side() {
                    return self.kill(id);
                }
            }
            (OP_RST, _) => return self.remove_conn(id),
            (OP_CREDIT_UPDATE, _) => {}
            (OP_CREDIT_REQUEST, _) => conn.owed |= owe::CREDIT_UPDATE,
            _ => {
                self.metrics.invalid_packets.inc();
                return self.kill(id);
            }
        }
        self.schedule(id);
    }

    /// A guest REQUEST to the host: connects to `<uds_path>_<port>`, or answers with an RST.
    fn guest_connect(&mut self, h: &Header) {
        if self.conns.len() >= MAX_CONNS {
            log::debug!("vsock: {MAX_CONNS} connections already; guest request refused");
            return self.orphan_rst(h);
        }
        let mut path = OsString::from(self.uds_path.as_os_str());
        path.push(format!("_{}", h.dst_port));
        match host::connect_nonblocking(std::path::Path::new(&path)) {
            Ok(stream) => {
                let id = self.add_conn(Conn::guest_initiated(stream, h));
                self.schedule(id);
            }
            Err(e) => {
                log::debug!("vsock: guest connection to {path:?} refused: {e}");
                self.orphan_rst(h);
            }
        }
    }

    /// The next thing for the guest: an orphan RST, or the first queued connection's packet.
    fn next_for_guest(&mut self) -> Option<(u32, Next)> {
        if !self.orphan_rsts.is_empty() {
            return Some((0, Next::Control(owe::RST)));
        }
        while let Some(&id) = self.queue.front() {
            if let Some(conn) = self.conns.get_mut(&id) {
                if let Some(next) = conn.next() {
                    return Some((id, next));
                }
                conn.queued = false;
            }
            self.queue.pop_front();
        }
        None
    }

    /// Fills RX buffers with what is owed to the guest; true if any was used.
    pub fn process_rx(&mut self) -> bool {
        let Some(mut active) = self.active.take() else {
            return false;
        };
        let mut buf = std::mem::take(&mut self.buf);
        let mut used_any = false;
        while let Some((id, next)) = self.next_for_guest() {
            let Some(chain) = active.queues[RX].pop_descriptor_chain(&active.mem) else {
                break;
            };
            let head = chain.head_index();
            let bufs = writable_buffers(&active.mem, chain).unwrap_or_default();
            let room = bufs.iter().map(|b| b.1).sum::<usize>();
            if room < HEADER_LEN {
                self.metrics.invalid_packets.inc();
                let _ = active.queues[RX].add_used(&active.mem, head, 0);
                used_any = true;
                continue;
            }
            buf.resize(HEADER_LEN + MAX_PAYLOAD as usize, 0);
            let Some(len) = self.packet_for_guest(id, next, &mut buf, room - HEADER_LEN) else {
                active.queues[RX].go_to_previous_position();
                continue;
            };
            let used = HEADER_LEN + len;
            if !write_buffers(&active.mem, &bufs, &buf[..used]) {
                self.metrics.invalid_packets.inc();
            }
            self.metrics.rx_packets_count.inc();
            if active.queues[RX]
                .add_used(&active.mem, head, used as u32)
                .is_err()
            {
                log::debug!("vsock: RX used ring update failed");
            }
            used_any = true;
        }
        if used_any {
            let _ = active.irq.trigger(InterruptKind::Queue);
        }
        self.buf = buf;
        self.active = Some(active);
        if self.tx_stalled && self.orphan_rsts.len() < MAX_ORPHAN_RSTS {
            self.process_tx();
            self.process_rx();
        }
        used_any
    }

    /// Puts the packet `next` of connection `id` in `buf` (header, then at most `room`
    /// payload bytes); its payload length, or `None` if there turned out to be nothing.
    fn packet_for_guest(
        &mut self,
        id: u32,
        next: Next,
        buf: &mut [u8],
        room: usize,
    ) -> Option<usize> {
        if id == 0 {
            let header = self.orphan_rsts.pop_front()?;
            buf[..HEADER_LEN].copy_from_slice(&header.to_bytes());
            return Some(0);
        }
        let cid = self.cid;
        let conn = self.conns.get_mut(&id)?;
        let mut ended = false;
        let (header, len) = match next {
            Next::Control(bit) => {
                conn.owed &= !bit;
                let mut h = conn.header(cid, op_for(bit), 0);
                match bit {
                    owe::REQUEST => conn.deadline = Some(Instant::now() + ANSWER_TIMEOUT),
                    owe::SHUTDOWN => {
                        h.flags = conn.shutdown_flags;
                        if h.flags == SHUTDOWN_SEND | SHUTDOWN_RCV {
                            conn.deadline = Some(Instant::now() + ANSWER_TIMEOUT);
                        }
                    }
                    owe::RST => ended = true,
                    _ => {}
                }
                (h, 0)
            }
            Next::Data => {
                let want = room.min(conn.peer_credit() as usize);
                match conn.read_host(&mut buf[HEADER_LEN..HEADER_LEN + want]) {
                    Ok(0) => {
                        conn.on_host_eof();
                        return None;
                    }
                    Ok(n) => {
                        self.metrics.rx_bytes_count.add(n as u64);
                        let h = conn.header(cid, OP_RW, n as u32);
                        // Others get a turn before this connection's next packet.
                        if self.queue.front() == Some(&id) {
                            self.queue.pop_front();
                            self.queue.push_back(id);
                        }
                        (h, n)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        conn.readable = false;
                        return None;
                    }
                    Err(_) => {
                        self.metrics.rx_read_fails.inc();
                        self.kill(id);
                        return None;
                    }
                }
            }
        };
        if ended {
            self.remove_conn(id);
        }
        buf[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        Some(len)
    }

    /// Takes every connection waiting on the listener.
    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.conns.len() >= MAX_CONNS || stream.set_nonblocking(true).is_err() {
                        log::debug!("vsock: a host connection refused");
                        continue;
                    }
                    let id = self.add_conn(Conn::host_initiated(stream));
                    self.read_connect_line(id);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.metrics.muxer_event_fails.inc();
                    log::warn!("vsock: accepting on {:?} failed: {e}", self.uds_path);
                    break;
                }
            }
        }
    }

    fn read_connect_line(&mut self, id: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        match conn.read_connect_line() {
            Line::Incomplete => {}
            Line::Bad => {
                log::debug!("vsock: a host connection without a valid CONNECT line");
                self.remove_conn(id);
            }
            Line::Port(port) => {
                let peer = port;
                let mut local = self.next_port;
                while self.ports.contains_key(&(local, peer)) {
                    local = local.wrapping_add(1).max(FIRST_HOST_PORT);
                }
                self.next_port = local.wrapping_add(1).max(FIRST_HOST_PORT);
                let Some(conn) = self.conns.get_mut(&id) else {
                    return;
                };
                conn.local_port = local;
                conn.peer_port = peer;
                conn.state = State::Requested;
                conn.owed = owe::REQUEST;
                self.ports.insert((local, peer), id);
                self.schedule(id);
            }
        }
    }

    fn on_conn_event(&mut self, id: u32, set: EventSet) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if set.contains(EventSet::ERROR) {
            self.metrics.conn_event_fails.inc();
            return self.kill(id);
        }
        if set.contains(EventSet::HANG_UP) {
            conn.host_hup = true;
        }
        if conn.state == State::ReadingConnect {
            return self.read_connect_line(id);
        }
        if set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP) {
            conn.readable = true;
        }
        if set.contains(EventSet::OUT) && conn.has_pending() {
            match conn.flush() {
                Ok(()) => {
                    if conn.finish_guest_side() {
                        return self.kill(id);
                    }
                }
                Err(_) => {
                    self.metrics.tx_write_fails.inc();
                    return self.kill(id);
                }
            }
        }
        self.schedule(id);
    }

    /// Connections whose guest did not answer in time are reset.
    fn on_timer(&mut self) {
        let now = Instant::now();
        let late: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            log::debug!("vsock: the guest did not answer in time; connection reset");
            self.kill(id);
        }
    }

    /// Arms the timer for the earliest deadline (on the VMM thread).
    fn rearm_timer(&mut self) {
        let first = self.conns.values().filter_map(|c| c.deadline).min();
        if first == self.armed {
            return;
        }
        self.armed = first;
        let result = match first {
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                self.timer.reset(wait.max(Duration::from_millis(1)), None)
            }
            None => self.timer.clear(),
        };
        if let Err(e) = result {
            self.metrics.muxer_event_fails.inc();
            log::warn!("vsock: cannot arm the timer: {e}");
        }
    }

    /// Watches new connections and forgets ended ones.
    fn sync_watches(&mut self, ops: &mut EventOps) {
        for conn in self.closed.drain(..) {
            let _ = ops.remove(Events::empty(&conn.stream));
        }
        for id in std::mem::take(&mut self.to_watch) {
            let Some(conn) = self.conns.get(&id) else {
                continue;
            };
            let set = EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP;
            let events = Events::with_data(&conn.stream, id, set | EventSet::EDGE_TRIGGERED);
            if let Err(e) = ops.add(events) {
                self.metrics.conn_event_fails.inc();
                log::warn!("vsock: cannot watch a connection: {e}");
                self.kill(id);
            }
        }
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn avail_features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features();
    }

    /// The configuration space is the guest's CID.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.cid.to_le_bytes(), offset, data);
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<IrqTrigger>,
    ) -> Result<(), ActivateError> {
        let queues = checked_queues(&mem, queues, 3, &self.metrics.activate_fails)?;
        self.active = Some(Active { mem, queues, irq });
        // This runs on a vCPU thread: the VMM thread serves what is already waiting.
        let _ = self.queue_events[TX].write(1);
        let _ = self.queue_events[RX].write(1);
        Ok(())
    }

    /// Every connection ends; the VMM thread closes them (this runs on a vCPU thread).
    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        for id in ids {
            self.remove_conn(id);
        }
        self.queue.clear();
        self.orphan_rsts.clear();
        let _ = self.queue_events[TX].write(1);
    }
}

impl MutEventSubscriber for Vsock {
    fn init(&mut self, ops: &mut EventOps) {
        let fixed = [
            Events::new(&self.queue_events[RX], EventSet::IN),
            Events::new(&self.queue_events[TX], EventSet::IN),
            Events::new(&self.queue_events[EVENT], EventSet::IN),
            Events::new(&self.listener, EventSet::IN),
            Events::new(&self.timer, EventSet::IN),
        ];
        for events in fixed {
            if let Err(e) = ops.add(events) {
                self.metrics.muxer_event_fails.inc();
                log::error!("vsock: cannot watch a descriptor: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.queue_events[RX].as_raw_fd() {
            let _ = self.queue_events[RX].read();
            self.metrics.rx_queue_event_count.inc();
        } else if fd == self.queue_events[TX].as_raw_fd() {
            let _ = self.queue_events[TX].read();
            self.metrics.tx_queue_event_count.inc();
            self.process_tx();
        } else if fd == self.queue_events[EVENT].as_raw_fd() {
            let _ = self.queue_events[EVENT].read();
        } else if fd == self.listener.as_raw_fd() {
            self.accept_all();
        } else if fd == self.timer.as_raw_fd() {
            let _ = self.timer.wait();
            self.armed = None;
            self.on_timer();
        } else {
            self.on_conn_event(events.data(), events.event_set());
        }
        self.process_rx();
        self.sync_watches(ops);
        self.rearm_timer();
    }
}

#[cfg(test)]
mod tests;
