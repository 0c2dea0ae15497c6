//! The virtio-mmio transport (virtio 1.x, register layout version 2): the register file the
//! guest driver programs, the device-status state machine, feature negotiation and queue
//! set-up. Every value comes from the guest, so every write is checked against the state the
//! spec allows it in; anything else is ignored, never trusted.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_queue::{Queue, QueueT};

use super::snapshot::{QueueSnapshot, RestoreError, TransportSnapshot};
use super::{GuestMemory, Interrupt, InterruptKind, IrqTrigger, VirtioDevice};
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

const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;

/// One device's MMIO window.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    mem: GuestMemory,
    irq: Arc<IrqTrigger>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    queues: Vec<Queue>,
    activated: bool,
    /// The guest may fail activation in a loop: logged sparingly.
    activation_log: telemetry::Sparse,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("status", &self.status)
            .field("activated", &self.activated)
            .finish()
    }
}

impl MmioTransport {
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemory,
        irq: Arc<IrqTrigger>,
    ) -> Self {
        let queues = fresh_queues(&*lock(&device));
        MmioTransport {
            device,
            mem,
            irq,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            queues,
            activated: false,
            activation_log: telemetry::Sparse::per_minute(),
        }
    }

    /// The device status register, for tests and diagnostics.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The transport's registers and the queues' positions, for a snapshot of a paused VM.
    pub fn snapshot(&self) -> TransportSnapshot {
        let device = lock(&self.device);
        let queues = match self.activated {
            true => device.queue_states(),
            false => self.queues.iter().map(Queue::state).collect(),
        };
        TransportSnapshot {
            device_type: device.device_type(),
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            interrupt_status: self.irq.status(),
            activated: self.activated,
            queues: queues.into_iter().map(QueueSnapshot::from).collect(),
        }
    }

    /// Puts a fresh transport (and its device) in the state `saved`; an activated device
    /// starts again on its saved queues. Nothing in `saved` is trusted: a device of another
    /// type, another queue count or a queue virtio-queue refuses is an error.
    pub fn restore(&mut self, saved: &TransportSnapshot) -> Result<(), RestoreError> {
        let device_type = lock(&self.device).device_type();
        if saved.device_type != device_type {
            return Err(RestoreError::DeviceType {
                saved: saved.device_type,
                here: device_type,
            });
        }
        if saved.queues.len() != self.queues.len() {
            return Err(RestoreError::QueueCount {
                device_type,
                saved: saved.queues.len(),
                here: self.queues.len(),
            });
        }
        let mut queues = Vec::with_capacity(saved.queues.len());
        for (index, (q, fresh)) in saved.queues.iter().zip(&self.queues).enumerate() {
            let bad = |reason: String| RestoreError::Queue {
                device_type,
                index,
                reason,
            };
            if q.max_size != fresh.max_size() {
                return Err(bad(format!("its largest size is {}", q.max_size)));
            }
            queues.push(q.to_queue().map_err(bad)?);
        }
        self.status = saved.status;
        self.device_features_sel = saved.device_features_sel;
        self.driver_features_sel = saved.driver_features_sel;
        self.driver_features = saved.driver_features & lock(&self.device).avail_features();
        self.queue_sel = saved.queue_sel;
        self.irq.clear();
        self.irq.set(saved.interrupt_status);
        if self.status & FEATURES_OK != 0 {
            lock(&self.device).set_acked_features(self.driver_features);
        }
        if !saved.activated {
            self.queues = queues;
            return Ok(());
        }
        let mut device = lock(&self.device);
        device
            .activate(self.mem.clone(), queues, self.irq.clone())
            .map_err(|e| RestoreError::Activate {
                device_type,
                reason: e.to_string(),
            })?;
        self.activated = true;
        self.queues.clear();
        Ok(())
    }

    /// Lets a restored, activated device tell its guest what the restore changed (vsock's
    /// transport reset, the balloon's hinting stop). Called once the VM's interrupt
    /// controllers and vCPUs have their saved state: an interrupt raised before that is
    /// overwritten by it and reaches the guest only with the device's next one.
    pub fn announce_restore(&mut self) {
        if self.activated {
            lock(&self.device).restored();
        }
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers may change only between FEATURES_OK and DRIVER_OK.
    fn queue_setup_allowed(&self) -> bool {
        self.status & (FEATURES_OK | DRIVER_OK | FAILED) == FEATURES_OK
    }

    fn read_register(&mut self, offset: u64) -> u32 {
        let device = lock(&self.device);
        match offset {
            REG_MAGIC => MAGIC,
            REG_VERSION => VERSION,
            REG_DEVICE_ID => device.device_type(),
            REG_VENDOR_ID => VENDOR_ID,
            REG_DEVICE_FEATURES => match self.device_features_sel {
                0 => device.avail_features() as u32,
                1 => (device.avail_features() >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => {
                drop(device);
                self.selected_queue().map_or(0, |q| u32::from(q.max_size()))
            }
            REG_QUEUE_READY => {
                drop(device);
                self.selected_queue().map_or(0, |q| u32::from(q.ready()))
            }
            REG_INTERRUPT_STATUS => self.irq.status(),
            REG_STATUS => self.status,
            REG_CONFIG_GENERATION => device.config_generation(),
            _ => 0,
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) {
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            REG_DRIVER_FEATURES if self.status & (DRIVER | FEATURES_OK | FAILED) == DRIVER => {
                let v = u64::from(value);
                match self.driver_features_sel {
                    0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v,
                    1 => {
                        self.driver_features = (self.driver_features & 0xffff_ffff) | (v << 32);
                    }
                    _ => {}
                }
            }
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NOTIFY => self.notify(value),
            REG_INTERRUPT_ACK => self.irq.ack(value),
            REG_STATUS => self.set_status(value),
            _ if self.queue_setup_allowed() => self.write_queue_register(offset, value),
            _ => {}
        }
    }

    fn write_queue_register(&mut self, offset: u64, value: u32) {
        let Some(q) = self.selected_queue() else {
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

    /// A notification that came as an MMIO exit rather than through the ioeventfd.
    fn notify(&self, queue: u32) {
        if self.status & DRIVER_OK == 0 {
            return;
        }
        let device = lock(&self.device);
        if let Some(evt) = device.queue_events().get(queue as usize) {
            let _ = evt.write(1);
        }
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let old = self.status;
        // Only a reset clears bits; anything else that drops one is a driver bug.
        if value & old != old {
            return;
        }
        let added = value & !old;
        let allowed = match added {
            FAILED => true,
            ACK => old == 0,
            DRIVER => old == ACK,
            FEATURES_OK => old == ACK | DRIVER && self.features_acceptable(),
            DRIVER_OK => old == ACK | DRIVER | FEATURES_OK,
            _ => false,
        };
        if !allowed {
            return;
        }
        self.status = value;
        if added == FEATURES_OK {
            lock(&self.device).set_acked_features(self.driver_features);
        }
        if added == DRIVER_OK {
            self.activate();
        }
    }

    /// The driver may accept only offered features, and must accept VIRTIO_F_VERSION_1.
    fn features_acceptable(&self) -> bool {
        let offered = lock(&self.device).avail_features();
        self.driver_features & !offered == 0
            && self.driver_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        let queues_valid = self
            .queues
            .iter()
            .all(|q| q.ready() && q.is_valid(&self.mem));
        let result = if queues_valid {
            // The device owns the queues from here on; a reset gives the transport fresh ones.
            let queues = std::mem::take(&mut self.queues);
            lock(&self.device).activate(self.mem.clone(), queues, self.irq.clone())
        } else {
            let bad = self
                .queues
                .iter()
                .position(|q| !(q.ready() && q.is_valid(&self.mem)));
            Err(super::ActivateError::InvalidQueue(bad.unwrap_or(0)))
        };
        match result {
            Ok(()) => self.activated = true,
            Err(e) => {
                if let Some(held) = self.activation_log.admit() {
                    log::warn!(
                        "virtio device activation failed: {e} ({held} more since the last line)"
                    );
                }
                self.status |= NEEDS_RESET;
                let _ = self.irq.trigger(InterruptKind::Config);
            }
        }
    }

    fn reset(&mut self) {
        if self.activated {
            lock(&self.device).reset();
            self.activated = false;
        }
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.queues = fresh_queues(&*lock(&self.device));
        self.irq.clear();
    }
}

fn fresh_queues(device: &dyn VirtioDevice) -> Vec<Queue> {
    device
        .queue_max_sizes()
        .iter()
        .filter_map(|&max| Queue::new(max).ok())
        .collect()
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE {
            lock(&self.device).read_config(offset - CONFIG_SPACE, data);
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
            if self.status & FAILED == 0 {
                lock(&self.device).write_config(offset - CONFIG_SPACE, data);
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
