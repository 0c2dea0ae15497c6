//! The virtio-net device: features and configuration space, and the RX and TX loops that run
//! on the VMM thread when a queue is notified, the TAP has frames, or the MMDS's timer fires.
//!
//! Nothing here busy-polls: the TAP is watched edge-triggered and read until it is empty or
//! the guest has no RX buffers left; in the second case one frame waits here and the TAP is
//! not read again until the guest gives buffers back (the RX queue's notification).

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use event_manager::{EventOps, Events, MutEventSubscriber};
use mmds::{MmdsStack, SharedStore};
use telemetry::NetMetrics;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MTU,
};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::Bytes;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

use super::tap::{Tap, TapError, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, VNET_HDR_LEN};
use crate::rate_limiter::{BucketUpdate, RateLimiter, RateLimiterConfig};
use crate::virtio::watch::watch_all;
use crate::virtio::{common_accessors, VirtioCommon, VirtioDevice};

pub const QUEUE_SIZE: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
/// The largest frame either way: the header, Ethernet, and a 64 KiB segmentation-offload
/// packet.
const MAX_FRAME: usize = VNET_HDR_LEN + 14 + 65_535;

/// How an interface reaches the MMDS.
#[derive(Debug, Clone)]
pub struct MmdsLink {
    pub ip: Ipv4Addr,
    pub store: SharedStore,
}

/// What the builder needs to make a net device.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub id: String,
    pub tap: String,
    pub guest_mac: Option<[u8; 6]>,
    pub mtu: Option<u16>,
    pub mmds: Option<MmdsLink>,
    pub rx_limiter: RateLimiterConfig,
    pub tx_limiter: RateLimiterConfig,
    pub metrics: Arc<NetMetrics>,
}

/// A `PATCH` of one direction's limiter: the bandwidth and ops buckets.
pub type LimiterUpdate = (BucketUpdate, BucketUpdate);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error("cannot create an eventfd or timerfd: {0}")]
    Fd(#[source] std::io::Error),
}

/// The MMDS on this interface: its stack, and the timer for the stack's retransmissions
/// and timeouts, re-armed only after something touched the stack.
#[derive(Debug)]
struct MmdsEndpoint {
    stack: MmdsStack,
    timer: TimerFd,
    touched: bool,
}

#[derive(Debug)]
pub struct Net {
    id: String,
    tap: Tap,
    common: VirtioCommon,
    mmds: Option<MmdsEndpoint>,
    /// One frame on its way to the guest (bytes `..rx_len`), waiting for an RX buffer.
    rx_frame: Vec<u8>,
    rx_len: usize,
    tx_frame: Vec<u8>,
    rx_limiter: RateLimiter,
    tx_limiter: RateLimiter,
    metrics: Arc<NetMetrics>,
}

impl Net {
    pub fn new(config: &NetConfig) -> Result<Self, Error> {
        let tap = Tap::open(&config.tap)?;
        let mut avail_features = 1u64 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_NET_F_CSUM
            | 1 << VIRTIO_NET_F_GUEST_CSUM
            | 1 << VIRTIO_NET_F_GUEST_TSO4
            | 1 << VIRTIO_NET_F_GUEST_TSO6
            | 1 << VIRTIO_NET_F_HOST_TSO4
            | 1 << VIRTIO_NET_F_HOST_TSO6;
        // mac[6], status (u16), max_virtqueue_pairs (u16), mtu (u16).
        let mut config_space = vec![0u8; 12];
        if let Some(mac) = config.guest_mac {
            avail_features |= 1 << VIRTIO_NET_F_MAC;
            config_space[..6].copy_from_slice(&mac);
        }
        if let Some(mtu) = config.mtu {
            avail_features |= 1 << VIRTIO_NET_F_MTU;
            config_space[10..12].copy_from_slice(&mtu.to_le_bytes());
        }
        Ok(Net {
            id: config.id.clone(),
            tap,
            common: VirtioCommon::new(
                VIRTIO_ID_NET,
                avail_features,
                &[QUEUE_SIZE, QUEUE_SIZE],
                config.metrics.clone(),
            )
            .map_err(Error::Fd)?
            .with_config_space(config_space),
            mmds: match &config.mmds {
                Some(link) => Some(MmdsEndpoint {
                    stack: MmdsStack::new(link.ip, link.store.clone()),
                    timer: TimerFd::new().map_err(|e| Error::Fd(e.into()))?,
                    touched: false,
                }),
                None => None,
            },
            rx_frame: Vec::new(),
            rx_len: 0,
            tx_frame: Vec::new(),
            rx_limiter: RateLimiter::new(config.rx_limiter).map_err(Error::Fd)?,
            tx_limiter: RateLimiter::new(config.tx_limiter).map_err(Error::Fd)?,
            metrics: config.metrics.clone(),
        })
    }

    /// New limiters after boot; `None` leaves a direction as it is. Frames held back by the
    /// old limits move now.
    pub fn update_limiters(&mut self, rx: Option<LimiterUpdate>, tx: Option<LimiterUpdate>) {
        if let Some((bandwidth, ops)) = rx {
            self.rx_limiter.update(bandwidth, ops);
        }
        if let Some((bandwidth, ops)) = tx {
            self.tx_limiter.update(bandwidth, ops);
        }
        self.process_tx();
        self.process_rx();
    }

    /// The RX limiter's timer fired (waits for it if not): deliver what it held back.
    pub fn on_rx_limiter_timer(&mut self) {
        self.rx_limiter.on_timer();
        self.metrics.rx_event_rate_limiter_count.inc();
        self.process_rx();
    }

    /// The TX limiter's timer fired (waits for it if not): send what it held back.
    pub fn on_tx_limiter_timer(&mut self) {
        self.tx_limiter.on_timer();
        self.metrics.tx_rate_limiter_event_count.inc();
        self.process_tx();
    }

    /// The limits in force (RX, TX), for tests.
    pub fn limiter_specs(&self) -> (RateLimiterConfig, RateLimiterConfig) {
        (self.rx_limiter.spec(), self.tx_limiter.spec())
    }

    /// The offloads the TAP may hand us: those the guest said it can take.
    fn tap_offload(&self) -> u32 {
        let mut flags = 0;
        if self.common.acked(VIRTIO_NET_F_GUEST_CSUM) {
            flags |= TUN_F_CSUM;
            if self.common.acked(VIRTIO_NET_F_GUEST_TSO4) {
                flags |= TUN_F_TSO4;
            }
            if self.common.acked(VIRTIO_NET_F_GUEST_TSO6) {
                flags |= TUN_F_TSO6;
            }
        }
        flags
    }

    /// Fills RX buffers from the waiting frame, the MMDS, then the TAP; true if any was used.
    pub fn process_rx(&mut self) -> bool {
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        let mut used_any = false;
        loop {
            if self.rx_len == 0 && !self.next_rx_frame() {
                break;
            }
            let Some(chain) = active.queues[RX].pop_descriptor_chain(&active.mem) else {
                // No buffers: the frame waits, and so does the TAP, until the guest adds some.
                self.metrics.no_rx_avail_buffer.inc();
                break;
            };
            let frame_len = (self.rx_len - VNET_HDR_LEN) as u64;
            if !self.rx_limiter.consume(frame_len, 1) {
                // The frame waits for the limiter's timer, its buffer in the guest's ring.
                active.queues[RX].go_to_previous_position();
                self.metrics.rx_rate_limiter_throttled.inc();
                break;
            }
            let head = chain.head_index();
            let frame = &self.rx_frame[..self.rx_len];
            let mut written = 0usize;
            for desc in chain {
                if written == frame.len() {
                    break;
                }
                if !desc.is_write_only() {
                    break;
                }
                let n = (desc.len() as usize).min(frame.len() - written);
                if active
                    .mem
                    .write_slice(&frame[written..written + n], desc.addr())
                    .is_err()
                {
                    break;
                }
                written += n;
            }
            let used = match written == frame.len() {
                true => {
                    self.metrics.rx_packets_count.inc();
                    self.metrics.rx_bytes_count.add(frame_len);
                    written as u32
                }
                false => {
                    self.metrics.rx_fails.inc();
                    log::debug!(
                        "net {}: an RX buffer is too small or bad; frame dropped",
                        self.id
                    );
                    0
                }
            };
            if active.queues[RX].add_used(&active.mem, head, used).is_err() {
                log::debug!("net {}: RX used ring update failed", self.id);
            }
            used_any = true;
            self.rx_len = 0;
        }
        if used_any {
            active.notify_if_wanted(RX);
        }
        self.common.active = Some(active);
        self.arm_mmds_timer();
        used_any
    }

    /// Puts the next frame for the guest into `rx_frame`: the MMDS's first, then the TAP's.
    fn next_rx_frame(&mut self) -> bool {
        if self.rx_frame.len() < MAX_FRAME {
            self.rx_frame.resize(MAX_FRAME, 0);
        }
        if let Some(mmds) = &mut self.mmds {
            if let Some(frame) = mmds.stack.next_frame() {
                let len = (VNET_HDR_LEN + frame.len()).min(MAX_FRAME);
                self.rx_frame[..VNET_HDR_LEN].fill(0);
                self.rx_frame[VNET_HDR_LEN..len].copy_from_slice(&frame[..len - VNET_HDR_LEN]);
                set_num_buffers(&mut self.rx_frame);
                self.rx_len = len;
                mmds.stack.pop_frame();
                mmds.touched = true;
                return true;
            }
        }
        match self.tap.read_frame(&mut self.rx_frame) {
            Ok(n) if n >= VNET_HDR_LEN => {
                set_num_buffers(&mut self.rx_frame);
                self.rx_len = n;
                true
            }
            Ok(_) => false,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    self.metrics.tap_read_fails.inc();
                    log::warn!("net {}: reading the TAP failed: {e}", self.id);
                }
                false
            }
        }
    }

    /// Sends every frame the guest queued: to the MMDS if it is for it, else to the TAP.
    pub fn process_tx(&mut self) -> bool {
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        if self.tx_frame.len() < MAX_FRAME {
            self.tx_frame.resize(MAX_FRAME, 0);
        }
        let mut used_any = false;
        let mut to_mmds = false;
        while let Some(chain) = active.queues[TX].pop_descriptor_chain(&active.mem) {
            let head = chain.head_index();
            let mut len = 0usize;
            let mut ok = true;
            for desc in chain {
                let n = desc.len() as usize;
                if desc.is_write_only() || len + n > MAX_FRAME {
                    ok = false;
                    break;
                }
                if active
                    .mem
                    .read_slice(&mut self.tx_frame[len..len + n], desc.addr())
                    .is_err()
                {
                    ok = false;
                    break;
                }
                len += n;
            }
            if ok && len >= VNET_HDR_LEN {
                let frame_len = (len - VNET_HDR_LEN) as u64;
                if !self.tx_limiter.consume(frame_len, 1) {
                    // Back into the ring: read again and sent when the limiter's timer fires.
                    active.queues[TX].go_to_previous_position();
                    self.metrics.tx_rate_limiter_throttled.inc();
                    break;
                }
                self.metrics.tx_packets_count.inc();
                self.metrics.tx_bytes_count.add(frame_len);
            }
            if active.queues[TX].add_used(&active.mem, head, 0).is_err() {
                log::debug!("net {}: TX used ring update failed", self.id);
            }
            used_any = true;
            if !ok || len < VNET_HDR_LEN {
                self.metrics.tx_malformed_frames.inc();
                log::debug!("net {}: a malformed TX chain was dropped", self.id);
                continue;
            }
            let frame = &self.tx_frame[VNET_HDR_LEN..len];
            if let Some(mmds) = &mut self.mmds {
                if mmds.stack.receive(frame) {
                    mmds.touched = true;
                    to_mmds = true;
                    continue;
                }
            }
            if let Err(e) = self.tap.write_frame(&self.tx_frame[..len]) {
                self.metrics.tap_write_fails.inc();
                log::debug!("net {}: the TAP refused a frame: {e}", self.id);
            }
        }
        if used_any {
            active.notify_if_wanted(TX);
        }
        self.common.active = Some(active);
        if to_mmds {
            self.process_rx();
        }
        used_any
    }

    fn on_mmds_timer(&mut self) {
        if let Some(mmds) = &mut self.mmds {
            let _ = mmds.timer.wait();
            mmds.stack.poll();
            mmds.touched = true;
        }
        self.process_rx();
    }

    /// Sets the timer for the stack's next deadline, if the stack was touched since the last
    /// time (RX from the TAP alone changes nothing there, and costs no system call).
    fn arm_mmds_timer(&mut self) {
        let Some(mmds) = self.mmds.as_mut().filter(|m| m.touched) else {
            return;
        };
        mmds.touched = false;
        let result = match mmds.stack.poll_delay() {
            Some(delay) => mmds.timer.reset(delay, None),
            None => mmds.timer.clear(),
        };
        if let Err(e) = result {
            log::warn!("net {}: cannot set the MMDS timer: {e}", self.id);
        }
    }

    /// The TAP, for tests.
    pub fn tap(&self) -> &Tap {
        &self.tap
    }

    /// Whether a frame is waiting here for an RX buffer.
    pub fn has_waiting_frame(&self) -> bool {
        self.rx_len > 0
    }
}

/// With VERSION_1 the header has `num_buffers`, which is 1 without mergeable buffers (the
/// TAP leaves those two bytes as they were).
fn set_num_buffers(frame: &mut [u8]) {
    frame[10..12].copy_from_slice(&1u16.to_le_bytes());
}

impl VirtioDevice for Net {
    common_accessors!();

    /// The TAP hands over what the driver can take, and the frames the driver queued
    /// before the ioeventfds were armed move on the VMM thread.
    fn activated(&mut self) {
        log::info!(
            "net {}: the driver took features {:#x}; TAP offloads {:#x}",
            self.id,
            self.common.acked_features(),
            self.tap_offload()
        );
        if let Err(e) = self.tap.set_offload(self.tap_offload()) {
            log::warn!("net {}: the TAP refused offloads: {e}", self.id);
            let _ = self.tap.set_offload(0);
        }
        self.common.kick([RX, TX]);
    }

    /// A frame read from the TAP but not yet delivered is dropped with the queues (and not
    /// kept in a snapshot): the network may drop a frame, and its sender sends it again.
    fn reset_device(&mut self) {
        self.rx_len = 0;
    }
}

impl MutEventSubscriber for Net {
    fn init(&mut self, ops: &mut EventOps) {
        let mut watch = vec![
            Events::new(self.common.queue_event(RX), EventSet::IN),
            Events::new(self.common.queue_event(TX), EventSet::IN),
            Events::new(&self.tap, EventSet::IN | EventSet::EDGE_TRIGGERED),
            Events::new(&self.rx_limiter, EventSet::IN),
            Events::new(&self.tx_limiter, EventSet::IN),
        ];
        if let Some(mmds) = &self.mmds {
            watch.push(Events::new(&mmds.timer, EventSet::IN));
        }
        let device = format!("net {}", self.id);
        watch_all(ops, watch, &self.metrics.event_fails, &device);
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        let queue = self.common.notified_queue(fd);
        // A throttled direction moves when its limiter's timer fires, not before.
        if queue == Some(RX) {
            self.metrics.rx_queue_event_count.inc();
            if !self.rx_limiter.is_blocked() {
                self.process_rx();
            }
        } else if queue == Some(TX) {
            self.metrics.tx_queue_event_count.inc();
            if !self.tx_limiter.is_blocked() {
                self.process_tx();
            }
        } else if fd == self.tap.as_raw_fd() {
            self.metrics.rx_tap_event_count.inc();
            if !self.rx_limiter.is_blocked() {
                self.process_rx();
            }
        } else if fd == self.rx_limiter.as_raw_fd() {
            self.on_rx_limiter_timer();
        } else if fd == self.tx_limiter.as_raw_fd() {
            self.on_tx_limiter_timer();
        } else if self
            .mmds
            .as_ref()
            .is_some_and(|m| fd == m.timer.as_raw_fd())
        {
            self.on_mmds_timer();
        }
    }
}
