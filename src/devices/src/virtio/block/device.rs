//! The virtio-blk device: its features and configuration space, and the request loop that
//! runs on the VMM thread when the guest notifies the queue. Reads, writes and flushes are
//! done there (the Sync engine), or handed to the host kernel's io_uring and completed when
//! its eventfd fires (the Async engine); both check, charge and answer requests alike.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use event_manager::{EventOps, Events, MutEventSubscriber};
use telemetry::BlockMetrics;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::Bytes;
use vmm_sys_util::epoll::EventSet;

use super::io_uring::{Completion, Op, Ring};
use super::request::{Request, RequestType, SECTOR_SIZE};
use crate::rate_limiter::{BucketUpdate, RateLimiter, RateLimiterConfig};
use crate::virtio::watch::watch_all;
use crate::virtio::{common_accessors, GuestMemory, VirtioCommon, VirtioDevice};

pub const QUEUE_SIZE: u16 = 256;
/// Data buffers per request the driver may use (VIRTIO_BLK_F_SEG_MAX). Without it Linux
/// sends one buffer per request, so a 64 KiB read of scattered pages becomes 16 requests,
/// each a round trip through the queue; half the ring leaves room for a second request.
const SEG_MAX: u32 = (QUEUE_SIZE as u32) / 2 - 2;

/// Firecracker's `cache_type`: whether a guest flush reaches the host disk (the API's and
/// the snapshot's type as well).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
pub enum CacheType {
    /// Flushes are acknowledged without syncing the host file (Firecracker's default).
    #[default]
    Unsafe,
    /// The flush feature is offered and a flush syncs the host file.
    Writeback,
}

/// Firecracker's `io_engine`: where reads, writes and flushes are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
pub enum IoEngine {
    /// On the VMM thread, one request after another.
    #[default]
    Sync,
    /// By the host kernel (io_uring), many at a time, completed through an eventfd.
    Async,
}

/// What the builder needs to make a block device.
#[derive(Debug, Clone)]
pub struct BlockConfig {
    pub id: String,
    pub path: PathBuf,
    pub read_only: bool,
    pub cache: CacheType,
    pub engine: IoEngine,
    pub limiter: RateLimiterConfig,
    pub metrics: Arc<BlockMetrics>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open the disk image {path}: {source}")]
    Open {
        path: PathBuf,
        source: hostfile::Error,
    },
    #[error("cannot find the size of the disk image {path}: {source}")]
    Size {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the queue eventfd or the rate limiter's timer: {0}")]
    EventFd(std::io::Error),
    #[error(
        "io_engine Async needs io_uring, which this host's kernel does not offer ({0}); use Sync"
    )]
    IoUring(std::io::Error),
}

/// What the completion of an Async request needs.
#[derive(Debug, Clone, Copy)]
struct Pending {
    head: u16,
    kind: RequestType,
    bytes: u64,
    status: vm_memory::GuestAddress,
    /// Bytes the device writes into the chain on success (data and status).
    used_len: u32,
    /// The device's activation it belongs to: after a reset its completion is dropped.
    generation: u64,
}

#[derive(Debug)]
pub struct Block {
    id: String,
    disk: File,
    path: PathBuf,
    /// Bytes the guest may address: whole sectors only.
    capacity: u64,
    read_only: bool,
    cache: CacheType,
    common: VirtioCommon,
    limiter: RateLimiter,
    metrics: Arc<BlockMetrics>,
    /// The Async engine's ring; None for Sync.
    ring: Option<Ring<Pending>>,
    /// Counts resets: requests started before one are not answered into the new queue.
    generation: u64,
}

/// `capacity` (sectors), `size_max` (0: not offered), `seg_max`.
fn config_space(capacity: u64) -> Vec<u8> {
    let mut space = (capacity / SECTOR_SIZE).to_le_bytes().to_vec();
    space.extend_from_slice(&0u32.to_le_bytes());
    space.extend_from_slice(&SEG_MAX.to_le_bytes());
    space
}

/// Opens a disk image; returns it with the bytes the guest may address (whole sectors).
fn open_disk(path: &Path, read_only: bool) -> Result<(File, u64), Error> {
    let mut disk = hostfile::open(path, hostfile::Kind::RegularOrBlockDevice, !read_only).map_err(
        |source| Error::Open {
            path: path.to_path_buf(),
            source,
        },
    )?;
    let len = disk_len(&mut disk, path)?;
    Ok((disk, len))
}

fn disk_len(disk: &mut File, path: &Path) -> Result<u64, Error> {
    let len = disk.seek(SeekFrom::End(0)).map_err(|source| Error::Size {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(len - len % SECTOR_SIZE)
}

/// Counts a request that succeeded, whichever engine did it.
fn count_done(m: &BlockMetrics, kind: RequestType, bytes: u64) {
    match kind {
        RequestType::In => {
            m.read_count.inc();
            m.read_bytes.add(bytes);
        }
        RequestType::Out => {
            m.write_count.inc();
            m.write_bytes.add(bytes);
        }
        RequestType::Flush => m.flush_count.inc(),
        _ => {}
    }
}

impl Block {
    pub fn new(config: &BlockConfig) -> Result<Self, Error> {
        let (disk, capacity) = open_disk(&config.path, config.read_only)?;
        let mut avail_features = 1u64 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_BLK_F_SEG_MAX;
        if config.read_only {
            avail_features |= 1 << VIRTIO_BLK_F_RO;
        }
        if config.cache == CacheType::Writeback {
            avail_features |= 1 << VIRTIO_BLK_F_FLUSH;
        }
        Ok(Block {
            id: config.id.clone(),
            disk,
            path: config.path.clone(),
            capacity,
            read_only: config.read_only,
            cache: config.cache,
            common: VirtioCommon::new(
                VIRTIO_ID_BLOCK,
                avail_features,
                &[QUEUE_SIZE],
                config.metrics.clone(),
            )
            .map_err(Error::EventFd)?
            .with_config_space(config_space(capacity)),
            limiter: RateLimiter::new(config.limiter).map_err(Error::EventFd)?,
            metrics: config.metrics.clone(),
            ring: match config.engine {
                IoEngine::Sync => None,
                IoEngine::Async => Some(Ring::new(u32::from(QUEUE_SIZE)).map_err(Error::IoUring)?),
            },
            generation: 0,
        })
    }

    /// The Async engine's completion eventfd (for the event loop, and tests).
    pub fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        self.ring.as_ref().map(Ring::completion_fd)
    }

    pub fn engine(&self) -> IoEngine {
        match self.ring {
            Some(_) => IoEngine::Async,
            None => IoEngine::Sync,
        }
    }

    /// The guest's view of the disk size changed: new configuration space, and a
    /// configuration-change interrupt if a driver is there to take it.
    fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
        self.common.set_config_space(config_space(capacity));
    }

    /// `PATCH /drives` with a new `path_on_host`: the guest reads and writes the new file
    /// from its next request on, and is told its size. The old file stays in use if the new
    /// one cannot be opened.
    pub fn replace_disk(&mut self, path: &Path) -> Result<(), Error> {
        let (disk, capacity) = open_disk(path, self.read_only).inspect_err(|_| {
            self.metrics.update_fails.inc();
        })?;
        // Requests in flight finish on the old file.
        self.drain();
        self.disk = disk;
        self.path = path.to_path_buf();
        self.metrics.update_count.inc();
        self.set_capacity(capacity);
        Ok(())
    }

    /// `BlockDeviceRescan`: the file was resized on the host; tell the guest its new size.
    pub fn rescan(&mut self) -> Result<(), Error> {
        let capacity = disk_len(&mut self.disk, &self.path).inspect_err(|_| {
            self.metrics.update_fails.inc();
        })?;
        self.metrics.update_count.inc();
        self.set_capacity(capacity);
        Ok(())
    }

    /// A new `rate_limiter` after boot; requests held back by the old one are served now.
    pub fn update_limiter(&mut self, bandwidth: BucketUpdate, ops: BucketUpdate) {
        self.limiter.update(bandwidth, ops);
        self.metrics.update_count.inc();
        self.process_queue();
    }

    /// The rate limiter's timer fired (waits for it if not): serve what it held back.
    pub fn on_limiter_timer(&mut self) {
        self.limiter.on_timer();
        self.metrics.rate_limiter_event_count.inc();
        self.process_queue();
    }

    /// The limits in force, for tests.
    pub fn limiter_spec(&self) -> RateLimiterConfig {
        self.limiter.spec()
    }

    /// Serves every request the guest has made available (with the Async engine: starts
    /// them, as many as the ring takes); true if any was completed now. A throttled queue
    /// waits for the limiter's timer.
    pub fn process_queue(&mut self) -> bool {
        if self.limiter.is_blocked() {
            return false;
        }
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        let mut used_any = false;
        while !self.ring.as_ref().is_some_and(Ring::is_full) {
            let Some(chain) = active.queues[0].pop_descriptor_chain(&active.mem) else {
                break;
            };
            let head = chain.head_index();
            let used_len = match Request::parse(&active.mem, chain) {
                Ok(request) => {
                    let bytes = match request.kind {
                        RequestType::In | RequestType::Out => request.data_len(),
                        _ => 0,
                    };
                    if !self.limiter.consume(bytes, 1) {
                        // Back into the ring: served, once, when the limiter's timer fires.
                        active.queues[0].go_to_previous_position();
                        self.metrics.rate_limiter_throttled_events.inc();
                        break;
                    }
                    match self.start(&active.mem, head, &request) {
                        Some(used_len) => used_len,
                        None => continue,
                    }
                }
                Err(e) => {
                    log::debug!("block {}: bad request: {e}", self.id);
                    self.metrics.invalid_reqs_count.inc();
                    0
                }
            };
            if active.queues[0]
                .add_used(&active.mem, head, used_len)
                .is_err()
            {
                log::debug!("block {}: used ring update failed", self.id);
            }
            used_any = true;
        }
        if used_any {
            active.notify(0);
        }
        self.common.active = Some(active);
        if let Some(ring) = &mut self.ring {
            if let Err(e) = ring.submit() {
                log::error!("block {}: cannot submit to io_uring: {e}", self.id);
            }
            // What the kernel finished during the submission (data in the page cache) is
            // answered now, not one event-loop turn later.
            let done = ring.completions();
            used_any |= !done.is_empty();
            self.complete(done);
        }
        used_any
    }

    /// Starts one checked request: with the Async engine a read, write or Writeback flush
    /// goes to the ring (None: its completion answers it); everything else is done now and
    /// its used length returned.
    fn start(&mut self, mem: &GuestMemory, head: u16, request: &Request) -> Option<u32> {
        let op = match request.kind {
            RequestType::In => Op::Read,
            RequestType::Out => Op::Write,
            RequestType::Flush if self.cache == CacheType::Writeback => Op::Flush,
            _ => return Some(self.execute(mem, request)),
        };
        if self.ring.is_none() {
            return Some(self.execute(mem, request));
        }
        let offset = match self.check_transfer(request) {
            Ok(offset) => offset,
            Err(status) => return Some(self.answer(mem, request, Err(status))),
        };
        let pending = Pending {
            head,
            kind: request.kind,
            bytes: request.data_len(),
            status: request.status,
            used_len: if op == Op::Read {
                request.data_len() as u32
            } else {
                0
            },
            generation: self.generation,
        };
        let ring = self.ring.as_mut()?;
        match ring.queue(op, &self.disk, offset, mem, &request.data, pending) {
            Ok(()) => None,
            // The ring had room (checked before the chain was taken), and every buffer was
            // checked against guest memory: this does not happen; the guest gets an error.
            Err(_) => Some(self.answer(mem, request, Err(VIRTIO_BLK_S_IOERR))),
        }
    }

    /// The Async engine's completions: each request's status, the used ring, one interrupt;
    /// then the requests the ring had no room for.
    pub fn on_completions(&mut self) {
        let done = match &mut self.ring {
            Some(ring) => ring.completions(),
            None => return,
        };
        self.complete(done);
        self.process_queue();
    }

    fn complete(&mut self, done: Vec<Completion<Pending>>) {
        let Some(active) = &mut self.common.active else {
            return;
        };
        if done.is_empty() {
            return;
        }
        for Completion { token: p, result } in done {
            if p.generation != self.generation {
                // Started before the driver reset the device: its queue is gone.
                continue;
            }
            let m = &self.metrics;
            let status = match result {
                Ok(()) => {
                    count_done(m, p.kind, p.bytes);
                    VIRTIO_BLK_S_OK
                }
                Err(errno) => {
                    log::debug!("block {}: io_uring request failed: errno {errno}", self.id);
                    m.execute_fails.inc();
                    VIRTIO_BLK_S_IOERR
                }
            };
            let used_len = match (status, active.mem.write_obj(status as u8, p.status)) {
                (_, Err(_)) => 0,
                (VIRTIO_BLK_S_OK, Ok(())) => p.used_len.saturating_add(1),
                _ => 1,
            };
            if active.queues[0]
                .add_used(&active.mem, p.head, used_len)
                .is_err()
            {
                log::debug!("block {}: used ring update failed", self.id);
            }
        }
        active.notify(0);
    }

    /// Waits for every Async request in flight and answers them: before a snapshot saves
    /// the queue, a reset, or a new disk file.
    pub fn drain(&mut self) {
        let done = match &mut self.ring {
            Some(ring) if ring.in_flight() > 0 => ring.drain(),
            _ => return,
        };
        self.complete(done);
    }

    /// Runs one checked request and writes its status; returns the bytes written to the guest.
    fn execute(&mut self, mem: &GuestMemory, request: &Request) -> u32 {
        let done = self.perform(mem, request);
        self.answer(mem, request, done)
    }

    /// Counts a request's outcome and writes its status; returns the used length.
    fn answer(&self, mem: &GuestMemory, request: &Request, done: Result<u32, u32>) -> u32 {
        let (status, written) = match done {
            Ok(written) => {
                count_done(&self.metrics, request.kind, request.data_len());
                (VIRTIO_BLK_S_OK, written)
            }
            Err(status) => {
                self.metrics.execute_fails.inc();
                (status, 0)
            }
        };
        if mem.write_obj(status as u8, request.status).is_err() {
            return 0;
        }
        written.saturating_add(1)
    }

    /// A read or write the device may do: not a write to a read-only drive, inside the
    /// disk. Its byte offset.
    fn check_transfer(&self, request: &Request) -> Result<u64, u32> {
        if request.kind == RequestType::Out && self.read_only {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let start = request
            .sector
            .checked_mul(SECTOR_SIZE)
            .ok_or(VIRTIO_BLK_S_IOERR)?;
        let end = start
            .checked_add(request.data_len())
            .ok_or(VIRTIO_BLK_S_IOERR)?;
        if end > self.capacity {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        Ok(start)
    }

    fn perform(&mut self, mem: &GuestMemory, request: &Request) -> Result<u32, u32> {
        match request.kind {
            RequestType::In | RequestType::Out => {
                let write = request.kind == RequestType::Out;
                let start = self.check_transfer(request)?;
                self.disk
                    .seek(SeekFrom::Start(start))
                    .map_err(|_| VIRTIO_BLK_S_IOERR)?;
                for &(addr, len) in &request.data {
                    let len = len as usize;
                    let done = if write {
                        mem.write_all_volatile_to(addr, &mut self.disk, len)
                    } else {
                        mem.read_exact_volatile_from(addr, &mut self.disk, len)
                    };
                    done.map_err(|_| VIRTIO_BLK_S_IOERR)?;
                }
                Ok(if write { 0 } else { request.data_len() as u32 })
            }
            RequestType::Flush => {
                if self.cache == CacheType::Writeback {
                    self.disk.sync_all().map_err(|_| VIRTIO_BLK_S_IOERR)?;
                }
                Ok(0)
            }
            RequestType::GetId => {
                let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
                let n = self.id.len().min(id.len());
                id[..n].copy_from_slice(&self.id.as_bytes()[..n]);
                let mut remaining = &id[..];
                let mut written = 0u32;
                for &(addr, len) in &request.data {
                    let n = remaining.len().min(len as usize);
                    mem.write_slice(&remaining[..n], addr)
                        .map_err(|_| VIRTIO_BLK_S_IOERR)?;
                    remaining = &remaining[n..];
                    written += n as u32;
                }
                Ok(written)
            }
            RequestType::Unsupported(_) => Err(VIRTIO_BLK_S_UNSUPP),
        }
    }
}

impl VirtioDevice for Block {
    common_accessors!();

    /// (On a vCPU thread, which may not wait on the ring: Async requests still in flight
    /// finish later, their buffers still mapped, and are not answered.)
    fn reset_device(&mut self) {
        self.generation += 1;
    }
}

impl MutEventSubscriber for Block {
    fn init(&mut self, ops: &mut EventOps) {
        let mut watched = vec![
            Events::new(self.common.queue_event(0), EventSet::IN),
            Events::new(&self.limiter, EventSet::IN),
        ];
        if let Some(ring) = &self.ring {
            watched.push(Events::new_raw(ring.completion_fd(), EventSet::IN));
        }
        let device = format!("block {}", self.id);
        watch_all(ops, watched, &self.metrics.event_fails, &device);
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if self.common.notified_queue(events.fd()).is_some() {
            self.metrics.queue_event_count.inc();
            self.process_queue();
        } else if events.fd() == self.limiter.as_raw_fd() {
            self.on_limiter_timer();
        } else if self
            .ring
            .as_ref()
            .is_some_and(|r| events.fd() == r.completion_fd())
        {
            self.on_completions();
        }
    }
}
