//! The virtio-mmio transport (virtio 1.x, register layout version 2): the register file the
//! guest driver programs, decoded onto the [`TransportState`] every transport shares (status
//! machine, features, queue set-up), plus the one interrupt line and its status bits.

use std::sync::{Arc, Mutex};

use virtio_queue::QueueT;

use super::snapshot::{RestoreError, TransportSnapshot};
use super::transport_state::{TransportState, FAILED};
use super::{GuestMemory, IrqTrigger, VirtioDevice};
use crate::bus::{lock, BusDevice};

const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
/// "EMBR", in the vendor ID register.
const VENDOR_ID: u32 = 0x5242_4d45;

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
pub const REG_VENDOR_ID: u64 = 0x00c;
pub const REG_DEVICE_FEATURES: u64 = 0x010;
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
pub const REG_DRIVER_FEATURES: u64 = 0x020;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
pub const REG_QUEUE_SEL: u64 = 0x030;
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
pub const REG_QUEUE_NUM: u64 = 0x038;
pub const REG_QUEUE_READY: u64 = 0x044;
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
pub const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
pub const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
pub const REG_QUEUE_AVAIL_HIGH: u64 = 0x094;
pub const REG_QUEUE_USED_LOW: u64 = 0x0a0;
pub const REG_QUEUE_USED_HIGH: u64 = 0x0a4;
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
pub const CONFIG_SPACE: u64 = 0x100;

/// One device's MMIO window.
#[derive(Debug)]
pub struct MmioTransport {
    state: TransportState,
    irq: Arc<IrqTrigger>,
}

impl MmioTransport {
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemory,
        irq: Arc<IrqTrigger>,
    ) -> Self {
        MmioTransport {
            state: TransportState::new(device, mem, irq.clone()),
            irq,
        }
    }

    /// The device status register, for tests and diagnostics.
    pub fn status(&self) -> u32 {
        self.state.status
    }

    /// The transport's registers and the queues' positions, for a snapshot of a paused VM.
    pub fn snapshot(&self) -> TransportSnapshot {
        self.state.save(self.irq.status(), None)
    }

    /// Puts a fresh transport (and its device) in the state `saved`; an activated device
    /// starts again on its saved queues. Nothing in `saved` is trusted: a device of another
    /// type or transport, another queue count or a queue virtio-queue refuses is an error.
    pub fn restore(&mut self, saved: &TransportSnapshot) -> Result<(), RestoreError> {
        saved.check(lock(&self.state.device).device_type(), false)?;
        self.irq.clear();
        self.irq.set(saved.interrupt_status);
        self.state.restore(saved)
    }

    /// Lets a restored, activated device tell its guest what the restore changed (vsock's
    /// transport reset, the balloon's hinting stop). Called once the VM's interrupt
    /// controllers and vCPUs have their saved state: an interrupt raised before that is
    /// overwritten by it and reaches the guest only with the device's next one.
    pub fn announce_restore(&mut self) {
        self.state.announce_restore();
    }

    fn read_register(&mut self, offset: u64) -> u32 {
        let s = &self.state;
        match offset {
            REG_MAGIC => MAGIC,
            REG_VERSION => VERSION,
            REG_DEVICE_ID => lock(&s.device).device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => s.device_features_word(),
            REG_QUEUE_NUM_MAX => s.selected_queue().map_or(0, |q| u32::from(q.max_size())),
            REG_QUEUE_READY => s.selected_queue().map_or(0, |q| u32::from(q.ready())),
            REG_INTERRUPT_STATUS => self.irq.status(),
            REG_STATUS => s.status,
            REG_CONFIG_GENERATION => lock(&s.device).config_generation(),
            _ => 0,
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) {
        let s = &mut self.state;
        match offset {
            REG_DEVICE_FEATURES_SEL => s.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => s.driver_features_sel = value,
            REG_DRIVER_FEATURES => s.write_driver_features_word(value),
            REG_QUEUE_SEL => s.queue_sel = value,
            REG_QUEUE_NOTIFY => s.notify(value),
            REG_INTERRUPT_ACK => self.irq.ack(value),
            REG_STATUS => {
                s.set_status(value);
                if value == 0 {
                    self.irq.clear();
                }
            }
            _ => self.write_queue_register(offset, value),
        }
    }

    fn write_queue_register(&mut self, offset: u64, value: u32) {
        let Some(q) = self.state.queue_to_set_up() else {
            return;
        };
        match offset {
            REG_QUEUE_NUM => q.set_size(u16::try_from(value).unwrap_or(0)),
            REG_QUEUE_READY => q.set_ready(value == 1),
            REG_QUEUE_DESC_LOW => q.set_desc_table_address(Some(value), None),
            REG_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(value)),
            REG_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(value), None),
            REG_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(value)),
            REG_QUEUE_USED_LOW => q.set_used_ring_address(Some(value), None),
            REG_QUEUE_USED_HIGH => q.set_used_ring_address(None, Some(value)),
            _ => {}
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE {
            lock(&self.state.device).read_config(offset - CONFIG_SPACE, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_register(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE {
            if self.state.status & FAILED == 0 {
                lock(&self.state.device).write_config(offset - CONFIG_SPACE, data);
            }
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return;
        };
        if offset.is_multiple_of(4) {
            self.write_register(offset, u32::from_le_bytes(bytes));
        }
    }
}

#[cfg(test)]
mod tests;
