//! The virtio-pci common configuration structure (virtio 1.x, 4.1.4.3), decoded onto the
//! shared [`TransportState`] and the device's MSI-X vector assignments. A field is read or
//! written with its own width; 64-bit queue addresses also as two 32-bit halves. Any other
//! access reads zero and changes nothing.

use virtio_queue::QueueT;

use super::interrupt::PciInterrupt;
use crate::pci::msix::NO_VECTOR;
use crate::virtio::transport_state::TransportState;

pub const LEN: u64 = 0x38;

/// The structure's fields, each at its offset in the structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Field {
    DeviceFeatureSelect = 0x00,
    DeviceFeature = 0x04,
    DriverFeatureSelect = 0x08,
    DriverFeature = 0x0c,
    ConfigMsixVector = 0x10,
    NumQueues = 0x12,
    DeviceStatus = 0x14,
    ConfigGeneration = 0x15,
    QueueSelect = 0x16,
    QueueSize = 0x18,
    QueueMsixVector = 0x1a,
    QueueEnable = 0x1c,
    QueueNotifyOff = 0x1e,
    QueueDesc = 0x20,
    QueueDriver = 0x28,
    QueueDevice = 0x30,
}

impl Field {
    const ALL: [Field; 16] = {
        use Field::*;
        [
            DeviceFeatureSelect,
            DeviceFeature,
            DriverFeatureSelect,
            DriverFeature,
            ConfigMsixVector,
            NumQueues,
            DeviceStatus,
            ConfigGeneration,
            QueueSelect,
            QueueSize,
            QueueMsixVector,
            QueueEnable,
            QueueNotifyOff,
            QueueDesc,
            QueueDriver,
            QueueDevice,
        ]
    };

    /// The field that starts at `offset`.
    fn at(offset: u64) -> Option<Field> {
        Self::ALL.into_iter().find(|f| *f as u64 == offset)
    }

    /// The width the field is accessed with.
    fn width(self) -> usize {
        use Field::*;
        match self {
            DeviceFeatureSelect | DeviceFeature | DriverFeatureSelect | DriverFeature => 4,
            ConfigMsixVector | NumQueues | QueueSelect | QueueSize | QueueMsixVector
            | QueueEnable | QueueNotifyOff => 2,
            DeviceStatus | ConfigGeneration => 1,
            QueueDesc | QueueDriver | QueueDevice => 8,
        }
    }
}

/// The field an access of `len` bytes at `offset` names, and whether it is a 64-bit
/// field's upper half.
fn field(offset: u64, len: usize) -> Option<(Field, bool)> {
    match Field::at(offset) {
        Some(f) if f.width() == len || (f.width() == 8 && len == 4) => Some((f, false)),
        _ => match Field::at(offset.checked_sub(4)?) {
            Some(f) if f.width() == 8 && len == 4 => Some((f, true)),
            _ => None,
        },
    }
}

pub fn read(state: &TransportState, irq: &PciInterrupt, offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Some((f, high)) = field(offset, data.len()) else {
        return;
    };
    let vectors = irq.vectors.lock().unwrap_or_else(|e| e.into_inner());
    let sel = state.queue_sel as usize;
    let queue = state.selected_queue();
    let value: u64 = match f {
        Field::DeviceFeatureSelect => u64::from(state.device_features_sel),
        Field::DeviceFeature => u64::from(state.device_features_word()),
        Field::DriverFeatureSelect => u64::from(state.driver_features_sel),
        Field::DriverFeature => u64::from(state.driver_features_word()),
        Field::ConfigMsixVector => u64::from(vectors.config),
        Field::NumQueues => vectors.queues.len() as u64,
        Field::DeviceStatus => u64::from(state.status as u8),
        Field::ConfigGeneration => {
            u64::from(crate::bus::lock(&state.device).config_generation() as u8)
        }
        Field::QueueSelect => u64::from(state.queue_sel as u16),
        Field::QueueSize => queue.map_or(0, |q| u64::from(q.size())),
        Field::QueueMsixVector => u64::from(vectors.queues.get(sel).copied().unwrap_or(NO_VECTOR)),
        Field::QueueEnable => queue.map_or(0, |q| u64::from(q.ready())),
        // Each queue's notification address is its index times the multiplier.
        Field::QueueNotifyOff if sel < vectors.queues.len() => sel as u64,
        Field::QueueDesc => queue.map_or(0, |q| q.desc_table()),
        Field::QueueDriver => queue.map_or(0, |q| q.avail_ring()),
        Field::QueueDevice => queue.map_or(0, |q| q.used_ring()),
        _ => 0,
    };
    let value = if high { value >> 32 } else { value };
    let bytes = value.to_le_bytes();
    data.copy_from_slice(&bytes[..data.len()]);
}

pub fn write(state: &mut TransportState, irq: &PciInterrupt, offset: u64, data: &[u8]) {
    let Some((f, high)) = field(offset, data.len()) else {
        return;
    };
    let mut bytes = [0u8; 8];
    bytes[..data.len()].copy_from_slice(data);
    let value = u64::from_le_bytes(bytes);
    let vectors_ok = |v: u16| v == NO_VECTOR || v < irq.vector_count();
    match f {
        Field::DeviceFeatureSelect => state.device_features_sel = value as u32,
        Field::DriverFeatureSelect => state.driver_features_sel = value as u32,
        Field::DriverFeature => state.write_driver_features_word(value as u32),
        // A vector the table lacks reads back as NO_VECTOR, which tells the driver.
        Field::ConfigMsixVector => {
            let v = value as u16;
            irq.vectors.lock().unwrap_or_else(|e| e.into_inner()).config =
                if vectors_ok(v) { v } else { NO_VECTOR };
        }
        Field::DeviceStatus => {
            state.set_status(value as u32 & 0xff);
            if value as u8 == 0 {
                irq.reset();
            }
        }
        Field::QueueSelect => state.queue_sel = u32::from(value as u16),
        Field::QueueMsixVector if state.queue_to_set_up().is_some() => {
            let v = value as u16;
            let mut vectors = irq.vectors.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = vectors.queues.get_mut(state.queue_sel as usize) {
                *slot = if vectors_ok(v) { v } else { NO_VECTOR };
            }
        }
        _ => write_queue(state, f, high, data.len(), value),
    }
}

/// The selected queue's size, enable and addresses: only while the driver sets it up.
fn write_queue(state: &mut TransportState, f: Field, high: bool, len: usize, value: u64) {
    let Some(q) = state.queue_to_set_up() else {
        return;
    };
    let (lo, hi) = match (len, high) {
        (8, _) => (Some(value as u32), Some((value >> 32) as u32)),
        (_, false) => (Some(value as u32), None),
        (_, true) => (None, Some(value as u32)),
    };
    match f {
        Field::QueueSize => q.set_size(value as u16),
        // Only enabling is allowed; a driver disables a queue by resetting the device.
        Field::QueueEnable if value as u16 == 1 => q.set_ready(true),
        Field::QueueDesc => q.set_desc_table_address(lo, hi),
        Field::QueueDriver => q.set_avail_ring_address(lo, hi),
        Field::QueueDevice => q.set_used_ring_address(lo, hi),
        _ => {}
    }
}
