//! The virtio-blk device: its features and configuration space, and the request loop that
//! runs on the VMM thread when the guest notifies the queue.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use event_manager::{EventOps, Events, MutEventSubscriber};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::request::{Request, RequestType, SECTOR_SIZE};
use crate::virtio::device::read_config_bytes;
use crate::virtio::{ActivateError, GuestMemory, InterruptKind, IrqTrigger, VirtioDevice};

pub const QUEUE_SIZE: u16 = 256;

/// Firecracker's `cache_type`: whether a guest flush reaches the host disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheType {
    /// Flushes are acknowledged without syncing the host file (Firecracker's default).
    #[default]
    Unsafe,
    /// The flush feature is offered and a flush syncs the host file.
    Writeback,
}

/// What the builder needs to make a block device.
#[derive(Debug, Clone)]
pub struct BlockConfig {
    pub id: String,
    pub path: PathBuf,
    pub read_only: bool,
    pub cache: CacheType,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open the disk image {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot find the size of the disk image {path}: {source}")]
    Size {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the queue eventfd: {0}")]
    EventFd(std::io::Error),
}

struct Active {
    mem: GuestMemory,
    queue: Queue,
    irq: Arc<IrqTrigger>,
}

pub struct Block {
    id: String,
    disk: File,
    /// Bytes the guest may address: whole sectors only.
    capacity: u64,
    read_only: bool,
    cache: CacheType,
    avail_features: u64,
    acked_features: u64,
    config_space: Vec<u8>,
    queue_events: [EventFd; 1],
    active: Option<Active>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("id", &self.id)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Block {
    pub fn new(config: &BlockConfig) -> Result<Self, Error> {
        let open_error = |source| Error::Open {
            path: config.path.clone(),
            source,
        };
        let mut disk = OpenOptions::new()
            .read(true)
            .write(!config.read_only)
            .open(&config.path)
            .map_err(open_error)?;
        let len = disk.seek(SeekFrom::End(0)).map_err(|source| Error::Size {
            path: config.path.clone(),
            source,
        })?;
        let capacity = len - len % SECTOR_SIZE;
        let mut avail_features = 1u64 << VIRTIO_F_VERSION_1;
        if config.read_only {
            avail_features |= 1 << VIRTIO_BLK_F_RO;
        }
        if config.cache == CacheType::Writeback {
            avail_features |= 1 << VIRTIO_BLK_F_FLUSH;
        }
        Ok(Block {
            id: config.id.clone(),
            disk,
            capacity,
            read_only: config.read_only,
            cache: config.cache,
            avail_features,
            acked_features: 0,
            config_space: (capacity / SECTOR_SIZE).to_le_bytes().to_vec(),
            queue_events: [EventFd::new(libc::EFD_NONBLOCK).map_err(Error::EventFd)?],
            active: None,
        })
    }

    /// Serves every request the guest has made available; true if any was completed.
    pub fn process_queue(&mut self) -> bool {
        let Some(mut active) = self.active.take() else {
            return false;
        };
        let mut used_any = false;
        while let Some(chain) = active.queue.pop_descriptor_chain(&active.mem) {
            let head = chain.head_index();
            let used_len = match Request::parse(&active.mem, chain) {
                Ok(request) => self.execute(&active.mem, &request),
                Err(e) => {
                    log::debug!("block {}: bad request: {e}", self.id);
                    0
                }
            };
            if active.queue.add_used(&active.mem, head, used_len).is_err() {
                log::debug!("block {}: used ring update failed", self.id);
            }
            used_any = true;
        }
        if used_any {
            let _ = active.irq.trigger(InterruptKind::Queue);
        }
        self.active = Some(active);
        used_any
    }

    /// Runs one checked request and writes its status; returns the bytes written to the guest.
    fn execute(&mut self, mem: &GuestMemory, request: &Request) -> u32 {
        let (status, written) = match self.perform(mem, request) {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(status) => (status, 0),
        };
        if mem.write_obj(status as u8, request.status).is_err() {
            return 0;
        }
        written.saturating_add(1)
    }

    fn perform(&mut self, mem: &GuestMemory, request: &Request) -> Result<u32, u32> {
        match request.kind {
            RequestType::In | RequestType::Out => {
                let write = request.kind == RequestType::Out;
                if write && self.read_only {
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
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn set_acked_features(&mut self, features: u64) {
        self.acked_features = features & self.avail_features;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_space, offset, data);
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<IrqTrigger>,
    ) -> Result<(), ActivateError> {
        let found = queues.len();
        let queue = queues
            .into_iter()
            .next()
            .filter(|_| found == 1)
            .ok_or(ActivateError::QueueCount { expected: 1, found })?;
        if !queue.is_valid(&mem) {
            return Err(ActivateError::InvalidQueue(0));
        }
        self.active = Some(Active { mem, queue, irq });
        // Requests made before the ioeventfd fired are served now.
        self.process_queue();
        Ok(())
    }

    fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
    }
}

impl MutEventSubscriber for Block {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.queue_events[0], EventSet::IN)) {
            log::error!("block {}: cannot watch the queue eventfd: {e}", self.id);
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.queue_events[0].as_raw_fd() {
            let _ = self.queue_events[0].read();
            self.process_queue();
        }
    }
}
