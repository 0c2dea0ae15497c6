//! What a snapshot keeps of a virtio-mmio device: the transport's registers and, for each
//! queue, where it lies in guest memory and how far the device has read and written it. A
//! restored device takes its queues back at those positions, so requests the guest posted
//! before the snapshot are served after it, and none is served twice.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState};

/// One virtqueue (virtio-queue's `QueueState`, which has no serde support of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub event_idx: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    pub next_avail: u16,
    pub next_used: u16,
}

impl From<QueueState> for QueueSnapshot {
    fn from(q: QueueState) -> Self {
        QueueSnapshot {
            max_size: q.max_size,
            size: q.size,
            ready: q.ready,
            event_idx: q.event_idx_enabled,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
            next_avail: q.next_avail,
            next_used: q.next_used,
        }
    }
}

impl QueueSnapshot {
    /// The queue again; a size or an address that virtio-queue refuses (say, in a damaged
    /// file) is an error, not a panic.
    pub fn to_queue(&self) -> Result<Queue, String> {
        Queue::try_from(QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
        .map_err(|e| format!("{e:?}"))
    }
}

/// A virtio-mmio transport and its device's queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportSnapshot {
    pub device_type: u32,
    pub status: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub driver_features: u64,
    pub queue_sel: u32,
    pub interrupt_status: u32,
    pub activated: bool,
    pub queues: Vec<QueueSnapshot>,
    /// A virtio-pci function's own state (absent for virtio-mmio, and in snapshots from
    /// before virtio-pci, which were all virtio-mmio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciSnapshot>,
}

impl TransportSnapshot {
    /// Whether the snapshot fits a device of `device_type` on a virtio-pci (`pci`) or
    /// virtio-mmio transport.
    pub fn check(&self, device_type: u32, pci: bool) -> Result<(), RestoreError> {
        if self.device_type != device_type {
            return Err(RestoreError::DeviceType {
                saved: self.device_type,
                here: device_type,
            });
        }
        let name = |pci| if pci { "virtio-pci" } else { "virtio-mmio" };
        if self.pci.is_some() != pci {
            return Err(RestoreError::Transport {
                device_type,
                saved: name(self.pci.is_some()),
                here: name(pci),
            });
        }
        Ok(())
    }
}

/// What a virtio-pci function adds: its configuration space (BAR placement, command
/// register, MSI-X control), its MSI-X table and which vector each queue uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciSnapshot {
    pub config: Vec<u8>,
    pub msix: crate::pci::msix::Msix,
    pub vectors: crate::virtio::pci::interrupt::Vectors,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("the snapshot has a device of type {saved} where this microVM has one of type {here}")]
    DeviceType { saved: u32, here: u32 },
    #[error("the snapshot's device of type {device_type} has {saved} queues; it needs {here}")]
    QueueCount {
        device_type: u32,
        saved: usize,
        here: usize,
    },
    #[error("queue {index} of the snapshot's device of type {device_type} is not valid: {reason}")]
    Queue {
        device_type: u32,
        index: usize,
        reason: String,
    },
    #[error("the snapshot's device of type {device_type} cannot start again: {reason}")]
    Activate { device_type: u32, reason: String },
    #[error("the snapshot's device of type {device_type} is on {saved}, this microVM's on {here}: load it with the same --enable-pci setting it was taken with")]
    Transport {
        device_type: u32,
        saved: &'static str,
        here: &'static str,
    },
    #[error("the snapshot's virtio-pci device of type {device_type} is not valid: {reason}")]
    Pci { device_type: u32, reason: String },
}
