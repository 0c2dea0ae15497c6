//! The virtio-pci common configuration structure (virtio 1.x, 4.1.4.3), decoded onto the
//! shared [`TransportState`] and the device's MSI-X vector assignments. A field is read or
//! written with its own width; 64-bit queue addresses also as two 32-bit halves. Any other
//! access reads zero and changes nothing.

use virtio_queue::QueueT;

use super::interrupt::PciInterrupt;
use crate::pci::msix::NO_VECTOR;
use crate::virtio::transport_state::TransportState;

pub const LEN: u64 = 0x38;
const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const DRIVER_FEATURE_SELECT: u64 = 0x08;
const DRIVER_FEATURE: u64 = 0x0c;
const CONFIG_MSIX_VECTOR: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const DEVICE_STATUS: u64 = 0x14;
const CONFIG_GENERATION: u64 = 0x15;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;
const QUEUE_NOTIFY_OFF: u64 = 0x1e;
const QUEUE_DESC: u64 = 0x20;
const QUEUE_DRIVER: u64 = 0x28;
const QUEUE_DEVICE: u64 = 0x30;

/// The width each field is accessed with.
fn width(offset: u64) -> Option<usize> {
    Some(match offset {
        DEVICE_FEATURE_SELECT | DEVICE_FEATURE | DRIVER_FEATURE_SELECT | DRIVER_FEATURE => 4,
        CONFIG_MSIX_VECTOR | NUM_QUEUES | QUEUE_SELECT | QUEUE_SIZE | QUEUE_MSIX_VECTOR
        | QUEUE_ENABLE | QUEUE_NOTIFY_OFF => 2,
        DEVICE_STATUS | CONFIG_GENERATION => 1,
        QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE => 8,
        _ => return None,
    })
}

/// The field an access of `len` bytes at `offset` names, and whether it is a 64-bit
/// field's upper half.
fn field(offset: u64, len: usize) -> Option<(u64, bool)> {
    match width(offset) {
        Some(w) if w == len || (w == 8 && len == 4) => Some((offset, false)),
        _ => match width(offset.checked_sub(4)?) {
            Some(8) if len == 4 => Some((offset - 4, true)),
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
        DEVICE_FEATURE_SELECT => u64::from(state.device_features_sel),
        DEVICE_FEATURE => u64::from(state.device_features_word()),
        DRIVER_FEATURE_SELECT => u64::from(state.driver_features_sel),
        DRIVER_FEATURE => u64::from(state.driver_features_word()),
        CONFIG_MSIX_VECTOR => u64::from(vectors.config),
        NUM_QUEUES => vectors.queues.len() as u64,
        DEVICE_STATUS => u64::from(state.status as u8),
        CONFIG_GENERATION => u64::from(crate::bus::lock(&state.device).config_generation() as u8),
        QUEUE_SELECT => u64::from(state.queue_sel as u16),
        QUEUE_SIZE => queue.map_or(0, |q| u64::from(q.size())),
        QUEUE_MSIX_VECTOR => u64::from(vectors.queues.get(sel).copied().unwrap_or(NO_VECTOR)),
        QUEUE_ENABLE => queue.map_or(0, |q| u64::from(q.ready())),
        // Each queue's notification address is its index times the multiplier.
        QUEUE_NOTIFY_OFF if sel < vectors.queues.len() => sel as u64,
        QUEUE_DESC => queue.map_or(0, |q| q.desc_table()),
        QUEUE_DRIVER => queue.map_or(0, |q| q.avail_ring()),
        QUEUE_DEVICE => queue.map_or(0, |q| q.used_ring()),
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
        DEVICE_FEATURE_SELECT => state.device_features_sel = value as u32,
        DRIVER_FEATURE_SELECT => state.driver_features_sel = value as u32,
        DRIVER_FEATURE => state.write_driver_features_word(value as u32),
        // A vector the table lacks reads back as NO_VECTOR, which tells the driver.
        CONFIG_MSIX_VECTOR => {
            let v = value as u16;
            irq.vectors.lock().unwrap_or_else(|e| e.into_inner()).config =
                if vectors_ok(v) { v } else { NO_VECTOR };
        }
        DEVICE_STATUS => {
            state.set_status(value as u32 & 0xff);
            if value as u8 == 0 {
                irq.reset();
            }
        }
        QUEUE_SELECT => state.queue_sel = u32::from(value as u16),
        QUEUE_MSIX_VECTOR if state.queue_to_set_up().is_some() => {
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
fn write_queue(state: &mut TransportState, f: u64, high: bool, len: usize, value: u64) {
    let Some(q) = state.queue_to_set_up() else {
        return;
    };
    let (lo, hi) = match (len, high) {
        (8, _) => (Some(value as u32), Some((value >> 32) as u32)),
        (_, false) => (Some(value as u32), None),
        (_, true) => (None, Some(value as u32)),
    };
    match f {
        QUEUE_SIZE => q.set_size(value as u16),
        // Only enabling is allowed; a driver disables a queue by resetting the device.
        QUEUE_ENABLE if value as u16 == 1 => q.set_ready(true),
        QUEUE_DESC => q.set_desc_table_address(lo, hi),
        QUEUE_DRIVER => q.set_avail_ring_address(lo, hi),
        QUEUE_DEVICE => q.set_used_ring_address(lo, hi),
        _ => {}
    }
}
