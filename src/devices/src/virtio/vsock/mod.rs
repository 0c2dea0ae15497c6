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

mod chain;
mod conn;
pub mod host;
mod host_side;
pub mod packet;
mod rx;
mod tx;

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::{EventOps, Events, MutEventSubscriber};
use telemetry::VsockMetrics;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::QueueT;
use vm_memory::Bytes;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

use self::conn::{owe, Conn, State};
use self::packet::*;
use crate::virtio::watch::watch_all;
use crate::virtio::{common_accessors, VirtioCommon, VirtioDevice};

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
/// How long a host connection has to send its `CONNECT` line.
pub const CONNECT_LINE_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports ember gives host-initiated connections start here.
const FIRST_HOST_PORT: u32 = 1 << 30;
/// `struct virtio_vsock_event { le32 id; }` with VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (0).
const TRANSPORT_RESET_EVENT: u32 = 0;
/// How long, after a restore, packets for the guest wait for it to have handled the
/// transport reset (it gives the event buffer back); a guest that does not is served anyway.
const RESET_ACK_WAIT: Duration = Duration::from_secs(2);

/// What the builder needs to make the vsock device; the listener is bound by `PUT /vsock`.
#[derive(Debug)]
pub struct VsockConfig {
    pub guest_cid: u64,
    pub uds_path: PathBuf,
    pub listener: UnixListener,
    pub metrics: Arc<VsockMetrics>,
}

#[derive(Debug)]
pub struct Vsock {
    cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    common: VirtioCommon,
    timer: TimerFd,
    armed: Option<Instant>,
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
    /// Set after a restore until the guest has handled the transport reset (or this time
    /// has passed): nothing goes into the RX queue meanwhile, so that a connection the host
    /// opens right after the restore is not reset with the old ones.
    reset_unacked: Option<Instant>,
}

impl Vsock {
    pub fn new(config: VsockConfig) -> std::io::Result<Self> {
        config.listener.set_nonblocking(true)?;
        Ok(Vsock {
            cid: config.guest_cid,
            uds_path: config.uds_path,
            listener: config.listener,
            common: VirtioCommon::new(
                VIRTIO_ID_VSOCK,
                1 << VIRTIO_F_VERSION_1,
                &[QUEUE_SIZE; 3],
                config.metrics.clone(),
            )?
            // The configuration space is the guest's CID.
            .with_config_space(config.guest_cid.to_le_bytes().to_vec()),
            timer: TimerFd::new()?,
            armed: None,
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
            reset_unacked: None,
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
}

impl VirtioDevice for Vsock {
    common_accessors!();

    /// The VMM thread serves what is already waiting. Not the event queue: its kick is the
    /// guest's answer to a transport reset.
    fn activated(&mut self) {
        self.common.kick([TX, RX]);
    }

    /// Every connection ends; the VMM thread closes them (this runs on a vCPU thread).
    fn reset_device(&mut self) {
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        for id in ids {
            self.remove_conn(id);
        }
        self.queue.clear();
        self.orphan_rsts.clear();
        self.reset_unacked = None;
        self.common.kick([TX]);
    }

    /// The host ends of the guest's connections stayed with the process that was
    /// snapshotted: tell the guest (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, as Firecracker does),
    /// so that it resets every connection and listens again.
    fn restored(&mut self) {
        let Some(active) = &mut self.common.active else {
            return;
        };
        let Some(chain) = active.queues[EVENT].pop_descriptor_chain(&active.mem) else {
            log::warn!("vsock: the guest posted no event buffer; it is not told of the reset");
            return;
        };
        let head = chain.head_index();
        let written = chain
            .filter(|d| d.is_write_only() && d.len() >= 4)
            .take(1)
            .any(|d| {
                active
                    .mem
                    .write_obj(TRANSPORT_RESET_EVENT, d.addr())
                    .is_ok()
            });
        let len = if written { 4 } else { 0 };
        if active.queues[EVENT]
            .add_used(&active.mem, head, len)
            .is_ok()
        {
            active.notify(EVENT);
            self.reset_unacked = Some(Instant::now() + RESET_ACK_WAIT);
        }
    }
}

impl Vsock {
    /// The driver gives event buffers back once it has handled the event in them: after a
    /// restore, the transport reset.
    fn event_queue_kicked(&mut self) {
        self.reset_unacked = None;
    }

    /// Whether packets may go into the RX queue: not while a restored guest has yet to
    /// handle the transport reset, for at most [`RESET_ACK_WAIT`].
    fn rx_open(&mut self) -> bool {
        match self.reset_unacked {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                log::warn!("vsock: the guest did not take up the transport reset in time");
                self.reset_unacked = None;
                true
            }
            None => true,
        }
    }
}

impl MutEventSubscriber for Vsock {
    fn init(&mut self, ops: &mut EventOps) {
        let fixed = [
            Events::new(self.common.queue_event(RX), EventSet::IN),
            Events::new(self.common.queue_event(TX), EventSet::IN),
            Events::new(self.common.queue_event(EVENT), EventSet::IN),
            Events::new(&self.listener, EventSet::IN),
            Events::new(&self.timer, EventSet::IN),
        ];
        watch_all(ops, fixed, &self.metrics.muxer_event_fails, "vsock");
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        let queue = self.common.notified_queue(fd);
        if queue == Some(RX) {
            self.metrics.rx_queue_event_count.inc();
        } else if queue == Some(TX) {
            self.metrics.tx_queue_event_count.inc();
            self.process_tx();
        } else if queue == Some(EVENT) {
            self.event_queue_kicked();
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
