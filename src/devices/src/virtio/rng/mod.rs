//! virtio-rng (the entropy device): the guest posts device-writable buffers and gets them
//! back filled from the host's getrandom(2), at most [`MAX_REQUEST`] bytes a request, held to
//! the `rate_limiter` (bytes and requests). Runs on the VMM thread.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use event_manager::{EventOps, Events, MutEventSubscriber};
use telemetry::EntropyMetrics;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use vm_memory::{Bytes, GuestAddress, GuestMemory as _, Permissions};
use vmm_sys_util::epoll::EventSet;

use crate::rate_limiter::{RateLimiter, RateLimiterConfig};
use crate::virtio::watch::watch_all;
use crate::virtio::{common_accessors, GuestMemory, VirtioCommon, VirtioDevice};

pub const QUEUE_SIZE: u16 = 256;
/// The most a request is given; a larger buffer gets this much (the used length says so).
pub const MAX_REQUEST: u32 = 64 << 10;

/// What the builder needs to make the entropy device.
#[derive(Debug, Clone)]
pub struct EntropyConfig {
    pub limiter: RateLimiterConfig,
    pub metrics: Arc<EntropyMetrics>,
}

#[derive(Debug)]
pub struct Entropy {
    common: VirtioCommon,
    limiter: RateLimiter,
    metrics: Arc<EntropyMetrics>,
    /// Reused for each request's random bytes.
    buf: Vec<u8>,
}

/// Why a request gets nothing.
#[derive(Debug, PartialEq, Eq)]
enum Bad {
    /// A device-readable buffer in the chain, or one outside guest memory.
    Buffer,
}

/// The chain's buffers, capped at [`MAX_REQUEST`] bytes in all.
fn buffers(
    mem: &GuestMemory,
    chain: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
) -> Result<Vec<(GuestAddress, u32)>, Bad> {
    let mut out = Vec::new();
    let mut total = 0u32;
    for d in chain {
        if !d.is_write_only() || !mem.check_range(d.addr(), d.len() as usize, Permissions::Write) {
            return Err(Bad::Buffer);
        }
        let len = d.len().min(MAX_REQUEST - total);
        if len > 0 {
            out.push((d.addr(), len));
            total += len;
        }
    }
    Ok(out)
}

impl Entropy {
    pub fn new(config: &EntropyConfig) -> std::io::Result<Self> {
        Ok(Entropy {
            common: VirtioCommon::new(
                VIRTIO_ID_RNG,
                1 << VIRTIO_F_VERSION_1,
                &[QUEUE_SIZE],
                config.metrics.clone(),
            )?,
            limiter: RateLimiter::new(config.limiter)?,
            metrics: config.metrics.clone(),
            buf: Vec::new(),
        })
    }

    /// Fills every request the guest has made available; true if any was completed. A
    /// throttled queue waits for the limiter's timer.
    pub fn process_queue(&mut self) -> bool {
        if self.limiter.is_blocked() {
            return false;
        }
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        let used_any = active.serve_queue(0, |mem, chain| {
            match buffers(mem, chain) {
                Ok(bufs) => {
                    let bytes: u64 = bufs.iter().map(|&(_, len)| u64::from(len)).sum();
                    if !self.limiter.consume(bytes, 1) {
                        // Left in the ring: filled, once, when the limiter's timer fires.
                        self.metrics.entropy_rate_limiter_throttled.inc();
                        return None;
                    }
                    Some(self.fill(mem, &bufs))
                }
                Err(Bad::Buffer) => {
                    log::debug!("entropy: a request with a buffer the device cannot write");
                    self.metrics.invalid_reqs_count.inc();
                    Some(0)
                }
            }
        });
        self.common.active = Some(active);
        used_any
    }

    /// Writes random bytes into `bufs`; returns how many (0 if the host's source failed).
    fn fill(&mut self, mem: &GuestMemory, bufs: &[(GuestAddress, u32)]) -> u32 {
        let total: usize = bufs.iter().map(|&(_, len)| len as usize).sum();
        self.buf.resize(total, 0);
        if mmds::random_bytes(&mut self.buf).is_err() {
            self.metrics.host_rng_fails.inc();
            return 0;
        }
        let mut offset = 0usize;
        for &(addr, len) in bufs {
            let len = len as usize;
            // Checked against guest memory when the chain was read.
            if mem
                .write_slice(&self.buf[offset..offset + len], addr)
                .is_err()
            {
                break;
            }
            offset += len;
        }
        self.metrics.entropy_bytes.add(offset as u64);
        offset as u32
    }

    fn on_limiter_timer(&mut self) {
        self.limiter.on_timer();
        self.metrics.rate_limiter_event_count.inc();
        self.process_queue();
    }
}

impl VirtioDevice for Entropy {
    common_accessors!();
}

impl MutEventSubscriber for Entropy {
    fn init(&mut self, ops: &mut EventOps) {
        let watched = [
            Events::new(self.common.queue_event(0), EventSet::IN),
            Events::new(&self.limiter, EventSet::IN),
        ];
        watch_all(ops, watched, &self.metrics.entropy_event_fails, "entropy");
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if self.common.notified_queue(events.fd()).is_some() {
            self.metrics.entropy_event_count.inc();
            self.process_queue();
        } else if events.fd() == self.limiter.as_raw_fd() {
            self.on_limiter_timer();
        }
    }
}

#[cfg(test)]
mod tests;
